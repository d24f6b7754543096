"""``Optimizer``: the base class, with torch's ``param_groups`` / ``state`` semantics.

Subclasses implement :meth:`Optimizer.step`, updating ``p.data`` **in place** from ``p.grad.data`` (DDP
writes averaged gradients into ``p.grad.data``; ZeRO hands the optimizer views of flat shards;
both rely on the update never rebinding the arrays).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn, optim
    >>> model = nn.Linear(3, 1)
    >>> opt = optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.0}], lr=0.1)
    >>> [g["lr"] for g in opt.param_groups]
    [0.1, 0.0]
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.autograd import RemovableHandle, add_hook, bump_version
from neural_arch.core.tensor import Tensor

__all__ = ["Optimizer", "ParamState", "register_optimizer_step_pre_hook", "required"]

#: hooks called before *every* optimizer's step (torch's ``register_optimizer_step_pre_hook``)
_GLOBAL_STEP_PRE_HOOKS: dict = {}


def register_optimizer_step_pre_hook(hook) -> RemovableHandle:
    """Call ``hook(optimizer, args, kwargs)`` before the ``step()`` of every optimizer (torch's global
    hook); a non-None return ``(args, kwargs)`` replaces the step's arguments. Remove it with the
    returned handle. ``async_save`` with asynchronous staging uses it so that a step waits until the
    arrays it updates have been copied.

    Example::

        >>> from neural_arch import nn, optim
        >>> seen = []
        >>> handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: seen.append(type(opt).__name__))
        >>> opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
        >>> opt.step()
        >>> handle.remove(); seen
        ['SGD']
    """
    return add_hook(_GLOBAL_STEP_PRE_HOOKS, hook)


def _with_step_pre_hooks(step):
    """``step`` preceded by the global step pre-hooks (one dict test when there are none)."""

    @functools.wraps(step)
    def hooked_step(self, *args, **kwargs):
        if _GLOBAL_STEP_PRE_HOOKS:
            for hook in list(_GLOBAL_STEP_PRE_HOOKS.values()):
                replaced = hook(self, args, kwargs)
                if replaced is not None:
                    args, kwargs = replaced
        swapped = _hyperparameters_as_numbers(self.param_groups)
        try:
            return step(self, *args, **kwargs)
        finally:
            for group, key, value in swapped:  # the caller's tensors stay in the groups, as in torch
                group[key] = value
            _count_the_writes(self.param_groups)

    hooked_step._runs_step_pre_hooks = True
    return hooked_step


def _count_the_writes(groups) -> None:
    """An optimizer step writes its parameters' arrays in place through NumPy, which the core's
    version counters cannot see: count one write per parameter that had a gradient, as torch's
    in-place updates do. A graph recorded before the step then raises torch's "modified by an
    inplace operation" at backward instead of mixing the old and the new weights into a gradient
    (a forward, a step, then the backward of that forward)."""
    for group in groups:
        for p in group["params"]:
            if p.grad is not None:
                bump_version(p.data)


#: hyper-parameter types used as they are (the common case: one set lookup per value)
_PLAIN = frozenset({float, int, bool, str, type(None), np.float64, np.float32, np.int64})


def _as_number(value, key, index):
    """A one-element Tensor/array hyper-parameter as a Python float; anything else unchanged."""
    if isinstance(value, Tensor):
        value = value.data
    if not (isinstance(value, np.ndarray) or _backend.is_device_array(value)):
        return value
    if value.size != 1:
        raise ValueError(f"param group {index}: hyper-parameter {key!r} is an array of shape {tuple(value.shape)}; "
                         "it must be a number or a one-element tensor")
    return float(value.reshape(()))


def _hyperparameters_as_numbers(groups) -> list:
    """Replace every Tensor (or array) hyper-parameter of ``groups`` -- torch accepts ``lr=torch.tensor(0.01)`` --
    by its value for the length of one ``step()``; returns ``(group, key, original)`` to put back.

    Why: the update arithmetic mixes hyper-parameters with NumPy arrays, and ``array -= lr * g`` with a
    Tensor ``lr`` rebinds a local name to a new Tensor instead of writing the parameter: the step would
    change nothing and say nothing. Python numbers (the usual case) cost one type test each.
    """
    swapped = []
    for index, group in enumerate(groups):
        for key, value in group.items():
            kind = type(value)
            if kind in _PLAIN or key == "params":
                continue
            if kind is tuple:
                if all(type(v) in _PLAIN for v in value):  # betas=(0.9, 0.999)
                    continue
                number = tuple(_as_number(v, key, index) for v in value)
                changed = any(a is not b for a, b in zip(number, value))
            else:
                number = _as_number(value, key, index)
                changed = number is not value
            if changed:
                swapped.append((group, key, value))
                group[key] = number
    return swapped


class _Required:
    """Marker for a hyper-parameter with no default (``lr`` for SGD)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def _host_copy(value):
    """Deep copy of an optimizer-state value with arrays as NumPy (checkpoints live on the host)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if _backend.is_device_array(value):  # CuPy (or a registered device type): a new host copy
        return _backend.to_host(value)
    if isinstance(value, Tensor):
        return _host_copy(value.data)
    return copy.deepcopy(value)


def _check_state_shapes(index: int, p, values: dict) -> None:
    """Every state array (not 0-d) must have its parameter's shape: a shard of another layout
    (FSDP/ZeRO, another world size) would otherwise load without a word and train wrongly."""
    for name, value in values.items():
        if not (isinstance(value, np.ndarray) or _backend.is_device_array(value)) or value.ndim == 0:
            continue
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"load_state_dict: state {name!r} of parameter {index} has shape {tuple(value.shape)} but the "
                f"parameter has shape {tuple(p.shape)}; the state dict was made for another layout (an FSDP or "
                "ZeRO shard, another world size?). Save and load sharded optimizers with "
                "neural_arch.distributed.checkpoint.state_dict.get_optimizer_state_dict / set_optimizer_state_dict")


class ParamState:
    """``optimizer.state``: a dict keyed by parameter *identity*.

    Tensors compare element-wise, so they make poor dict keys; this maps ``id(p)`` while keeping
    ``p`` alive, and reads like torch's ``optimizer.state[p]``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> model = nn.Linear(2, 1)
        >>> opt = optim.Adam(model.parameters())
        >>> model(na.ones(1, 2)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[model.weight])
        ['exp_avg', 'exp_avg_sq', 'step']
    """

    def __init__(self):
        self._entries: dict[int, tuple[Tensor, dict]] = {}

    def __getitem__(self, p) -> dict:
        return self._entries[id(p)][1]

    def __setitem__(self, p, value: dict) -> None:
        self._entries[id(p)] = (p, value)

    def __contains__(self, p) -> bool:
        return id(p) in self._entries

    def __delitem__(self, p) -> None:
        del self._entries[id(p)]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return (p for p, _ in self._entries.values())

    def get(self, p, default=None):
        entry = self._entries.get(id(p))
        return default if entry is None else entry[1]

    def setdefault(self, p, default: dict) -> dict:
        if id(p) not in self._entries:
            self._entries[id(p)] = (p, default)
        return self._entries[id(p)][1]

    def keys(self):
        return list(self)

    def values(self):
        return [v for _, v in self._entries.values()]

    def items(self):
        return list(self._entries.values())

    def clear(self) -> None:
        self._entries.clear()


def refuse_unsupported_flags(name: str, group: dict) -> None:
    """torch's ``capturable`` (CUDA-graph capture) and ``differentiable`` (autograd through the
    step) have no counterpart here: say so instead of stepping as if they were honoured.

    Example::

        >>> refuse_unsupported_flags("Adamax", {"capturable": False, "differentiable": False})
    """
    if group.get("capturable"):
        raise ValueError(f"{name}: capturable=True (CUDA-graph capture) is not supported by neural_arch; pass "
                         "capturable=False (the default): the update is the same")
    if group.get("differentiable"):
        raise ValueError(f"{name}: differentiable=True (autograd through the optimizer step) is not supported "
                         "by neural_arch; pass differentiable=False (the default)")


class Optimizer:
    """Holds ``param_groups`` (a list of dicts with ``"params"`` plus hyper-parameters) and ``state``.

    Args:
        params: an iterable of Parameters, or of dicts ``{"params": [...], **overrides}``.
        defaults: default hyper-parameters, copied into every group that does not set them.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn, optim
        >>> class PlainSGD(optim.Optimizer):
        ...     def __init__(self, params, lr):
        ...         super().__init__(params, dict(lr=lr))
        ...     def step(self, closure=None):
        ...         for group in self.param_groups:
        ...             for p in group["params"]:
        ...                 if p.grad is not None:
        ...                     p.data -= group["lr"] * p.grad.data
        >>> model = nn.Linear(2, 1, bias=False)
        >>> model.weight.data[...] = 1.0
        >>> opt = PlainSGD(model.parameters(), lr=0.5)
        >>> model(na.ones(1, 2)).sum().backward()
        >>> opt.step()
        >>> model.weight.tolist()
        [[0.5, 0.5]]
    """

    def __init__(self, params, defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        self.state = ParamState()
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError(
                "params must be an iterable of Parameters or of dicts, got a single Tensor; "
                "pass model.parameters() or [tensor]"
            )
        if isinstance(params, (set, frozenset)):
            # torch accepts a set here, but its order changes between runs and a state dict maps
            # parameters by position: a resumed run would load one tensor's state into another
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the "
                            "ordering of tensors in sets will change between runs. Please use a list instead.")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list; pass model.parameters()")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)
        cls = type(self)
        if not getattr(cls.step, "_runs_step_pre_hooks", False):
            # As torch does: the concrete class's step (whatever subclass defines it) runs the global
            # pre-hooks, so every optimizer honours them without each step() calling them.
            cls.step = _with_step_pre_hooks(cls.step)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add a group; unset hyper-parameters take the defaults. A parameter may be in one group only."""
        if not isinstance(group, dict):
            raise TypeError(f"param group must be a dict, got {type(group).__name__}")
        group = dict(group)
        params = group["params"]
        if isinstance(params, (set, frozenset)):
            # torch's error: a set's order changes between runs, and a state dict maps by position
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the "
                            "ordering of tensors in sets will change between runs. Please use a list instead.")
        params = [params] if isinstance(params, Tensor) else list(params)
        if len({id(p) for p in params}) != len(params):
            # torch only warns and then updates such a parameter once per occurrence; our multi-tensor
            # paths would update it once: neither is what the script meant, so say so at the call
            raise ValueError("a parameter group contains the same parameter more than once; pass each "
                             "parameter once (model.parameters() already lists tied parameters once)")
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.requires_grad:
                raise ValueError(
                    "optimizing a tensor with requires_grad=False; use Parameter or requires_grad=True"
                )
        group["params"] = params
        for key, value in self.defaults.items():
            if value is required and key not in group:
                raise ValueError(f"parameter group didn't specify a value of required argument '{key}'")
            group.setdefault(key, value)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients of every parameter (drop them, or zero them in place)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.data[...] = 0

    def step(self, closure=None):
        """Update every parameter of every group in place from its gradient; subclasses define it.
        ``closure`` (re-evaluates the model, returns the loss) is called first when given, and its loss
        returned, as in torch.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn, optim
            >>> model = nn.Linear(2, 1)
            >>> opt = optim.SGD(model.parameters(), lr=0.1)
            >>> model(np.ones((1, 2), np.float32)).sum().backward()
            >>> opt.step()
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def _params_with_grad(self, group):
        """Yield ``(p, grad_array)`` for parameters of ``group`` that have a gradient."""
        for p in group["params"]:
            if p.grad is not None:
                yield p, p.grad.data

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Torch-style: ``{"state": {index: {...}}, "param_groups": [{..., "params": [indices]}]}``.

        Parameters are referred to by their position across all groups, so the dict can be loaded
        into an optimizer built over a fresh copy of the same model. Arrays are NumPy copies.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            ids = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:
                    state[index[id(p)]] = {k: _host_copy(v) for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore hyper-parameters and per-parameter state saved by :meth:`state_dict`.

        Raises ``ValueError`` (before changing anything) when a state array's shape is not its
        parameter's, e.g. FSDP shards saved on another world size.
        """
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"load_state_dict: the checkpoint has {len(saved_groups)} parameter groups, this "
                f"optimizer has {len(self.param_groups)}; build the optimizer the same way as when saving"
            )
        by_index: dict[int, Tensor] = {}
        for saved, group in zip(saved_groups, self.param_groups):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"load_state_dict: a parameter group has {len(saved['params'])} parameters in the "
                    f"checkpoint and {len(group['params'])} here"
                )
            for i, p in zip(saved["params"], group["params"]):
                by_index[i] = p
        for key, values in state_dict["state"].items():
            if int(key) not in by_index:
                raise ValueError(f"load_state_dict: the state dict has state for parameter {key}, but its "
                                 f"param_groups list parameters {sorted(by_index)} only")
            _check_state_shapes(int(key), by_index[int(key)], values)
        self.state = ParamState()
        for key, values in state_dict["state"].items():
            p = by_index[int(key)]
            restored = {}
            for name, value in values.items():
                if isinstance(value, np.ndarray) and value.ndim > 0:
                    # Match the parameter's device; dtype stays as saved (state may be kept in fp32).
                    value = _backend.to_device(value.copy(), p.device)
                else:
                    value = copy.deepcopy(value)
                restored[name] = value
            step = restored.get("step")
            if step is not None and not isinstance(step, (int, float)):
                # torch saves ``step`` as a 0-d tensor: hold it as the number every optimizer here
                # counts with (the multi-tensor path groups parameters by it, in a set)
                value = float(step)
                restored["step"] = int(value) if value.is_integer() else value
            self.state[p] = restored
        for saved, group in zip(saved_groups, self.param_groups):
            for k, v in saved.items():
                if k != "params":
                    group[k] = copy.deepcopy(v)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for k in sorted(group):
                if k != "params":
                    lines.append(f"    {k}: {group[k]}")
        lines.append(")")
        return "\n".join(lines)
