"""Gradient clipping by global norm: ``clip_grad_norm_``.

On NumPy gradients the norm is computed on the host and returned as a Python float (reading it
is free there). On device gradients (CuPy) everything stays on the device: the norm, the clip
coefficient and the scaling, with no host synchronisation, and the norm is returned as a 0-d
Tensor on that device (like torch); read it with ``.item()`` only when you need the number.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.optim import clip_grad_norm_
    >>> p = nn.Parameter(np.zeros(2))
    >>> p.grad = Tensor(np.array([3.0, 4.0]))
    >>> clip_grad_norm_([p], max_norm=1.0)
    5.0
    >>> np.round(p.grad.data, 3).tolist()
    [0.6, 0.8]

Sharded gradients (FSDP's flat shards, ZeRO-2's bucket shards) carry ``_flat_shard`` (a
``FlatShard``, set by the sharding wrapper: ``optim`` does not import ``distributed``): the norm
is then the *global* one, as torch's on DTensor parameters: each rank's partial sum of
``|g|**norm_type`` over sharded gradients is summed over the shard group (one small all-reduce
per group; every rank must call, as with ``FSDP.clip_grad_norm_``), and added to the local part
of unsharded (replicated) gradients. A parameter whose gradient lives in such a shard instead
(FSDP's original parameters; ZeRO-2's) carries ``_grad_elsewhere``, a sentence saying what to clip
instead: clipping it with no gradient raises that sentence rather than returning a norm of 0.
Other parameters whose pieces live on several ranks carry ``_norm_shard`` with the same interface:
DTensor parameters (``fully_shard``'s, tensor parallel's), whose ``group`` is the tuple of the groups
of the mesh dimensions on which they are ``Shard`` (the partial sums are summed over each in turn;
``Replicate`` dimensions hold copies), and expert-parallel experts. One reduction per distinct group.
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad.data for p in parameters if p.grad is not None]


def _norm_shard(p):
    """What totals ``p``'s part of the norm over the ranks (FSDP's ``FlatShard``, a DTensor
    parameter's groups), or None when ``p``'s gradient is whole on this rank."""
    fs = getattr(p, "_flat_shard", None)
    if fs is None:
        fs = getattr(p, "_norm_shard", None)
    return fs if fs is not None and fs.group is not None else None


def _nonfinite_error(total) -> RuntimeError:
    return RuntimeError(
        f"clip_grad_norm_: the total gradient norm is {total}; pass error_if_nonfinite=False to "
        "clip anyway, or look for the NaN/inf in the loss"
    )


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None):
    """Scale all gradients in place so their joint ``norm_type``-norm is at most ``max_norm``.

    Returns the total norm *before* clipping: a Python float for NumPy gradients, a 0-d Tensor on
    the gradients' device for device (CuPy) gradients, computed without any host synchronisation
    (``error_if_nonfinite=True`` has to read it: one sync). ``norm_type`` may be ``inf``. The
    scale is ``min(1, max_norm / (total + 1e-6))``, like torch. Sharded gradients (FSDP, ZeRO-2)
    give the global norm over their ranks (a collective; a Python float on NumPy, a 0-d device Tensor
    without a host synchronisation on a device), see the module docstring. ``foreach``: torch's
    choice of kernel (the same values either way); accepted, and the gradients are always grouped
    by dtype here.

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn, optim
        >>> from neural_arch.core.tensor import Tensor
        >>> p = nn.Parameter(np.zeros(2))
        >>> p.grad = Tensor(np.array([3.0, 4.0]))
        >>> float(optim.clip_grad_norm_([p], max_norm=1.0, foreach=True)), p.grad.data.round(3).tolist()
        (5.0, [0.6, 0.8])
    """
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    max_norm, norm_type = float(max_norm), float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    for i, p in enumerate(params):
        elsewhere = getattr(p, "_grad_elsewhere", None) if p.grad is None else None
        if elsewhere:
            raise RuntimeError(f"clip_grad_norm_: parameter {i} (shape {tuple(p.shape)}) has no .grad: {elsewhere}")
    if any(_norm_shard(p) is not None for p in params):
        return _clip_sharded(params, max_norm, norm_type, error_if_nonfinite)
    grads = [p.grad.data for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if all(type(g) is np.ndarray for g in grads):
        return _clip_host(grads, max_norm, norm_type, error_if_nonfinite)
    return _clip_device(grads, max_norm, norm_type, error_if_nonfinite)


def _clip_sharded(params, max_norm: float, norm_type: float, error_if_nonfinite: bool):
    """Global norm: sharded parts summed over their shard groups, unsharded parts added locally.

    Every rank joins each group's all-reduce, with or without gradients of its own (the groups
    come from the parameters, in their order: the same on every rank). Partial norms, the group
    reductions (1-element buffers) and the scaling stay in the gradients' array module, so device
    gradients need no host synchronisation (a 0-d Tensor comes back); NumPy gives a Python float."""
    grads = [p.grad.data for p in params if p.grad is not None]
    device = next((g for g in grads if type(g) is not np.ndarray), None)
    xp = _backend.get_array_module(device) if device is not None else np
    inf = math.isinf(norm_type)
    # from the parameters, not the gradients: every rank must reduce the same dtype, with or without grads
    acc = xp.result_type(params[0].dtype, np.float32)   # at least float32: float16 squares overflow at 256

    def part_of(g):
        if not g.size:
            return xp.zeros((), dtype=acc)
        f = g.ravel()
        if f.dtype != acc:
            f = f.astype(acc)
        if inf:
            return xp.abs(f).max()
        return xp.vdot(f, f) if norm_type == 2.0 else (xp.abs(f) ** norm_type).sum()

    def combine(a, b):
        return xp.maximum(a, b) if inf else a + b

    local, groups = xp.zeros((), dtype=acc), {}
    for p in params:
        part = part_of(p.grad.data) if p.grad is not None else xp.zeros((), dtype=acc)
        fs = _norm_shard(p)
        if fs is not None:   # keyed by the group(s) themselves: one reduction per distinct group
            entry = groups.setdefault(fs.group, [fs, xp.zeros((), dtype=acc)])
            entry[1] = combine(entry[1], part)
        else:
            local = combine(local, part)
    for fs, part in groups.values():
        local = combine(local, fs.all_reduce_norm(xp.reshape(part, (1,)), "max" if inf else "sum")[0])
    total = local if inf else local ** (1.0 / norm_type)
    if error_if_nonfinite:
        value = float(total)  # the caller asked for the check: on a device, one read
        if not math.isfinite(value):
            raise _nonfinite_error(value)
    coef = xp.minimum(max_norm / (total + 1e-6), 1.0)   # always multiply (by exactly 1 below the limit):
    for g in grads:                                      # a branch on the norm would need the host
        g *= coef.astype(g.dtype)
    return Tensor._wrap(total) if device is not None else float(total)


def _wide(g):
    """``g`` itself, or a float32 copy of a float16/bfloat16 gradient: their squares overflow at 256
    (a norm of inf would zero every gradient) and underflow below 0.004, as the device path knows."""
    return g.astype(np.float32) if g.dtype.itemsize < 4 and g.dtype.kind != "c" else g


def _clip_host(grads, max_norm: float, norm_type: float, error_if_nonfinite: bool) -> float:
    if math.isinf(norm_type):
        total = max(float(np.abs(g).max()) if g.size else 0.0 for g in grads)
    elif norm_type == 2.0:
        # vdot of the flat view: one BLAS pass per gradient, no temporaries (but for float16).
        total = math.sqrt(sum(float(np.vdot(w.ravel(), w.ravel())) for w in map(_wide, grads)))
    else:
        total = sum(float((np.abs(_wide(g)) ** norm_type).sum()) for g in grads) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise _nonfinite_error(total)
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g *= coef
    return total


def _clip_device(grads, max_norm: float, norm_type: float, error_if_nonfinite: bool) -> Tensor:
    """Everything as device kernels: per-gradient partial norms, one stack, one reduction."""
    xp = _backend.get_array_module(grads[0])
    first = grads[0]
    for g in grads[1:]:
        if type(g) is not type(first):
            _backend.check_same_device(first, g, "clip_grad_norm_")
    # Accumulate in at least float32 (float16 squares overflow at 256).
    acc = xp.result_type(first.dtype, np.float32)
    nonempty = [g for g in grads if g.size]
    if not nonempty:
        total = xp.zeros((), dtype=acc)
    elif math.isinf(norm_type):
        total = xp.stack([xp.abs(g).max().astype(acc) for g in nonempty]).max()
    elif norm_type == 2.0:
        parts = []
        for g in nonempty:
            f = g.ravel()
            if f.dtype != acc:
                f = f.astype(acc)
            parts.append(xp.vdot(f, f))
        total = xp.sqrt(xp.stack(parts).sum())
    else:
        parts = [(xp.abs(g.astype(acc, copy=False)) ** norm_type).sum() for g in nonempty]
        total = xp.stack(parts).sum() ** (1.0 / norm_type)
    if error_if_nonfinite:
        value = float(total)  # the caller asked for the check: one read of the device
        if not math.isfinite(value):
            raise _nonfinite_error(value)
    # Always multiply (by exactly 1 below the limit): branching on the norm would need the host.
    coef = xp.minimum(max_norm / (total + 1e-6), 1.0)
    coefs = {}
    for g in grads:
        c = coefs.get(g.dtype)
        if c is None:
            c = coefs[g.dtype] = coef.astype(g.dtype)
        g *= c
    return Tensor._wrap(total)


def clip_grad_value_(parameters, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place (``foreach``:
    torch's choice of kernel, accepted; the same values either way).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn, optim
        >>> from neural_arch.core.tensor import Tensor
        >>> p = nn.Parameter(np.zeros(2))
        >>> p.grad = Tensor(np.array([3.0, -0.5]))
        >>> optim.clip_grad_value_([p], clip_value=1.0)
        >>> p.grad.tolist()
        [1.0, -0.5]
    """
    clip_value = float(clip_value)
    for g in _grads(parameters):
        xp = _backend.get_array_module(g)
        xp.clip(g, -clip_value, clip_value, out=g)
