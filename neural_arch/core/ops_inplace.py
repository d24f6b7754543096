"""In-place ops: ``add_``, ``sub_``, ``mul_``, ``div_``, ``clamp_``, ``zero_``, ``fill_``, ``copy_``
and the augmented operators ``+=``, ``-=``, ``*=``, ``/=``.

The rules are torch's, as far as a graph made of tensor references allows:

* no graph involved (the tensor needs no gradient, or grad mode is off, as in an optimizer step):
  the array is changed in place, so every alias of it sees the change;
* a leaf that requires grad, with grad mode on: ``RuntimeError``, as in torch (write to it under
  ``neural_arch.no_grad()``, or build a new tensor);
* a tensor produced by a recorded op (a non-leaf): ``t += x`` rebinds ``t`` to the out-of-place
  result, which gives the right gradients; the method forms (``t.add_(x)``) raise, because the
  graph here links tensors rather than tensor versions, so mutating ``t`` would corrupt the
  gradients of every op that already used it;
* a constant updated from a tensor that requires grad (``acc = zeros(3); acc += w``): ``acc``
  becomes that op's output (a non-leaf requiring grad), as in torch.

Every in-place write bumps the tensor's version counter (``t._version``, shared with every view
of the same memory, :func:`neural_arch.core.autograd.bump_version`): an op that saved a constant
for its backward refuses to run that backward once the constant was changed, with torch's
"modified by an inplace operation" error. Writes through ``.data`` (``t.data[...] = v``, NumPy
calls on the array) are not counted, as in torch.

Example::

    >>> import neural_arch as na
    >>> t = na.zeros(3)
    >>> alias = t
    >>> t += 1                      # in place: the alias sees it
    >>> alias.tolist()
    [1.0, 1.0, 1.0]
    >>> w = na.ones(2, requires_grad=True)
    >>> with na.no_grad():
    ...     _ = w.mul_(3)           # optimizer-style update of a parameter
    >>> w.tolist()
    [3.0, 3.0]
"""

from __future__ import annotations

from .. import backend as _backend
from . import autograd as _ag
from . import ops_basic as _ob
from .op_utils import _SCALARS, _operand
from .tensor import Tensor

_LEAF_MSG = (
    "a leaf tensor that requires grad is being used in an in-place operation ({op}); do the "
    "update under `with neural_arch.no_grad():` (as optimizers and initialisers do), or build a "
    "new tensor instead: `{alt}`"
)
_NONLEAF_MSG = (
    "in-place {op} on a tensor produced by a recorded op is not supported here: the autograd "
    "graph refers to this tensor, so changing it would corrupt the gradients of the ops that "
    "already used it; build a new tensor instead: `{alt}` (or detach() first)"
)


def _refuse_graph_tensor(t: Tensor, op: str, alt: str) -> None:
    """Raise torch's error for in-place changes to a tensor that autograd tracks."""
    if _ag._grad_mode.enabled and t.requires_grad:
        msg = _LEAF_MSG if t.grad_fn is None else _NONLEAF_MSG
        raise RuntimeError(msg.format(op=op, alt=alt))


def _records(t: Tensor, other) -> bool:
    """True when updating constant ``t`` from ``other`` must be recorded (other requires grad)."""
    return _ag._grad_mode.enabled and isinstance(other, Tensor) and other.requires_grad


def _adopt(t: Tensor, out: Tensor) -> Tensor:
    """Make the constant ``t`` become ``out``, graph node included (torch's in-place on a constant).

    No node refers to a constant, so it can take over ``out``'s history. Rebinding the array
    (rather than writing into it) keeps any array an earlier op saved for backward intact.
    """
    # torch counts this as one in-place write of t: the new array carries the old count plus one
    _ag.bump_version(out.data, to=_ag.version_of(t.data) + 1)
    t.data = out.data
    t.grad_fn = out.grad_fn
    t.requires_grad = out.requires_grad
    return t


def _binary(op: str, sym: str, fn, ufunc_name: str):
    alt = f"t = t {sym} x"

    def method(self: Tensor, other, *, alpha=None) -> Tensor:
        if alpha is not None and alpha != 1:
            other = other * alpha
        _refuse_graph_tensor(self, op, alt)
        if _records(self, other):
            return _adopt(self, fn(self, other))
        arr = self.data
        xp = _backend.get_array_module(arr)
        try:
            getattr(xp, ufunc_name)(arr, _operand(self, other)[0], out=arr)
        except TypeError as exc:  # NumPy's UFuncTypeError: e.g. an int tensor /= 2
            raise RuntimeError(
                f"{op}: the result cannot be stored in this {arr.dtype} tensor ({exc}); write "
                f"`t = t {sym} x` to get a new tensor of the promoted dtype"
            ) from None
        _ag.bump_version(arr)
        return self

    method.__name__ = op
    result = {"+": "3.0", "-": "-1.0", "*": "2.0", "/": "0.5"}[sym]     # 1 {sym}= 1 * 2
    method.__doc__ = (
        f"``self {sym}= other`` in place (``alpha`` scales ``other`` first); returns self.\n\n"
        f"Example::\n\n"
        f"    >>> import neural_arch as na\n"
        f"    >>> na.ones(2).{op}(1, alpha=2).tolist()\n"
        f"    [{result}, {result}]\n"
    )
    return method


add_ = _binary("add_", "+", _ob.add, "add")
sub_ = _binary("sub_", "-", _ob.sub, "subtract")
mul_ = _binary("mul_", "*", _ob.mul, "multiply")
div_ = _binary("div_", "/", _ob.div, "true_divide")


def _augmented(name: str, fn, method):
    def iop(self: Tensor, other):
        if _ag._grad_mode.enabled and (self.grad_fn is not None or _records(self, other)):
            # Python rebinds the name to what we return: the out-of-place result has torch's
            # value and gradient (only other aliases of the old tensor do not see the change).
            return fn(self, other)
        return method(self, other)  # in place; raises for a leaf that requires grad

    iop.__name__ = name
    return iop


def clamp_(self: Tensor, min=None, max=None) -> Tensor:
    """Clamp into ``[min, max]`` in place; returns self.

    Example::

        >>> import neural_arch as na
        >>> na.tensor([-1.0, 2.0]).clamp_(0.0, 1.0).tolist()
        [0.0, 1.0]
    """
    if min is None and max is None:
        raise ValueError("clamp_: give at least one of min= or max=")
    _refuse_graph_tensor(self, "clamp_", "t = t.clamp(min, max)")
    xp = _backend.get_array_module(self.data)
    lo = min.data if isinstance(min, Tensor) else min
    hi = max.data if isinstance(max, Tensor) else max
    if lo is not None:
        xp.maximum(self.data, lo, out=self.data)
    if hi is not None:
        xp.minimum(self.data, hi, out=self.data)
    _ag.bump_version(self.data)
    return self


def zero_(self: Tensor) -> Tensor:
    """Fill with zeros in place; returns self.

    Example::

        >>> import neural_arch as na
        >>> na.ones(2).zero_().tolist()
        [0.0, 0.0]
    """
    _refuse_graph_tensor(self, "zero_", "t = neural_arch.zeros_like(t)")
    self.data[...] = 0
    _ag.bump_version(self.data)
    return self


def fill_(self: Tensor, value) -> Tensor:
    """Fill with ``value`` (a number or a one-element tensor) in place; returns self.

    Example::

        >>> import neural_arch as na
        >>> na.zeros(2).fill_(7).tolist()
        [7.0, 7.0]
    """
    _refuse_graph_tensor(self, "fill_", "t = neural_arch.full_like(t, value)")
    self.data[...] = value.data if isinstance(value, Tensor) else value
    _ag.bump_version(self.data)
    return self


def copy_(self: Tensor, src) -> Tensor:
    """Copy ``src`` (Tensor or array, broadcastable, any device or dtype) into this tensor.

    Differentiable with respect to ``src`` like torch: copying a tensor that requires grad into a
    constant makes the constant a non-leaf whose gradient flows back to ``src``.

    Example::

        >>> import numpy as np
        >>> import neural_arch as na
        >>> na.zeros(2).copy_(np.array([1, 2])).tolist()
        [1.0, 2.0]
    """
    from .ops_shape import astype, broadcast_to, clone, to_device

    _refuse_graph_tensor(self, "copy_", "t = src.clone()")
    if _records(self, src):
        out = broadcast_to(astype(to_device(src, self.device), self.data.dtype), self.data.shape)
        return _adopt(self, clone(out))
    arr = src.data if isinstance(src, Tensor) else src
    if not isinstance(arr, _SCALARS) and _backend.device_of(arr) != self.device:
        arr = _backend.to_device(arr, self.device)
    self.data[...] = arr
    _ag.bump_version(self.data)
    return self


def _bind_methods(T) -> None:
    T.add_, T.sub_, T.mul_, T.div_ = add_, sub_, mul_, div_
    T.clamp_ = T.clip_ = clamp_
    T.zero_, T.fill_, T.copy_ = zero_, fill_, copy_
    T.__iadd__ = _augmented("__iadd__", _ob.add, add_)
    T.__isub__ = _augmented("__isub__", _ob.sub, sub_)
    T.__imul__ = _augmented("__imul__", _ob.mul, mul_)
    T.__itruediv__ = _augmented("__itruediv__", _ob.div, div_)
