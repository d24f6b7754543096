"""Elementwise unary ops on a DTensor (torch's ``_ops/_pointwise_ops.py``).

Rule: the op runs on the local piece and the output keeps the input's placements: an elementwise
op commutes with any cut of the tensor (``Shard``) and with copies (``Replicate``). A ``Partial``
input is a sum of terms, and ``f(a + b) != f(a) + f(b)`` for these nonlinear ops: that raises
(``neg`` is linear and keeps ``Partial``).

Example::

    y = dt.gelu()            # dt Shard(0): y Shard(0), y.full_tensor() == gelu(x)
"""

from __future__ import annotations

from neural_arch.core import ops_activation as _act
from neural_arch.distributed.tensor._api import DTensor
from neural_arch.distributed.tensor._sharding_rules import has_partial, no_rule

__all__ = ["UNARY_OPS", "unary"]

# name -> (core op, linear?)
UNARY_OPS = {
    "exp": (_act.exp, False), "log": (_act.log, False), "sqrt": (_act.sqrt, False),
    "abs": (_act.abs, False), "tanh": (_act.tanh, False), "sigmoid": (_act.sigmoid, False),
    "relu": (_act.relu, False), "gelu": (_act.gelu, False), "silu": (_act.silu, False),
    "neg": (lambda t: -t, True),
}


def unary(name: str, x: DTensor, *args, **kwargs) -> DTensor:
    """``name`` (a key of ``UNARY_OPS``) applied to ``x``'s local piece; placements kept."""
    fn, linear = UNARY_OPS[name]
    if has_partial(x.placements) and not linear:
        no_rule(f"{name}()", x, why="a nonlinear op of a Partial sum is not the sum of the op's terms")
    return DTensor(fn(x._local_tensor, *args, **kwargs), x.device_mesh, x.placements, shape=x.shape)


def _method(name: str):
    def method(self, *args, **kwargs):
        return unary(name, self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = (f"Elementwise ``{name}`` of the global tensor, computed on the local piece; the "
                      f"placements are kept (a ``Partial`` input raises unless the op is linear).\n\n"
                      f"Example::\n\n    dt.{name}().full_tensor()   # == the full tensor's {name}\n")
    return method


def bind(cls) -> None:
    for name in UNARY_OPS:
        if name != "neg":  # __neg__ is DTensor's own
            setattr(cls, name, _method(name))
