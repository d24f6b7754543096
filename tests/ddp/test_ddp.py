"""DistributedDataParallel: equivalence with single-process training, bucketing, overlap, no_sync,
unused parameters, join, construction checks. Ranks are real processes (RankPool, reused per module).
"""

import ddp_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.bucketing import plan_buckets
from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(240)]

TOL = {"float64": 1e-10, "float32": 1e-5}


@pytest.fixture(scope="module", params=[
    pytest.param(("gloo", 2), id="gloo-2"),
    pytest.param(("gloo", 3), id="gloo-3"),
    pytest.param(("mpi", 2), id="mpi-2", marks=pytest.mark.mpi),
    pytest.param(("mpi", 3), id="mpi-3", marks=pytest.mark.mpi),
])
def pool(request):
    backend, world = request.param
    with RankPool(world, backend=backend, timeout=90.0) as p:
        yield p


EQUIVALENCE = {
    "sgd-f64-tiny-buckets": {"opt": "sgd", "dtype": "float64", "cap": 0.0004, "first": 0.0001},
    "adam-f64-one-bucket": {"opt": "adam", "dtype": "float64", "cap": 25.0},
    "sgd-f32-view": {"opt": "sgd", "dtype": "float32", "cap": 0.001, "first": 0.0002, "view": True},
    "adam-f32-unshuffled": {"opt": "adam", "dtype": "float32", "shuffle": False},
    "sgd-no_sync-accumulation": {"opt": "sgd", "dtype": "float64", "accum": 2, "B": 4, "cap": 0.0004},
    "adam-global-no_sync": {"opt": "adam", "dtype": "float64", "accum": 2, "global_no_sync": True},
    "sgd-unused-params": {"opt": "sgd", "dtype": "float64", "model": "unused", "find_unused": True, "cap": 0.0004},
    "adam-unused-params-view": {"opt": "adam", "dtype": "float64", "model": "unused", "find_unused": True, "view": True},
    "sgd-manual-sync-is-harmless": {"opt": "sgd", "dtype": "float64", "manual_sync": True},
    "sgd-require_backward_grad_sync": {"opt": "sgd", "dtype": "float64", "accum": 2, "B": 4, "grad_sync_flag": True},
    "adam-torch-allreduce-hook": {"opt": "adam", "dtype": "float64", "cap": 0.0004, "hook": "allreduce_hook"},
    "sgd-custom-hook": {"opt": "sgd", "dtype": "float64", "cap": 0.0004, "first": 0.0001, "hook": "custom"},
    "adam-powersgd-full-rank": {"opt": "adam", "dtype": "float64", "cap": 0.0004, "hook": "powersgd-full-rank"},
    "sgd-topk-ratio-1": {"opt": "sgd", "dtype": "float64", "cap": 0.0004, "hook": "topk-everything"},
    # DGC's momentum correction at ratio 1 (nothing delayed) is heavy-ball SGD momentum, moved into the hook
    "sgd-topk-momentum-correction-ratio-1": {"opt": "sgd-momentum", "ddp_opt": "sgd-no-momentum", "dtype": "float64",
                                             "cap": 0.0004, "hook": "topk-momentum-everything"},
    "sgd-custom-hook-unused-params": {"opt": "sgd", "dtype": "float64", "model": "unused", "find_unused": True,
                                      "hook": "custom"},
}


@pytest.mark.parametrize("name", list(EQUIVALENCE))
def test_ddp_matches_single_process_training(pool, name):
    cfg = EQUIVALENCE[name]
    results = pool.run(fns.equivalence_run, cfg)
    tol = TOL[cfg["dtype"]]
    for rank, (diff, _, steps) in enumerate(results):
        assert steps >= 4
        assert diff <= tol, f"rank {rank}: DDP differs from single-process training by {diff:g} (> {tol:g})"
    prints = [fp for _, fp, _ in results]
    assert max(prints) - min(prints) <= 100 * tol * max(1.0, abs(prints[0]))


def test_unused_parameter_error_on_every_rank(pool):
    results = pool.run(fns.unused_error_run, False)
    for kind, msg in results:
        assert kind == "UnusedParametersError"
        assert "find_unused_parameters=True" in msg
    assert "dead.weight" in results[0][1] and "extra.weight" in results[0][1]
    # the pool's ranks are still in step: a normal run afterwards works
    kind, grads = pool.run(fns.unused_error_run, True)[0]
    assert kind == "ok" and grads["dead.weight"] is None and grads["fc1.weight"] > 0


def test_locally_unused_parameter_is_reduced_as_zero(pool):
    for diff in pool.run(fns.locally_unused_run):
        assert diff <= 1e-12


def test_manual_sync_gradients(pool):
    for diffs in pool.run(fns.manual_sync_run):
        assert max(diffs) <= 1e-12, diffs


def test_gradient_as_bucket_view_leaves_grads_in_the_buckets(pool):
    assert pool.run(fns.view_run) == [[True, True]] * pool.world_size


def test_fp16_compress_hook_equals_plain_averaging_within_float16_rounding(pool):
    cfg = {"opt": "sgd", "dtype": "float32", "cap": 0.0004, "hook": "fp16_compress_hook", "epochs": 1}
    for diff, _fp, steps in pool.run(fns.equivalence_run, cfg):
        assert steps > 0
        assert diff <= 2e-3, diff  # float16 keeps ~3 decimal digits of each averaged gradient


def test_bf16_compress_hook_equals_plain_averaging_within_bfloat16_rounding(pool):
    # every backend moves bfloat16 arrays: a wrong bfloat16 result is a failure, never a skip
    assert pool.run(fns.bf16_probe) == ["ok"] * pool.world_size
    cfg = {"opt": "sgd", "dtype": "float32", "cap": 0.0004, "hook": "bf16_compress_hook", "epochs": 1}
    for diff, _fp, steps in pool.run(fns.equivalence_run, cfg):
        assert steps > 0
        assert diff <= 2e-2, diff  # bfloat16 keeps 8 significant bits (~2-3 decimal digits)


@pytest.mark.parametrize("hook", ["powersgd-rank1", "topk-30%", "topk-warmup"])
def test_lossy_hooks_keep_every_rank_in_step(pool, hook):
    # several buckets (PowerSGD's second phase runs at backward's end, in bucket order): the
    # ranks stay in step and end with identical parameters
    cfg = {"opt": "sgd", "dtype": "float64", "cap": 0.0004, "first": 0.0001, "hook": hook}
    results = pool.run(fns.equivalence_run, cfg)
    prints = [fp for _, fp, _ in results]
    assert max(prints) - min(prints) <= 1e-9 * max(1.0, abs(prints[0]))
    for diff, _, steps in results:
        assert steps >= 4 and diff < 1.0  # lossy, but not diverged


@pytest.mark.parametrize("rank_r", [1, 3])
def test_powersgd_error_feedback_loses_nothing(pool, rank_r):
    for err, (sent, plain) in pool.run(fns.powersgd_feedback_run, rank_r):
        assert err <= 1e-12, err
        assert sent == (12 + 9) * rank_r + 5 and plain == 12 * 9 + 5  # P, Q of the matrix + the vector


@pytest.mark.parametrize("ratio", [0.25, 1.0])
def test_communication_optimizer_compressed_mean_loses_nothing(pool, ratio):
    for err, same, (sent, n) in pool.run(fns.facade_compressed_run, ratio):
        assert err <= 1e-12, err
        assert same  # every rank got the same mean
        assert n == 24 and sent == (24 if ratio == 1.0 else 2 * 6)  # plain mean, or k=6 indices + values


@pytest.mark.parametrize("ratio,kwargs", [
    pytest.param(0.1, None, id="sparse-10%"),
    pytest.param(0.3, None, id="sparse-30%"),
    pytest.param(0.1, {"warmup_iters": 0, "momentum": 0.9}, id="momentum-correction"),
])
def test_topk_error_feedback_loses_nothing(pool, ratio, kwargs):
    for err, sent_log in pool.run(fns.topk_feedback_run, ratio, 5, kwargs):
        assert err <= 1e-12, err
        assert sent_log == [(2 * int(np.ceil(ratio * 37)), 37)] * 5  # indices + values of k entries


def test_topk_sends_dense_where_sparse_would_not_pay(pool):
    # 90% of 37 entries as (int32 index, float64 value) pairs would move more bytes than an all-reduce
    for err, sent_log in pool.run(fns.topk_feedback_run, 0.9, 3, {"warmup_iters": 0, "momentum": 0.5}):
        assert err <= 1e-12, err
        assert sent_log == [(37, 37)] * 3


def test_topk_warmup_schedule_loses_nothing(pool):
    # a dense step, densities 50%, 25%, 12.5%, then 5%: nothing lost at any transition
    kwargs = {"start_iter": 1, "warmup_iters": 3, "warmup_start_ratio": 0.5, "warmup_factor": 2.0}
    for err, sent_log in pool.run(fns.topk_feedback_run, 0.05, 6, kwargs):
        assert err <= 1e-12, err
        sent = [s for s, _ in sent_log]
        assert sent_log[0] == (37, 37) and sent[-2:] == [2 * 2, 2 * 2]  # dense first, k = ceil(5% of 37) last
        # shrinking stage by stage (a sparse step counts 2 numbers per entry, a dense one 1)
        assert sent[1:] == sorted(sent[1:], reverse=True) and len(set(sent)) >= 4, sent_log


def test_comm_hook_sees_every_bucket_in_order_once_per_backward(pool):
    for seen, n_buckets, twice in pool.run(fns.hook_calls_run):
        assert n_buckets > 2
        order = [s[0] for s in seen]
        assert order == list(range(n_buckets)) * 2
        assert [s[1] for s in seen] == ([False] * (n_buckets - 1) + [True]) * 2
        assert sum(s[2] for s in seen[:n_buckets]) == 4  # every parameter in exactly one bucket
        assert "only be called once" in twice


def test_bucket_count_grows_as_cap_shrinks(pool):
    counts = []
    for cap in (25.0, 0.02, 0.005, 0.00005):
        (n, plan), *rest = pool.run(fns.count_allreduces_run, cap, cap)
        assert all(r[0] == n for r in rest)
        assert n == len(plan)
        counts.append(n)
    assert counts[0] == 1 and counts[-1] == 4  # one bucket per parameter at the smallest cap
    assert counts == sorted(counts) and counts[1] < counts[-1]


def test_allreduce_starts_before_backward_ends(pool):
    timeline, stats = pool.run(fns.overlap_run)[0]
    events = [e[0] for e in timeline]
    end = events.index("backward_end")
    launches_before = [e for e in timeline[:end] if e[0] == "launch"]
    assert len(launches_before) >= 2, timeline  # buckets were in flight while backward still ran
    assert stats["launched_before_end"] >= 2


def test_bucket_spans_and_per_bucket_stats(pool):
    spans, stats, timeline, totals, n = pool.run(fns.bucket_spans_run)[0]
    assert n >= 3 and len(spans) == len(stats) == n
    end = next(t for e, _, t in timeline if e == "backward_end")
    for i, ((name, cat, start, stop, args), st) in enumerate(zip(spans, stats)):
        assert name == f"bucket {i}" and cat == "bucket" and args["index"] == st["index"] == i
        assert args["bytes"] == st["bytes"] > 0
        assert start == args["ready"] <= args["launched"] <= args["started"] <= args["done"] == stop
        assert 0.0 <= st["hidden_s"] <= st["comm_s"] and 0.0 <= st["hidden_fraction"] <= 1.0
    assert spans[0][2] < end  # the first bucket was ready (and launched) while backward still ran
    assert sum(st["bytes"] for st in stats) == 4 * (256 * 512 + 512 + 512 * 10 + 10)
    assert [t for _, _, t in timeline] == sorted(t for _, _, t in timeline)
    assert len(totals["bucket_hidden_fraction"]) == n and totals["backwards"] == 2


def _check_join_equals_single_process(results, extra, world):
    prints = [fingerprint for fingerprint, _ in results]
    assert max(prints) - min(prints) <= 1e-9 * max(1.0, abs(prints[0]))
    reference = fns.join_reference(extra, world)
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, fns.join_reference(0, 1)))
    assert extra == 0 or moved > 1e-3, "uneven inputs must change the result, or the comparison proves nothing"
    for rank, (_, params) in enumerate(results):
        diff = max(float(np.max(np.abs(p - q))) for p, q in zip(params, reference))
        assert diff <= 1e-10, f"rank {rank}: join() differs from single-process training by {diff:g}"


@pytest.mark.parametrize("extra", [0, 2])
def test_join_uneven_inputs(pool, extra):
    _check_join_equals_single_process(pool.run(fns.join_run, extra, timeout=60), extra, pool.world_size)


def test_join_throw_on_early_termination(pool):
    results = pool.run(fns.join_throw_run, timeout=60)
    for done, msg in results:
        assert done == 2 and "ran out of inputs" in msg


def test_join_with_find_unused(pool):
    _check_join_equals_single_process(pool.run(fns.join_run, 1, True, timeout=60), 1, pool.world_size)


def test_model_mismatch_fails_on_every_rank(pool):
    for msg in pool.run(fns.mismatch_run):
        assert "differs between ranks" in msg and "0.weight" in msg


def test_construction_broadcasts_params_and_buffers(pool):
    results = pool.run(fns.broadcast_run)
    for params, buf in results:
        assert params == results[0][0]
        assert buf == [0.0, 0.0, 0.0]


@pytest.mark.cases(lambda p: p["pool"][1] >= 3)   # needs a rank outside the sub-group
def test_subgroup(pool):
    results = pool.run(fns.equivalence_run, {"opt": "sgd", "dtype": "float64", "subgroup": [0, 2], "cap": 0.0004})
    assert results[1] is None
    for r in (0, 2):
        assert results[r][0] <= 1e-10


@pytest.mark.parametrize("n", [1, 37, 60])
def test_distributed_evaluate_counts_every_real_sample_once(pool, n):
    for stats, ddp_stats, acc, loss in pool.run(fns.evaluate_run, n):
        assert stats["num_samples"] == ddp_stats["num_samples"] == n
        assert abs(stats["accuracy"] - acc) < 1e-12 and abs(ddp_stats["accuracy"] - acc) < 1e-12
        assert abs(stats["loss"] - loss) < 1e-9


def test_backward_that_raises_midway_does_not_poison_the_next(pool):
    for diff in pool.run(fns.recover_run):
        assert diff <= 1e-12


# -- no processes ---------------------------------------------------------------------------------

def test_plan_buckets_is_reverse_order_with_small_first_bucket():
    sizes = [(1000, "float32"), (10, "float32"), (1000, "float32"), (10, "float32")]
    assert plan_buckets(sizes, cap=10 ** 6, first_cap=10 ** 6) == [[3, 2, 1, 0]]
    # torch's rule: the parameter that reaches the limit closes the bucket it joined
    assert plan_buckets(sizes, cap=10 ** 6, first_cap=100) == [[3, 2], [1, 0]]
    assert plan_buckets(sizes, cap=4040, first_cap=40) == [[3], [2, 1], [0]]
    assert plan_buckets(sizes, cap=4000, first_cap=40) == [[3], [2], [1, 0]]
    assert plan_buckets(sizes, cap=1, first_cap=1) == [[3], [2], [1], [0]]
    # the MLP 784-1024-1024-10 of bench_ddp: the 4 MB middle weight leaves with the first bucket
    # (during the first layer's backward), not with the first layer's gradient at backward's end
    mlp = [(784 * 1024, "float32"), (1024, "float32"), (1024 * 1024, "float32"), (1024, "float32"),
           (10 * 1024, "float32"), (10, "float32")]
    assert plan_buckets(mlp, cap=25 << 20, first_cap=1 << 20) == [[5, 4, 3, 2], [1, 0]]
    # dtypes never share a bucket
    mixed = [(10, "float64"), (10, "float32"), (10, "float64")]
    assert sorted(map(sorted, plan_buckets(mixed, cap=10 ** 6))) == [[0, 2], [1]]


def test_distributed_evaluate_world_of_one():
    stats, _, acc, loss = fns.evaluate_run(23)
    assert stats["num_samples"] == 23 and abs(stats["accuracy"] - acc) < 1e-12 and abs(stats["loss"] - loss) < 1e-9


def test_world_of_one_state_dict_and_attributes():
    from neural_arch.distributed import DistributedDataParallel

    model = fns.build_mlp(0, np.float64)
    ddp = DistributedDataParallel(model, bucket_size_mb=5)
    assert list(ddp.state_dict()) == list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    torch_style = {"module." + k: v for k, v in model.state_dict().items()}
    ddp.load_state_dict(torch_style)
    assert ddp.bucket_cap_mb == 5 and ddp.module is model
    assert len(list(ddp.parameters())) == 4
    ddp.eval()
    assert not model.training
    ddp.sync_gradients()  # nothing to do in a world of one
    with pytest.raises(ValueError, match="only one of"):
        DistributedDataParallel(model, bucket_cap_mb=1, bucket_size_mb=2)
