"""Exploring checks for silent wrong results in DTensor, run on every rank of a RankPool (and
in-process on a world of one).

Each function takes one *case* (a dict every rank receives alike, drawn by hypothesis in
``test_dtensor_explore.py``), computes it on the DTensor and on the full NumPy array, and returns a
list of failure strings (empty when the case holds). A case may raise a *clear* error instead
(``NotImplementedError`` / ``ValueError`` / ``TypeError`` / ``IndexError`` / ``RuntimeError``
naming the op): that is never a failure, a wrong value or a wrong shape/dtype always is, and so is
any other exception.

Example::

    case = {"mesh": (3,), "shape": (5, 0), "dtype": "float64", "placements": ["S0"], "op": "sum",
            "args": {"dim": 0, "keepdim": True}}
    assert check_op(case) == []
"""

from __future__ import annotations

import numpy as np

TOL = {"float64": 1e-10, "float32": 1e-5}
CLEAR = (NotImplementedError, ValueError, TypeError, IndexError, RuntimeError)


from pooled_groups import mesh_of as _mesh


def _placement(code: str):
    """``"S1"`` -> Shard(1), ``"R"`` -> Replicate(), ``"P"`` / ``"Pavg"`` -> Partial."""
    from neural_arch.distributed.tensor import Partial, Replicate, Shard

    if code == "R":
        return Replicate()
    if code.startswith("P"):
        return Partial(code[1:] or "sum")
    return Shard(int(code[1:]))


def _full(case) -> np.ndarray:
    rng = np.random.default_rng(case.get("seed", 0))
    return rng.normal(size=case["shape"]).astype(case["dtype"])


def _dt(full, mesh, placements):
    """The DTensor of ``full`` under ``placements`` (Partial reached from Replicate by redistribute,
    so the terms really differ by rank)."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import Replicate, distribute_tensor

    base = [Replicate() if p.is_partial() else p for p in placements]
    return distribute_tensor(Tensor(full), mesh, base).redistribute(mesh, placements)


def _compare(tag: str, got: np.ndarray, want: np.ndarray, dtype: str) -> list[str]:
    if got.shape != want.shape:
        return [f"{tag}: shape {got.shape} != {want.shape}"]
    if np.dtype(got.dtype) != np.dtype(want.dtype):
        return [f"{tag}: dtype {got.dtype} != {want.dtype}"]
    diff = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0))
    if not diff <= TOL[dtype] and not (np.isnan(got).any() and np.array_equal(np.isnan(got), np.isnan(want))):
        return [f"{tag}: differs by {diff}"]
    return []


def _reference(op: str, x: np.ndarray, args: dict, other: np.ndarray | None = None) -> np.ndarray:
    dtype = x.dtype
    if op in ("sum", "mean"):
        dim, keep = args.get("dim"), args.get("keepdim", False)
        axis = None if dim is None else (tuple(dim) if isinstance(dim, (list, tuple)) else dim)
        fn = np.sum if op == "sum" else np.mean
        return np.asarray(fn(x, axis=axis, keepdims=keep)).astype(dtype)
    if op in ("softmax", "log_softmax"):
        d = args["dim"]
        if x.size == 0:              # torch: an empty tensor in, an empty tensor out
            return x.copy()
        e = np.exp(x - x.max(axis=d, keepdims=True))
        s = e / e.sum(axis=d, keepdims=True)
        return (s if op == "softmax" else np.log(s)).astype(dtype)
    if op == "reshape":
        return x.reshape(args["shape"])
    if op == "permute":
        return x.transpose(args["dims"])
    if op == "transpose":
        return np.swapaxes(x, *args["dims"])
    if op == "neg":
        return -x
    if op == "scale":
        return (x * args["factor"]).astype(dtype)
    if op in ("add", "sub"):
        return x + other if op == "add" else x - other
    if op == "matmul":
        return x @ other
    if op == "exp":
        return np.exp(x)
    if op == "relu":
        return np.maximum(x, 0)
    raise KeyError(op)


def _apply(op: str, dt, args: dict, other=None):
    if op in ("sum", "mean"):
        return getattr(dt, op)(dim=args.get("dim"), keepdim=args.get("keepdim", False))
    if op in ("softmax", "log_softmax"):
        return getattr(dt, op)(args["dim"])
    if op == "reshape":
        return dt.reshape(*args["shape"])
    if op == "permute":
        return dt.permute(*args["dims"])
    if op == "transpose":
        return dt.transpose(*args["dims"])
    if op == "neg":
        return -dt
    if op == "scale":
        return dt * args["factor"]
    if op == "add":
        return dt + other
    if op == "sub":
        return dt - other
    if op == "matmul":
        return dt @ other
    return getattr(dt, op)()


def _unsharded_raises(case, full, kind) -> bool:
    """Whether the project's own op on the full Tensor raises ``kind`` too (then the DTensor's
    error is the op's own, e.g. a softmax over an empty dim)."""
    from neural_arch.core.tensor import Tensor

    try:
        _apply(case["op"], Tensor(full), case.get("args", {}), None)
    except kind:
        return True
    except Exception:  # noqa: BLE001 - another error: not the same refusal
        return False
    return False


def check_op(case: dict) -> list[str]:
    """One op on a DTensor of ``case["shape"]`` under ``case["placements"]`` against NumPy; an
    ``other`` operand (``case["other_shape"]`` / ``case["other_placements"]``) for binary ops."""
    mesh = _mesh(case["mesh"])
    full = _full(case)
    pl = [_placement(c) for c in case["placements"]]
    tag = f"{case['op']}({case.get('args', {})}) {case['shape']} {case['dtype']} {pl} on mesh {case['mesh']}"
    other_dt = other_full = None
    if "other_shape" in case:
        other_full = np.random.default_rng(case.get("seed", 0) + 1).normal(size=case["other_shape"]).astype(case["dtype"])
        opl = [_placement(c) for c in case["other_placements"]]
        tag += f" with {case['other_shape']} {opl}"
    try:
        dt = _dt(full, mesh, pl)
        if other_full is not None:
            other_dt = _dt(other_full, mesh, opl)
    except CLEAR:
        return []  # a layout refused up front is a clear error
    try:
        want = _reference(case["op"], full, case.get("args", {}), other_full)
    except (ValueError, IndexError) as exc:  # NumPy refuses the input: the DTensor op must refuse it too
        want = exc
    try:
        out = _apply(case["op"], dt, case.get("args", {}), other_dt)
    except CLEAR as exc:
        if case["op"].split("_")[-1] not in str(exc) and "DTensor" not in str(exc) \
                and not _unsharded_raises(case, full, type(exc)):
            return [f"{tag}: unclear {type(exc).__name__}: {exc}"]
        return []
    except Exception as exc:  # noqa: BLE001 - any other exception is a finding
        return [f"{tag}: raised {type(exc).__name__}: {exc}"]
    if isinstance(want, Exception):
        return [f"{tag}: returned a result where the full-array op raises {type(want).__name__}: {want}"]
    bad = []
    if tuple(out.shape) != want.shape:
        bad.append(f"{tag}: DTensor.shape {tuple(out.shape)} != {want.shape}")
    local = out.to_local().data
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset

    local_shape, _ = compute_local_shape_and_global_offset(out.shape, mesh, out.placements)
    if tuple(local.shape) != tuple(local_shape):
        bad.append(f"{tag}: local piece {local.shape} but placements {out.placements} give {local_shape}")
        return bad
    return bad + _compare(tag, out.full_tensor().data, want, case["dtype"])


def check_round_trip(case: dict) -> list[str]:
    """distribute_tensor -> redistribute through ``case["path"]`` (placement lists) -> full_tensor
    equals the original bitwise; the gradient of sum(full * w) lands equal to w's piece."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import distribute_tensor

    mesh = _mesh(case["mesh"])
    full = _full(case)
    start = [_placement(c) for c in case["path"][0]]
    tag = f"round trip {case['shape']} {case['dtype']} {case['path']} on mesh {case['mesh']}"
    try:
        x = Tensor(full, requires_grad=True)
        dt = distribute_tensor(x, mesh, [p if not p.is_partial() else _placement("R") for p in start])
        leaf = dt
        dt = dt.redistribute(mesh, start)
        for step in case["path"][1:]:
            dt = dt.redistribute(mesh, [_placement(c) for c in step])
    except CLEAR:
        return []
    whole = dt.full_tensor()
    bad = _compare(tag, whole.data, full, case["dtype"])
    exact = not any(p.is_partial() for step in case["path"] for p in map(_placement, step))
    if not bad and exact and not np.array_equal(whole.data, full):  # no sum on the way: bitwise
        bad.append(f"{tag}: not bitwise equal")
    w = np.random.default_rng(7).normal(size=full.shape).astype(case["dtype"])
    (whole * Tensor(w)).sum().backward()
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset

    lshape, off = compute_local_shape_and_global_offset(full.shape, mesh, leaf.placements)
    want = w[tuple(slice(o, o + s) for o, s in zip(off, lshape))]
    got = None if leaf.grad is None else leaf.grad.to_local().data
    if got is None or got.shape != want.shape or np.abs(got - want).max(initial=0) > TOL[case["dtype"]]:
        bad.append(f"{tag}: gradient differs")
    return bad


def run_cases(fn_name: str, cases: list[dict]) -> list[str]:
    """Run many cases of one check in one call (one pool round trip)."""
    fn = globals()[fn_name]
    bad = []
    for case in cases:
        bad += fn(case)
    return bad
