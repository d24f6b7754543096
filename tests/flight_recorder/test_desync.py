"""The flight recorder names the rank, op and sequence number of a desync, with real processes.

Three ranks run four all_reduces and a barrier; rank 1 departs at the third all_reduce (see
``fr_fns``). Every rank dumps into one folder (on the failure each one sees, or on SIGUSR1 for the
rank that hangs in user code); the analyzer then names:

* ``skip``: rank 1's barrier met the others' all_reduce #4 (it is one op short);
* ``broadcast`` / ``shape``: rank 1 called another op / shape at #3;
* ``hang``: rank 1 is behind at #3 (its last op is #2) while ranks 0 and 2 wait in all_reduce #3;
  ``idle``: the same, rank 1's dump written at its peers' request (no signal);
* ``kill``: rank 1 never reported; ranks 0 and 2 were in all_reduce #3, which did not complete.

On gloo over TCP and over shared memory, and on MPI (the pool's ranks under a real mpiexec); ``hang`` and
``idle``, which wait out a timeout and do not depend on the transport, on TCP only.
MPI has no ``kill`` case: when a rank dies by a signal, mpiexec (MPICH's hydra) SIGKILLs every
other rank at once -- even with ``-disable-auto-cleanup`` -- so no rank lives to dump.
"""

from __future__ import annotations

import fr_fns
import pytest

from neural_arch.distributed.flight_recorder import analyze, load_dumps
from neural_arch.distributed.testing import run_ranks

pytestmark = pytest.mark.timeout(60)

CULPRIT = fr_fns.CULPRIT
# kind -> (divergence kind, sequence number, what rank 1 did there: its op, or None)
EXPECTED = {
    "skip": ("mismatch", 4, "barrier"),
    "broadcast": ("mismatch", 3, "broadcast"),
    "shape": ("mismatch", 3, "all_reduce"),
    "hang": ("behind", 3, None),
    "idle": ("behind", 3, None),
    "kill": ("stuck", 3, None),
}
# hang and idle wait out a timeout each, and what they test does not depend on the transport (the signal
# handler and the watcher run in the rank; the dump folder carries the request on every backend here, the
# store's path is tests/flight_recorder/test_recorder.py's): once each, on tcp
_ONCE = ("hang", "idle")
CASES = [(kind, transport) for transport in ("tcp", "shm") for kind in EXPECTED
         if kind not in _ONCE or transport == "tcp"] + [
    pytest.param(kind, "mpi", marks=pytest.mark.mpi) for kind in EXPECTED if kind not in ("kill",) + _ONCE]


def _run(kind: str, transport: str, folder: str) -> list:
    env = {"NEURAL_ARCH_FLIGHT_RECORDER_DIR": folder, "NEURAL_ARCH_TIMEOUT": "2",
           "NEURAL_ARCH_FLIGHT_RECORDER_CALLER": "1",   # the verdict names the callers' lines too
           # hang: the signal must be what dumps the idle rank; idle: the peers' request, checked often
           "NEURAL_ARCH_FLIGHT_RECORDER_POLL_S": {"hang": "0", "idle": "0.1"}.get(kind, "1")}
    if transport == "mpi":
        return run_ranks(fr_fns.scenario, 3, backend="mpi", args=(kind, "mpi"), timeout=30, env=env, init=False)
    env["NEURAL_ARCH_GLOO_TRANSPORT"] = transport
    return run_ranks(fr_fns.scenario, 3, backend="gloo", args=(kind,), timeout=30, env=env)


@pytest.mark.parametrize("kind,transport", CASES)
def test_the_analyzer_names_the_rank_the_op_and_the_sequence_number(kind, transport, tmp_path):
    results = _run(kind, transport, str(tmp_path))
    dumps = load_dumps(str(tmp_path))
    reported = sorted(d["rank"] for d in dumps)
    verdict = analyze(dumps, world_size=3)
    report = verdict.report()
    div = verdict.first
    want_kind, seq, culprit_op = EXPECTED[kind]
    assert div is not None, (results, report)
    assert (div.kind, div.seq, div.op) == (want_kind, seq, "all_reduce"), report
    assert div.ranks == [CULPRIT] and div.expected_ranks == [0, 2], report
    if kind == "kill":
        assert reported == [0, 2] and verdict.missing == [CULPRIT], report
        assert "ranks [1] never reported" in report, report
    else:
        assert reported == [0, 1, 2], (results, report)
    if want_kind == "mismatch":
        theirs = div.other_op[CULPRIT]
        assert theirs["op"] == culprit_op and theirs["file"].endswith("fr_fns.py"), report
        if kind == "shape":
            assert theirs["shape"] == [5] and div.expected["shape"] == [4], report
    if kind in ("hang", "idle"):
        assert div.behind == {CULPRIT: 2}, report
        assert verdict.rows[CULPRIT]["last_completed"]["seq"] == 2, report
        reason = next(d for d in dumps if d["rank"] == CULPRIT)["reason"]
        if kind == "hang":
            assert reason == "SIGUSR1", report
        else:
            assert reason.startswith(("requested by rank 0: all_reduce #3", "requested by rank 2: all_reduce #3")), reason
    # the last op every rank completed: the one before the divergence
    assert verdict.last_completed[(0, 1, 2)][0] == seq - 1, report


def test_without_a_folder_the_dumps_go_to_the_store(tmp_path):
    """gloo has a rendezvous store: with no NEURAL_ARCH_FLIGHT_RECORDER_DIR every rank dumps there,
    and ``fetch_from_store`` (here on rank 0) writes them out for the analyzer."""
    run_ranks(fr_fns.scenario, 3, backend="gloo", args=("broadcast", None, str(tmp_path)), timeout=30,
              env={"NEURAL_ARCH_TIMEOUT": "2", "NEURAL_ARCH_GLOO_TRANSPORT": "tcp",
                   "NEURAL_ARCH_FLIGHT_RECORDER_CALLER": "1"})
    verdict = analyze(load_dumps(str(tmp_path)), world_size=3)
    assert sorted(verdict.reported) == [0, 1, 2], verdict.report()
    assert (verdict.first.seq, verdict.first.ranks, verdict.first.other_op[1]["op"]) == (3, [1], "broadcast")
