"""Replacements started by the launcher (torchft's replica groups under torchelastic), for real.

A lighthouse process and two launchers, one per replica group (``--max_restarts 2``), run
``examples/ft_train.py``; a rank of replica b SIGKILLs itself in the middle of step 3 of its first
attempt. b's launcher stops b's other ranks and starts the group again; the new ranks' Managers join
the next quorum, heal from a's ranks with the same shard index (weights, Adam state, step, RNG, data
position: no checkpoint) and both replicas finish. Replica a never restarts: it discards the step the
failure hit and waits for b (``--min_replicas 2``). The final parameters of every rank equal one
process over exactly the committed batches (float64, <= 1e-10), and every sample of each epoch is used
once. One rank per replica (``ft.DistributedDataParallel``) and two (ZeRO-2 inside the replica, a
lane per shard index). Each scenario (``ft_launcher_scenario.py``) runs as a background job beside the
suite (``tests/background.py``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import background
import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NPROCS = (1, 2)
# a scenario's 150 s limit, waited for in the background and once more if it failed there
pytestmark = pytest.mark.timeout(330)


def _name(nproc: int) -> str:
    return f"ft launcher restart, {nproc} rank(s) per replica"


def _job(nproc: int) -> background.Job:
    from neural_arch.distributed.testing import script_env

    job = background.Job(_name(nproc), [], cwd=REPO, env=script_env(), timeout=150)
    job.argv = [sys.executable, str(HERE / "ft_launcher_scenario.py"), str(job.workdir / "scenario"), str(nproc)]
    return job


def background_jobs(items):
    """The scenarios the collected tests ask for, queued at collection."""
    wanted = {item.callspec.params["nproc"] for item in items if hasattr(item, "callspec")}
    return [_job(n) for n in NPROCS if n in wanted]


def _example():
    spec = importlib.util.spec_from_file_location("ft_train_example", REPO / "examples" / "ft_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("nproc", NPROCS)
def test_a_replica_restarted_by_its_launcher_heals_from_the_live_one(nproc):
    job = background.result(_name(nproc), lambda: _job(nproc))
    assert not job.timed_out, f"the scenario took more than {job.timeout:.0f} s:\n{job.stderr[-4000:]}"
    assert job.returncode == 0, f"the scenario failed ({job.returncode}):\n{job.stderr[-6000:]}"
    work = job.workdir / "scenario"
    results = json.loads((work / "results.json").read_text())
    kill_at = results["kill_at"]
    b_err = results["launchers"]["b"]["stderr"]
    assert f"rank {nproc - 1} killed by SIGKILL; restarting the group (restart 1 of 2)" in b_err, b_err
    assert "restarting" not in results["launchers"]["a"]["stderr"]
    ranks = {(replica, r): json.loads((work / "ranks" / f"{replica}.rank{r}.json").read_text())
             for replica in ("a", "b") for r in range(nproc)}
    stats = {key: got["stats"] for key, got in ranks.items()}

    # a ran once and discarded the fatal step; b's ranks are the restarted ones, each healed from a's same rank
    for r in range(nproc):
        assert stats["a", r]["attempt"] == 0 and stats["a", r]["discarded"] >= 1
        assert stats["b", r]["attempt"] == 1 and stats["b", r]["heals"] >= 1 and stats["b", r]["heal_bytes"] > 0
    quorums = results["lighthouse"]["quorums"]
    healed = {target: source for q in quorums for target, source in q["heal"].items()}
    for r in range(nproc):
        assert healed.get(stats["b", r]["member"]) == stats["a", r]["member"], (r, healed)
    assert len({st["step"] for st in stats.values()}) == 1
    assert len({st["rng"] for st in stats.values()}) == 1             # the RNG state came with the heal

    # a's log has every committed step; b's restarted ranks agree on the steps they took part in
    log = ranks["a", 0]["log"]
    final = stats["a", 0]["step"]
    assert [rec["step"] for rec in log] == list(range(1, final + 1))
    assert all(rec["size"] == 2 for rec in log)                       # min_replicas 2: a waited for b
    by_step = {rec["step"]: rec for rec in log}
    for key, got in ranks.items():
        for rec in got["log"]:
            mine = by_step[rec["step"]]
            assert (rec["epoch"], rec["processed"], rec["size"], rec["members"]) == \
                (mine["epoch"], mine["processed"], mine["size"], mine["members"]), (key, rec["step"])
    assert [rec["step"] for rec in ranks["b", 0]["log"]] == list(range(kill_at + 1, final + 1))   # from the redo on

    example = _example()
    args = example.parse_args(["--lighthouse", "x:1", "--replica_id", "x"])
    samples, batch = args.samples, args.batch
    for epoch in range(args.epochs):    # every sample of every epoch exactly once
        used = np.concatenate([example.global_batch(samples, batch, rec["epoch"], rec["processed"], rec["size"])
                               for rec in log if rec["epoch"] == epoch])
        assert sorted(used.tolist()) == list(range(samples)), epoch
    for rec in ranks["b", 0]["log"]:   # the ranks' shares make up each global batch
        got = sorted(x for key in ranks for r2 in ranks[key]["log"] if r2["step"] == rec["step"] for x in r2["samples"])
        want = example.global_batch(samples, batch, rec["epoch"], rec["processed"], rec["size"])
        assert got == sorted(want.tolist()), rec["step"]

    # equal to one process over exactly the committed batches, on every rank of both replicas
    ref = example.reference(log, samples, batch, args.lr)
    for key, got in ranks.items():
        for a, b in zip(got["params"], ref):
            assert np.max(np.abs(np.asarray(a) - b)) <= 1e-10, key
