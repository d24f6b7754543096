"""Adafactor (Shazeer & Stern 2018) as in ``torch.optim.Adafactor`` (torch >= 2.5): factored
second moments for matrices (row and column means over the last two dims), relative step size
``rho_t = min(lr, 1/sqrt(t))`` scaled by the parameter's RMS, update clipping at ``d``, and
decoupled weight decay ``p *= 1 - lr * weight_decay``.

For step ``t`` (torch's algorithm, including where it places ``eps1``)::

    w = t ** beta2_decay                           (1 - beta2_t)
    alpha = max(eps2, RMS(p)) * min(lr, 1 / sqrt(t))
    p = p * (1 - lr * weight_decay)
    matrices:  R = lerp(R, mean(g*g, -1), w);  C = lerp(C, mean(g*g, -2), w)
               V = (R @ C) / max(mean(R, -2), eps1)
    vectors:   V = lerp(V, g*g, w)
    U = g / sqrt(max(V, eps1**2));   p = p - alpha / max(1, RMS(U) / d) * U

``eps1=None`` means the dtype's machine epsilon. Like torch, Adafactor runs per tensor (its
factored state has no flat layout); ``foreach`` is accepted for torch compatibility.

Example::

    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(4, 2)
    >>> opt = optim.Adafactor(model.parameters())
    >>> opt.param_groups[0]["eps"], opt.param_groups[0]["beta2_decay"]
    ((None, 0.001), -0.8)
"""

from __future__ import annotations

import math

import numpy as np

from neural_arch import backend as _backend
from neural_arch.optim.optimizer import Optimizer

__all__ = ["Adafactor"]

_FACTORED = ("row_var", "col_var")


def _rms(x) -> float:
    return math.sqrt(float(x.ravel() @ x.ravel()) / x.size) if x.size else 0.0


class Adafactor(Optimizer):
    """Memory-light adaptive optimizer: O(rows + cols) second-moment state per matrix.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(3, 2)
        >>> before = model.weight.data.copy()
        >>> opt = optim.Adafactor(model.parameters(), lr=0.01)
        >>> model(na.ones(4, 3)).sum().backward()
        >>> opt.step(); opt.zero_grad()
        >>> bool((model.weight.data != before).all()), model.weight.grad is None
        (True, True)
    """

    def __init__(self, params, lr: float = 1e-2, beta2_decay: float = -0.8, eps=(None, 1e-3),
                 d: float = 1.0, weight_decay: float = 0.0, *, foreach: bool | None = None,
                 maximize: bool = False):
        if lr < 0.0:
            raise ValueError(f"Adafactor: invalid learning rate lr={lr}; it must be >= 0")
        if beta2_decay > 0.0:
            raise ValueError(f"Adafactor: beta2_decay must be <= 0, got {beta2_decay}")
        if len(eps) != 2 or (eps[0] is not None and eps[0] < 0.0) or eps[1] < 0.0:
            raise ValueError(f"Adafactor: eps must be (eps1 >= 0 or None, eps2 >= 0), got {eps}")
        if d < 1.0:
            raise ValueError(f"Adafactor: the clipping threshold d must be >= 1, got {d}")
        if weight_decay < 0.0:
            raise ValueError(f"Adafactor: invalid weight_decay={weight_decay}; it must be >= 0")
        super().__init__(params, {"lr": lr, "beta2_decay": beta2_decay, "eps": tuple(eps), "d": d,
                                  "weight_decay": weight_decay, "foreach": foreach, "maximize": maximize})

    def step(self, closure=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, wd, dclip = group["lr"], group["weight_decay"], group["d"]
            eps1, eps2 = group["eps"]
            for p, g in self._params_with_grad(group):
                data = p.data
                xp = _backend.get_array_module(data)
                if group["maximize"]:
                    g = -g
                e1 = float(np.finfo(data.dtype).eps) if eps1 is None else eps1
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = 0
                    if data.ndim > 1:
                        state["row_var"] = xp.zeros(data.shape[:-1] + (1,), dtype=data.dtype)
                        state["col_var"] = xp.zeros(data.shape[:-2] + (1, data.shape[-1]), dtype=data.dtype)
                    else:
                        state["variance"] = xp.zeros_like(data)
                state["step"] += 1
                if data.size == 0:  # nothing to update (the means below would be of empty slices)
                    continue
                t = float(state["step"])
                w = t ** group["beta2_decay"]
                alpha = max(eps2, _rms(data)) * min(lr, 1.0 / math.sqrt(t))
                if wd != 0:
                    data *= 1 - lr * wd
                sq = g * g
                if data.ndim > 1:
                    row, col = state["row_var"], state["col_var"]
                    row += w * (sq.mean(axis=-1, keepdims=True) - row)  # lerp
                    col += w * (sq.mean(axis=-2, keepdims=True) - col)
                    var = row @ col
                    var /= xp.maximum(row.mean(axis=-2, keepdims=True), e1)
                else:
                    v = state["variance"]
                    v += w * (sq - v)
                    var = xp.array(v, copy=True)  # the update must not write into the state
                update = g / xp.sqrt(xp.maximum(var, e1 * e1))
                denom = max(1.0, _rms(update) / dclip)
                data -= (alpha / denom) * update
        return loss

    def load_state_dict(self, state_dict) -> None:
        """As :meth:`~neural_arch.optim.Optimizer.load_state_dict`; the factored ``row_var``/``col_var`` are checked
        against the shapes the parameter implies (they are not the parameter's shape)."""
        params = {}
        for saved, group in zip(state_dict["param_groups"], self.param_groups):
            params.update(zip(saved["params"], group["params"]))
        factored, rest = {}, {}
        for key, values in state_dict["state"].items():
            p = params.get(int(key))
            rest[key] = {k: v for k, v in values.items() if k not in _FACTORED}
            fac = {k: v for k, v in values.items() if k in _FACTORED}
            if fac and p is not None:
                shape = tuple(p.shape)
                want = {"row_var": shape[:-1] + (1,), "col_var": shape[:-2] + (1,) + shape[-1:]}
                for k, v in fac.items():
                    if len(shape) < 2 or tuple(np.shape(v)) != want[k]:
                        raise ValueError(
                            f"load_state_dict: Adafactor state {k!r} of parameter {key} has shape "
                            f"{tuple(np.shape(v))} but the parameter of shape {shape} needs "
                            f"{want.get(k) if len(shape) >= 2 else 'no factored state'}; the state dict "
                            "was made for another model or layout")
                factored[int(key)] = fac
        super().load_state_dict({"state": rest, "param_groups": state_dict["param_groups"]})
        for key, fac in factored.items():
            p = params[key]
            self.state[p].update({k: _backend.to_device(np.array(v, copy=True), p.device)
                                  for k, v in fac.items()})
