"""Containers: ``Sequential``, ``ModuleList``, ``ModuleDict``.

Children are registered under their index (``"0"``, ``"1"``, ...) or key, so parameter names are
stable (``blocks.3.attn.q_proj.weight``) and tensor/pipeline parallelism can address them.

Example::

    >>> from neural_arch import nn
    >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> [n for n, _ in mlp.named_parameters()]
    ['0.weight', '0.bias', '2.weight', '2.bias']
    >>> layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    >>> len(layers), type(layers[-1]).__name__
    (3, 'Linear')
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Iterable, Iterator, Mapping

from neural_arch.nn.module import Module

__all__ = ["Sequential", "ModuleList", "ModuleDict"]


def _check_module(value, where: str) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{where}: expected a Module, got {type(value).__name__}")
    return value


class _IndexedContainer(Module):
    """Shared indexing for Sequential and ModuleList: children keyed "0", "1", ... in order."""

    def _index(self, idx: int) -> int:
        idx = operator.index(idx)  # torch: a float index is a TypeError, never truncated
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range for {type(self).__name__} of length {n}")
        return idx % n

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            picked = list(self._modules.items())[idx]
            if isinstance(self, Sequential):
                # torch keeps the original keys: model[2:].state_dict() names "2.weight" as model does
                return Sequential(OrderedDict(picked))
            return type(self)([m for _, m in picked])
        return list(self._modules.values())[self._index(idx)]

    def __setitem__(self, idx: int, module: Module) -> None:
        key = list(self._modules)[self._index(idx)]
        self._modules[key] = _check_module(module, f"{type(self).__name__}[{idx}] =")

    def _numbered(self) -> bool:
        return all(key.isdigit() for key in self._modules)

    def _rebuild(self, items: list) -> None:
        """Re-register ``(key, module)`` pairs; numbered containers are renumbered 0..n-1."""
        numbered = self._numbered()
        self._modules.clear()
        for i, (key, m) in enumerate(items):
            self._modules[str(i) if numbered else key] = m

    def __delitem__(self, idx) -> None:
        items = list(self._modules.items())
        if not isinstance(idx, slice):
            idx = self._index(idx)   # a clear IndexError naming the container, a float a TypeError
        del items[idx]
        self._rebuild(items)

    def _next_key(self) -> str:
        """``str(len(self))`` as torch, or past the largest number when a slice kept higher keys (torch
        would replace the child already under that key)."""
        key = str(len(self._modules))
        if key in self._modules:
            key = str(max(int(k) for k in self._modules if k.isdigit()) + 1)
        return key

    def append(self, module: Module):
        self.add_module(self._next_key(), _check_module(module, f"{type(self).__name__}.append"))
        return self

    def pop(self, idx: int = -1) -> Module:
        """Remove and return the child at ``idx`` (numbered containers are renumbered, as torch).

        Example::

            >>> from neural_arch import nn
            >>> layers = nn.ModuleList([nn.ReLU(), nn.Tanh()])
            >>> type(layers.pop(0)).__name__, list(layers._modules)
            ('ReLU', ['0'])
        """
        module = self[idx]
        del self[idx]
        return module

    def __iadd__(self, modules: Iterable[Module]):
        return self.extend(modules)

    def __add__(self, other):
        """A new container holding this one's children, then ``other``'s (torch's ``+``)."""
        if isinstance(self, Sequential):
            if not isinstance(other, Sequential):
                return NotImplemented
            return Sequential(*self, *other)
        if isinstance(other, (str, bytes, Mapping)) or not hasattr(other, "__iter__"):
            return NotImplemented   # torch's ModuleList + any iterable of modules
        return type(self)([*self, *other])

    def extend(self, modules: Iterable[Module]):
        if isinstance(modules, Module) and not isinstance(modules, _IndexedContainer):
            raise TypeError(f"{type(self).__name__}.extend needs an iterable of modules, got one "
                            f"{type(modules).__name__}: use append()")
        for m in list(modules):   # a list first: extending a container by itself must not loop forever
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        if not self._numbered():
            raise TypeError(f"insert() needs a numbered {type(self).__name__}; use add_module(name, module)")
        index = operator.index(index)
        n = len(self._modules)
        if isinstance(self, Sequential) and not -n <= index <= n:
            # torch's Sequential.insert: out of range is an IndexError, not an append
            raise IndexError(f"Sequential.insert: index {index} is out of range for length {n}")
        items = list(self._modules.items())
        items.insert(index, ("", _check_module(module, f"{type(self).__name__}.insert")))
        self._rebuild(items)


class Sequential(_IndexedContainer):
    """Calls its children in order, feeding each one's output to the next.

    ``Sequential(m1, m2, ...)`` names children "0", "1", ...; ``Sequential(OrderedDict(fc=..., act=...))``
    uses the given names.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> model(na.ones(3, 4)).shape, len(model)
        ((3, 2), 3)
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, m in modules[0].items():
                self.add_module(name, _check_module(m, f"Sequential['{name}']"))
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), _check_module(m, f"Sequential argument {i}"))

    def __getitem__(self, idx):
        if isinstance(idx, str):
            return self._modules[idx]
        return super().__getitem__(idx)

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(_IndexedContainer):
    """A list of modules whose parameters are registered (a plain list would hide them).

    Example::

        >>> from neural_arch import nn
        >>> layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
        >>> len(layers), len(list(layers.parameters()))
        (3, 6)
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(); iterate over it in your model's forward")


class ModuleDict(Module):
    """An ordered dict of modules (keys must be valid attribute-like names without '.').

    Example::

        >>> from neural_arch import nn
        >>> heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1)})
        >>> list(heads.keys()), [name for name, _ in heads.named_parameters()][:2]
        (['cls', 'reg'], ['cls.weight', 'cls.bias'])
    """

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, _check_module(module, f"ModuleDict['{key}'] ="))

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def values(self):
        return self._modules.values()

    def items(self):
        return self._modules.items()

    def pop(self, key: str) -> Module:
        return self._modules.pop(key)

    def clear(self) -> None:
        """Remove every module."""
        self._modules.clear()

    def update(self, modules) -> None:
        """Add or replace modules from a mapping, a ``ModuleDict`` or an iterable of ``(key, module)`` pairs.

        Example::

            >>> from neural_arch import nn
            >>> heads = nn.ModuleDict({"cls": nn.Linear(4, 3)})
            >>> heads.update(nn.ModuleDict({"reg": nn.Linear(4, 1)})); list(heads)
            ['cls', 'reg']
        """
        if isinstance(modules, (Mapping, ModuleDict)):
            for key, m in list(modules.items()):
                self[key] = m
            return
        if isinstance(modules, (str, bytes)) or not hasattr(modules, "__iter__"):
            raise TypeError(f"ModuleDict.update needs a mapping or an iterable of (key, module) pairs, "
                            f"got {type(modules).__name__}")
        for i, pair in enumerate(list(modules)):
            if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
                raise ValueError(f"ModuleDict update sequence element #{i} is not a (key, module) pair: {pair!r}")
            self[pair[0]] = pair[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(); index it in your model's forward")
