"""Exploring property tests for silent wrong results in DTensor (4 gloo ranks, one RankPool).

Hypothesis draws batches of cases -- shapes with dims of 0, 1 and sizes the mesh does not divide,
float32 and float64, negative dims, every placement (Partial "sum" and "avg" included) on a 1-d
mesh of 4 and a 2 x 2 mesh -- and each rank checks the DTensor op against the same op on the full
NumPy array (``dtensor_explore_rank_fns``). A case may raise a clear error; it may never return a
wrong value, shape or dtype, nor return a result where the full-array op refuses the input.
Pinned ``@example`` s are the cases that once failed (see each test's docstring).
"""

import math
import re

import dtensor_explore_rank_fns as fns
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)

MESHES = [(4,), (2, 2)]
OPS = ["sum", "mean", "softmax", "log_softmax", "reshape", "permute", "transpose", "neg", "scale", "add", "sub",
       "matmul", "exp", "relu"]
LINEAR = {"sum", "mean", "reshape", "permute", "transpose", "neg", "scale", "add", "sub", "matmul"}


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


@st.composite
def placements(draw, mesh, ndim: int, partial: bool = True):
    """One placement code per mesh dim; a tensor dim sharded on at most one mesh dim."""
    out, used = [], set()
    for _ in mesh:
        options = ["R"] + [f"S{d}" for d in range(-ndim, ndim) if d % ndim not in used]
        options += ["P", "Pavg"] if partial else []
        code = draw(st.sampled_from(options))
        if code.startswith("S"):
            used.add(int(code[1:]) % ndim)
        out.append(code)
    return out


sizes = st.sampled_from([0, 1, 2, 3, 5])


@st.composite
def op_case(draw):
    mesh = draw(st.sampled_from(MESHES))
    op = draw(st.sampled_from(OPS))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(sizes) for _ in range(ndim))
    args, case = {}, {}
    dim = st.integers(-ndim, ndim - 1)
    if op in ("sum", "mean"):
        args["dim"] = draw(st.one_of(st.none(), dim, st.lists(dim, min_size=1, max_size=ndim)))
        args["keepdim"] = draw(st.booleans())
    elif op in ("softmax", "log_softmax"):
        args["dim"] = draw(dim)
    elif op == "reshape":
        n = math.prod(shape)
        options = [(-1,), (n,), shape + (1,), (1,) + shape]
        if ndim >= 2:
            options += [(shape[0] * shape[1],) + shape[2:], (shape[0], -1)]
        args["shape"] = draw(st.sampled_from(options))
    elif op == "permute":
        args["dims"] = draw(st.permutations(range(ndim)))
    elif op == "transpose":
        args["dims"] = [draw(dim), draw(dim)]
    elif op == "scale":
        args["factor"] = draw(st.sampled_from([2, 0.5, -3.0, 0]))
    elif op in ("add", "sub"):
        case["other_shape"] = shape
    elif op == "matmul":
        shape = (draw(sizes), draw(sizes))
        case["other_shape"] = (shape[1], draw(sizes))
    case.update(mesh=mesh, op=op, shape=shape, dtype=draw(st.sampled_from(["float32", "float64"])), args=args,
                seed=draw(st.integers(0, 2**16)))
    case["placements"] = draw(placements(mesh, len(shape), partial=op in LINEAR))
    if "other_shape" in case:
        same = op != "matmul" and draw(st.booleans())
        case["other_placements"] = case["placements"] if same else draw(placements(mesh, 2 if op == "matmul"
                                                                                   else len(shape)))
    return case


@st.composite
def round_trip_case(draw):
    mesh = draw(st.sampled_from(MESHES))
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.sampled_from([0, 1, 2, 3, 5, 7])) for _ in range(ndim))
    path = draw(st.lists(placements(mesh, ndim), min_size=1, max_size=4))
    return {"mesh": mesh, "shape": shape, "dtype": draw(st.sampled_from(["float32", "float64"])), "path": path,
            "seed": draw(st.integers(0, 2**16))}


def _run(pool, name, cases):
    for rank, bad in enumerate(pool.run(fns.run_cases, name, cases)):
        assert bad == [], f"rank {rank}: {len(bad)} failures, e.g. {bad[:3]}"


_SETTINGS = settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(cases=st.lists(op_case(), min_size=20, max_size=20))
@example(cases=[  # sum/mean over a dim listed twice: NumPy (and torch) refuse it, DTensor deduplicated it
    {"mesh": (4,), "op": "sum", "shape": (1, 5, 3), "dtype": "float32", "placements": ["P"],
     "args": {"dim": [-3, -2, 1], "keepdim": False}},
    {"mesh": (2, 2), "op": "mean", "shape": (5, 5), "dtype": "float64", "placements": ["R", "S0"],
     "args": {"dim": [-2, 0], "keepdim": True}}])
@example(cases=[  # empty and size-1 dims on every op family, uneven shards down to zero rows
    {"mesh": (4,), "op": "softmax", "shape": (1, 0), "dtype": "float64", "placements": ["S-2"], "args": {"dim": -1}},
    {"mesh": (2, 2), "op": "mean", "shape": (5, 0), "dtype": "float32", "placements": ["S0", "Pavg"],
     "args": {"dim": 0, "keepdim": True}},
    {"mesh": (4,), "op": "reshape", "shape": (3, 1, 2), "dtype": "float64", "placements": ["S0"],
     "args": {"shape": (3, 2)}},
    {"mesh": (2, 2), "op": "matmul", "shape": (5, 3), "dtype": "float64", "placements": ["S0", "S1"],
     "args": {}, "other_shape": (3, 1), "other_placements": ["R", "S0"]}])
def test_ops_equal_the_full_array_op_or_raise_clearly(pool, cases):
    _run(pool, "check_op", cases)


@_SETTINGS
@given(cases=st.lists(round_trip_case(), min_size=12, max_size=12))
@example(cases=[{"mesh": (2, 2), "shape": (0, 5), "dtype": "float32", "path": [["S1", "S0"], ["P", "S1"], ["R", "R"]]},
                {"mesh": (4,), "shape": (7, 1), "dtype": "float64", "path": [["S0"], ["S1"], ["Pavg"], ["S-1"]]}])
def test_redistribute_round_trips_give_back_the_original(pool, cases):
    _run(pool, "check_round_trip", cases)


def test_comparisons_and_truth_raise_instead_of_object_identity(world_of_one):
    """``dt == 0`` and ``dt_a == dt_b`` were object identity (False, or True for the same object)
    and ``if dt:`` was always True: a Python bool where a Tensor gives the elementwise result. They
    raise naming the op; hashing stays identity (a DTensor in a set or dict key still works)."""
    import numpy as np

    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import Shard, distribute_tensor

    dt = distribute_tensor(Tensor(np.zeros((2, 3))), None, [Shard(0)])
    other = distribute_tensor(Tensor(np.zeros((2, 3))), None, [Shard(0)])
    for op, call in (("==", lambda: dt == 0), ("==", lambda: dt == other), ("!=", lambda: dt != other),
                     ("<", lambda: dt < 1), (">=", lambda: dt >= other), ("bool()", lambda: bool(dt))):
        with pytest.raises(NotImplementedError, match=rf"DTensor {re.escape(op)}: no sharding rule"):
            call()
    assert dt in {dt} and {dt: 1}[dt] == 1
