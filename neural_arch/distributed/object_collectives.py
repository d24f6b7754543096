"""Object collectives (pickle: trusted peers only) and ``monitored_barrier``, torch's names.

Split out of :mod:`neural_arch.distributed.collectives`, which re-exports every name here (import
them from either). Objects travel as pickled bytes over the group's backend; every rank of the
group must call the same function, as with any collective.

Example::

    objs = [None]
    broadcast_object_list(objs, src=0)        # every rank now holds rank 0's objs[0]
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import numpy as np

from neural_arch.distributed.errors import CollectiveTimeoutError
from neural_arch.distributed.resolve import _group

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "monitored_barrier",
           "recv_object_list", "scatter_object_list", "send_object_list"]


def broadcast_object_list(object_list: list[Any], src: int = 0, group=None, device=None) -> list[Any]:
    """Replace ``object_list``'s contents with global rank ``src``'s. Trusted peers only (pickle).

    ``device`` is accepted for torch compatibility and ignored (objects travel on the host).

    Example::

        objs = [{"lr": 0.1}] if dist.get_rank() == 0 else [None]
        dist.broadcast_object_list(objs, src=0)    # objs[0] == {"lr": 0.1} on every rank
    """
    pg = _group(group, "broadcast_object_list")
    if pg is None:
        return None
    root = pg.group_rank(src, "src")
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list (it is filled in place), got {type(object_list).__name__}")
    received = pg.backend.broadcast_object(list(object_list) if pg.rank() == root else None, root)
    if pg.rank() != root:
        object_list[:] = received
    return object_list


def all_gather_object(object_list: list[Any], obj: Any, group=None) -> list[Any]:
    """Fill ``object_list`` (length = group size) with every rank's ``obj``. Trusted peers only.

    Example::

        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, {"rank": dist.get_rank()})   # out[r] == {"rank": r}
    """
    pg = _group(group, "all_gather_object")
    if pg is None:
        return None
    if not isinstance(object_list, list) or len(object_list) != pg.size():
        got = len(object_list) if isinstance(object_list, list) else type(object_list).__name__
        raise ValueError(f"all_gather_object: object_list must be a list of length {pg.size()} (the group "
                         f"size), got {got}; use [None] * get_world_size(group)")
    object_list[:] = pg.backend.allgather_object(obj)
    return object_list


def _raise_if_root_refused(refused: bool, error: Exception | None, op: str, arg: str, root: int) -> None:
    """Raise on every rank when the root rejected ``arg``, an argument only the root has: the root its own
    error, the others one naming the root (the verdict travelled with the collective's own message)."""
    if error is not None:
        raise error
    if refused:
        raise ValueError(f"{op}: global rank {root} rejected its {arg}; nothing was exchanged (see that rank's error)")


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group=None):
    """Every rank's ``obj`` on global rank ``dst`` (filling ``object_gather_list`` there); None elsewhere.

    Example::

        out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(f"host-{dist.get_rank()}", out, dst=0)    # filled on rank 0 only
    """
    pg = _group(group, "gather_object")
    if pg is None:
        return None
    root = pg.group_rank(dst, "dst")
    error = None
    if pg.rank() == root and object_gather_list is not None and (
            not isinstance(object_gather_list, list) or len(object_gather_list) != pg.size()):
        error = ValueError(f"gather_object: object_gather_list must be a list of length {pg.size()} on dst")
    # Built on all_gather_object: simple and correct; objects are small by nature. The root's verdict on
    # its object_gather_list rides along, so a bad one is an error on every rank, not only on dst.
    everything = pg.backend.allgather_object((obj, error is not None))
    _raise_if_root_refused(everything[root][1], error, "gather_object", "object_gather_list", dst)
    everything = [item for item, _ in everything]
    if pg.rank() != root:
        return None
    if object_gather_list is None:
        return everything
    object_gather_list[:] = everything
    return object_gather_list


def scatter_object_list(scatter_object_output_list: list[Any], scatter_object_input_list=None,
                        src: int = 0, group=None) -> list[Any]:
    """Group rank r receives ``scatter_object_input_list[r]`` from ``src`` in ``output_list[0]``.

    Example::

        out = [None]
        configs = [{"shard": r} for r in range(dist.get_world_size())] if dist.get_rank() == 0 else None
        dist.scatter_object_list(out, configs, src=0)    # out[0] == {"shard": rank}
    """
    pg = _group(group, "scatter_object_list")
    if pg is None:
        return None
    root = pg.group_rank(src, "src")
    if not isinstance(scatter_object_output_list, list):
        raise TypeError("scatter_object_output_list must be a list (its first entry receives the object)")
    error = None
    if pg.rank() == root and (not isinstance(scatter_object_input_list, (list, tuple))
                              or len(scatter_object_input_list) != pg.size()):
        error = ValueError(f"scatter_object_list: on src the scatter_object_input_list needs {pg.size()} objects")
    # the root broadcasts its list, or that it refused it: every rank raises instead of waiting
    sent = ((None if error else list(scatter_object_input_list)), error is not None) if pg.rank() == root else None
    items, refused = pg.backend.broadcast_object(sent, root)
    _raise_if_root_refused(refused, error, "scatter_object_list", "scatter_object_input_list", src)
    if scatter_object_output_list:
        scatter_object_output_list[0] = items[pg.rank()]
    else:
        scatter_object_output_list.append(items[pg.rank()])
    return scatter_object_output_list


def send_object_list(object_list: list[Any], dst: int, group=None, device=None) -> None:
    """Send the picklable objects of ``object_list`` to global rank ``dst``. Trusted peers only.

    The receiver calls :func:`recv_object_list` with a list of the same length (torch).
    ``device`` is accepted for torch compatibility and ignored (objects travel on the host).

    Example::

        if dist.get_rank() == 0:
            dist.send_object_list([{"step": 7}], dst=1)
    """
    pg = _group(group, "send_object_list")
    if pg is None:
        return
    if not isinstance(object_list, list) or not object_list:
        raise ValueError("send_object_list: object_list must be a non-empty list")
    peer = pg.group_rank(dst, "dst")
    payloads = [np.frombuffer(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
                for o in object_list]
    sizes = np.array([p.size for p in payloads], dtype=np.int64)
    pg.backend.send(sizes, peer, _OBJECT_TAG).wait()
    pg.backend.send(np.ascontiguousarray(np.concatenate(payloads)), peer, _OBJECT_TAG).wait()
    return


def recv_object_list(object_list: list[Any], src: int | None = None, group=None, device=None) -> int:
    """Fill ``object_list`` (same length as the sender's) with the objects global rank ``src`` sent.

    Returns ``src`` (torch returns the sender's rank). Receiving from any source
    (``src=None``) is not supported: name the sender.

    Example::

        if dist.get_rank() == 1:
            objs = [None]
            dist.recv_object_list(objs, src=0)     # objs[0] == {"step": 7}
    """
    pg = _group(group, "recv_object_list")
    if pg is None:
        return -1
    if src is None:
        raise ValueError("recv_object_list: src=None (any source) is not supported here; pass the "
                         "sender's global rank, e.g. recv_object_list(objs, src=0)")
    if not isinstance(object_list, list) or not object_list:
        raise ValueError("recv_object_list: object_list must be a non-empty list as long as the sender's "
                         "(e.g. [None] * n); it is filled in place")
    peer = pg.group_rank(src, "src")
    sizes = np.empty(len(object_list), dtype=np.int64)
    try:
        pg.backend.recv(sizes, peer, _OBJECT_TAG).wait()
    except ValueError as exc:  # a size-array shape mismatch: the lists differ in length
        raise ValueError(f"recv_object_list: the sender's object_list has a different length than "
                         f"this one ({len(object_list)}); make them equal ({exc})") from exc
    payload = np.empty(int(sizes.sum()), dtype=np.uint8)
    pg.backend.recv(payload, peer, _OBJECT_TAG).wait()
    start = 0
    for i, n in enumerate(sizes.tolist()):
        object_list[i] = pickle.loads(payload[start:start + n].tobytes())
        start += n
    return src


# A tag of its own so object messages never pair with a user's tensor send/recv on tag 0.
_OBJECT_TAG = 32760  # within MPI's guaranteed tag range (0..32767) and gloo's


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not arrive (torch's ``monitored_barrier``).

    Group rank 0 waits ``timeout`` seconds (default: the group's timeout) for every other rank,
    then raises ``CollectiveTimeoutError`` naming the first missing rank (every missing rank with
    ``wait_all_ranks=True``); the other ranks wait for rank 0's release and raise if it never
    comes. Example::

        monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)
    """
    pg = _group(group, "monitored_barrier")
    if pg is None:
        return
    if pg.size() == 1:
        return
    if timeout is None:
        seconds = pg.timeout
    else:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    me, backend = pg.rank(), pg.backend
    if me != 0:
        backend.send(np.ones(1, np.int8), 0, _BARRIER_TAG).wait()
        release = backend.recv(np.empty(1, np.int8), 0, _BARRIER_TAG, async_op=True)
        try:
            release.wait(timeout=seconds)
        except CollectiveTimeoutError:
            raise CollectiveTimeoutError(
                f"monitored_barrier: global rank {pg.ranks[0]} (group rank 0) did not release rank "
                f"{pg.ranks[me]} within {seconds:g} s; see rank {pg.ranks[0]}'s error for the ranks that "
                "did not arrive") from None
        return
    arrivals = {r: backend.recv(np.empty(1, np.int8), r, _BARRIER_TAG, async_op=True)
                for r in range(1, pg.size())}
    deadline = time.monotonic() + seconds
    missing = []
    for r, work in arrivals.items():
        try:
            work.wait(timeout=max(0.0, deadline - time.monotonic()))
        except CollectiveTimeoutError:
            missing.append(pg.ranks[r])
            if not wait_all_ranks:
                break
    if missing:
        which = "ranks" if len(missing) > 1 else "rank"
        raise CollectiveTimeoutError(
            f"monitored_barrier: global {which} {', '.join(map(str, missing))} did not reach the barrier "
            f"within {seconds:g} s" + ("" if wait_all_ranks else " (the first one found; pass "
                                       "wait_all_ranks=True to list all)"))
    for r in range(1, pg.size()):
        backend.send(np.ones(1, np.int8), r, _BARRIER_TAG).wait()
    return


_BARRIER_TAG = 32761
