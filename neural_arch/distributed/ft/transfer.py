"""Healing's wire format: a nested state (dicts, lists, arrays, scalars) sent peer to peer.

A replica that is behind copies the whole training state from a live peer, never from a file:
``send_state`` splits the state into its arrays and a *skeleton* (the nesting, the scalars,
and each array's shape and dtype); the skeleton goes first as one pickled byte array, then every
array goes raw over the process group's ``send``, straight into a buffer ``recv_state``
allocated from the skeleton. Pickle is only the skeleton's, between the replicas of one job
(trusted peers only, like every ``*_object`` helper); the data path moves arrays.

Example::

    sent = send_state(pg, {"model": model.state_dict(), "step": 12}, dst=2)   # on the live peer
    state = recv_state(pg, src=0)                                             # on the replacement
"""

from __future__ import annotations

import pickle

import numpy as np

__all__ = ["join_arrays", "recv_state", "send_state", "split_arrays"]

_TAG = 7  # one tag for the whole transfer: send and recv pair up in order on it


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
            arrays.append(np.ascontiguousarray(x))
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


def send_state(pg, state, dst: int) -> int:
    """Send ``state`` to group rank ``dst`` of ``pg``; returns the bytes sent (skeleton and arrays).

    Example::

        nbytes = send_state(pg, state_dict(), dst=heal_rank)
    """
    skeleton, arrays = split_arrays(state)
    header = {"skeleton": skeleton, "arrays": [(a.shape, a.dtype.str) for a in arrays]}
    payload = np.frombuffer(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8).copy()
    pg.send(np.array([payload.size], dtype=np.int64), dst, _TAG)
    pg.send(payload, dst, _TAG)
    sent = payload.nbytes + 8
    for a in arrays:
        if a.size:
            pg.send(a, dst, _TAG)
            sent += a.nbytes
    return sent


def recv_state(pg, src: int):
    """Receive what ``send_state`` sent from group rank ``src`` (trusted peers only: it unpickles).

    Example::

        load_state_dict(recv_state(pg, src=quorum.rank_of(source)))
    """
    length = np.zeros(1, dtype=np.int64)
    pg.recv(length, src, _TAG)
    payload = np.empty(int(length[0]), dtype=np.uint8)
    pg.recv(payload, src, _TAG)
    header = pickle.loads(payload.tobytes())  # trusted peers only (module docstring)
    arrays = []
    for shape, dtype in header["arrays"]:
        a = np.empty(shape, dtype=np.dtype(dtype))
        if a.size:
            pg.recv(a, src, _TAG)
        arrays.append(a)
    return join_arrays(header["skeleton"], arrays)
