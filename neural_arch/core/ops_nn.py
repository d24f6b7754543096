"""Differentiable neural-network ops: activations, softmax, dropout, embedding, layer_norm,
losses, and the fused ``linear``.

Several of these are fused (one graph node, a hand-derived backward) because they sit on the hot
path of every training step: ``linear``, ``layer_norm``, ``cross_entropy``, ``log_softmax``.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core import ops_nn as F
    >>> x = Tensor(np.ones((4, 3)), requires_grad=True)
    >>> w = Tensor(np.ones((2, 3)), requires_grad=True)           # (out_features, in_features)
    >>> loss = F.cross_entropy(F.linear(x, w), np.array([0, 1, 1, 0]))
    >>> loss.backward()
    >>> w.grad.shape
    (2, 3)
"""

from __future__ import annotations

import math
import os

import numpy as np

from .. import backend as _backend
from .autograd import Node
from .ops_basic import _needs, _result, _same_device, _xp, scatter_add, unbroadcast
from .rng import get_generator
from .tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


# ============================================================================ elementwise
def exp(x: Tensor) -> Tensor:
    xd = x.data
    out = _xp(xd).exp(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * out,), (x,), "Exp"))


def log(x: Tensor) -> Tensor:
    xd = x.data
    out = _xp(xd).log(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g / xd,), (x,), "Log"))


def sqrt(x: Tensor) -> Tensor:
    xd = x.data
    out = _xp(xd).sqrt(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g / (2 * out),), (x,), "Sqrt"))


def abs(x: Tensor) -> Tensor:
    xd = x.data
    xp = _xp(xd)
    out = xp.abs(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * xp.sign(xd),), (x,), "Abs"))


def tanh(x: Tensor) -> Tensor:
    xd = x.data
    out = _xp(xd).tanh(xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (1 - out * out),), (x,), "Tanh"))


def _sigmoid_array(xp, xd):
    # exp(-|x|) never overflows; pick the stable form per sign.
    e = xp.exp(-xp.abs(xd))
    return xp.where(xd >= 0, 1 / (1 + e), e / (1 + e)).astype(xd.dtype, copy=False)


def sigmoid(x: Tensor) -> Tensor:
    xd = x.data
    out = _sigmoid_array(_xp(xd), xd)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * out * (1 - out),), (x,), "Sigmoid"))


def relu(x: Tensor) -> Tensor:
    xd = x.data
    xp = _xp(xd)
    out = xp.maximum(xd, 0)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (xd > 0),), (x,), "Relu"))


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    xd = x.data
    xp = _xp(xd)
    pos = xd > 0
    out = xp.where(pos, xd, xd * negative_slope)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (xp.where(pos, g, g * negative_slope),), (x,), "LeakyRelu"))


def silu(x: Tensor) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish)."""
    xd = x.data
    s = _sigmoid_array(_xp(xd), xd)
    out = xd * s
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * (s * (1 + xd * (1 - s))),), (x,), "Silu"))


def _erf(xp, x):
    """Vectorised erf (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7); NumPy has no erf."""
    sign = xp.sign(x)
    a = xp.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * xp.exp(-a * a))


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU. ``approximate="none"``: ``x * Phi(x)`` (erf form, torch's default);
    ``"tanh"``: the tanh approximation used by GPT-2."""
    xd = x.data
    xp = _xp(xd)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (xd + 0.044715 * xd * xd * xd)
        th = xp.tanh(inner)
        out = 0.5 * xd * (1 + th)

        def fn(g):
            dinner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * xd * xd)
            return (g * (0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * dinner),)

    elif approximate == "none":
        cdf = 0.5 * (1.0 + _erf(xp, xd * _INV_SQRT_2))
        out = xd * cdf

        def fn(g):
            pdf = _INV_SQRT_2PI * xp.exp(-0.5 * xd * xd)
            return (g * (cdf + xd * pdf),)

    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    out = out.astype(xd.dtype, copy=False)
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(fn, (x,), "Gelu"))


def clip(x: Tensor, min=None, max=None) -> Tensor:
    """Clamp to ``[min, max]`` (either may be None). Gradient is 1 inside the range, 0 outside."""
    if min is None and max is None:
        raise ValueError("clip: give at least one of min= or max=")
    xd = x.data
    xp = _xp(xd)
    lo = min.data if isinstance(min, Tensor) else min
    hi = max.data if isinstance(max, Tensor) else max
    out = xd
    if lo is not None:
        out = xp.maximum(out, lo)
    if hi is not None:
        out = xp.minimum(out, hi)
    out = out.astype(xd.dtype, copy=False)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        keep = True
        if lo is not None:
            keep = xd >= lo
        if hi is not None:
            keep = keep & (xd <= hi) if lo is not None else (xd <= hi)
        return (g * keep,)

    return _result(out, Node(fn, (x,), "Clip"))


clamp = clip


def where(cond, a, b) -> Tensor:
    """Pick from ``a`` where ``cond`` is true, else ``b`` (broadcasting; a or b may be scalars)."""
    cd = cond.data if isinstance(cond, Tensor) else cond
    at = a if isinstance(a, Tensor) else None
    bt = b if isinstance(b, Tensor) else None
    ad = at.data if at is not None else a
    bd = bt.data if bt is not None else b
    arrays = [d for d in (cd, ad, bd) if hasattr(d, "dtype") and not isinstance(d, np.generic)]
    if arrays:
        _same_device(arrays, "where")
    xp = _xp(arrays[0]) if arrays else np
    out = xp.where(cd, ad, bd)
    ra = at is not None and at.requires_grad
    rb = bt is not None and bt.requires_grad
    if not _needs(at if ra else None, bt if rb else None):
        return _result(out, None)
    ash = ad.shape if ra else None
    bsh = bd.shape if rb else None

    def fn(g):
        zero = xp.zeros((), dtype=g.dtype)
        return (
            unbroadcast(xp.where(cd, g, zero), ash) if ra else None,
            unbroadcast(xp.where(cd, zero, g), bsh) if rb else None,
        )

    return _result(out, Node(fn, (at if ra else None, bt if rb else None), "Where"))


# ============================================================================ softmax family
def softmax(x: Tensor, axis: int = -1, *, dim=None) -> Tensor:
    """Softmax along ``axis`` (``dim=`` accepted as torch's alias)."""
    if dim is not None:
        axis = dim
    xd = x.data
    xp = _xp(xd)
    e = xp.exp(xd - xd.max(axis=axis, keepdims=True))
    out = e / e.sum(axis=axis, keepdims=True)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        go = g * out
        return (go - out * go.sum(axis=axis, keepdims=True),)

    return _result(out, Node(fn, (x,), "Softmax"))


def _log_softmax_array(xp, xd, axis):
    shifted = xd - xd.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax(x: Tensor, axis: int = -1, *, dim=None) -> Tensor:
    """Log-softmax along ``axis`` (alias ``dim=``), computed stably in one fused op."""
    if dim is not None:
        axis = dim
    xd = x.data
    xp = _xp(xd)
    out = _log_softmax_array(xp, xd, axis)
    if not _needs(x):
        return _result(out, None)

    def fn(g):
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

    return _result(out, Node(fn, (x,), "LogSoftmax"))


# ============================================================================ dropout, embedding
def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1/(1-p)`` (inverted
    dropout). Identity when ``training`` is False or ``p == 0``. Uses the global generator."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    xd = x.data
    xp = _xp(xd)
    if p == 1.0:
        mask = xp.zeros(xd.shape, dtype=xd.dtype)
    else:
        if xp is np:
            keep = get_generator().random(xd.shape, dtype=np.float32) >= p
        else:
            keep = xp.random.random(xd.shape, dtype=xp.float32) >= p
        mask = keep.astype(xd.dtype) * xd.dtype.type(1.0 / (1.0 - p))
    out = xd * mask
    if not _needs(x):
        return _result(out, None)
    return _result(out, Node(lambda g: (g * mask,), (x,), "Dropout"))


def embedding(indices, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices`` (any shape).

    The weight gradient is a scatter-add, so repeated indices accumulate.
    """
    idx = indices.data if isinstance(indices, Tensor) else indices
    wd = weight.data
    xp = _xp(wd)
    idx = xp.asarray(idx)
    if idx.dtype.kind not in "iu":
        if idx.dtype.kind == "f" and bool((idx == xp.round(idx)).all()):
            idx = idx.astype(xp.int64)
        else:
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    out = wd[idx]
    if not _needs(weight):
        return _result(out, None)

    def fn(g):
        gw = xp.zeros(wd.shape, dtype=g.dtype)
        scatter_add(xp, gw, idx.reshape(-1), g.reshape((-1,) + wd.shape[1:]))
        return (gw,)

    return _result(out, Node(fn, (weight,), "Embedding"))


# ============================================================================ normalisation
def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale/shift (fused op)."""
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    xd = x.data
    if xd.shape[xd.ndim - k :] != normalized_shape:
        raise ValueError(
            f"layer_norm: input shape {xd.shape} does not end with normalized_shape {normalized_shape}"
        )
    xp = _xp(xd)
    axes = tuple(range(xd.ndim - k, xd.ndim))
    mu = xd.mean(axis=axes, keepdims=True)
    xc = xd - mu
    var = (xc * xc).mean(axis=axes, keepdims=True)
    rstd = 1.0 / xp.sqrt(var + eps)
    xhat = xc * rstd
    wd = weight.data if isinstance(weight, Tensor) else weight
    bd = bias.data if isinstance(bias, Tensor) else bias
    out = xhat * wd if wd is not None else xhat
    if bd is not None:
        out = out + bd
    out = out.astype(xd.dtype, copy=False)
    wt = weight if isinstance(weight, Tensor) and weight.requires_grad else None
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx = x.requires_grad
    if not _needs(x if rx else None, wt, bt):
        return _result(out, None)
    batch_axes = tuple(range(xd.ndim - k))
    n = 1
    for s in normalized_shape:
        n *= s

    def fn(g):
        gx = gw = gb = None
        if wt is not None:
            gw = (g * xhat).sum(axis=batch_axes)
        if bt is not None:
            gb = g.sum(axis=batch_axes)
        if rx:
            dxhat = g * wd if wd is not None else g
            m1 = dxhat.sum(axis=axes, keepdims=True) / n
            m2 = (dxhat * xhat).sum(axis=axes, keepdims=True) / n
            gx = rstd * (dxhat - m1 - xhat * m2)
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, wt, bt), "LayerNorm"))


# ============================================================================ losses
_EAGER_CHECKS_ENV = "NEURAL_ARCH_EAGER_CHECKS"
_TORCH_DTYPE_NAMES = {"float16": "Half", "float32": "Float", "float64": "Double", "bool": "Bool",
                      "bfloat16": "BFloat16", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


class TargetDtypeError(TypeError, RuntimeError):
    """A loss target of the wrong dtype. Both a ``TypeError`` (this project's convention for bad
    argument types) and a ``RuntimeError`` (what torch raises), so either ``except`` catches it."""


def _eager_checks(xp) -> bool:
    """Validate data-dependent conditions at once? Free on NumPy; on a device it would make the
    host wait for the GPU (a sync per check), so only when ``NEURAL_ARCH_EAGER_CHECKS=1`` (debug)."""
    return xp is np or os.environ.get(_EAGER_CHECKS_ENV, "").strip() not in ("", "0")


def _range_error(t1, bad, C: int, ignore_index: int) -> IndexError:
    """The error for out-of-range class targets (reads the targets on the host: error path only)."""
    host_t = _backend.to_host(t1)
    host_bad = _backend.to_host(bad)
    first = int(host_t[host_bad][0]) if host_bad.any() else "?"
    return IndexError(
        f"cross_entropy: target {first} is out of range for {C} classes (valid: 0..{C - 1}; "
        f"use ignore_index={ignore_index} to skip entries)"
    )


class _CheckedLoss(Tensor):
    """A loss Tensor whose input validation ran on the device and is read only with its value.

    On a GPU, checking targets eagerly would stall the host once per step, so ``cross_entropy``
    computes an error flag on the device instead. Reading the loss (``item()``, ``float()``,
    ``numpy()``, ``tolist()``, ``repr()``, ``bool()``) looks at the flag first and raises the same
    ``IndexError`` the eager check would have. Until then the loss holds NaN where targets were out
    of range (so a value read any other way is visibly wrong) and those rows get no gradient.
    """

    __slots__ = ()

    def _check_targets(self) -> None:
        pending = self.__dict__.pop("_pending_check", None)
        if pending is None:
            return
        flag, t1, bad, C, ignore_index = pending
        if bool(flag):  # the user asked for the value: reading the flag with it costs nothing extra
            self.__dict__["_pending_check"] = pending  # keep raising on every read
            raise _range_error(t1, bad, C, ignore_index)

    def item(self):
        self._check_targets()
        return super().item()

    def tolist(self):
        self._check_targets()
        return super().tolist()

    def numpy(self):
        self._check_targets()
        return super().numpy()

    def __array__(self, dtype=None, copy=None):
        self._check_targets()
        return super().__array__(dtype, copy)

    def __bool__(self) -> bool:
        self._check_targets()
        return super().__bool__()

    def __repr__(self) -> str:
        self._check_targets()
        return super().__repr__()

    def detach(self) -> Tensor:
        out = super().detach()
        pending = self.__dict__.get("_pending_check")
        if pending is not None:
            out.__class__ = _CheckedLoss
            out.__dict__["_pending_check"] = pending
        return out


def _target_array(xp, ld, target):
    """The target's array on the logits' device (host targets are copied over; a device target
    with host logits is an error)."""
    td = target.data if isinstance(target, Tensor) else target
    if xp is np and type(td) is np.ndarray:
        return td
    if _backend.is_device_array(td):
        _backend.check_same_device(ld, td, "cross_entropy")  # device targets with host logits: refuse
        return td
    return xp.asarray(td)  # host data (for device logits: one host-to-device copy)


def cross_entropy(logits: Tensor, target, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy from raw ``logits`` (fused op), with class-index or probability targets.

    Shapes follow torch: logits ``(N, C)`` with target ``(N,)``; ``(C,)`` with a scalar target; or
    ``(N, C, d1, ...)`` with target ``(N, d1, ...)``.

    * **Class indices** (integer target): entries equal to ``ignore_index`` add nothing, and
      ``"mean"`` divides by the number of non-ignored targets (NaN when there is none, like torch).
      A floating-point target of a different shape than the logits is refused like torch does
      (``expected scalar type Long``): convert it with ``target.long()``.
    * **Probabilities** (floating-point target of the logits' shape, "soft labels"): the loss of
      each sample is ``-sum_c target_c * log_softmax(logits)_c``; ``"mean"`` divides by the number
      of samples. The target may require grad.

    ``label_smoothing`` mixes the target with the uniform distribution, as torch does.

    Out-of-range class targets raise ``IndexError``: at once for NumPy arrays (free); for device
    arrays the check runs on the device and raises when the loss is read (``.item()``,
    ``float()``, ``.numpy()``, ``repr``), so a training step never waits for the GPU.
    ``NEURAL_ARCH_EAGER_CHECKS=1`` checks eagerly on devices too (debugging; one sync per call).
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    ld = logits.data
    if ld.ndim == 0:
        raise ValueError("cross_entropy: logits must have at least 1 dimension (the classes)")
    xp = _xp(ld)
    td = _target_array(xp, ld, target)
    kind = td.dtype.kind
    if kind == "f" and td.shape == ld.shape:
        tt = target if isinstance(target, Tensor) and target.requires_grad else None
        return _cross_entropy_probs(logits, tt, td, xp, reduction, label_smoothing)
    if kind not in "iu":
        found = _TORCH_DTYPE_NAMES.get(str(td.dtype), str(td.dtype))
        raise TargetDtypeError(
            f"cross_entropy: expected scalar type Long but found {found}: a class-index target "
            f"(shape {td.shape}) must hold integers; convert it with target.long() (or "
            f".astype(np.int64)). Probability targets must be floating point with the logits' "
            f"shape {ld.shape}"
        )
    # Move the class axis last: (N, C, d...) -> (N, d..., C).
    lm = xp.moveaxis(ld, 1, -1) if ld.ndim > 2 else ld
    C = lm.shape[-1]
    l2 = lm.reshape(-1, C)
    t1 = td.reshape(-1)
    if t1.shape[0] != l2.shape[0]:
        raise ValueError(
            f"cross_entropy: target shape {td.shape} does not match logits shape {ld.shape}"
        )
    valid = t1 != ignore_index
    bad = valid & ((t1 < 0) | (t1 >= C))
    eager = _eager_checks(xp)
    if eager:
        if bool(bad.any()):
            raise _range_error(t1, bad, C, ignore_index)
        keep = valid
    else:
        # No host sync: out-of-range rows are flagged on the device, give NaN and no gradient.
        keep = valid & ~bad
    safe_t = xp.where(keep, t1, 0)
    logp = _log_softmax_array(xp, l2, -1)
    rows = xp.arange(l2.shape[0])
    nll = -logp[rows, safe_t]
    if label_smoothing:
        nll = (1 - label_smoothing) * nll - label_smoothing * logp.mean(axis=-1)
    nll = nll * keep
    if not eager:
        nll = xp.where(bad, math.nan, nll)
    if eager:
        count = int(valid.sum())
        denom = max(count, 1)
        if reduction == "mean":
            # No valid target at all gives nan, like torch (0/0).
            out = nll.sum() / count if count else nll.sum() * float("nan")
    else:
        countf = valid.sum().astype(xp.result_type(ld.dtype, np.float32))  # float16 would overflow
        denom = xp.maximum(countf, 1)
        if reduction == "mean":
            out = nll.sum() / countf  # 0/0 = nan when every target is ignored, like torch
    if reduction == "sum":
        out = nll.sum()
    elif reduction == "none":
        out = nll.reshape(td.shape)
    out = xp.asarray(out, dtype=ld.dtype)
    res = _result(out, None)
    if _needs(logits):
        lshape = ld.shape

        def fn(g):
            p = xp.exp(logp)
            p[rows, safe_t] -= 1 - label_smoothing
            if label_smoothing:
                p -= label_smoothing / C
            if reduction == "mean":
                scale = (g / denom) * keep
            elif reduction == "sum":
                scale = g * keep
            else:
                scale = g.reshape(-1) * keep
            p *= scale.reshape(-1, 1).astype(p.dtype, copy=False)
            if len(lshape) > 2:
                shp = (lshape[0],) + lshape[2:] + (C,)
                return (xp.ascontiguousarray(xp.moveaxis(p.reshape(shp), -1, 1)),)
            return (p.reshape(lshape),)

        res = _result(out, Node(fn, (logits,), "CrossEntropy"))
    if not eager:
        res.__class__ = _CheckedLoss
        res.__dict__["_pending_check"] = (bad.any(), t1, bad, C, ignore_index)
    return res


def _cross_entropy_probs(logits: Tensor, tt, td, xp, reduction: str, label_smoothing: float) -> Tensor:
    """Cross-entropy with probability ("soft label") targets of the logits' shape (fused op)."""
    ld = logits.data
    td = td.astype(ld.dtype, copy=False)
    if ld.ndim > 2:
        lm, tm = xp.moveaxis(ld, 1, -1), xp.moveaxis(td, 1, -1)
    else:
        lm, tm = ld, td
    C = lm.shape[-1]
    l2 = lm.reshape(-1, C)
    t2 = tm.reshape(-1, C)
    if label_smoothing:
        t2 = t2 * (1 - label_smoothing) + label_smoothing / C
    M = l2.shape[0]
    logp = _log_softmax_array(xp, l2, -1)
    nll = -(t2 * logp).sum(axis=-1)
    if reduction == "mean":
        out = nll.sum() / M if M else nll.sum() * float("nan")
    elif reduction == "sum":
        out = nll.sum()
    else:
        out = nll.reshape(lm.shape[:-1])
    out = xp.asarray(out, dtype=ld.dtype)
    rl = logits.requires_grad
    if not _needs(logits if rl else None, tt):
        return _result(out, None)
    lshape = ld.shape

    def back(a):  # (M, C) rows -> the layout of the logits
        if len(lshape) > 2:
            shp = (lshape[0],) + lshape[2:] + (C,)
            return xp.ascontiguousarray(xp.moveaxis(a.reshape(shp), -1, 1))
        return a.reshape(lshape)

    def fn(g):
        if reduction == "mean":
            scale = xp.broadcast_to(g / max(M, 1), (M,))
        elif reduction == "sum":
            scale = xp.broadcast_to(g, (M,))
        else:
            scale = g.reshape(-1)
        scale = scale.reshape(-1, 1).astype(ld.dtype, copy=False)
        gl = gt = None
        if rl:
            # d/dx of -sum_c t_c log_softmax(x)_c = softmax(x) * sum_c t_c - t
            gl = back((xp.exp(logp) * t2.sum(axis=-1, keepdims=True) - t2) * scale)
        if tt is not None:
            gt = back(-logp * scale * (1 - label_smoothing))
        return gl, gt

    return _result(out, Node(fn, (logits if rl else None, tt), "CrossEntropy"))


def nll_loss(log_probs: Tensor, target, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of integer ``target`` under ``log_probs`` of shape (N, C)."""
    from .ops_basic import sum as _sum
    from .ops_shape import getitem

    xp = _xp(log_probs.data)
    td = _target_array(xp, log_probs.data, target).astype(xp.int64, copy=False)
    valid = td != ignore_index
    safe = xp.where(valid, td, 0)
    picked = getitem(log_probs, (xp.arange(td.shape[0]), safe)) * valid.astype(log_probs.dtype)
    if reduction == "none":
        return -picked
    if reduction == "sum":
        return -_sum(picked)
    if xp is np:
        return -_sum(picked) / max(int(valid.sum()), 1)
    # On a device: divide by the count where it lives (no host sync).
    return -_sum(picked) / xp.maximum(valid.sum(), 1).astype(log_probs.dtype)


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean squared error (fused; ``target`` may require grad too)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"mse_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    input = _t(input)
    tt = target if isinstance(target, Tensor) else None
    td = tt.data if tt is not None else target
    xd = input.data
    diff = xd - td
    sq = diff * diff
    if reduction == "mean":
        out = sq.mean()
    elif reduction == "sum":
        out = sq.sum()
    else:
        out = sq
    rt = tt is not None and tt.requires_grad
    if not _needs(input, tt if rt else None):
        return _result(out, None)
    n = sq.size
    ish, tsh = xd.shape, getattr(td, "shape", ())
    ri = input.requires_grad

    def fn(g):
        if reduction == "mean":
            gd = diff * (g * (2.0 / n))
        else:
            gd = diff * (2 * g)
        return (
            unbroadcast(gd, ish) if ri else None,
            unbroadcast(-gd, tsh) if rt else None,
        )

    return _result(out, Node(fn, (input if ri else None, tt if rt else None), "MseLoss"))


# ============================================================================ linear
def linear(x: Tensor, weight: Tensor, bias=None) -> Tensor:
    """``x @ weight.T + bias`` as one fused op; ``weight`` is (out_features, in_features).

    ``x`` may have any number of leading dims (..., in_features).
    """
    xd, wd = x.data, weight.data
    if type(xd) is not type(wd):
        _backend.check_same_device(xd, wd, "linear")
    if xd.shape[-1] != wd.shape[1]:
        raise ValueError(
            f"linear: input has {xd.shape[-1]} features but weight expects {wd.shape[1]} "
            f"(weight shape {wd.shape} is (out_features, in_features))"
        )
    out = xd @ wd.T
    bd = None
    if bias is not None:
        bd = bias.data if isinstance(bias, Tensor) else bias
        out += bd  # out is freshly allocated: add in place, no extra temporary
    bt = bias if isinstance(bias, Tensor) and bias.requires_grad else None
    rx, rw = x.requires_grad, weight.requires_grad
    if not _needs(x if rx else None, weight if rw else None, bt):
        return _result(out, None)
    xshape = xd.shape

    def fn(g):
        g2 = g if g.ndim == 2 else g.reshape(-1, g.shape[-1])
        gx = (g @ wd) if rx else None
        gw = None
        if rw:
            x2 = xd if xd.ndim == 2 else xd.reshape(-1, xshape[-1])
            gw = g2.T @ x2
        gb = g2.sum(axis=0) if bt is not None else None
        return gx, gw, gb

    return _result(out, Node(fn, (x if rx else None, weight if rw else None, bt), "Linear"))


# ============================================================================ method binding
def _bind_methods(T) -> None:
    T.exp, T.log, T.sqrt, T.abs, T.tanh = exp, log, sqrt, abs, tanh
    T.__abs__ = abs
    T.sigmoid, T.relu, T.gelu = sigmoid, relu, gelu
    T.clip = clip
    T.clamp = clip
    T.softmax = softmax
    T.log_softmax = log_softmax
