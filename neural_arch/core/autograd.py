"""The autograd engine: grad mode, graph nodes, hooks and the (iterative) backward pass.

Every differentiable op records one :class:`Node` holding a closure ``fn(grad) -> tuple`` that
maps the gradient of its output to gradients of its parents (raw arrays, ``None`` where a parent
gets nothing). :func:`run_backward` walks the graph without recursion, so a 10,000-op chain is
fine, in the order PyTorch uses: among ready nodes the most recently created one runs first.
That order finishes the gradients of the *last* layers first, which is what lets DDP start
reducing them while backward is still running.

Grad mode (``no_grad``, ``set_grad_enabled``, ``inference_mode``) is per thread, as in torch:
one thread's ``no_grad`` (or a backward running there) leaves another thread's recording alone,
and a new thread starts with grad enabled.

Example::

    >>> from neural_arch.core.tensor import Tensor, no_grad
    >>> x = Tensor([1.0, 2.0], requires_grad=True)
    >>> (x * x).sum().backward()
    >>> x.grad.tolist()
    [2.0, 4.0]
    >>> with no_grad():
    ...     y = x * 2
    >>> y.requires_grad
    False
"""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import threading
import weakref

import numpy as np

__all__ = [
    "no_grad",
    "enable_grad",
    "inference_mode",
    "set_grad_enabled",
    "is_grad_enabled",
    "queue_callback",
    "is_backward_running",
    "Node",
    "RemovableHandle",
    "version_of",
    "bump_version",
    "run_backward",
]

class _GradModeState(threading.local):
    """Grad mode, one per thread as in torch: a thread's ``no_grad`` (an evaluation or logging
    thread, a user callback on a background thread) must not stop another thread's forward from
    recording -- with one process-wide switch, the ops that ran in that window silently dropped
    out of the graph and their share of the gradient was lost. A new thread starts enabled."""

    enabled = True


#: read by every op (``_grad_mode.enabled``); a thread-local attribute costs a few tens of
#: nanoseconds more than a module global
_grad_mode = _GradModeState()


def is_grad_enabled() -> bool:
    """True when ops record the graph (the default).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import is_grad_enabled
        >>> is_grad_enabled()
        True
        >>> with na.no_grad():
        ...     is_grad_enabled()
        False
    """
    return _grad_mode.enabled


class _GradMode:
    """Base for the grad-mode context managers; each instance also works as a decorator."""

    _mode = True

    def __enter__(self):
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = self._mode
        return self

    def __exit__(self, *exc):
        _grad_mode.enabled = self._prev
        return False

    def _fresh(self):
        # A new instance per call: one decorated function may run re-entrantly (recursion,
        # threads), and each entry must remember its own previous mode.
        return self.__class__()

    def __call__(self, func):
        return _decorate(func, self._fresh)


def _decorate(func, make_context):
    """``func`` run under a fresh grad-mode context from ``make_context()`` at every call.

    A generator function gets the mode around each of its resumptions, as in torch: wrapping
    only the call would exit the context as soon as the generator object is made, and its body
    would then run (and record graphs) in whatever mode the caller happens to be in.
    """
    if inspect.isgeneratorfunction(func):
        @functools.wraps(func)
        def generator_wrapper(*args, **kwargs):
            gen = func(*args, **kwargs)
            try:
                with make_context():
                    request = next(gen)
                while True:
                    try:
                        response = yield request
                    except GeneratorExit:
                        with make_context():
                            gen.close()
                        raise
                    except BaseException as exc:  # noqa: BLE001 - thrown into us: the generator decides
                        with make_context():
                            request = gen.throw(exc)
                    else:
                        with make_context():
                            request = gen.send(response)
            except StopIteration as stop:
                return stop.value

        return generator_wrapper

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with make_context():
            return func(*args, **kwargs)

    return wrapper


class _NoArgGradMode(_GradMode):
    """Also usable as a bare decorator, ``@no_grad`` as well as ``@no_grad()`` (torch >= 2.0)."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class no_grad(_NoArgGradMode):
    """Context manager / decorator: ops inside record no graph (inference, optimizer steps).

    >>> with no_grad():
    ...     pass
    >>> @no_grad()
    ... def predict(x):
    ...     return x * 2
    """

    _mode = False


class enable_grad(_NoArgGradMode):
    """Context manager / decorator that turns graph recording back on inside ``no_grad``.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import enable_grad, is_grad_enabled
        >>> with na.no_grad():
        ...     with enable_grad():
        ...         is_grad_enabled()
        True
    """

    _mode = True


class inference_mode(_GradMode):
    """torch's ``inference_mode``: here the same as :class:`no_grad` (version counters are kept
    on every array, so there is nothing to skip); ``inference_mode(False)`` leaves the grad mode
    as it is.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.autograd import inference_mode
        >>> w = na.ones(2, requires_grad=True)
        >>> with inference_mode():
        ...     (w * 2).requires_grad
        False
    """

    def __new__(cls, mode=True):
        if callable(mode) and not isinstance(mode, bool):
            return cls()(mode)  # bare @inference_mode
        return super().__new__(cls)

    def __init__(self, mode=True):
        self._enabled = bool(mode)

    def __enter__(self):
        self._prev = _grad_mode.enabled
        if self._enabled:
            _grad_mode.enabled = False
        return self

    def _fresh(self):
        return inference_mode(self._enabled)


class set_grad_enabled(_GradMode):
    """``set_grad_enabled(False)`` as a context manager (or called plainly) sets grad mode.

    Example::

        >>> from neural_arch.core import is_grad_enabled, set_grad_enabled
        >>> with set_grad_enabled(False):
        ...     is_grad_enabled()
        False
        >>> is_grad_enabled()
        True
        >>> @set_grad_enabled(False)          # as a decorator: only inside the calls
        ... def mode():
        ...     return is_grad_enabled()
        >>> mode(), is_grad_enabled()
        (False, True)
    """

    def __init__(self, mode: bool):
        self._mode = bool(mode)
        # Calling it plainly (not in a with-block) sets the mode at once, like torch.
        self._prev = _grad_mode.enabled
        _grad_mode.enabled = self._mode

    def __enter__(self):
        return self

    def __call__(self, func):
        # ``__init__`` already switched the mode; as a decorator (``@set_grad_enabled(False)``)
        # nothing will ever exit, so put the mode back now, as torch does, or decorating a
        # function would silently switch graph recording off for the rest of the program.
        _grad_mode.enabled = self._prev
        mode = self._mode
        return _decorate(func, lambda: set_grad_enabled(mode))


# --------------------------------------------------------------------------------------------
# Hooks and backward-time callbacks
# --------------------------------------------------------------------------------------------

_hook_ids = itertools.count()


class RemovableHandle:
    """Returned by hook registration; ``handle.remove()`` unregisters the hook (idempotent).

    Example::

        >>> import neural_arch as na
        >>> w = na.ones(2, requires_grad=True)
        >>> handle = w.register_hook(lambda g: g * 0)
        >>> handle.remove()
        >>> (w * 3).sum().backward()
        >>> w.grad.tolist()
        [3.0, 3.0]
    """

    __slots__ = ("_store", "_key")

    def __init__(self, store: dict, key: int):
        self._store = store
        self._key = key

    def remove(self) -> None:
        self._store.pop(self._key, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()
        return False


def add_hook(store: dict, fn) -> RemovableHandle:
    if not callable(fn):
        raise TypeError(f"hook must be callable, got {type(fn).__name__}")
    key = next(_hook_ids)
    store[key] = fn
    return RemovableHandle(store, key)


_local = threading.local()


def _callback_stack() -> list:
    stack = getattr(_local, "callbacks", None)
    if stack is None:
        stack = _local.callbacks = []
    return stack


def is_backward_running() -> bool:
    """True while a backward pass is running in this thread (e.g. inside a gradient hook).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import is_backward_running
        >>> seen = []
        >>> w = na.ones(2, requires_grad=True)
        >>> _ = w.register_hook(lambda g: seen.append(is_backward_running()))
        >>> (w * 3).sum().backward()
        >>> seen, is_backward_running()
        ([True], False)
    """
    return bool(_callback_stack())


def queue_callback(fn) -> None:
    """Run ``fn()`` once when the current backward finishes (after all post-accumulate hooks).

    Only valid while a backward is running (call it from a gradient hook). Callbacks run in the
    order they were queued; DDP uses this to wait for its outstanding all-reduces.

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import queue_callback
        >>> done = []
        >>> w = na.ones(2, requires_grad=True)
        >>> _ = w.register_hook(lambda g: queue_callback(lambda: done.append("backward finished")))
        >>> (w * 3).sum().backward()
        >>> done
        ['backward finished']
    """
    stack = _callback_stack()
    if not stack:
        raise RuntimeError(
            "queue_callback() may only be called while a backward pass is running "
            "(call it from inside a gradient hook)"
        )
    if not callable(fn):
        raise TypeError(f"queue_callback needs a callable, got {type(fn).__name__}")
    stack[-1].append(fn)


# --------------------------------------------------------------------------------------------
# Graph nodes
# --------------------------------------------------------------------------------------------

_seq = itertools.count()


def next_seq() -> int:
    """A number from the node counter: nodes recorded later get larger ones (FSDP brackets a
    module call's nodes with two of these to know when all of them have run in backward)."""
    return next(_seq)

# --------------------------------------------------------------------------------------------
# Version counters (torch's ``Tensor._version``)
# --------------------------------------------------------------------------------------------
#
# torch keeps one counter per storage, shared by a tensor and all its views, bumped by every
# in-place write; a node remembers the versions of the tensors it saved and refuses to run its
# backward when one moved. Here a tensor's array *is* its storage handle: views made by basic
# indexing, reshape, transpose, detach() or ``Tensor(t.data)`` are arrays whose ``.base`` chain
# ends at the array that owns the memory, so the counter is kept per owner, in one dict keyed by
# the owner's id. Nothing is stored per tensor or per op output: only in-place
# writes and the ops that save a constant input for backward touch the dict.
#
# Everything else a backward reads (tensors that require grad, changed under ``no_grad``: an
# optimizer step taken between forward and backward; an op's own result that its backward reads,
# as exp/tanh/division do) is checked another way, so that recording an op costs nothing more:
# every write also stamps the owner with a number from the node counter, and a node refuses to run
# when an array its backward closure holds was stamped after the node was made. Both checks run
# only for nodes older than the latest write anywhere (one comparison per node otherwise).
#
# Not covered (documented limits): writes through ``.data`` or straight NumPy calls (torch does not
# count ``.data`` writes either; the optimizers update ``p.data`` this way); gradients accumulated
# into ``.grad``.
#
# An owner's entry is dropped when the owner dies (a weakref callback), so a later array that
# reuses its id starts again at 0; an owner that takes no weak reference keeps its entry (a stale
# count is harmless: a node holds the array it saved, so the id cannot be reused before the check).
_versions: dict = {}
# owner id -> node-counter number of its latest recorded write; the largest of them all
_written: dict = {}
_last_write = -1


def _owner(arr):
    """The array that owns ``arr``'s memory: the last array of its ``.base`` chain (NumPy collapses
    view-of-view chains, so this is one step for ordinary views). A chain that ends in a raw buffer
    (``np.frombuffer``, an array over shared memory) stops at the array made from it: arrays made
    separately over one buffer count apart, as torch's separate storages do."""
    base = getattr(arr, "base", None)
    while base is not None and getattr(base, "dtype", None) is not None:
        arr = base
        base = getattr(arr, "base", None)
    return arr


def version_of(arr) -> int:
    """The version counter of the memory behind ``arr``: how many recorded in-place writes it has
    seen (shared with every view of the same memory).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.autograd import bump_version, version_of
        >>> a = np.zeros(4)
        >>> bump_version(a[1:])             # an in-place write through a view
        >>> version_of(a), version_of(a.reshape(2, 2))
        (1, 1)
    """
    return _versions.get(id(_owner(arr)), 0)


def _forget(key: int) -> None:
    _versions.pop(key, None)
    _written.pop(key, None)


def bump_version(arr, to: int | None = None) -> None:
    """Record one in-place write to ``arr`` (or set its counter to ``to``): every in-place
    method calls this after writing, so nodes that saved the array see the change.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.autograd import bump_version, version_of
        >>> a = np.zeros(2)
        >>> bump_version(a); bump_version(a)
        >>> version_of(a)
        2
    """
    owner = _owner(arr)
    key = id(owner)
    cur = _versions.get(key)
    if cur is None:
        try:
            weakref.finalize(owner, _forget, key)
        except TypeError:  # bytes, mmap and the like take no weak reference: keep the entry
            pass
        cur = 0
    if to is None:
        _versions[key] = cur + 1
        # the memory changed: stamp it later than every node recorded so far
        global _last_write
        _last_write = _written[key] = next(_seq)
    else:  # a count carried over to a new array (in-place on a constant rebinds it): no write
        _versions[key] = to


def saved_versions(tensors) -> tuple | None:
    """``(array, version)`` for each constant Tensor in ``tensors`` (``None`` entries, non-Tensors
    and tensors that require grad are skipped): what a :class:`Node` checks before its backward.
    Returns ``None`` when there is nothing to check (the common case costs one loop).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.tensor import Tensor
        >>> x = Tensor(np.zeros(2))
        >>> [(a.shape, v) for a, v in saved_versions((x, None))]
        [((2,), 0)]
    """
    out = None
    for t in tensors:
        if t is None or getattr(t, "requires_grad", True):
            continue
        arr = t.data
        entry = (arr, _versions.get(id(_owner(arr)), 0) if _versions else 0)
        out = (entry,) if out is None else out + (entry,)
    return out


_MODIFIED_MSG = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: [{dtype} tensor of shape {shape}], saved by {name}Backward, is at version {now}; "
    "expected version {then} instead. Hint: the in-place change came after the forward pass that "
    "used it; make it before the forward, after backward, or on a copy (t = t.clone())"
)


_MODIFIED_LATER_MSG = (
    "one of the variables needed for gradient computation has been modified by an inplace "
    "operation: [{dtype} array of shape {shape}], read by {name}Backward, was written in place "
    "(under no_grad) after that op ran; it is at version {now}. Hint: an optimizer step or a "
    "parameter update between forward and backward, or an in-place change to an op's result, "
    "does this; make it after backward, or change a copy (t = t.clone())"
)


def _closure_arrays(fn, depth: int = 3):
    """The arrays a backward closure ``fn`` holds: its cells' arrays, tensors' arrays, those in
    tuples/lists there, and (``depth`` deep) those of the functions it holds."""
    cells = getattr(fn, "__closure__", None)
    if not cells:
        return
    for cell in cells:
        try:
            v = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        for item in (v if type(v) in (tuple, list) else (v,)):
            if hasattr(item, "grad_fn") and hasattr(item, "data"):  # a Tensor: its array
                item = item.data
            if getattr(item, "__array_priority__", None) is not None and hasattr(item, "base"):
                yield item  # an ndarray or a device array (NumPy scalars have no .base)
            elif depth > 1 and getattr(item, "__closure__", None):
                yield from _closure_arrays(item, depth - 1)


def _check_saved_entries(node, fn, saved) -> None:
    """Raise torch's error when an array ``node``'s backward reads was written in place after
    the node was recorded (only called when some write came after it, see ``_written``):

    * a constant the op declared (``Node(saved=...)``): its version moved;
    * any array the backward closure ``fn`` holds (an input that requires grad, changed under
      ``no_grad``: a parameter updated between forward and backward; the op's own result, which
      exp, tanh, sigmoid, softmax and division read; an array derived from them): stamped since.

    The second rule is wider than torch's: an op whose closure holds an input only for its shape or
    array module (sum, mean, indexing, concatenation) also refuses a change to it that torch lets
    pass. An error where torch computes is the price of never computing from changed values.
    """
    name = node.name
    if saved is not None:
        for arr, then in saved:
            now = _versions.get(id(_owner(arr)), 0)
            if now != then:
                raise RuntimeError(_MODIFIED_MSG.format(
                    dtype=arr.dtype, shape=list(arr.shape), name=name, now=now, then=then))
    seq = node.seq
    for arr in _closure_arrays(fn):
        key = id(_owner(arr))
        if _written.get(key, -1) > seq:
            raise RuntimeError(_MODIFIED_LATER_MSG.format(
                dtype=arr.dtype, shape=list(arr.shape), name=name, now=_versions.get(key, 0)))


_FREED_MSG = (
    "Trying to backward through the graph a second time (its saved arrays were freed after the "
    "first backward). Pass retain_graph=True to the first .backward() call if you need to "
    "backward twice."
)


class Node:
    """One recorded op. ``fn(grad)`` returns one gradient (array or None) per entry of ``parents``.

    ``parents`` holds the input Tensors (``None`` for inputs that need no gradient).
    ``fresh=True`` promises that the arrays ``fn`` returns are newly allocated and not shared with
    each other, so the engine may store them as ``.grad`` (or add into them) without copying.
    ``saved`` lists the op's inputs whose arrays ``fn`` reads: the constant ones among them (those
    that need no gradient, so no ``parents`` edge guards them) have their version remembered, and
    the engine refuses to run ``fn`` once one of them was changed in place (torch's check).

    Example::

        >>> import neural_arch as na
        >>> y = na.ones(2, requires_grad=True) * 3
        >>> type(y.grad_fn).__name__, y.grad_fn.name
        ('Node', 'Mul')
    """

    __slots__ = ("fn", "parents", "name", "seq", "fresh", "hooks", "retain", "saved", "__weakref__")

    def __init__(self, fn, parents, name: str, fresh: bool = True, saved=None):
        self.fn = fn
        self.parents = parents
        self.name = name
        self.seq = next(_seq)
        self.fresh = fresh
        # (array, version) per constant input fn reads; None: nothing to check. The loop finds the
        # common case (every input requires grad, or is a number) without a call.
        self.saved = None
        if saved is not None:
            for t in saved:
                if t is not None and not getattr(t, "requires_grad", True):
                    self.saved = saved_versions(saved)
                    break
        self.hooks = None  # dict of tensor hooks of the output tensor (register_hook on non-leaf)
        self.retain = None  # weakref to the output tensor when retain_grad() was called

    def __repr__(self) -> str:
        return f"<{self.name}Backward>"


def _run_tensor_hooks(hooks: dict, g, make_tensor):
    """Apply ``register_hook`` hooks; returns (array, replaced?)."""
    gt = make_tensor(g)
    replaced = False
    for h in list(hooks.values()):
        r = h(gt)
        if r is not None:
            if not hasattr(r, "data"):
                raise TypeError("a gradient hook must return a Tensor or None")
            if tuple(r.shape) != tuple(gt.shape):
                raise RuntimeError(
                    f"gradient hook returned shape {tuple(r.shape)}, expected {tuple(gt.shape)}"
                )
            if r.dtype != gt.dtype:
                # torch refuses too: a silent cast would round a float64 gradient through the
                # hook's float32 (or feed a float32 one into a float64 graph)
                raise RuntimeError(
                    f"gradient hook {getattr(h, '__name__', h)!r} changed the gradient's dtype from "
                    f"{gt.dtype} to {r.dtype}; return a tensor of the same dtype (e.g. g.to(g.dtype))"
                )
            gt = r
            replaced = True
    return gt.data, replaced


def _finalize_leaf(t, g, owned, make_tensor):
    """Give leaf ``t`` its complete gradient for this backward: hooks, accumulate, post-hooks."""
    data = t.data
    # cast before the hooks: a hook sees the gradient in the leaf's dtype, as in torch
    if isinstance(g, np.generic) or getattr(g, "dtype", None) != data.dtype:
        g = np.asarray(g, dtype=data.dtype) if isinstance(g, np.generic) else g.astype(data.dtype)
        owned = True
    if t._hooks:
        g, replaced = _run_tensor_hooks(t._hooks, g, make_tensor)
        if replaced:
            owned = False
            if isinstance(g, np.generic):  # a hook's 0-d result may be a NumPy scalar
                g, owned = np.asarray(g), True
    if g.shape != data.shape:
        # Only reachable through a user-given root gradient or a hook; torch would error too.
        raise RuntimeError(f"gradient shape {g.shape} does not match tensor shape {data.shape}")
    cur = t._grad
    if cur is None:
        # Never store an array that another node (or the caller) may still read or mutate.
        t._grad = make_tensor(g if owned else g.copy())
    else:
        cur.data += g
    if t._post_hooks:
        for h in list(t._post_hooks.values()):
            h(t)


def _accumulate(bufs, key, g, fresh):
    entry = bufs.get(key)
    if entry is None:
        bufs[key] = [g, fresh]
    elif entry[1]:
        try:
            entry[0] += g
        except (TypeError, ValueError):
            entry[0] = entry[0] + g
    else:
        entry[0] = entry[0] + g
        entry[1] = True


def run_backward(root, grad, retain_graph: bool, make_tensor, inputs=None) -> None:
    """Backpropagate ``grad`` (an array shaped like ``root``) through the graph ending at ``root``.

    ``make_tensor(array)`` wraps an array into a (non-grad) Tensor for hooks and ``.grad``.
    ``inputs`` (``backward(inputs=...)``): None, or the tensors that alone get ``.grad``; a
    non-leaf among them keeps its gradient as with ``retain_grad()``.

    Example::

        >>> import neural_arch as na
        >>> w = na.ones(2, requires_grad=True)
        >>> (w * w).sum().backward()          # Tensor.backward calls run_backward
        >>> w.grad.tolist()
        [2.0, 2.0]
    """
    stack = _callback_stack()
    callbacks: list = []
    stack.append(callbacks)
    prev_mode = _grad_mode.enabled
    _grad_mode.enabled = False  # hooks may use Tensor ops; they must not build graphs
    ok = False
    only = None
    retained = ()
    if inputs is not None:
        only = {id(t) for t in inputs if t.grad_fn is None}
        # a non-leaf input keeps its gradient for this call the way retain_grad() does
        retained = [(t.grad_fn, t.grad_fn.retain) for t in inputs if t.grad_fn is not None]
        for node, _ in retained:
            node.retain = weakref.ref(next(t for t in inputs if t.grad_fn is node))
    try:
        root_node = root.grad_fn
        if root_node is None:
            if only is None or id(root) in only:
                _finalize_leaf(root, grad, False, make_tensor)
        else:
            _execute(root_node, grad, retain_graph, make_tensor, only)
        ok = True
    finally:
        for node, before in retained:
            node.retain = before
        _grad_mode.enabled = prev_mode
        stack.pop()
    if ok:
        # Callbacks may queue more callbacks (e.g. a follow-up wait); keep draining in order.
        stack.append(callbacks)
        try:
            i = 0
            while i < len(callbacks):
                callbacks[i]()
                i += 1
        finally:
            stack.pop()


def _execute(root_node, grad, retain_graph, make_tensor, only=None):
    # 1) Discover the reachable graph, counting how many gradient contributions each node and
    #    each leaf will receive. A leaf is final (and its hooks fire) as soon as its count is 0.
    if root_node.fn is None:
        raise RuntimeError(_FREED_MSG)
    deps = {root_node: 0}
    leaf_count: dict = {}
    todo = [root_node]
    while todo:
        n = todo.pop()
        for p in n.parents:
            if p is None:
                continue
            gf = p.grad_fn
            if gf is not None:
                c = deps.get(gf)
                if c is None:
                    if gf.fn is None:
                        raise RuntimeError(_FREED_MSG)
                    deps[gf] = 1
                    todo.append(gf)
                else:
                    deps[gf] = c + 1
            elif p.requires_grad:
                k = id(p)
                leaf_count[k] = leaf_count.get(k, 0) + 1

    # 2) Run nodes, newest first among the ready ones. The accumulation of a gradient into its
    #    buffer is written out inline (this loop runs once per recorded op: a call per edge costs
    #    about as much as the bookkeeping itself, docs/benchmarks.md, issue 37).
    bufs = {root_node: [grad, False]}
    leaf_bufs: dict = {}
    ready = [(-root_node.seq, root_node)]
    pop, push = heapq.heappop, heapq.heappush
    bufs_pop, bufs_get = bufs.pop, bufs.get
    while ready:
        n = pop(ready)[1]
        entry = bufs_pop(n, None)
        fn = n.fn
        parents = n.parents
        saved = n.saved
        if not retain_graph:
            # Free the saved arrays (closure) and the links to the input tensors, so activations
            # die as soon as backward is done even if the caller keeps the loss tensor around.
            n.fn = None
            n.parents = ()
            n.saved = None
        if entry is None:
            # this node got no gradient: only propagate the "done" signal
            for p in parents:
                if p is None:
                    continue
                gf = p.grad_fn
                if gf is not None:
                    c = deps[gf] - 1
                    deps[gf] = c
                    if c == 0:
                        push(ready, (-gf.seq, gf))
                elif p.requires_grad:
                    k = id(p)
                    c = leaf_count[k] - 1
                    leaf_count[k] = c
                    if c == 0:
                        e = leaf_bufs.pop(k, None)
                        if e is not None and (only is None or k in only):
                            _finalize_leaf(p, e[0], e[1], make_tensor)
            continue
        if n.seq < _last_write:  # something was written in place since this node ran
            _check_saved_entries(n, fn, saved)
        g = entry[0]
        if n.hooks:
            g, replaced = _run_tensor_hooks(n.hooks, g, make_tensor)
            if replaced:
                entry[1] = False
        if n.retain is not None:
            t = n.retain()
            if t is not None:
                if t._grad is None:
                    keep = np.array(g) if isinstance(g, np.generic) else g.copy()
                    t._grad = make_tensor(keep)
                else:
                    t._grad.data = t._grad.data + g
        grads = fn(g)
        fresh = n.fresh
        if len(grads) < len(parents):  # a short tuple: an IndexError for a parent left without one
            grads = [grads[i] if p is not None else None for i, p in enumerate(parents)]
        for p, pg in zip(parents, grads):
            if p is None:
                continue
            gf = p.grad_fn
            if gf is not None:
                if pg is not None:
                    if pg.dtype != p.data.dtype:
                        pg = pg.astype(p.data.dtype)
                    # _accumulate, inlined: this runs once per gradient edge of the graph
                    acc = bufs_get(gf)
                    if acc is None:
                        bufs[gf] = [pg, fresh]
                    elif acc[1]:
                        try:
                            acc[0] += pg
                        except (TypeError, ValueError):
                            acc[0] = acc[0] + pg
                    else:
                        acc[0] = acc[0] + pg
                        acc[1] = True
                c = deps[gf] - 1
                deps[gf] = c
                if c == 0:
                    push(ready, (-gf.seq, gf))
            elif p.requires_grad:
                k = id(p)
                if pg is not None:
                    _accumulate(leaf_bufs, k, pg, fresh)
                c = leaf_count[k] - 1
                leaf_count[k] = c
                if c == 0:
                    e = leaf_bufs.pop(k, None)
                    if e is not None and (only is None or k in only):
                        _finalize_leaf(p, e[0], e[1], make_tensor)
