"""Every notebook exercise's checker accepts its solution and rejects a wrong one.

The checkers (``examples/notebooks/exercises/checks.py``) run a student's function on real ranks
and compare it with the library; the solutions live in ``examples/notebooks/solutions/``. Each
test runs the checker on the solution (it must return True) and on a plausible mistake (it must
raise AssertionError), and the shipped stub (it must return False: "not done yet"). One pool of
4 gloo ranks serves the whole module.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)

NOTEBOOKS = Path(__file__).resolve().parents[2] / "examples" / "notebooks"
cloudpickle = pytest.importorskip("cloudpickle")


def load(path: Path, name: str):
    """Import ``path`` as module ``name`` without putting its folder on ``sys.path``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module       # cloudpickle sends a module's functions by value only if it is registered
    spec.loader.exec_module(module)
    return module


checks = load(NOTEBOOKS / "exercises" / "checks.py", "notebook_exercise_checks")


def solution(name: str):
    """The solution module ``solutions/<name>.py``, sent to the ranks by value (as a notebook cell is)."""
    module = load(NOTEBOOKS / "solutions" / f"{name}.py", f"notebook_solution_{name}")
    cloudpickle.register_pickle_by_value(module)
    return getattr(module, name)


def stub(*_args):
    raise NotImplementedError


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


def test_ring_all_reduce(pool):
    assert checks.check_ring_all_reduce(stub) is False
    assert checks.check_ring_all_reduce(solution("ring_all_reduce"), pool=pool) is True

    def no_reduce(x, rank, world):                        # the all-gather half only: copies, never adds
        import neural_arch.distributed as dist
        out = np.array(x, dtype=np.float64)
        if world > 1:
            dist.broadcast(out, src=0)
        return out

    with pytest.raises(AssertionError, match="all_reduce"):
        checks.check_ring_all_reduce(no_reduce, pool=pool)


def test_one_f_one_b():
    assert checks.check_one_f_one_b(stub) is False
    assert checks.check_one_f_one_b(solution("one_f_one_b")) is True

    def gpipe(p, m):                                      # valid, but every forward before any backward
        return [[f"F{i}" for i in range(m)] + [f"B{i}" for i in range(m)] for _ in range(p)]

    with pytest.raises(AssertionError, match="not 1F1B"):
        checks.check_one_f_one_b(gpipe)

    def backward_first(p, m):                             # a backward before its forward: the simulator refuses
        return [[f"B{i}" for i in range(m)] + [f"F{i}" for i in range(m)] for _ in range(p)]

    with pytest.raises(AssertionError, match="simulator"):
        checks.check_one_f_one_b(backward_first)


def test_zero1_step(pool):
    assert checks.check_zero1_step(stub) is False
    assert checks.check_zero1_step(solution("zero1_step"), pool=pool) is True

    def no_broadcast(params, grads, state, rank, world, lr, momentum):   # each rank keeps only its own update
        for i, (p, g) in enumerate(zip(params, grads)):
            if i % world == rank:
                state[i] = buf = g.copy() if i not in state else momentum * state[i] + g
                p -= lr * buf

    with pytest.raises(AssertionError, match="ZeroRedundancyOptimizer"):
        checks.check_zero1_step(no_broadcast, pool=pool)


def test_bucket_assignment(pool):
    assert checks.check_bucket_assignment(stub) is False
    assert checks.check_bucket_assignment(solution("assign_buckets"), pool=pool) is True

    def close_before_cap(param_nbytes, cap, first_cap):    # the old rule: never let a bucket pass its cap
        buckets, current, filled = [], [], 0
        for i in reversed(range(len(param_nbytes))):
            limit = min(first_cap, cap) if not buckets else cap
            if current and filled + param_nbytes[i] > limit:
                buckets.append(current)
                current, filled = [], 0
            current.append(i)
            filled += param_nbytes[i]
        return buckets + ([current] if current else [])

    with pytest.raises(AssertionError, match="library"):
        checks.check_bucket_assignment(close_before_cap, pool=pool)


def test_mesh_groups(pool):
    assert checks.check_mesh_groups(stub) is False
    assert checks.check_mesh_groups(solution("mesh_groups"), pool=pool) is True

    def rows_always(shape, dim):                           # ignores dim: the last axis's groups every time
        return np.arange(int(np.prod(shape))).reshape(-1, shape[-1]).tolist()

    with pytest.raises(AssertionError, match="library"):
        checks.check_mesh_groups(rows_always, pool=pool)


def test_exposed_comm(pool):
    assert checks.check_exposed_comm(stub) is False
    assert checks.check_exposed_comm(solution("exposed_comm"), pool=pool) is True

    def ignores_waits(spans):                               # counts backward's wait for the buckets as compute
        from neural_arch.distributed.metrics import exposed_time
        return exposed_time([(s, e) for _, c, s, e in spans if c == "collective"],
                            [(s, e) for _, c, s, e in spans if c in ("forward", "backward", "optimizer")])

    with pytest.raises(AssertionError, match="expected"):
        checks.check_exposed_comm(ignores_waits, pool=pool)


def test_first_desync():
    assert checks.check_first_desync(stub) is False
    first_desync = solution("first_desync")
    assert checks.check_first_desync(first_desync) is True

    def ops_only(records):                                  # compares op names: misses another shape or dtype
        return first_desync({r: [dict(e, shape=None, dtype=None) for e in entries]
                             for r, entries in records.items()})

    with pytest.raises(AssertionError, match="analyzer"):
        checks.check_first_desync(ops_only)

    def from_the_oldest(records):                           # a rank whose ring forgot more looks behind
        oldest = min(e["seq"] for entries in records.values() for e in entries if not e.get("p2p"))
        lacking = sorted(r for r, entries in records.items() if all(e["seq"] != oldest for e in entries))
        return (oldest, lacking) if lacking else first_desync(records)

    with pytest.raises(AssertionError, match="forgot"):
        checks.check_first_desync(from_the_oldest)


def test_bytes_per_param():
    assert checks.check_bytes_per_param(stub) is False
    assert checks.check_bytes_per_param(solution("bytes_per_param")) is True

    def no_master_copy(optimizer, dtype_policy):              # mixed precision without the float32 master weights
        s = {"fp64": 8, "fp32": 4}.get(dtype_policy, 2)
        return (2 + {"sgd": 0, "sgd_momentum": 1}.get(optimizer, 2)) * s

    with pytest.raises(AssertionError, match="memory.estimate"):
        checks.check_bytes_per_param(no_master_copy)


def test_column_parallel_forward(pool):
    assert checks.check_column_parallel_forward(stub) is False
    assert checks.check_column_parallel_forward(solution("column_parallel_forward"), pool=pool) is True

    def full_weight(x, weight, bias, rank, world):            # every rank multiplies by the whole weight
        return x @ weight.T + bias

    with pytest.raises(AssertionError, match="NaN"):
        checks.check_column_parallel_forward(full_weight, pool=pool)

    def stacked(x, weight, bias, rank, world):                # gathers the slices along the batch, not the features
        import neural_arch.distributed as dist
        from neural_arch.core.tensor import Tensor
        per = weight.shape[0] // world
        local = x @ weight[rank * per:(rank + 1) * per].T + bias[rank * per:(rank + 1) * per]
        if world == 1:
            return local
        return np.concatenate([p.data for p in dist.all_gather(Tensor(local))], axis=0)

    with pytest.raises(AssertionError, match="shape"):
        checks.check_column_parallel_forward(stacked, pool=pool)


def test_decode_step():
    assert checks.check_decode_step(stub) is False
    decode_step = solution("decode_step")
    assert checks.check_decode_step(decode_step) is True

    def unscaled(q, k, v, cache):                              # forgets the 1 / sqrt(head_dim)
        return decode_step(q * np.sqrt(q.shape[-1]), k, v, cache)

    with pytest.raises(AssertionError, match="recomputation"):
        checks.check_decode_step(unscaled)

    def no_cache(q, k, v, cache):                              # attends to the new position only
        return v

    with pytest.raises(AssertionError, match="step 1"):
        checks.check_decode_step(no_cache)


def test_merge_partials(pool):
    assert checks.check_merge_partials(stub) is False
    assert checks.check_merge_partials(solution("merge_partials"), pool=pool) is True

    def naive(out_a, lse_a, out_b, lse_b):                     # exp of the raw lse: overflows for large scores
        with np.errstate(over="ignore", invalid="ignore"):
            a, b = np.exp(lse_a), np.exp(lse_b)
            return (a[..., None] * out_a + b[..., None] * out_b) / (a + b)[..., None], np.log(a + b)

    with pytest.raises(AssertionError, match="overflow"):
        checks.check_merge_partials(naive, pool=pool)

    def unweighted(out_a, lse_a, out_b, lse_b):                # the mean of the outputs: ignores each side's mass
        return np.where(np.isneginf(lse_a)[..., None], out_b, (out_a + out_b) / 2), np.logaddexp(lse_a, lse_b)

    with pytest.raises(AssertionError, match="merge_partial"):
        checks.check_merge_partials(unweighted, pool=pool)


def test_zero1_state_bytes(pool):
    assert checks.check_zero1_state_bytes(stub) is False
    assert checks.check_zero1_state_bytes(solution("zero1_state_bytes"), pool=pool) is True

    def round_robin(param_nbytes, world, optimizer):            # parameter i to rank i % world: unbalanced
        load = [0] * world
        for i, b in enumerate(param_nbytes):
            load[i % world] += b
        return [{"sgd": 0, "sgd_momentum": 1}.get(optimizer, 2) * x for x in load]

    with pytest.raises(AssertionError, match="memory.estimate|partition"):
        checks.check_zero1_state_bytes(round_robin, pool=pool)


def test_next_quorum():
    assert checks.check_next_quorum(stub) is False
    next_quorum = solution("next_quorum")
    assert checks.check_next_quorum(next_quorum) is True

    def trusts_dead_replicas(requests, healthy, min_replicas, join_timeout, now):   # ignores the heartbeats
        return next_quorum(requests, set(healthy) | set(requests), min_replicas, join_timeout, now)

    with pytest.raises(AssertionError, match="dropped"):
        checks.check_next_quorum(trusts_dead_replicas)

    def never_waits(requests, healthy, min_replicas, join_timeout, now):            # no join_timeout for the slow
        return next_quorum(requests, healthy, min_replicas, 0.0, now)

    with pytest.raises(AssertionError, match="plan_quorum"):
        checks.check_next_quorum(never_waits)


def test_accumulation_window(pool):
    assert checks.check_accumulation_window(stub) is False
    assert checks.check_accumulation_window(solution("accumulation_window"), pool=pool) is True

    def syncs_every_micro_batch(ddp, optimizer, micro_batches, loss_fn, max_norm):   # no no_sync(): same weights
        from neural_arch.optim.clip import clip_grad_norm_
        losses = []
        for x, y in micro_batches:
            loss = loss_fn(ddp(x), y)
            (loss / len(micro_batches)).backward()
            losses.append(float(loss.item()))
        clip_grad_norm_(ddp.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad()
        return sum(losses) / len(losses)

    with pytest.raises(AssertionError, match="no_sync"):
        checks.check_accumulation_window(syncs_every_micro_batch, pool=pool)

    def sums_the_losses(ddp, optimizer, micro_batches, loss_fn, max_norm):          # forgets / K: K times the lr
        import contextlib
        total = 0.0
        for i, (x, y) in enumerate(micro_batches):
            with ddp.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext():
                loss = loss_fn(ddp(x), y)
                loss.backward()
            total += float(loss.item()) / len(micro_batches)
        optimizer.step()
        optimizer.zero_grad()
        return total

    with pytest.raises(AssertionError, match="divided by the number of micro-batches"):
        checks.check_accumulation_window(sums_the_losses, pool=pool)
