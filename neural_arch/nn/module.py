"""``Module``: the base class of every layer and model.

A module owns parameters (:class:`~neural_arch.nn.Parameter`), buffers (non-learnable Tensors such as a causal
mask) and child modules, each registered by plain attribute assignment, in order. Everything
that walks a model (optimizers, DDP bucketing, ZeRO sharding, checkpoints) relies on that order
being deterministic, so it is the registration order, recursively, depth first.

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> class MLP(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc1 = nn.Linear(4, 8)
    ...         self.fc2 = nn.Linear(8, 2)
    ...     def forward(self, x):
    ...         return self.fc2(nn.functional.relu(self.fc1(x)))
    >>> model = MLP()
    >>> [name for name, _ in model.named_parameters()]
    ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']
    >>> sorted(model.state_dict())[:1]
    ['fc1.bias']
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Callable, Iterator

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core import dtypes as _dtypes
from neural_arch.core.autograd import RemovableHandle, add_hook
from neural_arch.core.tensor import Tensor
from neural_arch.nn.parameter import Parameter

__all__ = ["Module", "IncompatibleKeys", "register_module_forward_pre_hook"]

#: hooks called before *every* module's forward (torch's ``register_module_forward_pre_hook``)
_GLOBAL_FORWARD_PRE_HOOKS: dict = {}


def register_module_forward_pre_hook(hook) -> RemovableHandle:
    """Call ``hook(module, args)`` before the forward of every module (torch's global hook); a non-None
    return replaces ``args``. Remove it with the returned handle.

    Example::

        >>> from neural_arch import nn
        >>> seen = []
        >>> handle = register_module_forward_pre_hook(lambda m, args: seen.append(type(m).__name__))
        >>> _ = nn.Sequential(nn.Linear(2, 2))(__import__("neural_arch").ones(1, 2))
        >>> handle.remove(); seen
        ['Sequential', 'Linear']
    """
    return add_hook(_GLOBAL_FORWARD_PRE_HOOKS, hook)

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
IncompatibleKeys.__doc__ = """What ``Module.load_state_dict`` did not match: two lists of names.

Example::

    >>> from neural_arch import nn
    >>> model = nn.Linear(2, 2)
    >>> model.load_state_dict({"weight": model.weight.data}, strict=False).missing_keys
    ['bias']
"""


def _to_numpy(array) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array (checkpoints are always host arrays)."""
    if isinstance(array, np.ndarray):
        return array.copy()
    return _backend.to_host(array)  # the one host-transfer pair: a device array arrives as a new copy


def _assign_array(tensor: Tensor, value, name: str) -> None:
    """Copy ``value`` into ``tensor`` in place, keeping the tensor's dtype and device.

    In place (``data[...] = ``) rather than rebinding ``.data`` so that anything holding the same
    buffer (an optimizer's flat view, a ZeRO shard) sees the new values too.
    """
    if isinstance(value, Tensor):
        value = value.data
    if not hasattr(value, "shape"):
        value = np.asarray(value)
    current = tensor.data
    if tuple(value.shape) != tuple(current.shape):
        raise RuntimeError(
            f"load_state_dict: shape mismatch for '{name}': the checkpoint has "
            f"{tuple(value.shape)}, the model has {tuple(current.shape)}; "
            "build the model with the same configuration as the one that was saved"
        )
    current[...] = _backend.to_device(value, tensor.device).astype(current.dtype, copy=False)


class Module:
    """Base class for all layers and models; subclasses implement :meth:`Module.forward`.

    Assign ``Parameter``s, ``Module``s and (via :meth:`register_buffer`) buffers as attributes
    in ``__init__`` after calling ``super().__init__()``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> class Affine(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.scale = nn.Parameter(na.ones(2))
        ...     def forward(self, x):
        ...         return x * self.scale
        >>> model = Affine()
        >>> model(na.ones(2)).tolist(), list(model.state_dict())
        ([1.0, 1.0], ['scale'])
    """

    def __init__(self) -> None:
        # object.__setattr__ because our own __setattr__ needs these dicts to exist.
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_forward_pre_hooks", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() ran; "
                "call super().__init__() first in your module's __init__"
            )
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            self._forget(name)
            params[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign {type(value).__name__} to parameter '{name}': "
                    "use nn.Parameter(...) or None"
                )
            params[name] = None
        elif isinstance(value, Module):
            self._forget(name)
            modules[name] = value
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} to child module '{name}'")
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"buffer '{name}' must be a Tensor or None, got {type(value).__name__}")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name: str) -> None:
        """Remove ``name`` from every registry and the instance dict (before re-registering)."""
        self.__dict__.pop(name, None)
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        self._non_persistent.discard(name)

    def __getattr__(self, name: str):
        # Only called when normal lookup fails: look in the registries.
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            registry = d.get(key)
            if registry is not None and name in registry:
                return registry[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._buffers, self._modules):
            if name in registry:
                del registry[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` under ``name`` (``None`` reserves the slot, e.g. a missing bias)."""
        self._check_name(name, "_parameters")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"register_parameter('{name}'): expected a Parameter or None, got "
                f"{type(param).__name__}; wrap the array as nn.Parameter(array)"
            )
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Register a non-learnable Tensor (statistics, masks) that moves with ``to()``.

        Persistent buffers appear in ``state_dict()``; pass ``persistent=False`` for values that are
        cheap to rebuild (a causal mask) so checkpoints stay small.
        """
        self._check_name(name, "_buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor(tensor)
        self._forget(name)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        """Register ``module`` as a child under ``name`` (what ``self.name = module`` does)."""
        self._check_name(name, "_modules")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module('{name}'): expected a Module, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name: str, registry: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before registering anything")
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"invalid name {name!r}: use a non-empty string without '.'")
        # torch's rule: registering may replace an entry of the same kind, never another attribute
        # (a buffer named like a parameter, or a parameter named 'training', would silently
        # take its place). Plain assignment (``self.name = value``) still replaces anything.
        if name not in getattr(self, registry) and hasattr(self, name):
            raise KeyError(f"attribute '{name}' already exists")

    # ------------------------------------------------------------------ traversal
    def named_modules(self, prefix: str = "", memo: set | None = None) -> Iterator[tuple[str, "Module"]]:
        """Yield ``(name, module)`` for this module and every descendant, depth first, each once."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def children(self) -> Iterator["Module"]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, registry: str, prefix: str, recurse: bool):
        seen: set[int] = set()  # shared (tied) tensors are yielded once, under their first name
        modules = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mod_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value, module, name

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Yield ``(dotted_name, parameter)`` in registration order (tied parameters once)."""
        for full, value, _, _ in self._named_members("_parameters", prefix, recurse):
            yield full, value

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        for full, value, _, _ in self._named_members("_buffers", prefix, recurse):
            yield full, value

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> "Module":
        """Return the descendant at dotted path ``target`` (``""`` is this module)."""
        module = self
        for part in target.split(".") if target else []:
            if part not in module._modules:
                raise AttributeError(f"{type(module).__name__} has no submodule '{part}' (in '{target}')")
            module = module._modules[part]
        return module

    # ------------------------------------------------------------------ modes and helpers
    def train(self, mode: bool = True) -> "Module":
        """Set training mode on this module and all descendants (affects Dropout)."""
        if not isinstance(mode, bool):
            raise ValueError(f"train(mode): mode must be a bool, got {mode!r}")
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> "Module":
        """Shortcut for ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients: drop them (default, saves memory) or fill them with zeros in place."""
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.data[...] = 0

    def apply(self, fn: Callable[["Module"], None]) -> "Module":
        """Call ``fn(m)`` on every descendant (children first) and then on this module."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def to(self, device=None, dtype=None) -> "Module":
        """Move parameters, gradients and buffers to ``device`` and/or cast floats to ``dtype``.

        Works in place on the existing Parameter objects, so an optimizer built before ``to()``
        still points at the right tensors. Example: ``model.to("cuda:0")``,
        ``model.to(neural_arch.float64)``, ``model.to("cuda", neural_arch.float16)``. An integer
        device is that CUDA device, as in torch: ``model.to(local_rank)`` is ``model.to(f"cuda:{local_rank}")``.
        Integer buffers (``num_batches_tracked``) keep their dtype, as in torch.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch import nn
            >>> nn.Linear(2, 2).to(na.float64).weight.dtype
            dtype('float64')
        """
        if isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)):
            if device < 0:
                raise ValueError(f"Module.to({device}): a device index must be >= 0 (an integer means cuda:N)")
            device = f"cuda:{int(device)}"
        if device is not None and not isinstance(device, (str, _backend.Device)) and dtype is None \
                and not (hasattr(device, "type") and hasattr(device, "index")):
            # model.to(neural_arch.float64) / model.to(np.float64): a dtype given positionally
            try:
                if _dtypes.is_floating_dtype(_dtypes.as_dtype(device)):
                    device, dtype = None, device
            except TypeError:
                pass
        if dtype is not None:
            dtype = _dtypes.as_dtype(dtype)

        def convert(t: Tensor) -> None:
            array = t.data
            if dtype is not None and _dtypes.is_floating_dtype(array.dtype) and array.dtype.kind != "c":
                array = array.astype(dtype)
            if device is not None:
                array = _backend.to_device(array, device)
            if array is not t.data:
                _rebind(t, array, device)

        for p in self.parameters():
            convert(p)
            if p.grad is not None:
                convert(p.grad)
        for b in self.buffers():
            convert(b)
        return self

    def float(self) -> "Module":
        return self.to(dtype=np.float32)

    def double(self) -> "Module":
        return self.to(dtype=np.float64)

    def half(self) -> Module:
        return self.to(dtype=np.float16)

    def bfloat16(self) -> Module:
        return self.to(dtype="bfloat16")

    def cpu(self) -> Module:
        return self.to("cpu")

    def cuda(self, device=None) -> Module:
        """Move to ``cuda:device`` (default ``cuda:0``)."""
        return self.to("cuda" if device is None else f"cuda:{int(device)}")

    # ------------------------------------------------------------------ state
    def state_dict(self, prefix: str = "") -> "OrderedDict[str, np.ndarray]":
        """Return ``{dotted_name: numpy copy}`` for parameters and persistent buffers, in order."""
        out: OrderedDict[str, np.ndarray] = OrderedDict()
        for mod_prefix, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                if p is not None:
                    out[f"{mod_prefix}.{name}" if mod_prefix else name] = _to_numpy(p.data)
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    out[f"{mod_prefix}.{name}" if mod_prefix else name] = _to_numpy(b.data)
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> IncompatibleKeys:
        """Copy values from ``state_dict`` into this module's parameters and buffers, in place.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``. With ``strict=True`` (the
        default) any key mismatch raises ``RuntimeError`` naming the keys (as torch does); a shape
        mismatch always raises ``RuntimeError`` naming the parameter.
        """
        expected: dict[str, Tensor] = {}
        for mod_prefix, module in self.named_modules():
            for name, p in module._parameters.items():
                if p is not None:
                    expected[f"{mod_prefix}.{name}" if mod_prefix else name] = p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    expected[f"{mod_prefix}.{name}" if mod_prefix else name] = b
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"load_state_dict(strict=True) for {type(self).__name__}: missing keys {missing}, "
                f"unexpected keys {unexpected}; pass strict=False to load the matching subset"
            )
        for key, tensor in expected.items():
            if key in state_dict:
                _assign_array(tensor, state_dict[key], key)
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ calling and printing
    def forward(self, *args, **kwargs):
        """The computation of this module; every subclass defines it, and ``module(x)`` calls it (after
        the forward pre-hooks, before the forward hooks).

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> from neural_arch.core.tensor import Tensor
            >>> class Double(nn.Module):
            ...     def forward(self, x):
            ...         return x * 2
            >>> Double()(Tensor(np.ones(2))).data.tolist()
            [2.0, 2.0]
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def __call__(self, *args, **kwargs):
        if not (self._forward_pre_hooks or self._forward_hooks or _GLOBAL_FORWARD_PRE_HOOKS):
            return self.forward(*args, **kwargs)  # the common case: no hook bookkeeping at all
        for hook in [*_GLOBAL_FORWARD_PRE_HOOKS.values(), *self._forward_pre_hooks.values()]:
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    def register_forward_pre_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, args)`` before ``forward``; a non-None return replaces ``args``."""
        return add_hook(self._forward_pre_hooks, hook)

    def register_forward_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after ``forward``; a non-None return replaces the output."""
        return add_hook(self._forward_hooks, hook)

    def extra_repr(self) -> str:
        """One line of constructor arguments shown by ``repr`` (override in layers)."""
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, child in self._modules.items():
            child_repr = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child_repr}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"

    def __dir__(self):
        names = set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules)
        return sorted(names)

    def num_parameters(self) -> int:
        """Total number of scalar parameters (tied parameters counted once)."""
        return int(sum(int(np.prod(p.shape)) for p in self.parameters()))


def _rebind(t: Tensor, array, device) -> None:
    """Point tensor ``t`` at a new array (after a device move or cast)."""
    t.data = array
    # Tensors that cache their device string need it refreshed; harmless otherwise.
    if device is not None and "_device" in getattr(t, "__dict__", {}):
        t._device = _backend.parse_device(device)
