"""An in-process stand-in for ``cupy`` + ``cupy.cuda.nccl``, to test NCCLBackend's logic without a GPU.

Ranks are threads. Arrays are NumPy arrays wrapped in :class:`FakeArray`, whose ``data.ptr`` is
the real host address, so the fake communicator reads and writes through raw pointers exactly as
NCCL does: a wrong pointer, count, offset or root in ``nccl.py`` shows up as a wrong result here.
What it cannot check: CUDA streams and events (every fake event is complete at once), real NCCL
semantics under load, and anything about performance. Those need the GPU tests.

Example::

    world = FakeWorld(2)
    backends = make_backends(world)       # one NCCLBackend per rank, over fake comms
    run_ranks(lambda b: b.allreduce(FakeArray(np.ones(3))).result(), backends)
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time
import types

import numpy as np

# The real NCCL enum values (nccl.h), so the mapping tables are checked against them.
NCCL_CODES = {"NCCL_INT8": 0, "NCCL_UINT8": 1, "NCCL_INT32": 2, "NCCL_UINT32": 3, "NCCL_INT64": 4,
              "NCCL_UINT64": 5, "NCCL_FLOAT16": 6, "NCCL_FLOAT32": 7, "NCCL_FLOAT64": 8,
              "NCCL_SUM": 0, "NCCL_PROD": 1, "NCCL_MAX": 2, "NCCL_MIN": 3, "NCCL_AVG": 4}
_NP = {0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
       6: np.float16, 7: np.float32, 8: np.float64}


class FakeNcclError(RuntimeError):
    pass


def _mem(ptr: int, count: int, dtype_code: int) -> np.ndarray:
    dtype = np.dtype(_NP[dtype_code])
    if count == 0:
        return np.zeros(0, dtype)
    buf = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype)


class FakeWorld:
    """What the ranks of one fake communicator share: a rendezvous per op, mailboxes for p2p."""

    def __init__(self, size: int):
        self.size = size
        self.cv = threading.Condition()
        self.slots: dict = {}
        self.mail: dict = {}
        self.splits: dict = {}


class FakeComm:
    def __init__(self, world: FakeWorld, rank: int):
        self.world, self.rank = world, rank
        self.count = 0
        self.aborted = False
        self.async_error = None
        self.calls: list = []
        self.sent: list = []     # (peer, bytes) per send that reached the wire: what a test counts as moved

    # -- plumbing -------------------------------------------------------------------------
    def _wait(self, ready, give_up_s: float = 60.0) -> None:
        # give_up_s only stops threads that tests leave behind on purpose from polling forever
        w, end = self.world, time.monotonic() + give_up_s
        while not ready():
            if self.aborted:
                raise FakeNcclError("communicator aborted")
            if time.monotonic() > end:
                raise FakeNcclError("gave up waiting for peers")
            w.cv.wait(0.02)

    def _exchange(self, payload) -> dict:
        w, idx = self.world, self.count
        self.count += 1
        with w.cv:
            w.slots.setdefault(idx, {})[self.rank] = payload
            w.cv.notify_all()
            self._wait(lambda: len(w.slots[idx]) == w.size)
            return dict(w.slots[idx])

    @staticmethod
    def _reduce(values: list, op: int):
        out = values[0].copy()
        for v in values[1:]:
            if op in (0, 4):
                out += v
            elif op == 1:
                out *= v
            elif op == 2:
                np.maximum(out, v, out=out)
            elif op == 3:
                np.minimum(out, v, out=out)
        if op == 4:
            out /= len(values)
        return out

    # -- NCCL API (cupy.cuda.nccl.NcclCommunicator) ---------------------------------------
    def allReduce(self, send, recv, count, dtype, op, stream):
        self.calls.append("allReduce")
        got = self._exchange(_mem(send, count, dtype).copy())
        _mem(recv, count, dtype)[...] = self._reduce([got[r] for r in sorted(got)], op)

    def reduce(self, send, recv, count, dtype, op, root, stream):
        self.calls.append("reduce")
        got = self._exchange(_mem(send, count, dtype).copy())
        if self.rank == root:
            _mem(recv, count, dtype)[...] = self._reduce([got[r] for r in sorted(got)], op)

    def broadcast(self, send, recv, count, dtype, root, stream):
        self.calls.append("broadcast")
        got = self._exchange(_mem(send, count, dtype).copy() if self.rank == root else None)
        _mem(recv, count, dtype)[...] = got[root]

    def allGather(self, send, recv, count, dtype, stream):
        self.calls.append("allGather")
        got = self._exchange(_mem(send, count, dtype).copy())
        _mem(recv, count * self.world.size, dtype)[...] = np.concatenate([got[r] for r in sorted(got)])

    def reduceScatter(self, send, recv, count, dtype, op, stream):
        self.calls.append("reduceScatter")
        got = self._exchange(_mem(send, count * self.world.size, dtype).copy())
        total = self._reduce([got[r] for r in sorted(got)], op)
        _mem(recv, count, dtype)[...] = total[self.rank * count:(self.rank + 1) * count]

    def send(self, buf, count, dtype, peer, stream):
        self.calls.append("send")
        _GROUP.ops.append(("send", self, buf, count, dtype, peer)) if _GROUP.depth else \
            self._do_send(buf, count, dtype, peer)

    def recv(self, buf, count, dtype, peer, stream):
        self.calls.append("recv")
        _GROUP.ops.append(("recv", self, buf, count, dtype, peer)) if _GROUP.depth else \
            self._do_recv(buf, count, dtype, peer)

    def _do_send(self, buf, count, dtype, peer):
        w = self.world
        self.sent.append((peer, count * np.dtype(_NP[dtype]).itemsize))
        with w.cv:
            w.mail.setdefault((self.rank, peer), []).append(_mem(buf, count, dtype).copy())
            w.cv.notify_all()

    def _do_recv(self, buf, count, dtype, peer):
        w = self.world
        with w.cv:
            box = w.mail.setdefault((peer, self.rank), [])
            self._wait(lambda: bool(box))
            data = box.pop(0)
        if data.size != count:
            raise FakeNcclError(f"recv of {count} elements matched a send of {data.size}")
        _mem(buf, count, dtype)[...] = data

    def commSplit(self, color, key):
        self.calls.append("commSplit")
        idx = self.count
        got = self._exchange((color, key))
        if color < 0:
            return None
        members = sorted((k, r) for r, (c, k) in got.items() if c == color)
        with self.world.cv:
            world = self.world.splits.setdefault((idx, color), FakeWorld(len(members)))
        return FakeComm(world, [r for _, r in members].index(self.rank))

    def check_async_error(self):
        if self.async_error is not None:
            raise FakeNcclError(self.async_error)

    def abort(self):
        self.aborted = True
        with self.world.cv:
            self.world.cv.notify_all()

    def destroy(self):
        pass


class _Group(threading.local):
    depth = 0

    def __init__(self):
        self.ops = []


_GROUP = _Group()


def make_nccl_module(version: int = 21805, with_split: bool = True):
    """A module-like object with cupy.cuda.nccl's names."""
    mod = types.SimpleNamespace(available=True, **NCCL_CODES)
    mod.NCCL_SPLIT_NOCOLOR = -1
    mod.get_version = lambda: version
    worlds: dict = {}
    lock = threading.Lock()
    counter = itertools.count()

    def get_unique_id():
        n = next(counter)
        return tuple(((n * 7 + i) % 256) - 128 for i in range(128))

    def communicator(size, uid, rank):
        if not isinstance(uid, tuple):
            raise TypeError("commId must be a tuple")
        with lock:
            world = worlds.setdefault(uid, FakeWorld(size))
        comm = (FakeComm if with_split else FakeCommNoSplit)(world, rank)
        comm._exchange("init")    # ncclCommInitRank blocks until every rank arrived
        return comm

    def group_start():
        _GROUP.depth += 1

    def group_end():
        _GROUP.depth -= 1
        if _GROUP.depth:
            return
        ops, _GROUP.ops = _GROUP.ops, []
        for kind, comm, *args in ops:
            if kind == "send":
                comm._do_send(*args)
        for kind, comm, *args in ops:
            if kind == "recv":
                comm._do_recv(*args)

    mod.get_unique_id = get_unique_id
    mod.NcclCommunicator = communicator
    mod.groupStart, mod.groupEnd = group_start, group_end
    return mod


class FakeCommNoSplit(FakeComm):
    """A communicator of a CuPy/NCCL without ncclCommSplit."""

    @property
    def commSplit(self):
        raise AttributeError("commSplit needs NCCL 2.18")


# -- a fake cupy ------------------------------------------------------------------------------
class FakeArray:
    """Just enough of ``cupy.ndarray`` for the backend: NumPy memory, real pointers."""

    __module__ = "cupy_fake"   # looks like CuPy's; recognised through neural_arch.backend.register_device_type

    def __init__(self, a, device: int = 0):
        self._a = a if isinstance(a, np.ndarray) else np.asarray(a)
        self.device = types.SimpleNamespace(id=device)

    @property
    def __cuda_array_interface__(self):
        return self._a.__array_interface__

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    flags = property(lambda self: self._a.flags)
    data = property(lambda self: types.SimpleNamespace(ptr=self._a.__array_interface__["data"][0]))

    def __getitem__(self, idx):
        return FakeArray(self._a[idx], self.device.id)

    def __setitem__(self, idx, value):
        self._a[idx] = value._a if isinstance(value, FakeArray) else value

    def __itruediv__(self, x):
        self._a /= x
        return self

    def copy(self):
        return FakeArray(self._a.copy(), self.device.id)

    def get(self):
        return self._a.copy()

    def __repr__(self):
        return f"FakeArray({self._a!r})"


class _Stream:
    ptr = 1234

    def __init__(self, non_blocking=False):
        self.waited = []

    def wait_event(self, ev):
        self.waited.append(ev)

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Event:
    done = True

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = stream


class _Device:
    def __init__(self, i=0):
        self.id = i

    def use(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def register_with_backend(cp):
    """Make neural_arch.backend treat FakeArray as a device array (what it does for CuPy's): the
    comm layer recognises arrays only through the one owner, ``backend.is_array``. Returns the
    undo function."""
    from neural_arch import backend

    backend.register_device_type("fakecuda", xp=cp, array_type=FakeArray, to_host=lambda a: a.get(),
                                 from_host=lambda host, index: FakeArray(np.array(host), index),
                                 index_of=lambda a: a.device.id)
    return lambda: backend.unregister_device_type("fakecuda")


def make_cupy_module(device_count: int = 1):
    cuda = types.SimpleNamespace(Device=_Device, Stream=_Stream, Event=_Event,
                                 get_current_stream=lambda: _CURRENT,
                                 runtime=types.SimpleNamespace(getDeviceCount=lambda: device_count))
    return types.SimpleNamespace(
        cuda=cuda, int32=np.int32, int64=np.int64, uint8=np.uint8, ndarray=FakeArray,
        zeros=lambda shape, dtype=np.float32: FakeArray(np.zeros(shape, dtype)),
        empty=lambda shape, dtype=np.float32: FakeArray(np.empty(shape, dtype)),
        asarray=lambda a: a if isinstance(a, FakeArray) else FakeArray(np.array(a)),
        asnumpy=lambda a: a.get() if isinstance(a, FakeArray) else np.asarray(a))


_CURRENT = _Stream()
