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
from collections.abc import Mapping
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


def _as_array(value):
    """The raw array of a checkpoint value (a Tensor's array, an array, or a nested list / scalar)."""
    if isinstance(value, Tensor):
        return value.data
    return value if hasattr(value, "shape") else np.asarray(value)


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
        # keys of the hooks registered with ``with_kwargs=True`` (torch keeps the same two sets)
        object.__setattr__(self, "_forward_pre_hooks_with_kwargs", set())
        object.__setattr__(self, "_forward_hooks_with_kwargs", set())

    # ------------------------------------------------------------------ registration
    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign '{name}' before Module.__init__() ran; "
                "call super().__init__() first in your module's __init__"
            )
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            self._forget(name, keep="_parameters")
            params[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(
                    f"cannot assign {type(value).__name__} to parameter '{name}': "
                    "use nn.Parameter(...) or None"
                )
            params[name] = None
        elif isinstance(value, Module):
            self._forget(name, keep="_modules")
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

    def _forget(self, name: str, keep: str) -> None:
        """Remove ``name`` from the instance dict and every registry but ``keep`` (before registering it
        in ``keep``): an entry replaced by one of its own kind keeps its place, as in torch, so
        ``model.conv1 = nn.Conv2d(...)`` leaves the order of ``parameters()`` (optimizer state, DDP
        buckets, checkpoints) unchanged."""
        self.__dict__.pop(name, None)
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry != keep:
                getattr(self, registry).pop(name, None)
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
        self._forget(name, keep="_parameters")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Register a non-learnable Tensor (statistics, masks) that moves with ``to()``.

        Persistent buffers appear in ``state_dict()``; pass ``persistent=False`` for values that are
        cheap to rebuild (a causal mask) so checkpoints stay small.
        """
        self._check_name(name, "_buffers")
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor(tensor)
        self._forget(name, keep="_buffers")
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
        self._forget(name, keep="_modules")
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name: str, registry: str) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() before registering anything")
        if not isinstance(name, str):
            raise TypeError(f"a module attribute name must be a string, got {type(name).__name__}")  # torch's error
        if not name or "." in name:
            raise KeyError(f"invalid name {name!r}: use a non-empty string without '.'")
        # torch's rule: registering may replace an entry of the same kind, never another attribute
        # (a buffer named like a parameter, or a parameter named 'training', would silently
        # take its place). Plain assignment (``self.name = value``) still replaces anything.
        if name not in getattr(self, registry) and hasattr(self, name):
            raise KeyError(f"attribute '{name}' already exists")

    # ------------------------------------------------------------------ traversal
    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, "Module"]]:
        """Yield ``(name, module)`` for this module and every descendant, depth first (torch's signature).

        A module reachable under several names is yielded once, under its first name, unless
        ``remove_duplicate=False``.

        Example::

            >>> from neural_arch import nn
            >>> shared = nn.Linear(2, 2)
            >>> model = nn.Sequential(shared, shared)
            >>> [n for n, _ in model.named_modules()], [n for n, _ in model.named_modules(remove_duplicate=False)]
            (['', '0'], ['', '0', '1'])
        """
        if memo is not None and not isinstance(memo, set):
            raise TypeError(f"named_modules(memo=...): expected a set or None, got {type(memo).__name__} "
                            "(torch's first argument is memo: pass prefix= by keyword)")
        if remove_duplicate:
            memo = set() if memo is None else memo
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Yield ``(name, child)`` for the direct children under every name they have.

        Unlike torch, a child registered under two names is yielded under each: code that walks
        positions (``checkpoint_sequential`` over ``Sequential(a, a)``, ``convert_sync_batchnorm``)
        must see both, or it silently computes ``a(x)`` for ``a(a(x))``. :meth:`apply` and
        :meth:`named_modules` visit each module once, as torch.
        """
        for name, child in self._modules.items():
            if child is not None:
                yield name, child

    def _unique_children(self) -> Iterator["Module"]:
        seen: set[int] = set()
        for child in self._modules.values():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield child

    def children(self) -> Iterator["Module"]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, registry: str, prefix: str, recurse: bool, remove_duplicate: bool = True):
        seen: set[int] = set()  # shared (tied) tensors are yielded once, under their first name
        if recurse:
            modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
        else:
            modules = [(prefix, self)]
        for mod_prefix, module in modules:
            for name, value in getattr(module, registry).items():
                if value is None or (remove_duplicate and id(value) in seen):
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value, module, name

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Yield ``(dotted_name, parameter)`` in registration order (tied parameters once unless
        ``remove_duplicate=False``)."""
        for full, value, _, _ in self._named_members("_parameters", prefix, recurse, remove_duplicate):
            yield full, value

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        for full, value, _, _ in self._named_members("_buffers", prefix, recurse, remove_duplicate):
            yield full, value

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> "Module":
        """Return the descendant at dotted path ``target`` (``""`` is this module).

        Example::

            >>> from neural_arch import nn
            >>> type(nn.Sequential(nn.Sequential(nn.ReLU())).get_submodule("0.0")).__name__
            'ReLU'
        """
        module = self
        for part in target.split(".") if target else []:
            if part not in module._modules:
                raise AttributeError(f"{type(module).__name__} has no submodule '{part}' (in '{target}')")
            module = module._modules[part]
            if not isinstance(module, Module):   # a slot set to None (torch: "is not an nn.Module")
                raise AttributeError(f"'{part}' (in '{target}') is not a Module, it is {module!r}")
        return module

    def get_parameter(self, target: str) -> Parameter:
        """Return the parameter at dotted path ``target`` (``"block.0.weight"``), or raise AttributeError.

        Example::

            >>> from neural_arch import nn
            >>> nn.Sequential(nn.Linear(2, 3)).get_parameter("0.weight").shape
            (3, 2)
        """
        return self._get_member(target, "_parameters", "parameter")

    def get_buffer(self, target: str) -> Tensor:
        """Return the buffer at dotted path ``target`` (``"bn.running_mean"``), or raise AttributeError.

        Example::

            >>> from neural_arch import nn
            >>> nn.Sequential(nn.BatchNorm1d(2)).get_buffer("0.running_mean").shape
            (2,)
        """
        return self._get_member(target, "_buffers", "buffer")

    def _get_member(self, target: str, registry: str, kind: str):
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        members = getattr(module, registry)
        if name not in members:
            raise AttributeError(f"{type(module).__name__} has no {kind} '{name}' (in '{target}')")
        if members[name] is None:
            raise AttributeError(f"{kind} '{target}' is None")
        return members[name]

    # ------------------------------------------------------------------ modes and helpers
    def train(self, mode: bool = True) -> "Module":
        """Set training mode on this module and all descendants (affects Dropout)."""
        if not isinstance(mode, bool):
            raise ValueError(f"train(mode): mode must be a bool, got {mode!r}")
        object.__setattr__(self, "training", mode)
        # Through each child's own train() (not a flag set on every descendant): a child that
        # overrides train() (a frozen BatchNorm kept in eval) stays as it decides, as in torch.
        for child in self._unique_children():
            child.train(mode)
        return self

    def eval(self) -> "Module":
        """Shortcut for ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` on every parameter (through ``Tensor.requires_grad_``, so an integer
        parameter refuses ``True`` as in torch instead of getting truncated integer gradients)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
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
        for child in self._unique_children():   # a child under two names once, as torch
            child.apply(fn)
        fn(self)
        return self

    def to(self, device=None, dtype=None, non_blocking: bool = False) -> "Module":
        """Move parameters, gradients and buffers to ``device`` and/or cast floats to ``dtype``.

        Works in place on the existing Parameter objects, so an optimizer built before ``to()``
        still points at the right tensors. Example: ``model.to("cuda:0")``,
        ``model.to(neural_arch.float64)``, ``model.to("cuda", neural_arch.float16)``. An integer
        device is that CUDA device, as in torch: ``model.to(local_rank)`` is ``model.to(f"cuda:{local_rank}")``.
        Integer buffers (``num_batches_tracked``) keep their dtype, as in torch; an integer ``dtype`` is
        a TypeError (torch's). ``non_blocking`` is accepted for torch scripts: the copies here are
        synchronous, which is what it permits.

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
                as_dtype = _dtypes.as_dtype(device)
            except TypeError:
                as_dtype = None
            if as_dtype is not None:
                device, dtype = None, device
        if dtype is not None:
            dtype = _dtypes.as_dtype(dtype)
            if not (_dtypes.is_floating_dtype(dtype) or dtype.kind == "c"):
                # torch's rule: an integer dtype would silently cast nothing (only floats are cast)
                raise TypeError(f"Module.to only accepts floating point or complex dtypes, got {dtype}")

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
    def _state_tensors(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """``(key, tensor)`` of every parameter and persistent buffer, in ``named_modules`` order: a
        parameter tied into two modules has a key under each (as torch); a module reachable under
        two names is walked once, under its first name (torch walks it again under every name)."""
        for mod_prefix, module in self.named_modules():
            head = f"{prefix}{mod_prefix}." if mod_prefix else prefix
            for name, p in module._parameters.items():
                if p is not None:
                    yield head + name, p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    yield head + name, b
            if type(module).get_extra_state is not Module.get_extra_state:
                yield head + _EXTRA_STATE_KEY, _ExtraState(module)

    def get_extra_state(self):
        """Override (with :meth:`set_extra_state`) to save a non-Tensor value under ``"<prefix>_extra_state"``
        in ``state_dict()`` (torch's hook: a step counter, a config). The default has none.

        Example::

            >>> from neural_arch import nn
            >>> class Counter(nn.Module):
            ...     def __init__(self):
            ...         super().__init__()
            ...         self.calls = 0
            ...     def get_extra_state(self):
            ...         return {"calls": self.calls}
            ...     def set_extra_state(self, state):
            ...         self.calls = state["calls"]
            >>> model = nn.Sequential(Counter())
            >>> model[0].calls = 5
            >>> fresh = nn.Sequential(Counter()); _ = fresh.load_state_dict(model.state_dict()); fresh[0].calls
            5
        """
        raise RuntimeError(f"{type(self).__name__} has no extra state: override get_extra_state() "
                           "and set_extra_state() together")

    def set_extra_state(self, state) -> None:
        """Restore what :meth:`get_extra_state` returned (called by ``load_state_dict``)."""
        raise RuntimeError(f"{type(self).__name__}.set_extra_state is not implemented: a module that "
                           "overrides get_extra_state() must override set_extra_state() too")

    def state_dict(self, prefix: str = "", *, destination=None, keep_vars: bool = False):
        """Return ``{dotted_name: numpy copy}`` for parameters and persistent buffers, in order, and
        ``"<module>._extra_state"`` for a module that overrides :meth:`get_extra_state` (as torch).

        As torch: ``prefix`` is put in front of every key as given (``prefix="model."`` gives
        ``"model.weight"``); a parameter tied into two modules has a key under each (a module
        reachable under two names is saved once, under its first name); ``keep_vars=True`` gives
        the Parameter and buffer Tensors themselves instead of copies; ``destination`` is a dict
        to fill and return.

        Example::

            >>> from neural_arch import nn
            >>> list(nn.Linear(2, 2).state_dict(prefix="head."))
            ['head.weight', 'head.bias']
        """
        if not isinstance(prefix, str):
            raise TypeError(f"state_dict(prefix=...): expected a str, got {type(prefix).__name__} "
                            "(torch's positional destination is not supported: pass destination= by keyword)")
        out = OrderedDict() if destination is None else destination
        for key, tensor in self._state_tensors(prefix):
            if isinstance(tensor, _ExtraState):
                out[key] = tensor.module.get_extra_state()
            else:
                out[key] = tensor if keep_vars else _to_numpy(tensor.data)
        return out

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False) -> IncompatibleKeys:
        """Copy values from ``state_dict`` into this module's parameters and buffers, in place.

        Returns ``IncompatibleKeys(missing_keys, unexpected_keys)``. With ``strict=True`` (the
        default) any key mismatch raises ``RuntimeError`` naming the keys (as torch does); a shape
        mismatch always raises ``RuntimeError`` naming the parameter. Every shape is checked before
        anything is copied, so an error leaves the module unchanged. Values keep the module's dtype
        and device; with ``assign=True`` each Parameter/buffer object stays but takes the checkpoint's
        array as it is (its dtype: torch's ``assign``), on the module's device; as in torch, build
        the optimizer (or the DDP/FSDP wrapper) after such a load, since flat views are not followed.

        Example::

            >>> import numpy as np
            >>> from neural_arch import nn
            >>> layer = nn.Linear(2, 1)
            >>> layer.load_state_dict({"weight": np.ones((1, 2)), "bias": np.zeros(1)})
            IncompatibleKeys(missing_keys=[], unexpected_keys=[])
            >>> layer.weight.dtype
            dtype('float32')
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected a dict-like state_dict, got {type(state_dict).__name__}")
        expected: OrderedDict[str, Tensor] = OrderedDict(self._state_tensors())
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        if strict and (missing or unexpected):
            raise RuntimeError(
                f"load_state_dict(strict=True) for {type(self).__name__}: missing keys {missing}, "
                f"unexpected keys {unexpected}; pass strict=False to load the matching subset"
            )
        extra = [(entry.module, state_dict[key]) for key, entry in expected.items()
                 if isinstance(entry, _ExtraState) and key in state_dict]
        pairs = [(key, tensor, _as_array(state_dict[key])) for key, tensor in expected.items()
                 if key in state_dict and not isinstance(tensor, _ExtraState)]
        mismatched = [f"'{key}': the checkpoint has {tuple(value.shape)}, the model has {tuple(tensor.shape)}"
                      for key, tensor, value in pairs if tuple(value.shape) != tuple(tensor.data.shape)]
        if mismatched:   # torch raises on a shape mismatch even with strict=False
            raise RuntimeError(
                "load_state_dict: shape mismatch for " + "; ".join(mismatched)
                + "; build the model with the same configuration as the one that was saved"
            )
        for key, tensor, value in pairs:
            if assign:
                _rebind(tensor, _backend.to_device(value, tensor.device), tensor.device)
            else:
                _assign_array(tensor, value, key)
        for module, state in extra:
            module.set_extra_state(state)
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
        args, kwargs = self._call_forward_pre_hooks(args, kwargs)
        out = self.forward(*args, **kwargs)
        return self._call_forward_hooks(args, kwargs, out)

    def _call_forward_pre_hooks(self, args: tuple, kwargs: dict) -> tuple:
        """The global and this module's forward pre-hooks, in order: ``(args, kwargs)`` as they left
        them (also what activation checkpointing's recomputation runs, ``utils.checkpoint``)."""
        with_kwargs = getattr(self, "_forward_pre_hooks_with_kwargs", ())
        for hook in list(_GLOBAL_FORWARD_PRE_HOOKS.values()):
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        for key, hook in list(self._forward_pre_hooks.items()):
            if key in with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError("a forward pre-hook registered with_kwargs=True must return None "
                                           f"or a tuple (new_args, new_kwargs), got {type(result).__name__}")
                    args, kwargs = result
                    args = args if isinstance(args, tuple) else (args,)
                continue
            result = hook(self, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
        return args, kwargs

    def _call_forward_hooks(self, args: tuple, kwargs: dict, out):
        """This module's forward hooks, in order: the output as they left it."""
        with_kwargs = getattr(self, "_forward_hooks_with_kwargs", ())
        for key, hook in list(self._forward_hooks.items()):
            result = hook(self, args, kwargs, out) if key in with_kwargs else hook(self, args, out)
            if result is not None:
                out = result
        return out

    def _add_forward_hook(self, store: str, kwargs_keys: str, hook, prepend: bool, with_kwargs: bool):
        hooks = getattr(self, store)
        handle = add_hook(hooks, hook)
        if prepend:
            hooks.move_to_end(handle._key, last=False)
        if with_kwargs:
            keys = self.__dict__.get(kwargs_keys)
            if keys is None:    # a module unpickled from before these sets existed
                keys = set()
                object.__setattr__(self, kwargs_keys, keys)
            keys.add(handle._key)
        return handle

    def register_forward_pre_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args)`` before ``forward``; a non-None return replaces ``args``.

        As torch: ``prepend=True`` runs it before the hooks already registered; with ``with_kwargs=True``
        it is called as ``hook(module, args, kwargs)`` and may return ``(new_args, new_kwargs)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch import nn
            >>> layer = nn.Identity()
            >>> handle = layer.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
            >>> layer(na.ones(2)).tolist()
            [2.0, 2.0]
        """
        return self._add_forward_hook("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", hook,
                                      prepend, with_kwargs)

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False) -> RemovableHandle:
        """Call ``hook(module, args, output)`` after ``forward``; a non-None return replaces the output.

        As torch: ``prepend=True`` runs it before the hooks already registered; with ``with_kwargs=True``
        it is called as ``hook(module, args, kwargs, output)``.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch import nn
            >>> layer = nn.Identity()
            >>> handle = layer.register_forward_hook(lambda m, args, out: out + 1)
            >>> layer(na.ones(2)).tolist()
            [2.0, 2.0]
        """
        return self._add_forward_hook("_forward_hooks", "_forward_hooks_with_kwargs", hook, prepend, with_kwargs)

    def register_full_backward_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_input, grad_output)`` once the gradients with respect to this
        module's inputs are computed in a backward (tuples of Tensors, None where an input needs no
        gradient); a non-None return replaces ``grad_input``. torch's semantics and limits:
        :mod:`neural_arch.nn.backward_hooks`.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch import nn
            >>> double = nn.Identity()
            >>> h = double.register_full_backward_hook(lambda m, gin, gout: (gin[0] * 2,))
            >>> x = na.ones(2, requires_grad=True)
            >>> double(x).sum().backward()
            >>> x.grad.tolist()
            [2.0, 2.0]
        """
        from neural_arch.nn.backward_hooks import BackwardHooks

        return BackwardHooks.of(self).add(hook, pre=False, prepend=prepend)

    def register_full_backward_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """Call ``hook(module, grad_output)`` when the gradient with respect to this module's output
        arrives in a backward, before the module's own backward; a non-None return replaces it.

        Example::

            >>> import neural_arch as na
            >>> from neural_arch import nn
            >>> lin = nn.Identity()
            >>> h = lin.register_full_backward_pre_hook(lambda m, gout: (gout[0] * 0,))
            >>> x = na.ones(2, requires_grad=True)
            >>> lin(x).sum().backward()
            >>> x.grad.tolist()
            [0.0, 0.0]
        """
        from neural_arch.nn.backward_hooks import BackwardHooks

        return BackwardHooks.of(self).add(hook, pre=True, prepend=prepend)

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


_EXTRA_STATE_KEY = "_extra_state"   # torch's key for get_extra_state()'s value


class _ExtraState:
    """Marks, among the state tensors, the module whose ``get_extra_state`` value goes in the state dict."""

    __slots__ = ("module",)

    def __init__(self, module: Module):
        self.module = module


def _rebind(t: Tensor, array, device) -> None:
    """Point tensor ``t`` at a new array (after a device move or cast)."""
    t.data = array
    # Tensors that cache their device string need it refreshed; harmless otherwise.
    if device is not None and "_device" in getattr(t, "__dict__", {}):
        t._device = _backend.parse_device(device)
