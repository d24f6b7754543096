"""Process-group state: ``init_process_group``, ``new_group`` and the rank/world queries.

One process holds at most one *default* ("world") group at a time, plus the sub-groups made
from it with :func:`new_group`. A :class:`ProcessGroup` wraps one backend communicator and
remembers its members as **global** ranks, which is what every ``src``/``dst``/``root``
argument of :mod:`neural_arch.distributed.collectives` means (torch semantics).

How ``init_process_group()`` picks a backend when none is given (:func:`select_backend`):

======================================================  ========================================
environment                                             backend
======================================================  ========================================
``NEURAL_ARCH_BACKEND`` set                             that one
``init_method`` is ``tcp://`` or ``file://``            ``gloo``
started by ``mpiexec`` and mpi4py importable            ``mpi`` (MPI's own world decides ranks)
``MASTER_ADDR`` set, or a launcher says world > 1       ``gloo``
nothing                                                 a world of one (every collective a no-op)
======================================================  ========================================

A world of one never opens a socket, whatever backend was asked for, so
``init_process_group(backend="gloo", world_size=1, rank=0)`` works in a notebook.

Example::

    import neural_arch.distributed as dist
    dist.init_process_group()            # gloo / mpi / single process, from the environment
    evens = dist.new_group([r for r in range(dist.get_world_size()) if r % 2 == 0])
    print(dist.get_rank(), dist.get_world_size(), dist.get_backend())
    dist.destroy_process_group()
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from neural_arch.distributed.comm import get_backend_class
from neural_arch.distributed.errors import DistributedError, NotInitializedError

__all__ = [
    "GroupMember",
    "GroupMembershipError",
    "ProcessGroup",
    "destroy_process_group",
    "get_backend",
    "get_default_group",
    "get_distributed_info",
    "get_global_rank",
    "get_group_rank",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "select_backend",
    "split_group",
]

log = logging.getLogger("neural_arch.distributed")

DEFAULT_TIMEOUT = 300.0
DEFAULT_RENDEZVOUS_TIMEOUT = 60.0


from neural_arch.distributed.comm.registry import installed_backends as _installed_backends
from neural_arch.distributed.comm.registry import mpi_importable as _mpi_importable
from neural_arch.distributed.info import get_distributed_info  # noqa: F401 - re-exported
from neural_arch.distributed.state import STATE
from neural_arch.distributed.process_group import GroupMember, GroupMembershipError, ProcessGroup, _NonGroupMember  # noqa: F401


_STATE = STATE  # the module-level name the rest of this file (and tests) use


# ---------------------------------------------------------------------------------- selection
def select_backend(environ: Mapping[str, str], mpi_importable: bool | None = None,
                   init_method: str | None = None) -> str:
    """The backend ``init_process_group()`` uses when none is given (see the module table).

    Pure selection logic: reads only ``environ``. Example::

        >>> select_backend({"MASTER_ADDR": "10.0.0.1"})
        'gloo'
        >>> select_backend({})
        'local'
    """
    from neural_arch.distributed.run.env import detect_launch_env, launched_by_mpiexec

    explicit = (environ.get("NEURAL_ARCH_BACKEND") or "").strip().lower()
    if explicit:
        return explicit
    if init_method and not init_method.startswith("env://"):
        return "gloo"
    if launched_by_mpiexec(environ):
        if mpi_importable is None:
            mpi_importable = _mpi_importable()
        if mpi_importable:
            return "mpi"
    if (environ.get("MASTER_ADDR") or "").strip():
        return "gloo"
    launch = detect_launch_env(environ)
    if launch is not None and launch["world_size"] > 1:
        return "gloo"
    return "local"


def _seconds(value, name: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}={value!r} must be seconds (a number) or a datetime.timedelta") from None
    if value <= 0:
        raise ValueError(f"{name}={value} must be positive")
    return value


def _env_float(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return _seconds(text, name)
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={text!r} must be a positive number of seconds") from None


# ---------------------------------------------------------------------------------- init
def is_available() -> bool:
    """Always True: the gloo backend needs nothing beyond NumPy."""
    return True


def is_initialized() -> bool:
    """Whether ``init_process_group()`` ran (and ``destroy_process_group()`` did not since)."""
    return _STATE.world is not None


def init_process_group(backend: str | None = None, init_method: str | None = "env://",
                       world_size: int | None = None, rank: int | None = None,
                       timeout=None, store=None, rendezvous_timeout=None, **backend_options) -> ProcessGroup:
    """Join (or create) the default process group; returns it.

    Args:
        backend: ``"gloo"``, ``"mpi"``, ``"nccl"``, ``"local"`` or None to pick from the environment.
        init_method: ``"env://"`` (MASTER_ADDR/MASTER_PORT), ``"tcp://host:port"`` or ``"file:///path"``
            (a fresh file on a shared file system). Ignored when ``store`` is given.
        world_size, rank: default to what the launcher left (RANK/WORLD_SIZE, mpiexec, SLURM).
        timeout: seconds (or ``timedelta``) one collective may take; default 300 s
            (``NEURAL_ARCH_TIMEOUT``).
        store: an already connected store to rendezvous through.
        rendezvous_timeout: seconds every rank has to show up; default 60 s
            (``NEURAL_ARCH_RENDEZVOUS_TIMEOUT``). The error names the ranks that never arrived.

    Example::

        init_process_group()                                 # from the environment
        init_process_group("gloo", "tcp://10.0.0.1:29500", world_size=4, rank=r)
    """
    with _STATE.lock:
        if _STATE.world is not None:
            raise DistributedError(
                f"init_process_group() was already called (backend {_STATE.world.backend_name!r}, "
                f"rank {_STATE.world.rank()} of {_STATE.world.size()}); call destroy_process_group() "
                "first to re-initialise")
        timeout = _seconds(timeout, "timeout") if timeout is not None else \
            _env_float("NEURAL_ARCH_TIMEOUT", DEFAULT_TIMEOUT)
        rendezvous_timeout = (_seconds(rendezvous_timeout, "rendezvous_timeout") if rendezvous_timeout is not None
                              else _env_float("NEURAL_ARCH_RENDEZVOUS_TIMEOUT", DEFAULT_RENDEZVOUS_TIMEOUT))
        environ = os.environ
        # torch: rank=-1 / world_size=-1 (its defaults) mean "from the environment"
        rank = None if rank is not None and int(rank) == -1 else rank
        world_size = None if world_size is not None and int(world_size) == -1 else world_size
        init_method = init_method or "env://"
        name = (backend or select_backend(environ, init_method=None if store is not None else init_method))
        name = str(name).strip().lower()
        # Counted before anything can fail: a retry after a failed rendezvous then uses fresh
        # store keys instead of the half-written ones of the failed attempt.
        generation = _STATE.generation = _STATE.generation + 1
        token = environ.get("NEURAL_ARCH_AUTH_TOKEN") or _derived_job_token(environ)
        launch = _launch_env(environ)
        layout = None

        if name == "mpi":
            impl = get_backend_class("mpi").create(None, rank, world_size, timeout,
                                                   rendezvous_timeout=rendezvous_timeout, **backend_options)
            rank, world_size = impl.rank, impl.size
            source = "mpi"
        else:
            rank, world_size, source = _resolve_rank_world(rank, world_size, launch, init_method, name)
            if world_size == 1 and store is None:
                # A world of one needs no rendezvous and no sockets, whatever was asked for.
                impl = get_backend_class("local").create(None, 0, 1, timeout)
            else:
                if store is None:
                    store = _make_store(init_method, rank, world_size, rendezvous_timeout, token, launch)
                impl, layout = _create_backend(name, store, rank, world_size, timeout, rendezvous_timeout,
                                               token, generation, backend_options)

        world = ProcessGroup(impl, list(range(world_size)), name, "WORLD", generation)
        _STATE.world = world
        _STATE.groups = [world]
        _STATE.generation = generation
        GroupMember.WORLD = world
        _STATE.info = {"init_method": init_method if source != "mpi" else "mpi", "rank_source": source,
                       "timeout": timeout, "rendezvous_timeout": rendezvous_timeout, "launch": launch,
                       "layout": layout}
        _mark_ready(environ, rank)
        if impl.debug:
            log.warning("neural_arch.distributed: NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL on rank %d of %d "
                        "(%s): every collective is first checked across ranks (op, shape, dtype, root); "
                        "this costs one extra small all_gather per collective", rank, world_size, name)
        return world


READY_DIR_ENV = "NEURAL_ARCH_READY_DIR"


def _mark_ready(environ, rank: int) -> None:
    """Tell the launcher this rank got through rendezvous: an empty ``$NEURAL_ARCH_READY_DIR/rank_N``.

    The launcher's start timeout counts only ranks that never wrote their file, so a slow first
    step is not mistaken for a stuck start. A failure to write it is logged, never raised: the
    job itself is fine. Example: ``NEURAL_ARCH_READY_DIR=/tmp/job1`` -> ``/tmp/job1/rank_3``.
    """
    folder = (environ.get(READY_DIR_ENV) or "").strip()
    if not folder:
        return
    path = os.path.join(folder, f"rank_{rank}")
    try:
        with open(path, "wb"):
            pass
    except OSError as exc:
        log.warning("rank %d could not write its ready marker %s (%s); the launcher may count this rank "
                    "as not started: check that %s=%s exists and is writable", rank, path, exc,
                    READY_DIR_ENV, folder)


def _derived_job_token(environ) -> str | None:
    """A job token derived from mpiexec's/srun's job id (run_env), when the launcher gave none.

    Looked up with getattr so this module works with run_env versions that lack it.
    """
    from neural_arch.distributed.run import env as run_env

    derive = getattr(run_env, "derive_job_token", None)
    return derive(environ) if callable(derive) else None


def _launch_env(environ) -> dict | None:
    from neural_arch.distributed.run.env import detect_launch_env

    return detect_launch_env(environ)


def _resolve_rank_world(rank, world_size, launch, init_method: str, name: str):
    """Explicit arguments win; otherwise what the launcher (RANK/WORLD_SIZE, mpiexec, SLURM) says."""
    source = "arguments"
    if launch is not None:
        if world_size is None:
            world_size, source = launch["world_size"], launch["source"]
        if rank is None:
            rank, source = launch["rank"], launch["source"]
    if world_size is None and rank is None:
        world_size, rank, source = 1, 0, "default"
    if world_size is None or rank is None:
        missing = "world_size" if world_size is None else "rank"
        raise ValueError(f"init_process_group(backend={name!r}, init_method={init_method!r}): {missing} is "
                         f"unknown; pass {missing}=... or set RANK and WORLD_SIZE (our launcher does)")
    world_size, rank = int(world_size), int(rank)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    return rank, world_size, source


def _make_store(init_method: str, rank: int, world_size: int, timeout: float, token, launch):
    """Connect to (rank 0: host) the rendezvous store named by ``init_method``; cached per address."""
    from neural_arch.distributed.rendezvous.store import FileStore, TCPStore

    if init_method.startswith("file://"):
        path = init_method[len("file://"):]
        key = ("file", os.path.abspath(path))
        if key not in _STATE.stores:
            _STATE.stores[key] = FileStore(path, world_size=world_size, timeout=timeout)
        return _STATE.stores[key]
    if init_method.startswith("tcp://"):
        host, _, port = init_method[len("tcp://"):].rstrip("/").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"init_method={init_method!r} must look like 'tcp://HOST:PORT'")
        port = int(port)
    elif init_method.startswith("env://"):
        host = os.environ.get("MASTER_ADDR") or (launch or {}).get("master_addr") or "127.0.0.1"
        port_text = os.environ.get("MASTER_PORT") or str((launch or {}).get("master_port") or 29500)
        if not port_text.strip().isdigit():
            raise ValueError(f"MASTER_PORT={port_text!r} must be a port number")
        port = int(port_text)
    else:
        raise ValueError(f"init_method={init_method!r} is not understood; use 'env://', "
                         "'tcp://HOST:PORT' or 'file:///path/to/fresh/file'")
    host = host.strip("[]")
    key = ("tcp", host, port)
    store = _STATE.stores.get(key)
    if store is None:
        # Rank 0 listens on MASTER_ADDR itself; when that names this host by a non-local name,
        # listen on every interface so the other hosts can reach it.
        bind = host if rank != 0 or _is_loopback(host) else "0.0.0.0"
        store = TCPStore(bind if rank == 0 else host, port, world_size=world_size, is_master=(rank == 0),
                         timeout=timeout, auth_token=token)
        _STATE.stores[key] = store
    return store


def _is_loopback(host: str) -> bool:
    try:
        return host in ("localhost", "::1") or socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _create_backend(name, store, rank, world_size, timeout, rendezvous_timeout, token, generation, options):
    from neural_arch.distributed.rendezvous.store import PrefixStore, store_barrier

    cls = get_backend_class(name)
    if not cls.is_available():
        raise ImportError(f"backend {name!r} is not available here; installed: {_installed_backends()}")
    # A fresh key namespace per init: destroy + re-init on the same store must not see old keys.
    scoped = PrefixStore(f"neural_arch/pg{generation}/", store)
    # Each rank publishes its host before the barrier, so after it the whole map is readable:
    # it gives local_rank / local_world_size when the launcher's variables do not.
    scoped.set(f"host/{rank}", _host_identity())
    store_barrier(scoped, rank, world_size, "init", rendezvous_timeout)
    layout = _host_layout([scoped.get(f"host/{r}").decode() for r in range(world_size)], rank)
    if name == "gloo" and token is not None:
        options = dict(options, auth_token=token)
    return cls.create(scoped, rank, world_size, timeout, **options), layout


def _host_identity() -> str:
    from neural_arch.distributed.comm.transport.engine import host_identity  # the transport's notion of "same host"

    return host_identity()


def _host_layout(hosts: list[str], rank: int) -> dict[str, int]:
    """``hosts[r]`` = rank r's host -> this rank's local_rank, local_world_size, node_rank, num_nodes.

    Nodes are numbered in order of their lowest rank. Example::

        >>> _host_layout(["a", "b", "a"], 2)
        {'local_rank': 1, 'local_world_size': 2, 'node_rank': 0, 'num_nodes': 2}
    """
    mine = hosts[rank]
    order = list(dict.fromkeys(hosts))
    return {"local_rank": sum(1 for h in hosts[:rank] if h == mine), "local_world_size": hosts.count(mine),
            "node_rank": order.index(mine), "num_nodes": len(order)}


def destroy_process_group(group=None) -> None:
    """Tear down ``group`` (default: the world and every sub-group). Safe when not initialised.

    The rendezvous store stays connected, so ``init_process_group()`` on the same address works
    right after. Example::

        destroy_process_group()
        init_process_group()        # a fresh group
    """
    with _STATE.lock:
        if group is None or group is GroupMember.WORLD or group is _STATE.world:
            targets = list(_STATE.groups)
            _STATE.world = None
            _STATE.groups = []
            GroupMember.WORLD = None
        elif group is GroupMember.NON_GROUP_MEMBER:
            return
        else:
            targets = [group] if group in _STATE.groups else []
            _STATE.groups = [g for g in _STATE.groups if g is not group]
        for pg in reversed(targets):  # sub-groups first: they may share the world's sockets
            pg.destroyed = True
            try:
                pg.backend.shutdown()
            except Exception as exc:  # noqa: BLE001 - a teardown error must not hide the real one
                log.warning("shutting down %r failed: %s", pg, exc)


def _close_stores() -> None:
    for store in list(_STATE.stores.values()):
        try:
            store.close()
        except Exception as exc:  # noqa: BLE001 - exiting anyway
            log.debug("closing %r at exit failed: %s", store, exc)
    _STATE.stores.clear()


atexit.register(_close_stores)


# ---------------------------------------------------------------------------------- groups
def get_default_group() -> ProcessGroup:
    """The world group; :class:`NotInitializedError` before ``init_process_group()``."""
    world = _STATE.world
    if world is None:
        raise NotInitializedError("the default process group is not initialised; call "
                                  "neural_arch.distributed.init_process_group() first")
    return world


def _resolve_group(group=None, op: str = "this operation") -> ProcessGroup:
    """``group`` (None / GroupMember.WORLD / a ProcessGroup) -> the ProcessGroup to use.

    Raises NotInitializedError before init, GroupMembershipError for NON_GROUP_MEMBER, and a
    clear error for a group that was destroyed or belongs to an earlier init.
    """
    world = _STATE.world
    if world is None:
        raise NotInitializedError(f"{op} needs a process group; call "
                                  "neural_arch.distributed.init_process_group() first")
    if group is None or group is GroupMember.WORLD:
        return world
    if group is GroupMember.NON_GROUP_MEMBER:
        raise GroupMembershipError(
            f"{op}: this rank (global rank {world.rank()}) is not a member of the group; new_group() "
            "returned GroupMember.NON_GROUP_MEMBER here. Only the group's ranks may call it: guard the "
            "call with `if group is not GroupMember.NON_GROUP_MEMBER:`")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"{op}: group={group!r} must be a ProcessGroup from new_group() (or None for the world)")
    if group.destroyed or group.generation != world.generation:
        raise DistributedError(f"{op}: {group!r} was destroyed (or made before the last "
                               "init_process_group()); create it again with new_group()")
    return group


def new_group(ranks: Sequence[int] | None = None, timeout=None, backend: str | None = None):
    """Make a sub-group of the world. **Every rank of the world must call it.**

    Two calling styles are accepted, and told apart by one small all-gather of every rank's
    list (so a wrong call fails at once, on every rank, instead of hanging later):

    * **torch's**: every rank passes the *same* list (non-members too). Members get the new
      :class:`ProcessGroup`, the others ``GroupMember.NON_GROUP_MEMBER``.
    * **a split** (MPI_Comm_split; seed 004's pattern): each rank passes the ranks of *its own*
      group, and the lists form a partition of the world (each list holds its caller, two lists
      either agree or are disjoint). Every rank then gets the group it named.

    Anything else (e.g. rank 1 passing ``[0, 1]`` while rank 0 passes ``[0, 2]``) raises
    :class:`DistributedError` on every rank, naming each rank's list.

    ``ranks`` are global ranks (default: all). Example::

        pair = new_group([0, 1])                       # torch style, called by every rank
        if pair is not GroupMember.NON_GROUP_MEMBER:
            all_reduce(t, group=pair)
        tp = new_group([r - r % 2, r - r % 2 + 1])     # split style: each rank names its own pair
    """
    world = _resolve_group(None, "new_group")
    size = world.size()
    ranks = list(range(size)) if ranks is None else [int(r) for r in ranks]
    _check_ranks(ranks, size, "new_group")
    if backend is not None and str(backend).lower() != world.backend_name:
        raise ValueError(f"new_group(backend={backend!r}): sub-groups use the world's backend "
                         f"({world.backend_name!r}); omit backend=")
    lists = _exchange_rank_lists(world, ranks)
    me = world.rank()
    if all(lst == lists[0] for lst in lists):
        return _make_groups([ranks], me, timeout)[0]
    partition = _as_partition(lists)
    if partition is None:
        shown = "; ".join(f"rank {r}: {lst}" for r, lst in enumerate(lists))
        raise DistributedError(
            f"new_group: the ranks disagree on the group ({shown}). Either every rank passes the same "
            "list (torch's style, non-members included), or each rank passes the ranks of its own group "
            "and the lists form a partition of the world (a split); for several groups at once use "
            "new_subgroups_by_enumeration([[...], [...]])")
    groups = _make_groups(partition, me, timeout)
    return next(g for g, members in zip(groups, partition) if me in members)


def _check_ranks(ranks: list[int], size: int, op: str) -> None:
    if not ranks:
        raise ValueError(f"{op}: ranks must not be empty")
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(f"{op}: rank {r} is out of range for a world of size {size} "
                             f"(valid: 0..{size - 1})")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{op}: ranks {ranks} contain duplicates")


def _exchange_rank_lists(world: ProcessGroup, ranks: list[int]) -> list[list[int]]:
    """Every rank's (sorted) list, via one int64 all-gather over the world (arrays, no pickle)."""
    import numpy as np

    size = world.size()
    mine = np.full(size, -1, dtype=np.int64)
    mine[:len(ranks)] = sorted(ranks)
    table = np.empty((size, size), dtype=np.int64)
    world.backend.allgather(table, mine)
    return [[int(v) for v in row if v >= 0] for row in table]


def _as_partition(lists: list[list[int]]) -> list[list[int]] | None:
    """The distinct groups when ``lists[r]`` is rank r's own group in a partition; else None."""
    for r, lst in enumerate(lists):
        if r not in lst or any(lists[m] != lst for m in lst):
            return None
    return sorted({tuple(lst) for lst in lists}, key=lambda g: g[0])  # type: ignore[return-value]


def _make_groups(groups: Sequence[Sequence[int]], me: int, timeout) -> list:
    """Create each group in order on every rank (backends need all ranks to take part in each).

    Returns one entry per group: the ProcessGroup where this rank is a member,
    ``GroupMember.NON_GROUP_MEMBER`` elsewhere.
    """
    world = _resolve_group(None, "new_group")
    out = []
    for members in groups:
        members = sorted(int(r) for r in members)
        impl = world.backend.new_group(members)  # collective over the world
        with _STATE.lock:
            if impl is None:
                out.append(GroupMember.NON_GROUP_MEMBER)
                continue
            if timeout is not None:
                impl.timeout = _seconds(timeout, "timeout")
            pg = ProcessGroup(impl, members, world.backend_name, f"group{len(_STATE.groups)}", world.generation)
            _STATE.groups.append(pg)
            out.append(pg)
    return out


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]], timeout=None,
                                 backend: str | None = None):
    """Make several disjoint groups at once (torch): returns ``(this rank's group, all groups)``.

    Every rank calls it with the same list of lists. The first item is None on a rank that is in
    none of them; the list holds ``GroupMember.NON_GROUP_MEMBER`` for groups this rank is not in.
    Example (4 ranks)::

        mine, groups = new_subgroups_by_enumeration([[0, 2], [1, 3]])
    """
    world = _resolve_group(None, "new_subgroups_by_enumeration")
    if backend is not None and str(backend).lower() != world.backend_name:
        raise ValueError(f"new_subgroups_by_enumeration(backend={backend!r}): sub-groups use the world's "
                         f"backend ({world.backend_name!r}); omit backend=")
    if not ranks_per_subgroup_list:
        raise ValueError("new_subgroups_by_enumeration: ranks_per_subgroup_list must not be empty")
    groups = [[int(r) for r in g] for g in ranks_per_subgroup_list]
    seen: dict[int, int] = {}
    for i, g in enumerate(groups):
        _check_ranks(g, world.size(), "new_subgroups_by_enumeration")
        for r in g:
            if r in seen:
                raise ValueError(f"new_subgroups_by_enumeration: rank {r} is in subgroup {seen[r]} and in "
                                 f"subgroup {i}; the subgroups must be disjoint")
            seen[r] = i
    # Same consistency check as new_group: every rank must pass the same enumeration.
    lists = _exchange_enumeration(world, groups)
    if any(lst != lists[0] for lst in lists):
        shown = "; ".join(f"rank {r}: {lst}" for r, lst in enumerate(lists))
        raise DistributedError(f"new_subgroups_by_enumeration: the ranks passed different subgroups ({shown}); "
                               "every rank must pass the same list of lists")
    out = _make_groups(groups, world.rank(), timeout)
    mine = next((g for g in out if g is not GroupMember.NON_GROUP_MEMBER), None)
    return mine, out


def _exchange_enumeration(world: ProcessGroup, groups: list[list[int]]) -> list[list[list[int]]]:
    """Every rank's list of groups (encoded as one int64 row: ranks, -1 between groups)."""
    import numpy as np

    size = world.size()
    width = 2 * size + 1
    code = [r for g in groups for r in (*g, -1)]
    if len(code) > width:  # cannot happen for disjoint groups of valid ranks; guards the encoding
        raise ValueError("new_subgroups_by_enumeration: too many subgroups for the world size")
    row = np.full(width, -2, dtype=np.int64)
    row[:len(code)] = code
    table = np.empty((size, width), dtype=np.int64)
    world.backend.allgather(table, row)
    decoded = []
    for line in table:
        gs, cur = [], []
        for v in line:
            if v == -2:
                break
            if v == -1:
                gs.append(cur)
                cur = []
            else:
                cur.append(int(v))
        decoded.append(gs)
    return decoded


def new_subgroups(group_size: int | None = None, group=None, timeout=None, backend: str | None = None):
    """Split the world into consecutive groups of ``group_size`` ranks (torch).

    Returns ``(this rank's group, all groups)``; ``group_size`` defaults to the ranks per node
    (``LOCAL_WORLD_SIZE``), and must divide the world size. Example (4 ranks)::

        mine, groups = new_subgroups(2)      # [[0, 1], [2, 3]]
    """
    world = _resolve_group(None, "new_subgroups")
    if group is not None and group is not GroupMember.WORLD and group is not world:
        raise NotImplementedError("new_subgroups(group=...): only splitting the world is supported; "
                                  "use new_subgroups_by_enumeration with global ranks instead")
    if group_size is None:
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE") or (_STATE.info.get("layout") or {}).get(
            "local_world_size") or world.size())
    group_size = int(group_size)
    size = world.size()
    if group_size <= 0 or size % group_size:
        raise ValueError(f"new_subgroups: group_size={group_size} must be positive and divide the world "
                         f"size {size}")
    return new_subgroups_by_enumeration([list(range(s, s + group_size)) for s in range(0, size, group_size)],
                                        timeout=timeout, backend=backend)


def split_group(parent_pg=None, split_ranks: Sequence[Sequence[int]] | None = None, timeout=None,
                pg_options=None, group_desc: str | None = None):
    """Split ``parent_pg`` (default: the world) into the disjoint groups ``split_ranks`` (torch).

    Every rank calls it with the same ``split_ranks`` (global ranks); returns this rank's new
    group, or None when it is in none. Example (4 ranks)::

        tp = split_group(split_ranks=[[0, 1], [2, 3]])
    """
    world = _resolve_group(None, "split_group")
    if parent_pg is not None and parent_pg is not GroupMember.WORLD and parent_pg is not world:
        raise NotImplementedError("split_group(parent_pg=...): only the world can be split here; pass "
                                  "parent_pg=None with global ranks in split_ranks")
    if split_ranks is None:
        raise ValueError("split_group: split_ranks is required (a list of disjoint lists of global ranks)")
    if pg_options is not None:
        raise ValueError("split_group: pg_options are not supported by neural_arch backends; omit it")
    mine, _ = new_subgroups_by_enumeration(split_ranks, timeout=timeout)
    if mine is not None and group_desc:
        mine.name = str(group_desc)
    return mine


# ---------------------------------------------------------------------------------- queries
def get_rank(group=None) -> int:
    """This process's rank in ``group`` (default: the world); -1 on a non-member (torch)."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve_group(group, "get_rank").rank()


def get_world_size(group=None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 on a non-member (torch)."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve_group(group, "get_world_size").size()


def get_backend(group=None) -> str:
    """The backend name of ``group`` (``"gloo"``, ``"mpi"``, ``"local"``, ...)."""
    return _resolve_group(group, "get_backend").backend_name


def get_group_rank(group, global_rank: int) -> int:
    """Global rank -> rank inside ``group``."""
    return _resolve_group(group, "get_group_rank").group_rank(global_rank, "global_rank")


def get_global_rank(group, group_rank: int) -> int:
    """Rank inside ``group`` -> global rank."""
    return _resolve_group(group, "get_global_rank").global_rank(group_rank)
