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
