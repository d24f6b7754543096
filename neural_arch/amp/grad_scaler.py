"""``GradScaler``: dynamic loss scaling for float16 training (torch's semantics).

float16 gradients underflow to zero below ~6e-8; multiplying the loss by a large scale
(``init_scale=2**16``) keeps them representable. Before the optimizer step the gradients are
divided by the scale again (:meth:`GradScaler.unscale_`, which you may call yourself before clipping). If
any gradient is inf/NaN the step is **skipped** and the scale multiplied by ``backoff_factor``;
after ``growth_interval`` clean steps in a row it is multiplied by ``growth_factor``.

Example::

    scaler = GradScaler(init_scale=2.0**16)
    with autocast("cuda"):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)                          # optional: clip true gradients
    clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)                              # skipped if a gradient is inf/NaN
    scaler.update()                               # grow or back off the scale

Sharded training: gradients live in shards, so every rank must agree whether *any* rank saw an
inf; pass ``found_inf_reducer=`` (a function ``bool -> bool`` that ORs over the ranks), or use
:class:`neural_arch.distributed.fsdp.ShardedGradScaler` which does it over a process group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["GradScaler"]

_READY, _UNSCALED, _STEPPED = 0, 1, 2


class GradScaler:
    """Dynamic loss scaling (see the module docstring). ``enabled=False`` makes every method a pass-through.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> from neural_arch.amp import GradScaler
        >>> model = nn.Linear(2, 1)
        >>> opt = optim.SGD(model.parameters(), lr=0.1)
        >>> scaler = GradScaler(init_scale=1024.0)
        >>> scaler.scale(model(na.ones(1, 2)).sum()).backward()
        >>> scaler.step(opt); scaler.update()
        >>> scaler.get_scale(), model.weight.grad.tolist()        # gradients unscaled before the step
        (1024.0, [[1.0, 1.0]])
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 found_inf_reducer: Callable[[bool], bool] | None = None):
        if init_scale <= 0:
            raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale}")
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if int(growth_interval) <= 0:
            raise ValueError(f"GradScaler: growth_interval must be a positive int, got {growth_interval}")
        self.device = device
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._enabled = bool(enabled)
        self._found_inf_reducer = found_inf_reducer
        self._per_optimizer: dict = {}  # id(optimizer) -> {"stage", "found_inf"}

    # -- queries ------------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    # -- the four calls of a step ---------------------------------------------------------------
    def scale(self, outputs):
        """``outputs * scale`` (a Tensor, or a list/tuple of them)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: expected a Tensor or a list/tuple of Tensors, got {type(outputs).__name__}")

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY, "found_inf": False})

    def unscale_(self, optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale, in place, and look for inf/NaN."""
        if not self._enabled:
            return
        st = self._state(optimizer)
        if st["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update()")
        if st["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv = 1.0 / self._scale
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                if g.dtype.itemsize < 4:
                    # float16/bfloat16: multiply in float32, as torch's kernel does. 1/scale itself
                    # underflows to 0 in float16 once the scale passes 2**24, which would zero every
                    # finite gradient without a word (and round it for scales that are not powers of 2).
                    g[...] = (g.astype("float32") * _backend.get_array_module(g).float32(inv)).astype(g.dtype)
                else:
                    g *= g.dtype.type(inv) if hasattr(g.dtype, "type") else inv
                if not found:
                    xp = _backend.get_array_module(g)
                    found = not bool(xp.isfinite(g.astype("float32") if g.dtype.name == "bfloat16" else g).all())
        if self._found_inf_reducer is not None:
            found = bool(self._found_inf_reducer(found))
        st["found_inf"] = found
        st["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless a gradient was inf/NaN (then the step is skipped: returns None)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        st = self._state(optimizer)
        if st["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update()")
        if st["stage"] == _READY:
            self.unscale_(optimizer)
        st["stage"] = _STEPPED
        if st["found_inf"]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: float | None = None) -> None:
        """Back off the scale if any optimizer saw inf/NaN this iteration, else maybe grow it."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(new_scale.item() if isinstance(new_scale, Tensor) else new_scale)
            self._growth_tracker = 0
        elif self._per_optimizer:
            if any(s["found_inf"] for s in self._per_optimizer.values()):
                self._scale *= self._backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    if math.isfinite(self._scale * self._growth_factor):
                        self._scale *= self._growth_factor
                    self._growth_tracker = 0
        self._per_optimizer = {}

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval, "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("GradScaler.load_state_dict: the state dict is empty (saved with enabled=False?)")
        self._scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
