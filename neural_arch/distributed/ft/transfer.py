"""Healing's wire format: a nested state (dicts, lists, arrays, scalars) sent peer to peer.

A replica that is behind copies the whole training state from a live peer, never from a file.
``send_state`` splits the state into its arrays and a *skeleton* (the nesting, the scalars, and
each array's shape and dtype). The skeleton goes first, pickled, in a *head* message of a size
both ends know (``HEAD_BYTES``, or the size the receiver asked for: below; its length, then its
bytes; a skeleton too long for the head sends the rest in a message of its own): the receiver
needs no length message before it. Then the arrays, in the
messages :func:`plan_messages` lays out from their sizes alone (both ends compute the same plan,
so it is never sent):

* an array of at least ``SMALL_BYTES`` goes raw in a message of its own, straight from the
  sender's memory into the receiver's buffer (no copy on either side);
* smaller arrays travel together in *bundles* of up to ``BUNDLE_BYTES``, each array at a
  64-byte aligned offset: one message instead of one per bias, norm weight or optimizer scalar
  (a model's state has hundreds; each message costs a header, a frame and a wake-up, more under
  load), paid for with one copy of those small arrays on each side;
* the first bundle rides in the head, after the skeleton, when both fit: a small state (a few
  biases, scalars, a sampler's position) crosses in **one** message, and a large one pays one
  message for its skeleton and small arrays together. A heal of a small state is bound by the
  number of messages, not by its bytes: each is a frame, a header check and a wake-up on each side.

The head's size is ``HEAD_BYTES`` unless the receiver asked for another (``head_bytes=`` on both
ends; both must pass the same): a replacement computes, from its own state, the head that would
carry its skeleton and its small arrays (:func:`head_bytes_for`), and the quorum hands that number
to its healer (``Quorum.heal_head``). When the healer's state has the same layout -- the same model
and optimizer -- every small array rides in the head: one message instead of a head and a bundle
(measured in docs/benchmarks.md). When it does not, nothing breaks: the head carries what fits and
the rest follows as above.

``recv_state(..., into=state)`` receives in place: every incoming array whose place in the
skeleton holds, in ``into``, a writable C-contiguous NumPy array of the same shape and dtype is
received straight into that array (a raw message) or copied into it from its bundle; the others
get new buffers. Passing the replica's live arrays (its parameters, say) saves the new memory --
first-touch page faults cost about as much as the transfer itself in a fresh process -- and a
second copy of the state. The returned state holds the ``into`` arrays where they were used.

Pickle is only the skeleton's, between the replicas of one job (trusted peers only, like every
``*_object`` helper); the data path moves arrays.

``send_state`` is :func:`pack_state` (read the state, fill the head) then :func:`send_packed`
(move the bytes): a healer of several replacements that asked for the same head packs once.

Example::

    sent = send_state(pg, {"model": model.state_dict(), "step": 12}, dst=2)   # on the live peer
    state = recv_state(pg, src=0)                                             # on the replacement
"""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np

__all__ = ["PackedState", "head_bytes_for", "inline_offset", "join_arrays", "pack_state", "plan_messages",
           "recv_state", "send_packed", "send_state", "split_arrays", "warm_arrays", "warm_buffer"]

_TAG = 7  # one tag for the whole transfer: send and recv pair up in order on it
#: arrays smaller than this travel in bundles (a copy each side is cheaper than a message of their own)
SMALL_BYTES = 256 << 10
#: the most bytes one bundle holds (bounds the extra memory a bundle needs on each side)
BUNDLE_BYTES = 4 << 20
#: the first message's fixed size: the skeleton's length and bytes, then the first bundle if it fits
#: (a fixed size lets the receiver post it without a length message first; a few KiB cost less
#: than a second message)
HEAD_BYTES = 4096
#: the largest head a receiver may ask for (bounds the memory a head takes on each side)
MAX_HEAD_BYTES = BUNDLE_BYTES + (256 << 10)
#: ``head_bytes_for`` sizes a head only for states of at most this many arrays: a larger state
#: saves one message of many, and walking and pickling its skeleton once more costs more than that
SIZED_HEAD_MAX_ARRAYS = 64
_ALIGN = 64
_LEN = 8      # the skeleton's length, an int64 at the start of the head
_PAGE = 4096


def warm_buffer(nbytes: int, buffer: np.ndarray | None = None) -> np.ndarray:
    """A byte array of at least ``nbytes`` whose memory is mapped: ``buffer`` when it is large
    enough, else a new one with every page touched once.

    Why: fresh memory from the allocator is mapped page by page on first write, and a heal's head
    (a few hundred KiB for a small model) written or received into fresh memory pays a page fault
    per 4 KiB -- on this project's VMs several microseconds each, more than copying the bytes. The
    ``Manager`` warms its head buffer where it would wait anyway (a replacement before its quorum
    answer, a healer while its new group connects) and passes it as ``pack_state(out=)`` and
    ``recv_state(head=)``.

    Example:
        >>> buf = warm_buffer(10_000)
        >>> buf.dtype, buf.size >= 10_000, warm_buffer(5_000, buf) is buf
        (dtype('uint8'), True, True)
    """
    nbytes = int(nbytes)
    if buffer is not None and buffer.size >= nbytes:
        return buffer
    buffer = np.empty(nbytes, dtype=np.uint8)
    buffer[::_PAGE] = 0          # one write per page maps it (the contents are overwritten before use)
    return buffer


#: ``madvise`` advice that maps a range writable without changing its contents (Linux 5.14+)
_MADV_POPULATE_WRITE = 23
#: arrays smaller than this are not worth a system call each in :func:`warm_arrays`
_WARM_MIN_BYTES = 64 << 10
_madvise = None


def warm_arrays(state) -> int:
    """Map the memory of ``state``'s arrays before a heal writes into them; returns the bytes warmed.

    A replacement's state is mostly fresh memory (optimizer moments from ``zeros_like``, a model
    just built), and a heal received in place (``recv_state(into=)``) would pay a page fault per
    4 KiB inside the transfer. Writing to warm the pages would change the state (this replica may
    not be healed after all), and reading first maps the shared zero page and doubles the faults,
    so this asks the kernel to map them as they are: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14
    and later, through ``ctypes``). Elsewhere, or for read-only or non-contiguous arrays, it does
    nothing: the heal is the same, only slower. The ``Manager`` calls it while a new replica waits
    for its quorum answer.

    Example:
        >>> state = {"w": np.zeros(1 << 17), "step": 3}
        >>> warm_arrays(state) in (0, state["w"].nbytes)      # 0 where the kernel has no such advice
        True
        >>> float(state["w"].sum())                           # the contents are unchanged
        0.0
    """
    global _madvise
    if _madvise is None:
        _madvise = _load_madvise()
    if _madvise is False:
        return 0
    warmed = 0
    # (not split_arrays: it copies a non-contiguous array, which would warm the copy)
    for a in _arrays_in(state):
        if a.nbytes < _WARM_MIN_BYTES or not a.flags.writeable or not a.flags.c_contiguous:
            continue
        start = a.ctypes.data & ~(_PAGE - 1)
        if _madvise(start, a.ctypes.data + a.nbytes - start, _MADV_POPULATE_WRITE) != 0:
            return warmed          # (EINVAL on kernels without the advice: stop asking)
        warmed += a.nbytes
    return warmed


def _load_madvise():
    """libc's ``madvise`` through ctypes, or False where there is none (not Linux)."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _head_from(buffer: np.ndarray | None, head_size: int, name: str) -> np.ndarray:
    """``head_size`` bytes of ``buffer`` (a caller's warm buffer), or a new array without one."""
    if buffer is None:
        return np.empty(head_size, dtype=np.uint8)
    if (not isinstance(buffer, np.ndarray) or buffer.dtype != np.uint8 or buffer.ndim != 1
            or not buffer.flags.c_contiguous or not buffer.flags.writeable):
        raise TypeError(f"{name} must be a writable 1-d C-contiguous uint8 NumPy array (warm_buffer() makes one)")
    if buffer.size < head_size:
        raise ValueError(f"{name} holds {buffer.size} bytes, fewer than the head's {head_size}: pass "
                         f"warm_buffer({head_size}, {name})")
    return buffer[:head_size]


class _ArrayRef:
    """Where array ``index`` goes back in the skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self):
        return (_ArrayRef, (self.index,))


def split_arrays(state) -> tuple[object, list[np.ndarray]]:
    """``(skeleton, arrays)``: ``state`` with every numeric array replaced by a reference.

    Example:
        >>> skeleton, arrays = split_arrays({"w": np.ones(2), "step": 3, "opt": [np.zeros(1)]})
        >>> len(arrays), skeleton["step"]
        (2, 3)
        >>> join_arrays(skeleton, arrays)["opt"][0]
        array([0.])
    """
    arrays: list[np.ndarray] = []

    def walk(x):
        if isinstance(x, np.ndarray) and x.dtype != object:
            # not ``np.ascontiguousarray``: it turns a 0-d array (an optimizer's step count) into shape (1,)
            arrays.append(np.asarray(x, order="C"))
            return _ArrayRef(len(arrays) - 1)
        if isinstance(x, dict):
            return type(x)((k, walk(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x
    return walk(state), arrays


def join_arrays(skeleton, arrays: list[np.ndarray]):
    """The inverse of ``split_arrays``.

    Example:
        >>> join_arrays(*split_arrays({"w": np.arange(2)}))["w"]
        array([0, 1])
    """
    def walk(x):
        if isinstance(x, _ArrayRef):
            return arrays[x.index]
        if isinstance(x, dict):
            return type(x)((k, walk(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x
    return walk(skeleton)


def plan_messages(nbytes: list[int], small: int | None = None, bundle: int | None = None) -> list[tuple]:
    """The messages that carry arrays of ``nbytes`` (in order), as data: ``("raw", i)`` sends array
    ``i`` alone; ``("bundle", [(i, offset), ...], size)`` sends small arrays together in one byte
    array of ``size`` bytes, each at its (64-byte aligned) offset. Empty arrays send nothing.
    ``small`` and ``bundle`` default to ``SMALL_BYTES`` and ``BUNDLE_BYTES``.

    Example:
        >>> plan_messages([8, 1 << 20, 16, 0], small=1024, bundle=4096)
        [('bundle', [(0, 0), (2, 64)], 80), ('raw', 1)]
    """
    small = SMALL_BYTES if small is None else int(small)
    bundle = BUNDLE_BYTES if bundle is None else int(bundle)
    out: list[tuple] = []
    members: list[tuple[int, int]] = []
    size = 0
    for i, n in enumerate(nbytes):
        if n == 0:
            continue
        if n >= small:
            out.append(("raw", i))
            continue
        offset = -(-size // _ALIGN) * _ALIGN
        if members and offset + n > bundle:
            out.append(("bundle", members, size))
            members, offset = [], 0
        members.append((i, offset))
        size = offset + n
    if members:
        out.append(("bundle", members, size))
    # bundles go first (one message for every small array, whatever the order), then the raw ones
    return [m for m in out if m[0] == "bundle"] + [m for m in out if m[0] == "raw"]


def _bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def inline_offset(plan: list[tuple], skeleton_bytes: int, head: int | None = None) -> int | None:
    """Where in the head message the plan's first bundle starts, or None when it travels on its own
    (the plan starts with a raw array, or the skeleton and the bundle do not fit in ``head`` bytes,
    default ``HEAD_BYTES``). Both ends compute it from the skeleton's length and the plan.

    Example:
        >>> plan = plan_messages([8, 16])
        >>> inline_offset(plan, skeleton_bytes=100), inline_offset(plan, skeleton_bytes=5000)
        (128, None)
    """
    head = HEAD_BYTES if head is None else int(head)
    if not plan or plan[0][0] != "bundle":
        return None
    offset = -(-(_LEN + skeleton_bytes) // _ALIGN) * _ALIGN
    return offset if offset + plan[0][2] <= head else None


def _header_payload(skeleton, arrays) -> np.ndarray:
    """The pickled skeleton (nesting, scalars, each array's shape and dtype) as bytes."""
    # the dtype itself, not ``dtype.str``: an extension dtype (ml_dtypes' bfloat16) spells itself
    # "<V2", which would come back as raw void bytes
    header = {"skeleton": skeleton, "arrays": [(a.shape, a.dtype) for a in arrays]}
    return np.frombuffer(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def head_bytes_for(state) -> int:
    """The head size that carries ``state``'s skeleton and its first bundle in one message.

    A replacement asks its healer for this size, computed from its *own* state: a peer with the
    same layout then sends everything but the large arrays in the head. The skeleton part gets
    some room to spare: its scalars (step, RNG state, data position) pickle to a few bytes more or
    less on the healer. At least ``HEAD_BYTES``, at most ``MAX_HEAD_BYTES``; ``HEAD_BYTES`` for a
    state of more than ``SIZED_HEAD_MAX_ARRAYS`` arrays (counted with an early stop, so a large
    state costs no more than a small one here).

    Example:
        >>> head_bytes_for({"w": np.zeros(1000), "step": 3}) > 8000
        True
        >>> head_bytes_for({"w": np.zeros(1 << 20)}) == HEAD_BYTES    # a large array goes raw
        True
        >>> head_bytes_for([np.zeros(10)] * 100) == HEAD_BYTES          # many arrays: the default
        True
    """
    if _more_arrays_than(state, SIZED_HEAD_MAX_ARRAYS):
        return HEAD_BYTES
    skeleton, arrays = split_arrays(state)
    length = _header_payload(skeleton, arrays).size
    plan = plan_messages([a.nbytes for a in arrays])
    room = length + length // 8 + 256
    offset = -(-(_LEN + room) // _ALIGN) * _ALIGN
    wanted = offset + (plan[0][2] if plan and plan[0][0] == "bundle" else 0)
    return int(min(max(wanted, HEAD_BYTES), MAX_HEAD_BYTES))


def _arrays_in(state):
    """The numeric arrays of a nested state, as they are (no copies), in no particular order."""
    stack = [state]
    while stack:
        x = stack.pop()
        if isinstance(x, np.ndarray) and x.dtype != object:
            yield x
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)


def _more_arrays_than(state, limit: int) -> bool:
    """Whether ``state`` holds more than ``limit`` arrays (the walk stops once it knows)."""
    return next(itertools.islice(_arrays_in(state), limit, None), None) is not None


def _check_head(head: int | None) -> int:
    head = HEAD_BYTES if head is None else int(head)
    if not _LEN + 1 <= head <= MAX_HEAD_BYTES:
        raise ValueError(f"head_bytes={head} must be between {_LEN + 1} and MAX_HEAD_BYTES ({MAX_HEAD_BYTES})")
    return head


def _pack(packed: np.ndarray, members, arrays) -> None:
    end = 0
    for i, offset in members:
        packed[end:offset] = 0               # alignment padding: no stale memory on the wire
        end = offset + arrays[i].nbytes
        packed[offset:end] = _bytes(arrays[i])


class PackedState:
    """A state laid out for sending (what :func:`pack_state` returns): the head message (its
    skeleton and, when it fits, the first bundle), the skeleton's rest if the head was too short,
    the plan of the messages still to send, and the arrays they read. Packing reads the state
    once; :func:`send_packed` then only moves bytes, so a healer can pack while its new group
    connects (``Manager``) and send the moment both ends are ready.

    Example::

        packed = pack_state({"model": model.state_dict(), "step": 12}, head_bytes=4096)
        packed.head.nbytes        # 4096: the first message
    """

    __slots__ = ("arrays", "head", "plan", "skeleton_rest")

    def __init__(self, head: np.ndarray, skeleton_rest: np.ndarray, plan: list, arrays: list):
        self.head, self.skeleton_rest, self.plan, self.arrays = head, skeleton_rest, plan, arrays


def pack_state(state, head_bytes: int | None = None, out: np.ndarray | None = None) -> PackedState:
    """Lay ``state`` out for :func:`send_packed`: split it, pickle its skeleton, fill the head.

    ``head_bytes``: the size of the first message, as the receiver asked (default ``HEAD_BYTES``;
    the receiver's ``recv_state`` must pass the same). The arrays are not copied (the large ones
    are sent from the state's own memory): the state must not change until the send is done.
    ``out``: a byte buffer of at least ``head_bytes`` to build the head in (:func:`warm_buffer`;
    it must not be reused until the send is done); default a new array.

    Example:
        >>> packed = pack_state({"w": np.ones(3), "step": 2})
        >>> packed.head.nbytes == HEAD_BYTES, packed.plan        # the one small array rode in the head
        (True, [])
    """
    head_size = _check_head(head_bytes)
    skeleton, arrays = split_arrays(state)
    payload = _header_payload(skeleton, arrays)
    plan = plan_messages([a.nbytes for a in arrays])
    inline = inline_offset(plan, payload.size, head_size)
    head = _head_from(out, head_size, "out")
    head[:_LEN] = np.array([payload.size], dtype=np.int64).view(np.uint8)
    first = min(payload.size, head_size - _LEN)
    head[_LEN:_LEN + first] = payload[:first]
    used = _LEN + first
    if inline is not None:
        _, members, size = plan[0]
        head[used:inline] = 0                # padding (zeroed: no stale memory on the wire)
        _pack(head[inline:inline + size], members, arrays)
        plan = plan[1:]
        used = inline + size
    head[used:] = 0
    return PackedState(head, payload[first:], plan, arrays)


def send_packed(pg, packed: PackedState, dst: int) -> int:
    """Send a :func:`pack_state` result to group rank ``dst`` of ``pg``; returns the bytes sent.

    Example::

        nbytes = send_packed(pg, pack_state(state_dict(), head_bytes=quorum.heal_head.get(target)), dst=1)
    """
    pg.send(packed.head, dst, _TAG)
    sent = packed.head.nbytes
    if packed.skeleton_rest.size:            # a long skeleton: the rest in a message of its own
        pg.send(packed.skeleton_rest, dst, _TAG)
        sent += packed.skeleton_rest.size
    plan, arrays = packed.plan, packed.arrays
    # one buffer for every bundle: send returns once the bytes are out, and fresh memory per
    # bundle would cost a page fault per page on top of the copy
    scratch = np.empty(max([m[2] for m in plan if m[0] == "bundle"], default=0), dtype=np.uint8)
    for message in plan:
        if message[0] == "raw":
            pg.send(arrays[message[1]], dst, _TAG)
            sent += arrays[message[1]].nbytes
            continue
        _, members, size = message
        bundle = scratch[:size]
        _pack(bundle, members, arrays)
        pg.send(bundle, dst, _TAG)
        sent += size
    return sent


def send_state(pg, state, dst: int, head_bytes: int | None = None) -> int:
    """Send ``state`` to group rank ``dst`` of ``pg``; returns the bytes sent (head, skeleton and arrays):
    :func:`pack_state` then :func:`send_packed`.

    ``head_bytes``: the size of the first message, as the receiver asked (default ``HEAD_BYTES``;
    the receiver's ``recv_state`` must pass the same).

    Example::

        nbytes = send_state(pg, state_dict(), dst=heal_rank)
    """
    return send_packed(pg, pack_state(state, head_bytes), dst)


def _targets(skeleton, into, count: int) -> list:
    """Per array index: the array of ``into`` at the same place in the nesting, or None."""
    found: list = [None] * count

    def walk(x, y):
        if isinstance(x, _ArrayRef):
            if isinstance(y, np.ndarray) and y.flags.c_contiguous and y.flags.writeable:
                found[x.index] = y
        elif isinstance(x, dict) and isinstance(y, dict):
            for k, v in x.items():
                if k in y:
                    walk(v, y[k])
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and len(x) == len(y):
            for a, b in zip(x, y):
                walk(a, b)
    if into is not None:
        walk(skeleton, into)
    return found


def recv_state(pg, src: int, into=None, head_bytes: int | None = None, head: np.ndarray | None = None):
    """Receive what ``send_state`` sent from group rank ``src`` (trusted peers only: it unpickles).

    ``into``: a state of the same nesting whose matching arrays are filled in place (module
    docstring); None allocates every array. ``head_bytes``: the first message's size, the same
    as the sender's (default ``HEAD_BYTES``). ``head``: a byte buffer of at least ``head_bytes``
    to receive the first message in (:func:`warm_buffer`; reusable afterwards: nothing returned
    points into it); default a new array.

    Example::

        load_state_dict(recv_state(pg, src=quorum.rank_of(source), into=live_state()))
    """
    head_size = _check_head(head_bytes)
    borrowed = head is not None
    head = _head_from(head, head_size, "head")
    pg.recv(head, src, _TAG)
    length = int(head[:_LEN].view(np.int64)[0])
    payload = head[_LEN:_LEN + length]
    if length > head_size - _LEN:            # a long skeleton: the rest came on its own
        rest = np.empty(length - (head_size - _LEN), dtype=np.uint8)
        pg.recv(rest, src, _TAG)
        payload = np.concatenate([payload, rest])
    header = pickle.loads(payload.tobytes())  # trusted peers only (module docstring)
    metas = [(tuple(shape), np.dtype(dtype)) for shape, dtype in header["arrays"]]
    targets = _targets(header["skeleton"], into, len(metas))
    arrays: list = [None] * len(metas)
    for i, (shape, dtype) in enumerate(metas):
        t = targets[i]
        if t is not None and t.shape == shape and t.dtype == dtype:
            arrays[i] = t
    nbytes = [math.prod(shape) * dtype.itemsize for shape, dtype in metas]
    plan = plan_messages(nbytes)
    inline = inline_offset(plan, length, head_size)
    if inline is not None:                   # the first bundle came in the head
        _, members, size = plan[0]
        _unpack(head[inline:inline + size], members, metas, nbytes, arrays, copy=borrowed)
        plan = plan[1:]
    scratch = None     # a bundle whose every array has a place in ``into`` is copied out: reuse its buffer
    for message in plan:
        if message[0] == "raw":
            i = message[1]
            if arrays[i] is None:
                arrays[i] = np.empty(metas[i][0], dtype=metas[i][1])
            pg.recv(arrays[i], src, _TAG)
            continue
        _, members, size = message
        if all(arrays[i] is not None for i, _ in members):
            if scratch is None or scratch.size < size:
                # the largest bundle still to come: fresh memory costs a page fault per page touched
                scratch = np.empty(max(m[2] for m in plan if m[0] == "bundle"), dtype=np.uint8)
            packed = scratch[:size]
        else:
            packed = np.empty(size, dtype=np.uint8)
        pg.recv(packed, src, _TAG)
        _unpack(packed, members, metas, nbytes, arrays)
    for i, (shape, dtype) in enumerate(metas):   # empty arrays: nothing travelled
        if arrays[i] is None:
            arrays[i] = np.empty(shape, dtype=dtype)
    return join_arrays(header["skeleton"], arrays)


def _unpack(packed: np.ndarray, members, metas, nbytes, arrays: list, copy: bool = False) -> None:
    """The arrays of one bundle: copied into their ``into`` places, or views into ``packed``
    (copies when ``copy``: ``packed`` is the caller's buffer, reused after the call)."""
    for i, offset in members:
        shape, dtype = metas[i]
        view = packed[offset:offset + nbytes[i]].view(dtype).reshape(shape)
        if arrays[i] is None:
            arrays[i] = view.copy() if copy else view   # a view into the bundle: no second copy
        else:
            arrays[i][...] = view
