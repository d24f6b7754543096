"""Pipeline parallelism equals single-process training on the global batch (float64, <= 1e-10):
a deep MLP Sequential and a GPT, 2 and 4 stages, GPipe / 1F1B / interleaved 1F1B / ZB-V / interleaved
zero bubble (IZB), gloo and MPI,
and pp=2 x dp=2 on 4 ranks. Gradients are compared after the first step and parameters after
every step. Ranks are real processes (one RankPool per world size, fed every case)."""

import pp_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)
TOL = 1e-10


@pytest.fixture(scope="module", params=[
    pytest.param(("gloo", 2), id="gloo-2"),
    pytest.param(("gloo", 4), id="gloo-4"),
    pytest.param(("mpi", 2), id="mpi-2", marks=pytest.mark.mpi),
])
def pool(request):
    backend, world = request.param
    with RankPool(world, backend=backend, timeout=120.0) as p:
        yield p


def _check(results, cfg):
    for rank, r in enumerate(results):
        assert r["moved"] > 1e-3, "training must move the parameters, or the comparison proves nothing"
        assert r["nparams"] > 0
        assert r["grad"] <= TOL, f"rank {rank} {cfg}: gradients differ by {r['grad']:g}"
        assert r["param"] <= TOL, f"rank {rank} {cfg}: parameters differ by {r['param']:g}"
        assert r["loss"] <= TOL, f"rank {rank} {cfg}: micro-batch losses differ by {r['loss']:g}"


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zbv", 2), ("izb", 2)])
# MPI: one GPT schedule (the MLP covers the others), and no IZB (its executor path is interleaved's and
# ZB-V's, covered above)
@pytest.mark.cases(lambda p: p["pool"][0] == "gloo" or (p["schedule"] != "izb"
                                                         and (p["kind"] == "mlp" or p["schedule"] == "1f1b")))
def test_pipeline_matches_single_process(pool, kind, schedule, v):
    world = pool.world_size
    cfg = {"kind": kind, "pp": world, "v": v, "m": 2 * world, "schedule": schedule,
           "opt": "adam" if kind == "gpt" else "sgd", "steps": 3}
    results = pool.run(fns.train_run, cfg)
    _check(results, cfg)
    assert sorted(s for r in results for s in r["stages"]) == list(range(world * v))


@pytest.mark.parametrize("kind, schedule", [("mlp", "1f1b"), ("gpt", "gpipe"), ("mlp", "interleaved"),
                                            ("gpt", "zbv")])
@pytest.mark.cases(lambda p: p["pool"][1] == 4)   # pp=2 x dp=2 needs 4 ranks
def test_pipeline_times_data_parallel(pool, kind, schedule):
    cfg = {"kind": kind, "pp": 2, "v": 2 if schedule in fns.MULTI_STAGE else 1, "m": 2, "schedule": schedule,
           "steps": 3}
    _check(pool.run(fns.train_run, cfg), cfg)


@pytest.mark.cases(lambda p: p["pool"][0] == "gloo")   # the schedule's arithmetic: one backend is enough
def test_uneven_balance_and_odd_microbatches(pool):
    cfg = {"kind": "mlp", "pp": pool.world_size, "m": 3, "schedule": "1f1b", "balance": "layers", "layers": 5}
    _check(pool.run(fns.train_run, cfg), cfg)
    # IZB takes any n_microbatches (interleaved 1F1B needs a multiple of p): m=3 on 2 and 4 ranks
    cfg = {"kind": "mlp", "pp": pool.world_size, "v": 2, "m": 3, "schedule": "izb", "layers": 8}
    _check(pool.run(fns.train_run, cfg), cfg)


def test_shape_header_is_sent_every_step(pool):
    results = pool.run(fns.plan_shapes_run)
    assert results[-1] == [2, 2] and all(r == [None, None] for r in results[:-1])


def test_batch_not_divisible_is_a_clear_error():
    """Only the first stage sees the batch; it raises, and the later stages (waiting for its
    activations) raise at once naming it, not after the group's timeout. The group is poisoned
    by design, so the check runs on fresh ranks of its own rather than on the module's pool."""
    with RankPool(3, backend="gloo", timeout=60.0) as fresh:
        results = fresh.run(fns.bad_batch_run)
    assert "multiple of 3" in results[0]["error"], results[0]
    for rank, r in enumerate(results[1:], start=1):
        assert "pipeline stage 0 (global rank 0)" in r["error"] and "multiple of 3" in r["error"], (rank, r)
        assert r["seconds"] < 30, f"rank {rank} waited {r['seconds']:.1f} s: it was not told"


@pytest.mark.cases(lambda p: p["pool"][0] == "gloo")   # arithmetic, not transport: gloo's pools suffice
def test_zero_bubble_one_rank_and_bitwise_interleaved(pool):
    """ZB-V and IZB on one pipeline rank (every stage local; pp=1 x dp=world) equal single-process
    training; on ``world`` ranks they give bitwise the parameters of interleaved 1F1B on the same
    2p stages (the split backward, the V placement and the order change no arithmetic)."""
    world = pool.world_size
    for schedule in ("zbv", "izb"):
        cfg = {"kind": "mlp", "pp": 1, "v": 2, "m": 2, "schedule": schedule, "layers": 4}
        _check(pool.run(fns.train_run, cfg), cfg)
    finals = {}
    for schedule in ("interleaved", "zbv", "izb"):
        cfg = {"kind": "gpt", "pp": world, "v": 2, "m": 2 * world, "schedule": schedule, "opt": "adam",
               "steps": 2, "final": True}
        finals[schedule] = {n: b for r in pool.run(fns.train_run, cfg) for n, b in r["final"].items()}
    for schedule in ("zbv", "izb"):
        assert finals[schedule].keys() == finals["interleaved"].keys() and finals[schedule]
        assert [n for n in finals[schedule] if finals[schedule][n] != finals["interleaved"][n]] == [], schedule


@pytest.mark.cases(lambda p: p["pool"] == ("gloo", 2))   # argument checks: one case is enough
def test_zbv_placement_errors_name_what_to_pass(pool):
    for rank, errors in enumerate(pool.run(fns.zbv_errors_run)):
        assert "do not follow the 'v' placement" in errors["loop stages to ZB-V"], errors
        assert f"style='v') = [{rank}, {3 - rank}]" in errors["loop stages to ZB-V"]
        assert "a list of this rank's 2 stages" in errors["one stage to ZB-V"]
        assert "exactly 2 stages per rank (V placement), got 3" in errors["three stages to ZB-V"]
        if rank == 0:  # rank 1's V stages (1, 2) are not interleaved's (1, 3); rank 0's (0, 3) neither
            assert "do not follow the 'loop' placement" in errors["V stages to interleaved"], errors
