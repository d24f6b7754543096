"""Split backward for zero-bubble schedules: input gradients in ``B``, weight gradients in ``W``.

The autograd core computes every input of a node in one closure, so "backward without the
weight gradient" needs the weight gradient to be *outside* the graph. During a split stage's
forward, every plain :class:`~neural_arch.nn.linear.Linear` (the layers that hold almost all
of a GPT's or an MLP's FLOPs) is run by :func:`_deferred_linear` instead: the same forward
arithmetic, but its graph node returns only ``dL/dx = g @ W`` and records the output gradient
``g`` next to the saved input ``x``. ``W`` later computes ``dL/dW = g^T x`` and
``dL/db = sum(g)`` from those.

Why this is bitwise equal to the fused backward (GPipe / 1F1B):

* ``W`` evaluates the very expressions of ``ops_nn.linear``'s closure (``g2.T @ x2``,
  ``g2.sum(axis=0)``) on the very arrays (the saved ``x``, the ``g`` backward produced);
* a layer called several times in one forward gets its contributions summed in the order the
  engine would have run them (recorded as the deferred closures run), then added into
  ``.grad`` exactly as ``_finalize_leaf`` does (store the first, ``+=`` later ones);
* the schedules run each stage's ``W`` actions in micro-batch order, the order fused
  backwards accumulate in.

Other parameters (LayerNorm, embeddings, a subclass of ``Linear`` with its own ``forward``, a
weight with gradient hooks) keep their gradient in ``B``: still exact, just not deferred.
A weight that is also used outside its own Linear (tied weights) gets the right gradient, but
its deferred part is added after the rest, so its last bit may differ from the fused order.

Example::

    stash = WeightGradStash()
    with defer_linear_weight_grads(stage_module, stash):
        out = stage_module(x)            # Linear nodes compute input gradients only
    out.backward(grad)                   # B: input gradients, stash records the output grads
    stash.apply()                        # W: weight gradients into .grad
"""

from __future__ import annotations

import contextlib

from neural_arch.core import autograd as _ag
from neural_arch.core.autograd import Node
from neural_arch.core.op_utils import _result
from neural_arch.core.ops_nn import linear_bias_grad
from neural_arch.core.tensor import Tensor
from neural_arch.nn.linear import Linear, _as_tensor
from neural_arch.nn.module import Module


class _Call:
    """One deferred Linear call: its module, saved input array, and (after B) output gradient."""

    __slots__ = ("module", "x", "g")

    def __init__(self, module: Linear, x):
        self.module = module
        self.x = x
        self.g = None


class WeightGradStash:
    """The deferred weight gradients of one micro-batch on one stage.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.tensor import Tensor
        >>> from neural_arch.nn import Linear
        >>> layer, stash = Linear(3, 2), WeightGradStash()
        >>> with defer_linear_weight_grads(layer, stash):
        ...     out = layer(Tensor(np.ones((4, 3)), requires_grad=True))
        >>> out.sum().backward()                  # B: the input gradient only
        >>> layer.weight.grad is None, len(stash)
        (True, 1)
        >>> stash.apply()                         # W: the weight gradients
        >>> layer.weight.grad.shape
        (2, 3)
    """

    def __init__(self):
        self.calls: list[_Call] = []
        self.ran: list[_Call] = []  # calls in the order backward ran their closures

    def __len__(self) -> int:
        return len(self.calls)

    def apply(self) -> None:
        """``W``: add this micro-batch's Linear weight (and bias) gradients into ``.grad``."""
        if len(self.ran) != len(self.calls):
            missing = len(self.calls) - len(self.ran)
            raise RuntimeError(f"W before its B: {missing} of {len(self.calls)} deferred Linear calls have "
                               "no output gradient yet (run the micro-batch's backward first)")
        # one module at a time (its calls in backward order), so only one layer's weight
        # gradient is alive beyond .grad at any moment
        by_module: dict[int, list[_Call]] = {}
        for call in self.ran:
            by_module.setdefault(id(call.module), []).append(call)
        for calls in by_module.values():
            m = calls[0].module
            gw = gb = None
            for call in calls:
                g, xd = call.g, call.x
                # the expressions of ops_nn.linear's backward closure, on the same arrays
                g2 = g if g.ndim == 2 else g.reshape(-1, g.shape[-1])
                x2 = xd if xd.ndim == 2 else xd.reshape(-1, xd.shape[-1])
                gw = _sum(gw, g2.T @ x2)
                if m.bias is not None and m.bias.requires_grad:
                    gb = _sum(gb, linear_bias_grad(g2))
                call.g = call.x = None
            _into_grad(m.weight, gw)
            if gb is not None:
                _into_grad(m.bias, gb)
        self.calls.clear()
        self.ran.clear()


def _sum(total, g):
    if total is None:
        return g
    total += g  # fresh arrays: in place, as the engine's leaf buffer does
    return total


def _into_grad(param, g) -> None:
    # what the engine's _finalize_leaf does with a leaf's summed gradient
    if g.dtype != param.data.dtype:
        g = g.astype(param.data.dtype)
    if param._grad is None:
        param._grad = Tensor._wrap(g)   # freshly computed here: no copy needed
    else:
        param._grad.data += g


def _deferrable(m: Module) -> bool:
    if not isinstance(m, Linear) or type(m).forward is not Linear.forward or "forward" in vars(m):
        return False
    w, b = m.weight, m.bias
    params = [w] if b is None else [w, b]
    # hooks on a parameter must see its gradient inside backward; leave such layers fused
    return w.requires_grad and all(not p._hooks and not p._post_hooks for p in params)


def _deferred_linear(m: Linear, x, stash: WeightGradStash) -> Tensor:
    x = _as_tensor(x)
    weight, bias = m.weight, m.bias
    xd, wd = x.data, weight.data
    if xd.shape[-1] != wd.shape[1] or not _ag.is_grad_enabled():
        return Linear.forward(m, x)  # the ordinary path raises the ordinary error / records nothing
    out = xd @ wd.T
    if bias is not None:
        out += bias.data
    rx = x.requires_grad
    call = _Call(m, xd)
    stash.calls.append(call)

    def fn(g):
        call.g = g
        stash.ran.append(call)
        return ((g @ wd) if rx else None), None

    # the weight is a parent that receives nothing: the output still requires grad when x does
    # not (a stage's first layer), and the engine leaves the weight's .grad alone
    return _result(out, Node(fn, (x if rx else None, weight), "LinearInputGrad", saved=(x,)))


@contextlib.contextmanager
def defer_linear_weight_grads(module: Module, stash: WeightGradStash):
    """Within the block, plain Linear layers of ``module`` record into ``stash`` (see module doc).

    Example::

        stash = WeightGradStash()
        with defer_linear_weight_grads(stage_module, stash):
            out = stage_module(x)
        out.backward(grad)                        # B
        stash.apply()                             # W, later, in an idle slot
    """
    patched = []
    try:
        for m in module.modules():
            if _deferrable(m):
                object.__setattr__(m, "forward", lambda x, m=m: _deferred_linear(m, x, stash))
                patched.append(m)
        yield stash
    finally:
        for m in patched:
            vars(m).pop("forward", None)


__all__ = ["WeightGradStash", "defer_linear_weight_grads"]
