"""The fault matrix: which outcome each (case, backend variant) must have, shared by the tests
and ``benchmarks/bench_faults.py``.

Variants: ``gloo-tcp``, ``gloo-shm`` (the gloo backend over each transport) and ``mpi`` (a real
``mpiexec``). ``EXPECT[case][variant]`` is ``(first, next)``: what the faulty call and the correct
all_reduce after it must give on **every** rank (``"error"``: any exception; a class name: that
class; ``"ok"``: returns). Cases without an MPI entry are MPI's documented behaviour
(docs/fault_tolerance.md).
"""

from __future__ import annotations

VARIANTS = {
    "gloo-tcp": ("gloo", {"NEURAL_ARCH_GLOO_TRANSPORT": "tcp"}),
    "gloo-shm": ("gloo", {"NEURAL_ARCH_GLOO_TRANSPORT": "shm"}),
    "mpi": ("mpi", {}),
}
FAULT_TIMEOUT = 3.0   # seconds: the group timeout of the fault pools (missing-rank cases wait for it)

_POISON = ("error", "GroupPoisonedError")
EXPECT = {
    # validated at the call: only the faulty rank raises, nothing moved, the group goes on
    "readonly": {"gloo": ("ValueError@0", "ok"), "mpi": ("ValueError@0", "ok")},
    # checked by every frame's header (gloo) or by the call check every MPI collective starts with
    # (comm/mpi/check.py: op, sequence number, dtype, bytes, root): an error on every rank, and the
    # group is poisoned on every rank
    "dtype": {"gloo": _POISON, "mpi": _POISON},
    "size": {"gloo": _POISON, "mpi": _POISON},
    "op_order": {"gloo": _POISON, "mpi": _POISON},
    "p2p_size": {"gloo": ("ValueError@1", "GroupPoisonedError")},
    # rank 0's reduction fails after bytes moved. Over the plans rank 1 already holds its result; on
    # the direct shared-memory path (gloo-shm) rank 0 owned half of it, so rank 1 fails too, with a
    # GroupPoisonedError naming rank 0's ValueError ("~X": the other ranks return or raise X)
    "reduce_fault": {"gloo": ("ValueError@0~GroupPoisonedError", "GroupPoisonedError")},
    # the last rank skips the op: the others time out naming it (it is exempt from "first")
    "missing_rank": {"gloo": ("CollectiveTimeoutError", "error")},
}
SLOW = {"missing_rank"}


def expectation(case: str, backend: str):
    return EXPECT[case].get(backend)


def matches(kind: str, rank: int, want: str, skipped: bool = False) -> bool:
    """Whether one rank's outcome ``kind`` satisfies ``want`` (``"ValueError@0"``: rank 0 raises
    ValueError, the other ranks return; ``"ValueError@0~X"``: the others return or raise X)."""
    if want == "any":
        return True
    if "@" in want:
        cls, _, who = want.partition("@")
        who, _, others = who.partition("~")
        return kind == cls if rank == int(who) else kind in ("ok", others or "ok")
    if want == "error":
        return kind != "ok" or skipped
    return kind == want or (skipped and want != "ok")
