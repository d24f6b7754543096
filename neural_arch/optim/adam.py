"""Adam and AdamW (decoupled weight decay), torch's update formulas, in place and vectorised.

For step t with gradient g (negated first if ``maximize``; Adam adds ``weight_decay * p`` to g;
AdamW instead multiplies ``p`` by ``1 - lr * weight_decay`` first)::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_hat = max(v_hat, v) if amsgrad else v
    p = p - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    >>> opt.param_groups[0]["betas"]
    (0.9, 0.999)
"""

from __future__ import annotations

import bisect
import functools
import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core import device_kernels
from neural_arch.core.thread_pool import parallel_chunks, splits
from neural_arch.optim._multi_tensor import run_group
from neural_arch.optim.optimizer import Optimizer

__all__ = ["Adam", "AdamW"]


def _check(lr, betas, eps, weight_decay, who):
    if lr < 0.0:
        raise ValueError(f"{who}: invalid learning rate lr={lr}; it must be >= 0")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{who}: betas must be two numbers in [0, 1), got {betas}")
    if eps < 0.0:
        raise ValueError(f"{who}: invalid eps={eps}; it must be >= 0")
    if weight_decay < 0.0:
        raise ValueError(f"{who}: invalid weight_decay={weight_decay}; it must be >= 0")


class Adam(Optimizer):
    """Adam (Kingma & Ba) with optional L2 weight decay and AMSGrad.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.Adam(model.parameters(), lr=1e-3)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False):
        _check(lr, betas, eps, weight_decay, type(self).__name__)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad, "foreach": foreach,
                                  "maximize": bool(maximize)})

    def _init_state(self, group):
        amsgrad = group["amsgrad"]

        def init(state, data):
            xp = _backend.get_array_module(data)
            state["step"] = 0
            state["exp_avg"] = xp.zeros_like(data)
            state["exp_avg_sq"] = xp.zeros_like(data)
            if amsgrad:
                state["max_exp_avg_sq"] = xp.zeros_like(data)

        return init

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        A group of NumPy parameters takes the multi-tensor path (:mod:`neural_arch.optim._multi_tensor`,
        ``foreach``: torch's flag): its small tensors (all with ``foreach=True``) are updated as one
        flat vector, in a dozen NumPy calls instead of a dozen per tensor; large vectors are split
        over the core's thread pool. The arithmetic is the same on every path.
        """
        loss = closure() if closure is not None else None
        for gi, group in enumerate(self.param_groups):
            names = ("exp_avg", "exp_avg_sq") + (("max_exp_avg_sq",) if group["amsgrad"] else ())
            init = self._init_state(group)
            pairs = list(self._params_with_grad(group))
            # the flat path casts gradients to the parameters' dtype: only where that changes nothing
            if all(type(p.data) is np.ndarray and getattr(g, "dtype", None) == p.data.dtype for p, g in pairs):
                pending = _PooledUpdates()
                run_group(self, gi, group, names, init, functools.partial(self._update, pending=pending))
                pending.run()
                continue
            for p, g in pairs:  # device arrays, or gradients of another dtype: one tensor at a time
                state = self.state.setdefault(p, {})
                if not state:
                    init(state, p.data)
                state["step"] += 1
                self._update(p.data, g, state, state["step"], None, group)
        return loss

    def _update(self, d, g, st, t, seg, group, pending=None):
        """Adam's update of ``d`` (in place) and its state ``st`` at step ``t``; ``seg`` unused
        (elementwise: a flat vector of many tensors updates like each tensor alone). A contiguous
        NumPy tensor too small for the thread pool on its own joins ``pending`` (a
        :class:`_PooledUpdates`, run by the caller) instead of being updated inline."""
        if getattr(d, "ndim", 1) == 0:
            # 0-d (the per-tensor path, e.g. a gradient of another dtype): 1-element views, so the
            # kernel's in-place writes have arrays to land in (NumPy turns 0-d results into scalars)
            xp0 = _backend.get_array_module(d)
            d, g = d.reshape(1), xp0.asarray(g).reshape(1)
            st = {k: (v.reshape(1) if getattr(v, "ndim", None) == 0 else v) for k, v in st.items()}
        if group.get("maximize", False):  # a group saved before the option existed has none
            g = -g  # a new array: never modify the caller's gradient
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        wd, amsgrad = group["weight_decay"], group["amsgrad"]
        bias1 = 1 - beta1**t
        bias2 = 1 - beta2**t
        m, v = st["exp_avg"], st["exp_avg_sq"]
        vmax = st["max_exp_avg_sq"] if amsgrad else None
        decay = (1 - lr * wd) if wd != 0 and self._decoupled else None
        l2 = wd if wd != 0 and not self._decoupled else None
        scalars = (beta1, beta2, eps, lr / bias1, math.sqrt(bias2), decay, l2)
        arrays = (d, g, m, v) + (() if vmax is None else (vmax,))
        if all(type(a) is np.ndarray and a.flags.c_contiguous and a.shape == d.shape for a in arrays) \
                and d.ndim > 0:
            # flat views of contiguous arrays: the pool's chunks write the parameter itself
            fd, fg, fm, fv = (a.reshape(-1) for a in (d, g, m, v))
            fvmax = None if vmax is None else vmax.reshape(-1)

            # only a tensor updated in place: a multi-tensor flat vector is copied back right after
            if pending is not None and getattr(seg, "single", False) and not splits(_ADAM_PASSES * fd.size):
                pending.add((fd, fg, fm, fv, fvmax), scalars)
                return

            def chunk(lo, hi):
                _adam_kernel(np, fd[lo:hi], fg[lo:hi], fm[lo:hi], fv[lo:hi],
                             None if fvmax is None else fvmax[lo:hi], *scalars)

            parallel_chunks(fd.size, chunk, work=_ADAM_PASSES * fd.size)
            return
        xp = _backend.get_array_module(d)
        if xp is not np and device_kernels.applies(*arrays, same_shape=True):
            device_kernels.adam_step(xp, d, g, m, v, vmax, *scalars)  # one kernel on a device
            return
        _adam_kernel(xp, d, g, m, v, vmax, *scalars)


#: passes :func:`_adam_kernel` makes over its arrays: its work for the thread pool's size threshold
_ADAM_PASSES = 14


class _PooledUpdates:
    """Per-tensor updates of NumPy tensors each too small for the thread pool, run as one pooled
    job over their concatenated elements (the multi-tensor path leaves tensors above its size
    limit to one update each; a GPT's MLP weights are such tensors, and one at a time they keep
    the second core idle). Each element gets exactly the arithmetic of its tensor's own update, so
    the results are bit-identical for any thread count.

    Example::

        >>> import numpy as np
        >>> from neural_arch.optim.adam import _PooledUpdates
        >>> d, g, m, v = (np.ones(3) for _ in range(4))
        >>> pending = _PooledUpdates()
        >>> pending.add((d, g, m, v, None), (0.9, 0.999, 1e-8, 0.1, 1.0, None, None))
        >>> pending.run()
        >>> d.round(4).tolist()
        [0.9, 0.9, 0.9]
    """

    __slots__ = ("jobs", "starts")

    def __init__(self):
        self.jobs, self.starts = [], [0]

    def add(self, arrays, scalars) -> None:
        """Queue the update of flat contiguous ``arrays`` ``(d, g, m, v, vmax or None)``."""
        self.jobs.append((arrays, scalars))
        self.starts.append(self.starts[-1] + arrays[0].size)

    def run(self) -> None:
        """Apply every queued update (split over the thread pool when large enough together)."""
        if not self.jobs:
            return
        starts, jobs = self.starts, self.jobs

        def chunk(lo, hi):
            # the tensors overlapping [lo, hi), each on its own part of the range
            for i in range(bisect.bisect_right(starts, lo) - 1, len(jobs)):
                s0 = starts[i]
                if s0 >= hi:
                    break
                a, b = max(lo, s0) - s0, min(hi, starts[i + 1]) - s0
                (fd, fg, fm, fv, fvmax), scalars = jobs[i]
                _adam_kernel(np, fd[a:b], fg[a:b], fm[a:b], fv[a:b],
                             None if fvmax is None else fvmax[a:b], *scalars)

        parallel_chunks(starts[-1], chunk, work=_ADAM_PASSES * starts[-1])
        self.jobs, self.starts = [], [0]


def _adam_kernel(xp, d, g, m, v, vmax, beta1, beta2, eps, step_size, sqrt_bias2, decay, l2):
    """The update in place, torch's formulas; ``decay`` (AdamW) or ``l2`` (Adam) or neither."""
    if decay is not None:
        d *= decay
    elif l2 is not None:
        g = g + l2 * d
    m *= beta1
    # One temporary for (1-b1)*g, (1-b2)*g*g, the denominator and the update (same
    # arithmetic as the expression form): Adam is memory-bound.
    tmp = xp.multiply(g, 1 - beta1)
    m += tmp
    v *= beta2
    if getattr(tmp, "ndim", 0) > 0:  # 0-d: NumPy gives back a scalar, out= cannot take it
        xp.multiply(g, g, out=tmp)
        tmp *= 1 - beta2
        v += tmp
    else:
        v += (1 - beta2) * (g * g)
    if vmax is not None:
        xp.maximum(vmax, v, out=vmax)
        v = vmax
    reuse = getattr(tmp, "ndim", 0) > 0 and tmp.dtype == v.dtype and tmp.shape == v.shape
    update = xp.sqrt(v, out=tmp) if reuse else xp.sqrt(v)
    update /= sqrt_bias2
    update += eps
    xp.divide(m, update, out=update)
    update *= step_size
    d -= update


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p *= 1 - lr * weight_decay``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize)
