"""``examples/train_gpt_5d.py``: every parallel dimension composed with data parallelism trains exactly
like one process (its ``--verify`` verdict: loss curve and final parameters within 1e-10 in float64).

Few process starts, each covering several compositions (a start costs an interpreter and the
imports per rank, and the machines running the suite have 2 cores):

* launcher, 8 ranks, dp 2 x tp 2 x cp 2 x ep 2: dp x tp, dp x cp, dp x ep, dp x tp x cp on 8
  ranks, and MoE under tp and cp;
* launcher, 8 ranks, dp 2 x pp 2 x cp 2: dp x pp (and pp x cp);
* launcher, 4 ranks, pp 2 x dp 2 x ep 2 with an MoE in every block: MoE under pipelining (the first
  stage's aux loss reaches its router through ``MoEAuxLossAutoScaler``; the reference accumulates
  the same micro-batches);
* launcher, 4 ranks, dp 2 x cp 2 x ep 2 with top-1 routing and a capacity: the dropped assignments
  chosen by global position under the head-tail layout;
* mpiexec, 4 ranks, dp 4 x ep 2 with top-1 routing and a capacity: experts held twice (the
  expert-data-parallel groups) and tokens dropped;
* in this process: the layouts the script refuses, each with a sentence naming the flags.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

import background
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "train_gpt_5d.py")
ONE_THREAD = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
VERDICT = re.compile(r"verify: (PASS|FAIL) (pp=\d+ dp=\d+ cp=\d+ tp=\d+ ep=\d+): max \|loss - single process\| = "
                     r"(\S+), max \|parameter - single process\| = (\S+)")


def _verdict(out: str, layout: str) -> None:
    match = VERDICT.search(out)
    assert match, out[-3000:]
    assert match.group(2) == layout, (match.group(2), out[-3000:])
    loss, params = float(match.group(3)), float(match.group(4))
    assert match.group(1) == "PASS" and loss <= 1e-10 and params <= 1e-10, out[-3000:]
    assert re.search(r"step   2  loss \d", out), out[-3000:]


def _command(nproc: int, flags) -> list[str]:
    return [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", str(nproc),
            SCRIPT, *flags, "--steps", "3", "--verify"]


def _job(nproc: int, flags) -> background.Job:
    """One launcher run as a background job (``tests/background.py``): self-contained, so it runs beside the
    other tests on the cycles they leave idle; the test judges its output."""
    from neural_arch.distributed.testing import script_env

    return background.Job(_name(nproc, flags), _command(nproc, flags), cwd=REPO, env=script_env(ONE_THREAD),
                          timeout=150)


def _name(nproc: int, flags) -> str:
    """The job's name, without building it (a Job makes its folder, which only the queue removes)."""
    return " ".join(_command(nproc, flags)[3:])


def background_jobs(items):
    """The launcher compositions the collected tests ask for, queued at collection."""
    return [_job(item.callspec.params["nproc"], item.callspec.params["flags"]) for item in items
            if item.originalname == "test_launcher_compositions_match_single_process"]


def _launch(nproc: int, *flags: str) -> str:
    job = background.result(_name(nproc, flags), lambda: _job(nproc, flags))
    cmd = " ".join(job.argv)
    assert not job.timed_out, f"{cmd} did not finish within {job.timeout:.0f} s\n--- stderr ---\n{job.stderr[-3000:]}"
    assert job.returncode == 0, (f"{cmd} exited with {job.returncode}\n--- stdout ---\n"
                                 f"{job.stdout[-3000:]}\n--- stderr ---\n{job.stderr[-3000:]}")
    return job.stdout


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("nproc, flags, layout", [
    (8, ["--dp", "2", "--tp", "2", "--cp", "2", "--ep", "2"], "pp=1 dp=2 cp=2 tp=2 ep=2"),
    (8, ["--dp", "2", "--pp", "2", "--cp", "2"], "pp=2 dp=2 cp=2 tp=1 ep=1"),
    (4, ["--pp", "2", "--dp", "2", "--ep", "2", "--moe-every", "1"], "pp=2 dp=2 cp=1 tp=1 ep=2"),
    (4, ["--dp", "2", "--cp", "2", "--ep", "2", "--top-k", "1", "--capacity-factor", "1.0"],
     "pp=1 dp=2 cp=2 tp=1 ep=2"),
], ids=["dp2xtp2xcp2xep2", "dp2xpp2xcp2", "pp2xdp2xep2", "dp2xcp2xep2-capacity"])
def test_launcher_compositions_match_single_process(nproc, flags, layout):
    out = _launch(nproc, *flags)
    _verdict(out, layout)
    if "--pp" in flags and "--ep" in flags:
        # rank 0 holds the first stage, and it has an MoE block: its aux loss had to reach the router
        # through the activations' backward (one micro-batch: 2 dp x 1 sequence x 8 positions, top-2)
        counts = re.search(r"moe block 0: tokens per expert \[([\d, ]+)\]", out)
        assert counts and sum(int(c) for c in counts.group(1).split(",")) == 2 * 1 * 8 * 2, out[-3000:]
    elif "--capacity-factor" in flags:
        dropped = re.search(r"moe block 1: tokens per expert \[[\d, ]+\], (\d+) assignments dropped", out)
        assert dropped and int(dropped.group(1)) > 0, out[-3000:]  # the capacity path really ran
    elif "--ep" in flags:
        # the MoE block really routed the step's whole batch (2 dp x 2 sequences x 8 positions)
        counts = re.search(r"moe block 1: tokens per expert \[([\d, ]+)\]", out)
        assert counts, out[-3000:]
        assert sum(int(c) for c in counts.group(1).split(",")) == 2 * 2 * 8 * 2, out[-3000:]   # top-2


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.timeout(200)
def test_mpiexec_expert_data_parallel_groups_with_capacity_match_single_process():
    from neural_arch.distributed.testing import run_mpiexec

    done = run_mpiexec(SCRIPT, 4, args=["--dp", "4", "--ep", "2", "--top-k", "1", "--capacity-factor", "1.0",
                                        "--steps", "3", "--verify"], env=ONE_THREAD, timeout=150, cwd=REPO)
    assert done.returncode == 0, done.output[-4000:]
    _verdict(done.stdout, "pp=1 dp=4 cp=1 tp=1 ep=2")
    dropped = re.search(r"moe block 1: tokens per expert \[[\d, ]+\], (\d+) assignments dropped", done.stdout)
    assert dropped and int(dropped.group(1)) > 0, done.stdout[-3000:]  # the capacity path really ran


@pytest.fixture(scope="module")
def script():
    """The example as a module (its layout checks need no processes); the environment variables and
    the ``sys.path`` entry it sets on import are put back afterwards."""
    environ, path = dict(os.environ), list(sys.path)
    spec = importlib.util.spec_from_file_location("train_gpt_5d", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path
    return module


@pytest.mark.parametrize("world, flags, words", [
    (4, ["--dp", "4", "--ep", "3"], ["--ep 3 must divide --dp 4"]),
    (4, ["--dp", "2", "--tp", "3"], ["must equal the world size 4"]),
    (2, ["--cp", "2", "--seq-len", "6"], ["--seq-len 6", "2 x --cp = 4"]),
], ids=["ep-outside-dp", "world", "cp-seq-len"])
def test_unsupported_layouts_are_refused_with_the_flags_named(script, world, flags, words):
    reason = script.check_layout(script.parse_args(flags), world)
    assert reason is not None and all(w in reason for w in words), reason


def test_supported_layouts_pass_the_check(script):
    for world, flags in ((8, ["--dp", "2", "--tp", "2", "--cp", "2", "--ep", "2"]),
                         (8, ["--pp", "2", "--dp", "2", "--tp", "2"]),
                         (4, ["--pp", "2", "--cp", "2"]), (1, []),
                         (4, ["--dp", "2", "--tp", "2", "--ep", "2", "--moe-every", "1"]),  # TP with no dense MLP
                         (4, ["--dp", "2", "--pp", "2", "--ep", "2"]), (2, ["--pp", "2", "--experts", "4"]),
                         (4, ["--dp", "2", "--cp", "2", "--ep", "2", "--capacity-factor", "1.0"])):
        assert script.check_layout(script.parse_args(flags), world) is None, flags
