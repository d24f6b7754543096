"""Activation checkpointing: trade compute for memory (torch's ``torch.utils.checkpoint``).

``checkpoint(fn, *args)`` runs ``fn`` **without** recording a graph (so none of its
intermediate activations are kept), and returns outputs that still require grad. When backward
reaches them, ``fn`` is run again on the saved inputs with the graph on, and the gradient is
back-propagated through that recomputation (a nested backward: parameters used inside ``fn``
get their ``.grad`` there). The global random state (``neural_arch.core.rng``) is saved
before the first run and restored for the recomputation, so dropout draws the same masks:
gradients equal the non-checkpointed ones.

``use_reentrant`` is accepted (True/False/None) for torch compatibility; both give the same
recompute-in-backward here. Only the NumPy generator's state is preserved (CuPy's global
RandomState has no state getter): on the GPU, dropout inside a checkpoint recomputes different
masks (use ``preserve_rng_state`` there only with p=0).

Example::

    >>> import numpy as np
    >>> from neural_arch import nn
    >>> from neural_arch.core.tensor import Tensor
    >>> from neural_arch.utils.checkpoint import checkpoint
    >>> block = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    >>> x = Tensor(np.ones((2, 4), dtype=np.float32), requires_grad=True)
    >>> checkpoint(block, x, use_reentrant=False).sum().backward()
    >>> x.grad.shape, block[0].weight.grad is not None
    ((2, 4), True)
"""

from __future__ import annotations

import contextlib

from neural_arch.core import autocast_state
from neural_arch.core import rng as _rng
from neural_arch.core.autograd import Node, enable_grad, is_backward_running, is_grad_enabled, no_grad
from neural_arch.core.tensor import Tensor

__all__ = [
    "CheckpointWrapper",
    "apply_activation_checkpointing",
    "checkpoint",
    "checkpoint_scope",
    "checkpoint_sequential",
    "checkpoint_wrapper",
    "is_checkpointing_enabled",
]


def _get_rng_state():
    return _rng.get_generator().bit_generator.state


def _set_rng_state(state) -> None:
    _rng.get_generator().bit_generator.state = state


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state: bool = True, context_fn=None,
               determinism_check: str = "default", debug: bool = False, **kwargs):
    """Run ``function(*args, **kwargs)`` keeping no activations; recompute them in backward.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import checkpoint
        >>> layer = nn.Linear(4, 4)
        >>> y = checkpoint(layer, na.ones(2, 4), use_reentrant=False)   # activations recomputed in backward
        >>> y.sum().backward()
        >>> layer.weight.grad.shape
        (4, 4)
    """
    if not callable(function):
        raise TypeError(f"checkpoint(function, ...): function must be callable, got {type(function).__name__}")
    if use_reentrant not in (None, True, False):
        raise TypeError(f"checkpoint: use_reentrant must be True, False or None, got {use_reentrant!r}")
    if context_fn is not None:
        raise NotImplementedError("checkpoint(context_fn=...) is not implemented")
    if not is_grad_enabled():
        return function(*args, **kwargs)
    state = _get_rng_state() if preserve_rng_state else None
    cast = autocast_state.current()
    with no_grad():
        out = function(*args, **kwargs)
    single = isinstance(out, Tensor)
    outs = (out,) if single else out
    if not isinstance(outs, (tuple, list)):
        raise TypeError(f"checkpoint: function must return a Tensor or a tuple/list of Tensors, got {type(out).__name__}")
    # every Tensor among the arguments, keyword arguments and lists/tuples/dicts of them (torch's
    # non-reentrant checkpoint takes them all): each is a fresh leaf in the recomputation, so the
    # nested backward stops there and hands its gradient to the outer graph
    tensors: list[Tensor] = []
    template = _take_tensors((args, kwargs), tensors)
    parents = tuple(t if t.requires_grad else None for t in tensors)

    def make_backward(k: int):
        def backward(g):
            now = _get_rng_state() if state is not None else None
            if state is not None:
                _set_rng_state(state)
            leaves = []
            for t in tensors:
                leaf = Tensor._wrap(t.data)
                leaf.requires_grad = t.requires_grad
                leaves.append(leaf)
            inputs, kw = _put_tensors(template, leaves)
            try:
                # the forward's autocast region, whatever is open around backward: the recomputed
                # graph must be the one the first run built (torch restores it likewise)
                with enable_grad(), autocast_state.restore(cast):
                    redo = function(*inputs, **kw)
            finally:
                if now is not None:
                    _set_rng_state(now)
            target = redo if single else redo[k]
            if isinstance(target, Tensor) and target.requires_grad:
                target.backward(Tensor._wrap(g))
            return tuple(leaf.grad.data if leaf.grad is not None else None for leaf in leaves)
        return backward

    results = []
    for k, o in enumerate(outs):
        if isinstance(o, Tensor) and o.is_floating_point():
            t = Tensor._wrap(o.data)
            t.grad_fn = Node(make_backward(k), parents, "Checkpoint", saved=tuple(tensors))
            t.requires_grad = True
            results.append(t)
        else:
            results.append(o)
    return results[0] if single else type(outs)(results)


class _Slot:
    """Where the ``index``-th Tensor of a checkpoint's arguments goes back."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _take_tensors(x, found: list):
    """``x`` with each Tensor (also inside lists, tuples and dicts) replaced by a :class:`_Slot`."""
    if isinstance(x, Tensor):
        found.append(x)
        return _Slot(len(found) - 1)
    if isinstance(x, dict):
        return type(x)((k, _take_tensors(v, found)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
        items = [_take_tensors(v, found) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)   # a namedtuple takes fields
    return x


def _put_tensors(template, tensors: list):
    """The inverse of :func:`_take_tensors`, with ``tensors`` in the slots."""
    if isinstance(template, _Slot):
        return tensors[template.index]
    if isinstance(template, dict):
        return type(template)((k, _put_tensors(v, tensors)) for k, v in template.items())
    if isinstance(template, (list, tuple)):
        items = [_put_tensors(v, tensors) for v in template]
        return type(template)(*items) if hasattr(template, "_fields") else type(template)(items)
    return template


def checkpoint_sequential(functions, segments: int, input, use_reentrant=None, **kwargs):
    """Split ``functions`` (a Sequential or a list of modules) into ``segments`` chunks; checkpoint
    every chunk but the last (whose activations backward needs right away), as torch does.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import checkpoint_sequential
        >>> model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
        >>> checkpoint_sequential(model, 2, na.ones(3, 4), use_reentrant=False).shape
        (3, 4)
    """
    fns = list(functions.children()) if hasattr(functions, "children") else list(functions)
    if not fns:
        raise ValueError("checkpoint_sequential: functions is empty")
    if not 1 <= int(segments) <= len(fns):
        raise ValueError(f"checkpoint_sequential: segments must be in [1, {len(fns)}], got {segments}")
    size = -(-len(fns) // int(segments))

    def run(chunk):
        def f(x):
            for fn in chunk:
                x = fn(x)
            return x
        return f

    chunks = [fns[i:i + size] for i in range(0, len(fns), size)]
    x = input
    for chunk in chunks[:-1]:
        x = checkpoint(run(chunk), x, use_reentrant=use_reentrant, **kwargs)
    return run(chunks[-1])(x)


class CheckpointWrapper:
    """Marks a module whose ``forward`` was replaced by a checkpointed one (see :func:`checkpoint_wrapper`).

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import CheckpointWrapper, checkpoint_wrapper
        >>> layer = checkpoint_wrapper(nn.Linear(4, 4))
        >>> isinstance(layer, CheckpointWrapper) or hasattr(layer, "_checkpoint_wrapper")
        True
    """

    def __init__(self, module, orig_forward):
        self.module, self.orig_forward = module, orig_forward

    def unwrap(self) -> None:
        self.module.__dict__.pop("forward", None)
        self.module.__dict__.pop("_checkpoint_wrapper", None)


def checkpoint_wrapper(module, only_if=None, **checkpoint_kwargs):
    """Make ``module(...)`` run under :func:`checkpoint` (in place; returns the module).

    Hooks (e.g. FSDP's gather) still run around the call, and again in the recomputation.
    ``only_if``: a zero-argument callable consulted at each call (e.g. "inside a checkpoint scope").

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import checkpoint_wrapper
        >>> layer = checkpoint_wrapper(nn.Linear(4, 4))
        >>> layer(na.ones(2, 4)).sum().backward()
        >>> layer.weight.grad.shape
        (4, 4)
    """
    if "_checkpoint_wrapper" in module.__dict__:
        return module
    orig = type(module).forward.__get__(module)

    def run(*args, **kwargs):
        # In the first run Module.__call__ has already run the hooks around forward; in the
        # recomputation (inside backward) nobody has: run them, so e.g. FSDP re-gathers the
        # unit's parameters and frees them again.
        if not is_backward_running():
            return orig(*args, **kwargs)
        # for their side effects only (FSDP's re-gather and free), through the module's own hook runner
        # (hooks registered with_kwargs get (args, kwargs)): what they return was applied around the
        # first forward, outside this function -- applied again, the recomputation would differ from it
        module._call_forward_pre_hooks(args, kwargs)
        out = orig(*args, **kwargs)
        module._call_forward_hooks(args, kwargs, out)
        return out

    def forward(*args, **kwargs):
        if only_if is not None and not only_if():
            return orig(*args, **kwargs)
        return checkpoint(run, *args, **checkpoint_kwargs, **kwargs)

    object.__setattr__(module, "forward", forward)
    object.__setattr__(module, "_checkpoint_wrapper", CheckpointWrapper(module, orig))
    return module


def apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: True,
                                   auto_wrap_policy=None):
    """Checkpoint every submodule of ``model`` for which ``check_fn(submodule)`` is True (torch's name).

    Example: ``apply_activation_checkpointing(gpt, check_fn=lambda m: isinstance(m, nn.TransformerBlock))``.
    Returns the list of wrapped modules.

    Example::

        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import apply_activation_checkpointing
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        >>> len(apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, nn.Linear)))
        2
    """
    wrapped = []
    for _, m in model.named_modules():
        if m is not model and check_fn(m):
            checkpoint_wrapper_fn(m)
            wrapped.append(m)
    return wrapped


# -- seed 002's scope: checkpoint a model's blocks while a `with` block is open ------------------
#: how many checkpoint_scope blocks are open (modules wrapped with only_if=is_checkpointing_enabled
#: consult it)
_depth = 0


def is_checkpointing_enabled() -> bool:
    """True inside a :func:`checkpoint_scope`.

    Example::

        >>> from neural_arch.utils.checkpoint import checkpoint_scope, is_checkpointing_enabled
        >>> with checkpoint_scope():
        ...     is_checkpointing_enabled()
        True
        >>> is_checkpointing_enabled()
        False
    """
    return _depth > 0


def _default_targets(model):
    from neural_arch.nn.container import ModuleList

    lists = [m for _, m in model.named_modules() if isinstance(m, ModuleList)]
    if lists:
        return [child for ml in lists for child in ml.children()]
    return list(model.children())


@contextlib.contextmanager
def checkpoint_scope(model=None, check_fn=None):
    """Checkpoint ``model``'s blocks while the scope is open.

    The blocks: every element of the model's ``ModuleList``s (a GPT's transformer blocks), else its
    direct children; ``check_fn(module) -> bool`` picks them instead. Without ``model`` (seed 002's
    ``with checkpoint_scope(): output = ddp_model(batch)``) the model is the first module called in
    the scope: its blocks are wrapped just before its forward runs. Backward may run inside the scope
    or after it: wrapped blocks keep their checkpointed outputs either way.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch import nn
        >>> from neural_arch.utils.checkpoint import checkpoint_scope
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        >>> with checkpoint_scope():                 # the model is the first module called
        ...     model(na.ones(2, 4)).sum().backward()
        >>> model[0].weight.grad.shape
        (4, 4)
    """
    global _depth
    wrapped = []

    def wrap(target_model) -> None:
        targets = ([m for _, m in target_model.named_modules() if m is not target_model and check_fn(m)]
                   if check_fn is not None else _default_targets(target_model))
        for m in targets:
            if "_checkpoint_wrapper" not in m.__dict__:
                checkpoint_wrapper(m)
                wrapped.append(m)

    handle = None
    if model is not None:
        wrap(model)
    else:
        from neural_arch.nn.module import register_module_forward_pre_hook

        def first_call(module, args):
            handle.remove()          # only the outermost module of the first call is the model
            wrap(module)

        handle = register_module_forward_pre_hook(first_call)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if handle is not None:
            handle.remove()
        for m in wrapped:
            m.__dict__["_checkpoint_wrapper"].unwrap()
