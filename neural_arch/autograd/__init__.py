"""``neural_arch.autograd``: torch's ``torch.autograd`` names -- ``grad``, ``backward``, ``Function``
(custom ops with their own backward) and the grad-mode switches.

:func:`grad` returns the gradients of ``outputs`` with respect to ``inputs`` without touching any
``.grad`` (nor the gradient hooks that run when a leaf's ``.grad`` is accumulated, such as DDP's):
an input gradient for a saliency map, a gradient norm penalty's first half, the gradient of a loss
with respect to an activation. Higher-order gradients (``create_graph=True``) are not supported: the
core's backward formulas compute on arrays, so such a gradient would carry no graph; it raises.

Example::

    >>> import neural_arch as na
    >>> x = na.tensor([1.0, 2.0], requires_grad=True)
    >>> y = (x * x).sum()
    >>> (gx,) = na.autograd.grad(y, x)
    >>> gx.tolist(), x.grad is None
    ([2.0, 4.0], True)
"""

from __future__ import annotations

import numpy as np

from neural_arch import backend as _backend
from neural_arch.autograd.function import Function, FunctionCtx, once_differentiable
from neural_arch.core.autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from neural_arch.core.tensor import Tensor

__all__ = ["Function", "FunctionCtx", "backward", "enable_grad", "grad", "inference_mode", "is_grad_enabled",
           "no_grad", "once_differentiable", "set_grad_enabled"]

_NO_CREATE_GRAPH = ("create_graph=True: higher-order gradients are not supported here (the backward formulas "
                    "compute on arrays, so the gradient would have no graph); compute the second derivative "
                    "analytically or by finite differences of first derivatives")


def _as_tensors(value, name: str) -> tuple:
    items = (value,) if isinstance(value, Tensor) else tuple(value)
    for i, t in enumerate(items):
        if not isinstance(t, Tensor):
            raise TypeError(f"autograd: {name}[{i}] is a {type(t).__name__}, not a Tensor")
    return items


def _root(outputs: tuple, grad_outputs) -> tuple:
    """``(root, gradient)``: one output and its gradient as they are, several as one scalar
    ``sum_i (output_i * grad_output_i).sum()`` (the same gradients: backward is linear)."""
    if grad_outputs is None:
        grad_outputs = (None,) * len(outputs)
    else:
        grad_outputs = (grad_outputs,) if isinstance(grad_outputs, (Tensor, np.ndarray)) else tuple(grad_outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"autograd: grad_outputs has {len(grad_outputs)} entries but there are "
                           f"{len(outputs)} outputs")
    for i, out in enumerate(outputs):
        if not out.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if grad_outputs[i] is None and out.data.size != 1:
            raise RuntimeError(f"grad can be implicitly created only for scalar outputs (output {i} has shape "
                               f"{tuple(out.shape)}): pass grad_outputs")
    if len(outputs) == 1:
        return outputs[0], grad_outputs[0]
    with enable_grad():
        total = None
        for out, g in zip(outputs, grad_outputs):
            g = 1.0 if g is None else (g.data if isinstance(g, Tensor) else g)
            xp = _backend.get_array_module(out.data)      # (a device output's gradient stays on its device)
            part = (out * Tensor._wrap(xp.asarray(g, dtype=out.data.dtype))).sum()
            total = part if total is None else total + part
    return total, None


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None, create_graph: bool = False,
         only_inputs: bool = True, allow_unused: bool | None = None, is_grads_batched: bool = False,
         materialize_grads: bool = False) -> tuple:
    """torch's ``autograd.grad``: the gradients of ``outputs`` with respect to each of ``inputs``, as a
    tuple of Tensors, leaving every ``.grad`` as it was.

    ``grad_outputs``: the gradient of each output (None: 1 for a single-element output). The graph
    is freed afterwards unless ``retain_graph=True``. An input the outputs do not depend on is an
    error unless ``allow_unused=True`` (then None, or zeros with ``materialize_grads=True``).
    Tensor hooks (``register_hook``) on the way run as in ``backward``; hooks that run when a leaf's
    ``.grad`` is accumulated do not (nothing is accumulated).

    Example::

        >>> import neural_arch as na
        >>> a = na.tensor([1.0, 2.0], requires_grad=True)
        >>> h = a * 3
        >>> out = (h * h).sum()
        >>> [g.tolist() for g in na.autograd.grad(out, [a, h], retain_graph=True)]
        [[18.0, 36.0], [6.0, 12.0]]
    """
    if create_graph:
        raise NotImplementedError(f"autograd.grad({_NO_CREATE_GRAPH})")
    if is_grads_batched:
        raise NotImplementedError("autograd.grad(is_grads_batched=True) is not supported; call grad once per "
                                  "row of grad_outputs")
    if allow_unused is None:
        allow_unused = bool(materialize_grads)
    elif materialize_grads and not allow_unused:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, but "
                         "got: allow_unused=False.")
    outputs = _as_tensors(outputs, "outputs")
    inputs = _as_tensors(inputs, "inputs")
    if not inputs:
        raise RuntimeError("grad requires non-empty inputs.")
    for i, t in enumerate(inputs):
        if not t.requires_grad:
            raise RuntimeError(f"One of the differentiated Tensors (inputs[{i}]) does not require grad")
    unique = list({id(t): t for t in inputs}.values())
    root, gradient = _root(outputs, grad_outputs)
    # nothing accumulates anywhere: each input's .grad and post-accumulate hooks are set aside
    kept = [(t, t._grad, t._post_hooks) for t in unique]
    for t in unique:
        t._grad, t._post_hooks = None, None
    try:
        root.backward(gradient=gradient, retain_graph=bool(retain_graph), inputs=unique)
        found = {id(t): t._grad for t in unique}
    finally:
        for t, g, hooks in kept:
            t._grad, t._post_hooks = g, hooks
    result = []
    for i, t in enumerate(inputs):
        g = found[id(t)]
        if g is None:
            if not allow_unused:
                raise RuntimeError(f"One of the differentiated Tensors (inputs[{i}]) appears to not have been "
                                   "used in the graph. Set allow_unused=True if this is the desired behavior.")
            if materialize_grads:
                g = Tensor(np.zeros_like(t.data))
        result.append(g)
    return tuple(result)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None, create_graph: bool = False,
             inputs=None) -> None:
    """torch's ``autograd.backward``: accumulate into ``.grad`` the gradients of ``tensors`` (one or
    several outputs, each with its gradient in ``grad_tensors``), as ``Tensor.backward`` does for one.

    Example::

        >>> import neural_arch as na
        >>> x = na.tensor([1.0, 2.0], requires_grad=True)
        >>> na.autograd.backward([x.sum(), (x * x).sum()])
        >>> x.grad.tolist()
        [3.0, 5.0]
    """
    if create_graph:
        raise NotImplementedError(f"autograd.backward({_NO_CREATE_GRAPH})")
    root, gradient = _root(_as_tensors(tensors, "tensors"), grad_tensors)
    root.backward(gradient=gradient, retain_graph=bool(retain_graph), inputs=inputs)
