"""Losses: ``cross_entropy`` (fused softmax + negative log-likelihood, class-index or probability
targets, ``ignore_index``, ``label_smoothing``), ``nll_loss``, ``mse_loss``, and the element-wise
``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits`` and ``kl_div`` (torch's signatures and formulas).

Targets are validated without stalling a GPU: on the host out-of-range classes raise at once; on
a device the check rides on the loss and raises when its value is read (``_CheckedLoss``), unless
``NEURAL_ARCH_EAGER_CHECKS=1`` asks for eager checks (read through :mod:`neural_arch.config`).

Example::

    >>> import numpy as np
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.core.ops_loss import cross_entropy, mse_loss
    >>> round(cross_entropy(Tensor(np.zeros((2, 4))), np.array([1, 3])).item(), 6)  # log(4)
    1.386294
    >>> mse_loss(Tensor(np.array([1.0, 3.0])), np.array([0.0, 1.0])).item()
    2.5
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from neural_arch.core import device_kernels

from .. import backend as _backend
from .. import config
from .autograd import Node
from .op_utils import _needs, _result, _xp, unbroadcast
from .ops_activation import _log_softmax_array
from .ops_reduce import sum as _sum
from .ops_shape import getitem
from .tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")


def _t(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


# ============================================================================ losses
_EAGER_CHECKS_ENV = "NEURAL_ARCH_EAGER_CHECKS"
_TORCH_DTYPE_NAMES = {"float16": "Half", "float32": "Float", "float64": "Double", "bool": "Bool",
                      "bfloat16": "BFloat16", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


class TargetDtypeError(TypeError, RuntimeError):
    """A loss target of the wrong dtype. Both a ``TypeError`` (this project's convention for bad
    argument types) and a ``RuntimeError`` (what torch raises), so either ``except`` catches it.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> try:
        ...     F.cross_entropy(na.zeros(2, 3), np.array([0.0, 1.0]))
        ... except TypeError as exc:
        ...     type(exc).__name__
        'TargetDtypeError'
    """


def _eager_checks(xp) -> bool:
    """Validate data-dependent conditions at once? Free on NumPy; on a device it would make the
    host wait for the GPU (a sync per check), so only when ``NEURAL_ARCH_EAGER_CHECKS=1`` (debug)."""
    return xp is np or config.get(_EAGER_CHECKS_ENV)


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


def cross_entropy(logits: Tensor, target, weight=None, *, ignore_index: int = -100, reduction: str = "mean",
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

    ``weight`` (torch's third positional argument; a ``(C,)`` tensor or array, no gradient) scales
    each class's term, as torch: with class indices a row's loss is ``(1 - eps) * w[y] * -log p[y] +
    eps / C * sum_c w[c] * -log p[c]`` and ``"mean"`` divides by the sum of ``w[y]`` over the
    non-ignored rows; with probabilities each ``t_c`` is scaled by ``w[c]`` and ``"mean"`` still
    divides by the number of samples. The arguments after ``weight`` are keyword-only: torch's
    fourth positional argument is the legacy ``size_average``, which is refused rather than guessed.

    Out-of-range class targets raise ``IndexError``: at once for NumPy arrays (free); for device
    arrays the check runs on the device and raises when the loss is read (``.item()``,
    ``float()``, ``.numpy()``, ``repr``), so a training step never waits for the GPU.
    ``NEURAL_ARCH_EAGER_CHECKS=1`` checks eagerly on devices too (debugging; one sync per call).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> round(F.cross_entropy(na.zeros(2, 4), np.array([0, 3])).item(), 4)      # log(4)
        1.3863
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    ld = logits.data
    if ld.ndim == 0:
        raise ValueError("cross_entropy: logits must have at least 1 dimension (the classes)")
    if ld.dtype.kind in "biu":  # the loss would be cast back to the logits' integer dtype (torch raises)
        raise TypeError(f"cross_entropy: expected floating-point logits, got dtype {ld.dtype}; convert them "
                        f"with .float() first")
    xp = _xp(ld)
    td = _target_array(xp, ld, target)
    wv = _class_weight(xp, ld, weight, "cross_entropy")
    kind = td.dtype.kind
    if kind == "f" and td.shape == ld.shape:
        tt = target if isinstance(target, Tensor) and target.requires_grad else None
        return _cross_entropy_probs(logits, tt, td, xp, reduction, label_smoothing, wv, saved=(target, weight))
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
    if wv is not None:
        res = _weighted_class_loss(logits, logp, rows, safe_t, keep, bad, eager, wv, reduction,
                                   label_smoothing, td.shape, saved=(weight,) if label_smoothing else None)
        return res if eager else _with_pending_check(res, bad, t1, C, ignore_index)
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
            p *= _row_scale(g, keep, denom, reduction).reshape(-1, 1).astype(p.dtype, copy=False)
            return (_logits_layout(xp, p, lshape),)

        if xp is not np and device_kernels.applies(logp):
            fn = _cross_entropy_device_backward(xp, logp, safe_t, keep, denom, reduction, label_smoothing,
                                                lshape)
        res = _result(out, Node(fn, (logits,), "CrossEntropy"))
    return res if eager else _with_pending_check(res, bad, t1, C, ignore_index)


def _with_pending_check(res: Tensor, bad, t1, C: int, ignore_index: int) -> Tensor:
    """``res`` as a :class:`_CheckedLoss` that raises for out-of-range targets when it is read."""
    res.__class__ = _CheckedLoss
    res.__dict__["_pending_check"] = (bad.any(), t1, bad, C, ignore_index)
    return res


def _class_weight(xp, ld, weight, who: str):
    """``weight`` (None, or a Tensor/array/list of the ``C`` class weights) as an array of the
    logits ``ld``'s dtype on their device."""
    if weight is None:
        return None
    C = ld.shape[1] if ld.ndim > 1 else ld.shape[0]
    wd = _target_array(xp, ld, weight)
    if tuple(wd.shape) != (C,):
        raise ValueError(f"{who}: weight must hold one value per class, shape ({C},), got shape {tuple(wd.shape)}")
    return wd.astype(ld.dtype, copy=False)


def _weighted_class_loss(logits: Tensor, logp, rows, safe_t, keep, bad, eager: bool, wv, reduction: str,
                         eps: float, tshape: tuple, saved=None) -> Tensor:
    """Class-index cross-entropy with class weights ``wv`` (torch's formula, see :func:`cross_entropy`),
    from the rows' log-probabilities ``logp`` (rows, C); plain array ops on every device. ``saved``:
    the constant inputs whose arrays the backward reads (see :class:`~neural_arch.core.autograd.Node`)."""
    xp = _xp(logp)
    C = logp.shape[-1]
    wk = wv[safe_t] * keep  # each row's weight: 0 where ignored (or out of range)
    nll = -logp[rows, safe_t] * wk
    if eps:
        nll = (1 - eps) * nll - (eps / C) * (logp @ wv) * keep
    if not eager:
        nll = xp.where(bad, math.nan, nll)
    denom = wk.sum()
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 = nan when nothing counts, as torch
            out = nll.sum() / denom
    elif reduction == "sum":
        out = nll.sum()
    else:
        out = nll.reshape(tshape)
    out = xp.asarray(out, dtype=logp.dtype)
    if not _needs(logits):
        return _result(out, None)
    lshape = logits.data.shape

    def fn(g):
        # d/dx of -sum_c a_c log_softmax(x)_c = softmax(x) * sum_c a_c - a, a row's coefficients a
        a = xp.zeros_like(logp)
        a[rows, safe_t] = (1 - eps) * wk
        if eps:
            a += (eps / C) * (wv * keep[:, None])
        p = xp.exp(logp) * a.sum(axis=-1, keepdims=True) - a
        if reduction == "mean":
            scale = g / denom  # nothing counted (denom 0): nan, as the loss
        else:
            scale = g if reduction == "sum" else g.reshape(-1, 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            p *= xp.asarray(scale, dtype=p.dtype)
        return (_logits_layout(xp, p, lshape),)

    return _result(out, Node(fn, (logits,), "CrossEntropy", saved=saved))


def _cross_entropy_device_backward(xp, logp, safe_t, keep, denom, reduction: str, label_smoothing: float,
                                   lshape: tuple):
    """The backward of class-index :func:`cross_entropy` on a device: the gradient of every row in one
    kernel (neural_arch.core.device_kernels), the same formula as the host path's."""

    def fn(g):
        scale = _row_scale(g, keep, denom, reduction)
        p = device_kernels.cross_entropy_backward(xp, logp, safe_t, scale, label_smoothing)
        return (_logits_layout(xp, p, lshape),)

    return fn


def _row_scale(g, keep, denom, reduction: str):
    """Each row's share of the upstream gradient ``g`` (0 for ignored rows): the backward's scale."""
    if reduction == "mean":
        return (g / denom) * keep
    if reduction == "sum":
        return g * keep
    return g.reshape(-1) * keep


def _logits_layout(xp, p, lshape: tuple):
    """The per-row gradient ``p`` (rows, C) back in the logits' layout (classes on dim 1 for >2-d)."""
    if len(lshape) > 2:
        shp = (lshape[0],) + lshape[2:] + (lshape[1],)
        return xp.ascontiguousarray(xp.moveaxis(p.reshape(shp), -1, 1))
    return p.reshape(lshape)


def _cross_entropy_probs(logits: Tensor, tt, td, xp, reduction: str, label_smoothing: float, wv=None,
                         saved=None) -> Tensor:
    """Cross-entropy with probability ("soft label") targets of the logits' shape (fused op); class
    weights ``wv`` scale each class's term (torch: ``"mean"`` still divides by the sample count).
    ``saved``: the constant inputs whose arrays the backward reads (the target, the class weights)."""
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
    a2 = t2 if wv is None else t2 * wv  # each class's coefficient of -log p
    nll = -(a2 * logp).sum(axis=-1)
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
            gl = back((xp.exp(logp) * a2.sum(axis=-1, keepdims=True) - a2) * scale)
        if tt is not None:
            gt = back(-logp * (scale * (1 - label_smoothing) if wv is None else wv * scale * (1 - label_smoothing)))
        return gl, gt

    return _result(out, Node(fn, (logits if rl else None, tt), "CrossEntropy", saved=saved))


def nll_loss(log_probs: Tensor, target, weight=None, *, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of integer ``target`` under ``log_probs``, as torch's ``nll_loss``.

    Shapes: ``(C,)`` with a 0-d target, ``(N, C)`` with ``(N,)``, ``(N, C, d1, ...)`` with
    ``(N, d1, ...)``. A row's loss is ``-weight[y] * log_probs[y]`` (``weight`` a ``(C,)`` tensor or
    array, torch's third positional argument; no gradient), 0 where ``y == ignore_index``;
    ``"mean"`` divides by the sum of ``weight[y]`` over the non-ignored rows (nan when there is
    none, as torch). A target outside ``[0, C)`` raises ``IndexError`` (NumPy arrays; device
    targets give nan rows instead of waiting for the GPU), a non-integer target ``TypeError``.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.nll_loss(na.tensor([[-1.0, -2.0], [-3.0, -4.0]]), np.array([0, 1])).item()
        2.5
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"nll_loss: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    ld = log_probs.data
    if ld.ndim == 0:
        raise ValueError("nll_loss: input must have at least 1 dimension (the classes)")
    xp = _xp(ld)
    td = _target_array(xp, ld, target)
    if td.dtype.kind not in "iu":
        found = _TORCH_DTYPE_NAMES.get(str(td.dtype), str(td.dtype))
        raise TargetDtypeError(f"nll_loss: expected scalar type Long but found {found}: the target holds "
                               f"class indices; convert it with target.long() (or .astype(np.int64))")
    want = () if ld.ndim == 1 else (ld.shape[0],) + ld.shape[2:]
    if tuple(td.shape) != want:
        raise ValueError(f"nll_loss: target shape {tuple(td.shape)} does not match input shape {ld.shape}: "
                         f"expected {want} (input (N, C, d1, ...) takes a target (N, d1, ...))")
    C = ld.shape[0] if ld.ndim == 1 else ld.shape[1]
    wv = _class_weight(xp, ld, weight, "nll_loss")
    # rows of classes: (C,) -> (1, C); (N, C, d...) -> (N * d..., C), classes last
    if ld.ndim == 1:
        rows = log_probs.reshape(1, C)
    elif ld.ndim == 2:
        rows = log_probs
    else:
        rows = log_probs.permute(0, *range(2, ld.ndim), 1).reshape(-1, C)
    t1 = td.reshape(-1).astype(xp.int64, copy=False)
    valid = t1 != ignore_index
    bad = valid & ((t1 < 0) | (t1 >= C))
    eager = _eager_checks(xp)
    if eager and bool(bad.any()):
        first = int(_backend.to_host(t1)[_backend.to_host(bad)][0])
        raise IndexError(f"nll_loss: target {first} is out of bounds for {C} classes (valid: 0..{C - 1}; "
                         f"use ignore_index={ignore_index} to skip entries)")
    keep = valid & ~bad
    safe = xp.where(keep, t1, 0)
    share = keep.astype(ld.dtype) if wv is None else wv[safe] * keep  # each row's weight
    picked = getitem(rows, (xp.arange(t1.shape[0]), safe)) * share
    if not eager:  # out-of-range device targets: visibly nan, no host sync
        picked = picked + xp.where(bad, math.nan, 0.0).astype(ld.dtype)
    if reduction == "none":
        return -picked.reshape(td.shape)
    if reduction == "sum":
        return -_sum(picked)
    if xp is np:
        total = float(share.sum())
        return -_sum(picked) / total if total else _sum(picked) * math.nan  # 0 / 0: torch's nan
    return -_sum(picked) / share.sum()  # on a device: divide where the count lives (no host sync)


def mse_loss(input: Tensor, target, reduction: str = "mean") -> Tensor:
    """Mean squared error (fused; ``target`` may require grad too).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.nn import functional as F
        >>> F.mse_loss(na.tensor([1.0, 3.0]), na.tensor([0.0, 0.0])).item()
        5.0
    """
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
            gd = diff * (g * (2.0 / n if n else math.nan))  # empty input: an empty gradient
        else:
            gd = diff * (2 * g)
        return (
            unbroadcast(gd, ish) if ri else None,
            unbroadcast(-gd, tsh) if rt else None,
        )

    return _result(out, Node(fn, (input if ri else None, tt if rt else None), "MseLoss"))


# ============================================================================ element-wise losses
# l1, smooth_l1, huber, binary cross-entropy (on probabilities and on logits) and kl_div: each builds
# its element-wise loss and the partial derivatives of that loss with respect to each operand that
# requires grad; ``_reduced_loss`` reduces it and writes the one backward they share.
_KL_REDUCTIONS = ("mean", "batchmean", "sum", "none")
_BCE_LOG_FLOOR = -100.0  # torch clamps log() at -100 so a probability of exactly 0 or 1 stays finite
_BCE_GRAD_EPS = 1e-12  # torch's floor for x * (1 - x) in BCE's input gradient


def _check_reduction(reduction: str, who: str, allowed: tuple = _REDUCTIONS) -> None:
    if reduction not in allowed:
        raise ValueError(f"{who}: reduction must be one of {allowed}, got {reduction!r}")


def _loss_input(input, who: str) -> Tensor:
    """``input`` as a Tensor of a floating-point dtype (the loss and its gradient have that dtype)."""
    x = _t(input)
    if x.data.dtype.kind != "f":
        raise TypeError(f"{who}: expected a floating-point input, got dtype {x.data.dtype}; convert it with "
                        f".float() first")
    return x


def _loss_operand(xd, value, who: str, name: str):
    """(``value``'s array in the input ``xd``'s dtype on its device, ``value`` when it is a Tensor that
    requires grad else None). A device array next to a host input is an error, as everywhere."""
    tensor = value if isinstance(value, Tensor) else None
    vd = tensor.data if tensor is not None else value
    if _backend.is_device_array(vd):
        _backend.check_same_device(xd, vd, f"{who} ({name})")
    xp = _xp(xd)
    vd = xp.asarray(vd)
    if vd.dtype.kind not in "biuf":
        raise TypeError(f"{who}: {name} must hold numbers, got dtype {vd.dtype}")
    vd = vd.astype(xd.dtype, copy=False)
    return vd, (tensor if tensor is not None and tensor.requires_grad else None)


def _warn_if_broadcast(xd, td, who: str) -> None:
    """torch's rule for the regression losses: a target of another shape broadcasts, with a warning
    (a (N, 1) prediction against a (N,) target silently becomes an (N, N) loss otherwise)."""
    if tuple(td.shape) == tuple(xd.shape):
        return
    try:
        np.broadcast_shapes(tuple(xd.shape), tuple(td.shape))
    except ValueError:
        raise ValueError(f"{who}: target size {tuple(td.shape)} does not broadcast with input size "
                         f"{tuple(xd.shape)}; give the target the input's shape") from None
    warnings.warn(f"{who}: using a target size {tuple(td.shape)} that is different to the input size "
                  f"{tuple(xd.shape)}. This will likely lead to incorrect results due to broadcasting. "
                  f"Please ensure they have the same size.", UserWarning, stacklevel=3)


def _check_same_size(xd, td, who: str) -> None:
    """torch's rule for the binary cross-entropies: the target must have the input's shape."""
    if tuple(td.shape) != tuple(xd.shape):
        raise ValueError(f"{who}: target size {tuple(td.shape)} must be the same as input size "
                         f"{tuple(xd.shape)} (this loss never broadcasts the target)")


def _check_fits_input(xd, wd, who: str, name: str) -> None:
    """A rescaling ``weight`` / ``pos_weight`` must broadcast to the input's shape without growing it."""
    try:
        shape = np.broadcast_shapes(tuple(xd.shape), tuple(wd.shape))
    except ValueError:
        shape = None
    if shape != tuple(xd.shape):
        raise ValueError(f"{who}: {name} of shape {tuple(wd.shape)} must broadcast to the input's shape "
                         f"{tuple(xd.shape)}")


def _reduced_loss(elementwise, reduction: str, operands, name: str, divisor=None, saved=None) -> Tensor:
    """Reduce the element-wise loss and record its backward.

    ``operands`` lists ``(tensor_or_None, partial)`` pairs: ``partial()`` gives d(element-wise loss) /
    d(operand) at each element (anything that broadcasts to the loss's shape); it runs only in
    backward, and only for a tensor that requires grad. ``"mean"`` divides by ``divisor`` (the number
    of elements unless given; 0 gives nan, as torch's mean of nothing). ``saved`` names the operands
    whose arrays the partials read: the constant ones among them (a target, a weight) must not be
    changed in place before backward (see :class:`~neural_arch.core.autograd.Node`).
    """
    xp = _xp(elementwise)
    dtype = elementwise.dtype
    count = elementwise.size if divisor is None else divisor
    factor = (1.0 / count) if count else math.nan
    if reduction == "none":
        out = elementwise
    elif reduction == "sum":
        out = elementwise.sum()
    else:
        out = elementwise.sum() * factor
    out = xp.asarray(out, dtype=dtype)
    wanted = [(t, partial) for t, partial in operands if t is not None]
    if not wanted or not _needs(*(t for t, _ in wanted)):
        return _result(out, None)
    full = elementwise.shape

    def fn(g):
        scale = g * factor if reduction not in ("none", "sum") else g
        grads = []
        for t, partial in operands:
            if t is None:
                grads.append(None)
                continue
            d = partial() * scale
            if d.shape != full:  # a fresh array, not a read-only broadcast view: a leaf's .grad accumulates in place
                d = d + xp.zeros(full, dtype=d.dtype)
            grads.append(unbroadcast(d, t.data.shape).astype(t.data.dtype, copy=False))
        return tuple(grads)

    return _result(out, Node(fn, tuple(t for t, _ in operands), name, saved=saved))


def l1_loss(input: Tensor, target, *, reduction: str = "mean") -> Tensor:
    """Mean (or summed) absolute error ``|input - target|``, as torch's ``F.l1_loss``.

    A target of another shape broadcasts with torch's warning. The gradient is ``sign(input -
    target)`` (0 where they are equal, as torch). The arguments after ``target`` are keyword-only:
    torch's third positional argument is the legacy ``size_average``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import l1_loss
        >>> l1_loss(na.tensor([1.0, -3.0]), na.tensor([0.0, 0.0])).item()
        2.0
    """
    _check_reduction(reduction, "l1_loss")
    x = _loss_input(input, "l1_loss")
    xd = x.data
    td, tt = _loss_operand(xd, target, "l1_loss", "target")
    _warn_if_broadcast(xd, td, "l1_loss")
    xp = _xp(xd)
    diff = xd - td
    return _reduced_loss(xp.abs(diff), reduction,
                         [(x, lambda: xp.sign(diff)), (tt, lambda: -xp.sign(diff))], "L1Loss")


def smooth_l1_loss(input: Tensor, target, *, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """torch's ``F.smooth_l1_loss``: ``0.5 * d**2 / beta`` where ``|d| < beta``, else ``|d| - 0.5 * beta``,
    with ``d = input - target``. ``beta=0`` is :func:`l1_loss` (as torch); a negative ``beta`` is an error.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import smooth_l1_loss
        >>> smooth_l1_loss(na.tensor([0.5, 3.0]), na.zeros(2), reduction="none").tolist()
        [0.125, 2.5]
    """
    _check_reduction(reduction, "smooth_l1_loss")
    beta = float(beta)
    if not beta >= 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    if beta == 0.0:
        return l1_loss(input, target, reduction=reduction)
    x = _loss_input(input, "smooth_l1_loss")
    xd = x.data
    td, tt = _loss_operand(xd, target, "smooth_l1_loss", "target")
    _warn_if_broadcast(xd, td, "smooth_l1_loss")
    xp = _xp(xd)
    diff = xd - td
    adiff = xp.abs(diff)
    inside = adiff < beta
    loss = xp.where(inside, (0.5 / beta) * diff * diff, adiff - 0.5 * beta)

    def partial():
        return xp.where(inside, diff * (1.0 / beta), xp.sign(diff))

    return _reduced_loss(loss, reduction, [(x, partial), (tt, lambda: -partial())], "SmoothL1Loss")


def huber_loss(input: Tensor, target, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """torch's ``F.huber_loss``: ``0.5 * d**2`` where ``|d| < delta``, else ``delta * (|d| - 0.5 * delta)``,
    with ``d = input - target`` (``delta`` times :func:`smooth_l1_loss` with ``beta=delta``). ``delta``
    must be positive.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import huber_loss
        >>> huber_loss(na.tensor([0.5, 3.0]), na.zeros(2), reduction="none", delta=2.0).tolist()
        [0.125, 4.0]
    """
    _check_reduction(reduction, "huber_loss")
    delta = float(delta)
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be positive, got {delta}")
    x = _loss_input(input, "huber_loss")
    xd = x.data
    td, tt = _loss_operand(xd, target, "huber_loss", "target")
    _warn_if_broadcast(xd, td, "huber_loss")
    xp = _xp(xd)
    diff = xd - td
    adiff = xp.abs(diff)
    inside = adiff < delta
    loss = xp.where(inside, 0.5 * diff * diff, delta * (adiff - 0.5 * delta))

    def partial():
        return xp.where(inside, diff, delta * xp.sign(diff))

    return _reduced_loss(loss, reduction, [(x, partial), (tt, lambda: -partial())], "HuberLoss")


def _check_probabilities(xd, who: str) -> None:
    """torch's check that BCE's input holds probabilities. Free on the host; on a device only with
    ``NEURAL_ARCH_EAGER_CHECKS=1`` (it would make the host wait for the GPU)."""
    xp = _xp(xd)
    if not _eager_checks(xp):
        return
    bad = ~((xd >= 0) & (xd <= 1))  # NaN is out of range too
    if bool(bad.any()):
        first = float(_backend.to_host(xd[bad])[0])
        raise ValueError(f"{who}: all elements of input should be between 0 and 1 (probabilities), got "
                         f"{first}; for raw scores use binary_cross_entropy_with_logits")



def _bce_operands(input, target, weight, reduction: str, who: str):
    """The two binary cross-entropies' checked operands: ``(x, xd, td, tt, wd, wt)`` -- the input
    Tensor and its array, the target's array and Tensor (same size as the input, torch's rule), the
    weight's (None, or broadcastable to the input)."""
    _check_reduction(reduction, who)
    x = _loss_input(input, who)
    xd = x.data
    td, tt = _loss_operand(xd, target, who, "target")
    _check_same_size(xd, td, who)
    wd, wt = (None, None) if weight is None else _loss_operand(xd, weight, who, "weight")
    if wd is not None:
        _check_fits_input(xd, wd, who, "weight")
    return x, xd, td, tt, wd, wt

def binary_cross_entropy(input: Tensor, target, weight=None, *, reduction: str = "mean") -> Tensor:
    """Binary cross-entropy of probabilities ``input`` against ``target`` (same shape), torch's
    ``F.binary_cross_entropy``: ``-weight * (t * log(x) + (1 - t) * log(1 - x))`` with each log
    clamped to ``>= -100``, so ``x`` of exactly 0 or 1 gives a finite loss.

    ``input`` must lie in ``[0, 1]`` (an error otherwise; on a device checked only with
    ``NEURAL_ARCH_EAGER_CHECKS=1``). A target of another shape is an error, as torch. ``weight``
    broadcasts to the input's shape. The input's gradient is torch's ``(x - t) / max(x * (1 - x),
    1e-12)`` times the weight; ``target`` and ``weight`` get gradients when they require grad.
    The arguments after ``weight`` are keyword-only (torch's fourth is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import binary_cross_entropy
        >>> round(binary_cross_entropy(na.tensor([0.5, 0.5]), na.tensor([1.0, 0.0])).item(), 4)   # log 2
        0.6931
        >>> binary_cross_entropy(na.tensor([0.0]), na.tensor([1.0])).item()       # log clamped at -100
        100.0
    """
    who = "binary_cross_entropy"
    x, xd, td, tt, wd, wt = _bce_operands(input, target, weight, reduction, who)
    _check_probabilities(xd, who)
    xp = _xp(xd)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_x = xp.maximum(xp.log(xd), _BCE_LOG_FLOOR)
        log_1mx = xp.maximum(xp.log1p(-xd), _BCE_LOG_FLOOR)
    plain = -(td * log_x + (1 - td) * log_1mx)
    loss = plain if wd is None else plain * wd
    w = 1 if wd is None else wd

    def d_input():
        return (xd - td) / xp.maximum(xd * (1 - xd), _BCE_GRAD_EPS) * w

    return _reduced_loss(loss, reduction, [(x, d_input), (tt, lambda: (log_1mx - log_x) * w),
                                           (wt, lambda: plain)], "BinaryCrossEntropy",
                         saved=(target, weight))


def _sigmoid_and_softplus_neg(xp, xd):
    """(sigmoid(x), softplus(-x) = -log sigmoid(x)), both without overflow for any |x|."""
    e = xp.exp(-xp.abs(xd))
    sig = xp.where(xd >= 0, 1 / (1 + e), e / (1 + e))
    return sig, xp.maximum(-xd, 0) + xp.log1p(e)


def binary_cross_entropy_with_logits(input: Tensor, target, weight=None, *, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
    """Binary cross-entropy of ``sigmoid(input)`` against ``target`` (same shape), torch's
    ``F.binary_cross_entropy_with_logits``, computed stably for any ``|input|``::

        loss = weight * ((1 - t) * x + (1 + (pos_weight - 1) * t) * softplus(-x))

    which is ``-weight * (pos_weight * t * log sigmoid(x) + (1 - t) * log(1 - sigmoid(x)))``.
    ``pos_weight`` scales the positive term and broadcasts as torch's does (a ``(C,)`` vector against a
    ``(N, C)`` input weighs each class); ``weight`` broadcasts to the input's shape. A target of another
    shape is an error. Every operand that requires grad gets a gradient. The arguments after
    ``weight`` are keyword-only (torch's fourth positional argument is the legacy ``size_average``).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import binary_cross_entropy_with_logits
        >>> round(binary_cross_entropy_with_logits(na.zeros(2), na.tensor([1.0, 0.0])).item(), 4)  # log 2
        0.6931
        >>> binary_cross_entropy_with_logits(na.tensor([-1000.0]), na.tensor([1.0])).item()    # no overflow
        1000.0
    """
    who = "binary_cross_entropy_with_logits"
    x, xd, td, tt, wd, wt = _bce_operands(input, target, weight, reduction, who)
    pd, pt = (None, None) if pos_weight is None else _loss_operand(xd, pos_weight, who, "pos_weight")
    if pd is not None:
        _check_fits_input(xd, pd, who, "pos_weight")
    xp = _xp(xd)
    sig, sp = _sigmoid_and_softplus_neg(xp, xd)
    log_weight = 1 if pd is None else 1 + (pd - 1) * td
    plain = (1 - td) * xd + log_weight * sp
    loss = plain if wd is None else plain * wd
    w = 1 if wd is None else wd
    p = 1 if pd is None else pd

    def d_input():
        return (log_weight * sig - p * td) * w

    def d_target():
        return ((p - 1) * sp - xd) * w

    return _reduced_loss(loss, reduction, [(x, d_input), (tt, d_target), (wt, lambda: plain),
                                           (pt, lambda: td * sp * w)], "BinaryCrossEntropyWithLogits",
                         saved=(input, target, weight, pos_weight))


def kl_div(input: Tensor, target, *, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """Kullback-Leibler divergence ``target * (log(target) - input)`` with ``input`` holding
    log-probabilities, torch's ``F.kl_div``; with ``log_target=True`` the target holds
    log-probabilities too: ``exp(target) * (target - input)``.

    A target entry of 0 adds 0 (``0 * log 0 = 0``, as torch's ``xlogy``). Reductions: ``"batchmean"``
    divides the sum by the batch size ``input.shape[0]`` (the KL divergence per sample); ``"mean"``
    divides by the number of elements and warns, as torch does; ``"sum"``; ``"none"``. A target of
    another shape broadcasts with a warning. The arguments after ``target`` are keyword-only (torch's
    third positional argument is the legacy ``size_average``).

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> from neural_arch.core.ops_loss import kl_div
        >>> p = na.tensor([[0.5, 0.5]])
        >>> kl_div(p.log(), p, reduction="batchmean").item()                      # KL(p || p)
        0.0
        >>> round(kl_div(na.tensor([[0.25, 0.75]]).log(), p, reduction="batchmean").item(), 4)
        0.1438
    """
    who = "kl_div"
    _check_reduction(reduction, who, _KL_REDUCTIONS)
    x = _loss_input(input, who)
    xd = x.data
    td, tt = _loss_operand(xd, target, who, "target")
    _warn_if_broadcast(xd, td, who)
    if reduction == "mean":
        warnings.warn("kl_div: reduction='mean' divides the total loss by both the batch size and the "
                      "support size; 'batchmean' divides only by the batch size and matches the KL "
                      "divergence's definition", UserWarning, stacklevel=2)
    xp = _xp(xd)
    with np.errstate(divide="ignore", invalid="ignore"):
        if log_target:
            et = xp.exp(td)
            loss = et * (td - xd)
        else:
            # xlogy(t, t): exactly 0 where t == 0 (log 0 would give nan there)
            loss = xp.where(td == 0, 0, td * xp.log(xp.where(td == 0, 1, td))) - td * xd
    divisor = None
    if reduction == "batchmean":  # torch: a 0-d input has no batch dim and is not divided
        divisor = loss.shape[0] if loss.ndim else 1

    def d_input():
        return -et if log_target else -td

    def d_target():
        with np.errstate(divide="ignore", invalid="ignore"):
            if log_target:
                return et * (td - xd + 1)
            # torch's xlogy: a target of 0 contributes 0 and gets gradient 0 (log 0 would give -inf)
            return xp.where(td == 0, 0, xp.log(xp.where(td == 0, 1, td)) + 1 - xd)

    return _reduced_loss(loss.astype(xd.dtype, copy=False), "mean" if reduction == "batchmean" else reduction,
                         [(x, d_input), (tt, d_target)], "KLDivLoss", divisor, saved=(input, target))
