"""Exploring checks for silent wrong results in distributed checkpoints, run on every rank of a
RankPool: save a DTensor (and its optimizer state) under one mesh and placements, load it under
another, values bitwise equal to the original; loads whose keys or shapes do not match must raise
naming the key.

Every rank builds the same full arrays from the case's seed (``src_data_rank=None``: no
broadcast), so each rank can check its own piece against the matching slice.

Example::

    case = {"save_mesh": (4,), "save": ["S0"], "load_mesh": (2, 2), "load": ["R", "S1"],
            "shape": (5, 3), "dtype": "float32", "seed": 0}
    assert save_case(case, "/tmp/ck") is True and load_case(case, "/tmp/ck") == []
"""

from __future__ import annotations

import numpy as np


def full_arrays(case) -> dict[str, np.ndarray]:
    """The original arrays of a case: the weight, its two Adam moments and a replicated bias."""
    rng = np.random.default_rng(case.get("seed", 0))
    shape, dtype = tuple(case["shape"]), case["dtype"]
    return {"w": rng.normal(size=shape).astype(dtype), "exp_avg": rng.normal(size=shape).astype(dtype),
            "exp_avg_sq": rng.random(size=shape).astype(dtype), "bias": rng.normal(size=(3,)).astype(dtype)}


from pooled_groups import mesh_of as _mesh


def _placement(code: str):
    from neural_arch.distributed.tensor import Replicate, Shard

    return Replicate() if code == "R" else Shard(int(code[1:]))


def _dtensors(case, which: str, fill: float | None):
    """The case's arrays as DTensors under ``case[which + "_mesh"]`` / ``case[which]`` (``fill``:
    every element set to it instead, a target to load into)."""
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed.tensor import distribute_tensor

    mesh = _mesh(case[which + "_mesh"])
    pl = [_placement(c) for c in case[which]]
    out = {}
    for name, full in full_arrays(case).items():
        if name == "bias":
            continue
        src = full if fill is None else np.full_like(full, fill)
        out[name] = distribute_tensor(Tensor(src), mesh, pl, src_data_rank=None)
    return out


def state_dict(case, which: str, fill: float | None = None) -> dict:
    """A torch-like ``{"model": ..., "optim": ...}`` with DTensor leaves."""
    dts = _dtensors(case, which, fill)
    bias = full_arrays(case)["bias"]
    return {"model": {"w": dts["w"], "bias": bias if fill is None else np.full_like(bias, fill)},
            "optim": {"state": {"w": {"exp_avg": dts["exp_avg"], "exp_avg_sq": dts["exp_avg_sq"],
                                      "step": 7 if fill is None else 0}},
                      "param_groups": [{"lr": 0.1 if fill is None else 0.0, "betas": (0.9, 0.999),
                                        "params": ["w"]}]},
            "epoch": 3 if fill is None else 0}


def save_case(case, directory: str) -> bool:
    import neural_arch.distributed.checkpoint as dcp

    dcp.save(state_dict(case, "save"), checkpoint_id=directory)
    return True


def _check_dtensor(tag, dt, full, bad) -> None:
    from neural_arch.distributed.tensor._api import compute_local_shape_and_global_offset

    shape, off = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh, dt.placements)
    want = full[tuple(slice(o, o + s) for o, s in zip(off, shape))]
    got = dt.to_local().data
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        bad.append(f"{tag}: piece {got.shape} {got.dtype} differs from the original's {want.shape} {want.dtype}")


def load_case(case, directory: str) -> list[str]:
    """Load the checkpoint into the case's load layout; every piece, the bias and the plain values
    must equal the originals bitwise."""
    import neural_arch.distributed.checkpoint as dcp

    sd = state_dict(case, "load", fill=-1.0)
    dcp.load(sd, checkpoint_id=directory)
    full, bad = full_arrays(case), []
    tag = f"{case}"
    _check_dtensor(f"{tag} w", sd["model"]["w"], full["w"], bad)
    for name in ("exp_avg", "exp_avg_sq"):
        _check_dtensor(f"{tag} {name}", sd["optim"]["state"]["w"][name], full[name], bad)
    if not np.array_equal(sd["model"]["bias"], full["bias"]):
        bad.append(f"{tag}: bias differs")
    plain = (sd["optim"]["state"]["w"]["step"], sd["optim"]["param_groups"][0]["lr"],
             sd["optim"]["param_groups"][0]["betas"], sd["epoch"])
    if plain != (7, 0.1, (0.9, 0.999), 3):
        bad.append(f"{tag}: plain values {plain}")
    return bad


def load_mismatch(case, directory: str) -> dict[str, str]:
    """Loads that do not match the checkpoint: each must raise naming the key (the message), or
    ``"NO ERROR"`` when it did not raise."""
    import neural_arch.distributed.checkpoint as dcp

    out = {}

    def attempt(name, mutate, **kwargs):
        sd = state_dict(case, "load", fill=-1.0)
        mutate(sd)
        try:
            dcp.load(sd, checkpoint_id=directory, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            out[name] = f"{type(exc).__name__}: {exc}"
        else:
            out[name] = "NO ERROR"

    shape = tuple(case["shape"])
    bigger = tuple(s + 1 if d == 0 else s for d, s in enumerate(shape))

    def grow(sd):  # the weight of another global shape (its moments stay right)
        c = dict(case, shape=bigger)
        sd["model"]["w"] = _dtensors(c, "load", -1.0)["w"]

    def missing(sd):
        sd["model"]["extra"] = np.zeros(2, dtype=case["dtype"])

    def wrong_dtype(sd):
        sd["model"]["bias"] = np.zeros(3, dtype=np.float16)

    def array_for_number(sd):  # an array where the checkpoint has a plain number
        sd["epoch"] = np.zeros(2)

    attempt("shape", grow)
    attempt("missing", missing)
    attempt("dtype", wrong_dtype)
    attempt("array_for_number", array_for_number)
    # strict=False skips the missing key and loads the rest
    sd = state_dict(case, "load", fill=-1.0)
    sd["model"]["extra"] = np.zeros(2, dtype=case["dtype"])
    dcp.load(sd, checkpoint_id=directory, strict=False)
    out["non_strict_extra_untouched"] = str(sd["model"]["extra"].tolist())
    full = full_arrays(case)
    out["non_strict_bias_loaded"] = str(np.array_equal(sd["model"]["bias"], full["bias"]))
    return out
