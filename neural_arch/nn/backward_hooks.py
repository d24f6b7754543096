"""Module backward hooks (torch's ``register_full_backward_hook`` / ``register_full_backward_pre_hook``).

A full backward hook sees, once per backward through a module call, the gradients with respect to the
module's tensor inputs and outputs: ``hook(module, grad_input, grad_output)`` (a non-None return
replaces ``grad_input``); a backward pre-hook sees ``grad_output`` first (``hook(module,
grad_output)``, a non-None return replaces it). Torch wraps the call's inputs and outputs in identity
autograd nodes; so does this, installed as a forward pre-hook and a forward hook of the module (the
module's call costs nothing extra until a backward hook is registered):

* the output's identity node receives ``grad_output``, runs the pre-hooks, and keeps it for the call;
* the input's identity node receives ``grad_input`` and runs the full hooks with both.

When no input requires grad (the first layer on data), the full hooks run from the output's node
with ``grad_input`` all None, as torch's. Supported calls: at most one positional tensor input that
requires grad, and one tensor output that does (or a tuple holding one); other calls raise
``NotImplementedError`` naming the module (the core's nodes have one output each, so a node that
hands several gradients to one hook at once is not expressible yet).

Example::

    >>> import neural_arch as na
    >>> from neural_arch import nn
    >>> lin = nn.Linear(2, 1)
    >>> seen = []
    >>> h = lin.register_full_backward_hook(lambda m, gin, gout: seen.append((gin[0].shape, gout[0].shape)))
    >>> lin(na.ones(3, 2, requires_grad=True)).sum().backward()
    >>> seen
    [((3, 2), (3, 1))]
"""

from __future__ import annotations

from collections import OrderedDict

from neural_arch.core.autograd import Node, RemovableHandle, add_hook, is_grad_enabled
from neural_arch.core.op_utils import _result
from neural_arch.core.tensor import Tensor

__all__ = ["BackwardHooks"]


class _Call:
    """One forward call's backward: which input got wrapped, and the output gradient once known."""

    __slots__ = ("grad_output", "n_inputs", "position")

    def __init__(self, n_inputs: int, position: int | None):
        self.n_inputs, self.position, self.grad_output = n_inputs, position, None


class BackwardHooks:
    """The backward hooks of one module and the forward hooks that install them (module docstring).

    Example::

        hooks = BackwardHooks.of(module)        # made on the first registration
        handle = hooks.add(hook, pre=False, prepend=False)
    """

    def __init__(self, module):
        self.full: OrderedDict = OrderedDict()
        self.pre: OrderedDict = OrderedDict()
        self._pending: list = []
        module.register_forward_pre_hook(self._wrap_inputs)
        module.register_forward_hook(self._wrap_output)

    @classmethod
    def of(cls, module) -> BackwardHooks:
        hooks = module.__dict__.get("_backward_hook_state")
        if hooks is None:
            hooks = cls(module)
            object.__setattr__(module, "_backward_hook_state", hooks)
        return hooks

    def add(self, hook, pre: bool, prepend: bool) -> RemovableHandle:
        store = self.pre if pre else self.full
        handle = add_hook(store, hook)
        if prepend:
            store.move_to_end(handle._key, last=False)
        return handle

    # -- around the forward ------------------------------------------------------------------------
    def _wrap_inputs(self, module, args):
        if not (self.full or self.pre) or not is_grad_enabled():
            self._pending.append(None)
            return None
        tensors = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        wanted = [i for i in tensors if args[i].requires_grad]
        if len(wanted) > 1:
            raise NotImplementedError(
                f"{type(module).__name__}: a full backward hook on a call with {len(wanted)} inputs that require "
                "grad is not supported (one at most); hook the module that takes one of them, or use "
                "register_hook on the tensors")
        call = _Call(len(tensors), tensors.index(wanted[0]) if wanted else None)
        self._pending.append(call)
        if not wanted:
            return None
        i = wanted[0]
        x = args[i]
        wrapped = _result(x.data, Node(self._input_backward(module, call), (x,), "BackwardHookFunction",
                                       fresh=False))
        return args[:i] + (wrapped,) + args[i + 1:]

    def _wrap_output(self, module, args, out):
        call = self._pending.pop() if self._pending else None
        if call is None:
            return None
        outs = out if isinstance(out, tuple) else (out,)
        wanted = [j for j, o in enumerate(outs) if isinstance(o, Tensor) and o.requires_grad]
        if not wanted:
            return None     # nothing flows back through this call: no hook runs (as torch)
        if len(wanted) > 1:
            raise NotImplementedError(
                f"{type(module).__name__}: a full backward hook on a call with {len(wanted)} outputs that require "
                "grad is not supported (one at most); use register_hook on the outputs")
        j = wanted[0]
        y = outs[j]
        wrapped = _result(y.data, Node(self._output_backward(module, call), (y,), "BackwardHookFunction",
                                       fresh=False))
        return wrapped if not isinstance(out, tuple) else out[:j] + (wrapped,) + out[j + 1:]

    # -- in the backward -----------------------------------------------------------------------------
    def _output_backward(self, module, call: _Call):
        def fn(g):
            grad_output = (Tensor._wrap(g),)
            for hook in list(self.pre.values()):
                result = hook(module, grad_output)
                if result is not None:
                    grad_output = _checked(result, grad_output, "grad_output", module)
            call.grad_output = grad_output
            if call.position is None:       # no input requires grad: the full hooks run here
                self._run_full(module, (None,) * call.n_inputs, grad_output)
            return (grad_output[0].data,)
        return fn

    def _input_backward(self, module, call: _Call):
        def fn(g):
            grad_input = tuple(Tensor._wrap(g) if k == call.position else None for k in range(call.n_inputs))
            grad_input = self._run_full(module, grad_input, call.grad_output)
            return (grad_input[call.position].data,)
        return fn

    def _run_full(self, module, grad_input: tuple, grad_output) -> tuple:
        for hook in list(self.full.values()):
            result = hook(module, grad_input, grad_output)
            if result is not None:
                grad_input = _checked(result, grad_input, "grad_input", module)
        return grad_input


def _checked(result, before: tuple, name: str, module) -> tuple:
    """A hook's replacement for ``before``: as many entries, each None where ``before`` is, else a
    Tensor of the same shape (torch's rule)."""
    result = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if len(result) != len(before):
        raise RuntimeError(f"backward hook of {type(module).__name__} returned {len(result)} values for {name}, "
                           f"expected {len(before)}")
    for k, (new, old) in enumerate(zip(result, before)):
        if old is None:
            continue
        if not isinstance(new, Tensor) or new.shape != old.shape:
            raise RuntimeError(f"backward hook of {type(module).__name__} returned an invalid {name}[{k}]: expected "
                               f"a Tensor of shape {tuple(old.shape)}, got "
                               f"{getattr(new, 'shape', type(new).__name__)}")
    return result
