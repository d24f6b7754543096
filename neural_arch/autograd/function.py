"""``autograd.Function``: an op with a hand-written backward, as torch's.

Subclass it with two static methods, ``forward(ctx, *args)`` (runs without recording a graph; keeps
what the backward needs with ``ctx.save_for_backward``) and ``backward(ctx, *grad_outputs)`` (one
gradient per argument of ``forward``, None for the ones that get none), and call ``Fn.apply(...)``.

How it is recorded here: each Tensor output gets a node of its own, which calls ``backward`` with
that output's gradient and zeros for the others (torch's materialised gradients). A function with
several outputs whose gradients all arrive therefore has its ``backward`` called once per output and
the results summed -- the same gradients, since a backward is linear in the output gradients (a
``backward`` with side effects sees one call per output). Double backward is not supported
(``once_differentiable`` is accepted and changes nothing).

Example::

    >>> import neural_arch as na
    >>> class Exp(na.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         y = x.exp()
    ...         ctx.save_for_backward(y)
    ...         return y
    ...     @staticmethod
    ...     def backward(ctx, g):
    ...         (y,) = ctx.saved_tensors
    ...         return g * y
    >>> x = na.tensor([0.0, 1.0], requires_grad=True)
    >>> Exp.apply(x).sum().backward()
    >>> [round(v, 4) for v in x.grad.tolist()]
    [1.0, 2.7183]
"""

from __future__ import annotations

import functools

import numpy as np

from neural_arch.core.autograd import Node, is_grad_enabled, no_grad
from neural_arch.core.op_utils import _result
from neural_arch.core.tensor import Tensor

__all__ = ["Function", "FunctionCtx", "once_differentiable"]


class FunctionCtx:
    """What ``forward`` hands to ``backward`` (torch's ``ctx``): ``save_for_backward`` /
    ``saved_tensors``, ``needs_input_grad`` (per argument of ``forward``: a Tensor that requires
    grad), ``mark_non_differentiable`` and ``set_materialize_grads``; any other attribute may be set.

    Example::

        ctx = FunctionCtx()
        ctx.save_for_backward(x, y)
        ctx.saved_tensors                # (x, y)
    """

    def __init__(self):
        self.to_save: tuple = ()
        self.needs_input_grad: tuple = ()
        self.non_differentiable: tuple = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        for i, t in enumerate(tensors):
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward can only save Tensors or None, got a {type(t).__name__} at "
                                f"position {i}: keep other values as attributes of ctx")
        self.to_save = tensors

    @property
    def saved_tensors(self) -> tuple:
        return self.to_save

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable = tuple(tensors)

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    def mark_dirty(self, *tensors) -> None:
        raise NotImplementedError("ctx.mark_dirty (a Function that changes its inputs in place) is not supported: "
                                  "return a new tensor from forward instead")


def once_differentiable(fn):
    """torch's marker for a ``backward`` that cannot itself be differentiated: double backward is not
    supported here at all, so it returns ``fn`` unchanged.

    Example::

        @staticmethod
        @once_differentiable
        def backward(ctx, g): ...
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class Function:
    """Base class of an op with its own backward (module docstring).

    Example::

        class Scale(Function):
            @staticmethod
            def forward(ctx, x, k):          # k: a plain number
                ctx.k = k
                return x * k
            @staticmethod
            def backward(ctx, g):
                return g * ctx.k, None       # no gradient for k
        y = Scale.apply(x, 3.0)
    """

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward(ctx, *args) as a @staticmethod")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("a Function subclass must define backward(ctx, *grad_outputs) as a @staticmethod")

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is an autograd.Function: call {type(self).__name__}.apply(...), "
                           "do not instantiate it")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        record = is_grad_enabled() and any(ctx.needs_input_grad)
        with no_grad():
            result = cls.forward(ctx, *args, **kwargs)
        if not record:
            return result
        single = not isinstance(result, tuple)
        outs = (result,) if single else result
        positions = [i for i, o in enumerate(outs) if isinstance(o, Tensor)]
        if not positions:
            return result
        parents = tuple(a if isinstance(a, Tensor) and a.requires_grad else None for a in args)
        skip = {id(t) for t in ctx.non_differentiable}
        wrapped = list(outs)
        for k, j in enumerate(positions):
            out = outs[j]
            if id(out) in skip or out.data.dtype.kind not in "fc":
                continue        # marked, or an integer/bool output: no gradient flows through it
            node = Node(_backward_of(cls, ctx, outs, positions, k, args), parents, cls.__name__, fresh=False,
                        saved=ctx.to_save or None)
            wrapped[j] = _result(out.data, node)
        return wrapped[0] if single else tuple(wrapped)


def _backward_of(cls, ctx, outs, positions, k, args):
    """The node function of output ``positions[k]``: ``cls.backward`` with its gradient and zeros
    (or None without materialised gradients) for the other outputs, checked against the inputs."""
    def fn(g):
        grads = [Tensor(np.zeros_like(outs[j].data)) if ctx.materialize_grads else None for j in positions]
        grads[k] = Tensor(g)
        returned = cls.backward(ctx, *grads)
        returned = returned if isinstance(returned, tuple) else (returned,)
        if len(returned) != len(args):
            raise RuntimeError(f"function {cls.__name__}Backward returned an incorrect number of gradients "
                               f"(expected {len(args)}, got {len(returned)})")
        arrays = []
        for i, (a, r) in enumerate(zip(args, returned)):
            if not (isinstance(a, Tensor) and a.requires_grad) or r is None:
                arrays.append(None)
                continue
            r = r.data if isinstance(r, Tensor) else np.asarray(r)
            if r.shape != a.data.shape:
                raise RuntimeError(f"Function {cls.__name__}Backward returned an invalid gradient at index {i} - "
                                   f"got {list(r.shape)} but expected shape compatible with {list(a.data.shape)}")
            arrays.append(r)
        return tuple(arrays)
    return fn
