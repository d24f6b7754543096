"""``ParameterList`` and ``ParameterDict``: torch's containers that register a variable number of
parameters under their index or key (``"0"``, ``"1"``, ... or the dict keys), so ``parameters()``,
``state_dict()`` and optimizers see every one.

A Tensor that is not yet a :class:`~neural_arch.nn.Parameter` is wrapped in one as it goes in (torch 2.x).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> scales = nn.ParameterList([nn.Parameter(np.ones(2)) for _ in range(3)])
    >>> [name for name, _ in scales.named_parameters()]
    ['0', '1', '2']
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping

from neural_arch.core.tensor import Tensor
from neural_arch.nn.module import Module
from neural_arch.nn.parameter import Parameter

__all__ = ["ParameterDict", "ParameterList"]


def _as_parameter(value, where: str) -> Parameter:
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor):
        return Parameter(value)
    raise TypeError(f"{where}: expected a Parameter or a Tensor, got {type(value).__name__}")


class ParameterList(Module):
    """A list of parameters registered as ``"0"``, ``"1"``, ... (torch's ``nn.ParameterList``).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> params = nn.ParameterList()
        >>> _ = params.append(nn.Parameter(np.zeros(3))).extend([nn.Parameter(np.ones(1))])
        >>> len(params), params[-1].shape
        (2, (1,))
    """

    def __init__(self, values: Iterable | None = None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def _index(self, idx) -> int:
        idx = operator.index(idx)
        n = len(self._parameters)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range for ParameterList of length {n}")
        return idx % n

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._parameters.values())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return ParameterList(list(self._parameters.values())[idx])
        return self._parameters[str(self._index(idx))]

    def __setitem__(self, idx, value) -> None:
        self.register_parameter(str(self._index(idx)), _as_parameter(value, "ParameterList[...] ="))

    def append(self, value) -> ParameterList:
        """Add ``value`` at the end; returns the list (torch's chaining)."""
        self.register_parameter(str(len(self)), _as_parameter(value, "ParameterList.append"))
        return self

    def extend(self, values: Iterable) -> ParameterList:
        """Append each of ``values``; returns the list."""
        if isinstance(values, (Tensor, Mapping)) or not isinstance(values, Iterable):
            raise TypeError(f"ParameterList.extend should be called with an iterable of parameters, got "
                            f"{type(values).__name__}")
        for value in values:
            self.append(value)
        return self

    def __iadd__(self, values: Iterable):
        return self.extend(values)

    def __dir__(self):
        return [k for k in super().__dir__() if not k.isdigit()]

    def extra_repr(self) -> str:
        lines = [f"  ({k}): Parameter containing: [{p.data.dtype} of size {'x'.join(map(str, p.shape)) or '()'}]"
                 for k, p in self._parameters.items()]
        return "\n" + "\n".join(lines) + "\n" if lines else ""


class ParameterDict(Module):
    """An ordered dict of parameters registered under their keys (torch's ``nn.ParameterDict``).

    Example::

        >>> import numpy as np
        >>> from neural_arch import nn
        >>> params = nn.ParameterDict({"scale": nn.Parameter(np.ones(2)), "shift": nn.Parameter(np.zeros(2))})
        >>> list(params.keys()), sorted(params.state_dict())
        (['scale', 'shift'], ['scale', 'shift'])
    """

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, value) -> None:
        if not isinstance(key, str) or not key or "." in key:
            raise KeyError(f"ParameterDict keys must be non-empty strings without '.', got {key!r}")
        self.register_parameter(key, _as_parameter(value, f"ParameterDict[{key!r}] ="))

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def __contains__(self, key) -> bool:
        return key in self._parameters

    def keys(self):
        return self._parameters.keys()

    def values(self):
        return self._parameters.values()

    def items(self):
        return self._parameters.items()

    def get(self, key: str, default=None):
        return self._parameters.get(key, default)

    def pop(self, key: str) -> Parameter:
        return self._parameters.pop(key)

    def clear(self) -> None:
        """Remove every parameter."""
        self._parameters.clear()

    def update(self, parameters) -> None:
        """Add or replace parameters from a mapping, a ``ParameterDict`` or an iterable of ``(key, value)``
        pairs."""
        if isinstance(parameters, (Mapping, ParameterDict)):
            items = parameters.items()
        else:
            items = []
            for i, pair in enumerate(parameters):
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise ValueError(f"ParameterDict.update: element #{i} should be a (key, value) pair, got "
                                     f"{pair!r}")
                items.append(pair)
        for key, value in items:
            self[key] = value

    def extra_repr(self) -> str:
        lines = [f"  ({k}): Parameter containing: [{p.data.dtype} of size {'x'.join(map(str, p.shape)) or '()'}]"
                 for k, p in self._parameters.items()]
        return "\n" + "\n".join(lines) + "\n" if lines else ""
