"""Process-group state: ``init_process_group``, ``new_group`` and the rank/world queries.

One process holds at most one *default* ("world") group at a time, plus the sub-groups made
from it with :func:`~neural_arch.distributed.subgroups.new_group`. A
:class:`~neural_arch.distributed.process_group.ProcessGroup` wraps one backend communicator and
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
import sys
import time
import warnings
from collections.abc import Mapping
from typing import NamedTuple

from neural_arch import config
from neural_arch.distributed.comm import get_backend_class
from neural_arch.distributed.comm.local import LocalBackend
from neural_arch.distributed.errors import DistributedError, NotInitializedError, RendezvousError
from neural_arch.distributed.host import host_identity as _host_identity  # the transport's "same host"

__all__ = [
    "destroy_process_group",
    "get_backend",
    "get_default_group",
    "get_global_rank",
    "get_group_rank",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_available",
    "is_initialized",
    "select_backend",
]

log = logging.getLogger("neural_arch.distributed")

DEFAULT_TIMEOUT = 300.0
DEFAULT_RENDEZVOUS_TIMEOUT = 60.0
#: A rank still waiting at the rendezvous after this many seconds says what it waits for (and again
#: every as many seconds): a long rendezvous timeout must not be a long silence.
WAIT_LOG_S = 30.0
#: The longest the store's host waits at destroy/exit for the other ranks to leave (see _Leave).
LEAVE_WAIT_S = 10.0


from neural_arch.distributed.comm.registry import installed_backends as _installed_backends
from neural_arch.distributed.comm.registry import mpi_importable as _mpi_importable

# Sub-groups live in their own module; re-exported here, where they have always been importable.
from neural_arch.distributed.process_group import (
    GroupMember,
    GroupMembershipError,
    ProcessGroup,
)
from neural_arch.distributed.resolve import _resolve_group, _seconds
from neural_arch.distributed.state import STATE

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
    from neural_arch.distributed.launch_env import detect_launch_env, launched_by_mpiexec

    explicit = (config.get("NEURAL_ARCH_BACKEND", environ) or "").strip().lower()
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


def _env_float(name: str, default: float) -> float:
    """A positive number of seconds from the environment (read through the one settings table)."""
    try:
        value = config.get(name)
    except ValueError as exc:  # the table's message names the variable and its value
        raise ValueError(f"environment variable {exc}; it must be a positive number of seconds") from None
    try:
        return default if value is None else _seconds(value, name)
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={value!r} must be a positive number of seconds") from None


# ---------------------------------------------------------------------------------- init
def is_available() -> bool:
    """Always True: the gloo backend needs nothing beyond NumPy.

    Example::

        >>> import neural_arch.distributed as dist
        >>> dist.is_available()
        True
    """
    return True


def is_initialized() -> bool:
    """Whether ``init_process_group()`` ran (and ``destroy_process_group()`` did not since).

    Example::

        if not dist.is_initialized():
            dist.init_process_group()
    """
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
        # The token authenticates; the srun/mpiexec job id (public) only keeps two jobs apart.
        token = config.get("NEURAL_ARCH_AUTH_TOKEN", environ) or None
        auth = _StoreAuth(token, _derived_job_token(environ), config.get("NEURAL_ARCH_ALLOW_UNAUTHENTICATED", environ))
        launch = _launch_env(environ)
        layout = leave = None

        if name == "mpi":
            _refuse_mpi_outside_mpiexec(environ, launch)
            if rank is not None or world_size is not None:
                # torch's rule (its MPI tutorial passes rank=0, world_size=0): MPI assigns both
                warnings.warn(f"init_process_group('mpi'): rank={rank} and world_size={world_size} are ignored; "
                              "the MPI runtime assigns them (start N ranks with mpiexec -n N)", stacklevel=2)
                rank = world_size = None
            impl = get_backend_class("mpi").create(None, rank, world_size, timeout,
                                                   rendezvous_timeout=rendezvous_timeout, **backend_options)
            _check_mpi_world(launch, impl)
            rank, world_size = impl.rank, impl.size
            source = "mpi"
        else:
            rank, world_size, source = _resolve_rank_world(rank, world_size, launch, init_method, name)
            # Checked before the rendezvous, on every rank: a backend that cannot run here (nccl without
            # CuPy) must give every rank the same clear error -- checked after it, rank 0 raised and took
            # the store with it, and the others reported a lost store instead. In a world of one it is
            # still an error (else get_backend() would say "nccl" on a machine without CuPy).
            _require_available(name)
            if world_size == 1 and store is None:
                impl = get_backend_class("local").create(None, 0, 1, timeout)
            else:
                if store is None:
                    store = _make_store(init_method, rank, world_size, rendezvous_timeout, auth, launch)
                leave = _Leave(store, generation, rank, world_size, rendezvous_timeout)
                impl, layout = _create_backend(name, store, rank, world_size, timeout, rendezvous_timeout,
                                               token, generation, backend_options)

        world = ProcessGroup(impl, list(range(world_size)), name, "WORLD", generation)
        _STATE.world = world
        _STATE.groups = [world]
        _STATE.generation = generation
        GroupMember.WORLD = world
        _STATE.info = {"init_method": init_method if source != "mpi" else "mpi", "rank_source": source,
                       "timeout": timeout, "rendezvous_timeout": rendezvous_timeout, "launch": launch,
                       "layout": layout, "leave": leave}
        _mark_ready(environ, rank)
        _STATE.info["exported_env"] = _export_torch_env(launch, environ)
        _start_observability(world)
        if impl.debug:
            log.warning("neural_arch.distributed: NEURAL_ARCH_DISTRIBUTED_DEBUG=DETAIL on rank %d of %d "
                        "(%s): every collective is first checked across ranks (op, shape, dtype, root); "
                        "this costs one extra small all_gather per collective", rank, world_size, name)
        return world


_WARNED_OVERSUBSCRIBED = False


def _export_torch_env(launch, environ) -> list[str]:
    """Under mpiexec/srun: torch's RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE into the environment
    (those not set already; ``destroy_process_group`` removes them again), and -- once, on local rank
    0 -- a warning when the host runs more ranks than it has CPUs (our launcher warns for its own)."""
    global _WARNED_OVERSUBSCRIBED
    from neural_arch.distributed.launch_env import export_launch_env, oversubscription_message

    if launch is None or launch["source"] not in ("mpiexec", "slurm"):
        return []
    message = oversubscription_message(int(launch["local_world_size"]))
    if message and int(launch["local_rank"]) == 0 and not _WARNED_OVERSUBSCRIBED:
        _WARNED_OVERSUBSCRIBED = True
        log.warning("neural_arch.distributed (%s): %s", launch["source"], message)
    return export_launch_env(launch, environ)


def _start_observability(world) -> None:
    """Start what watches the job: the stall inspector (``NEURAL_ARCH_STALL_WARNING_S``, default
    60 s, 0 = off) and the job-long timeline (``NEURAL_ARCH_TIMELINE=dir``: a collective clock sync)."""
    from neural_arch.distributed.stall import start_stall_inspector
    from neural_arch.profiler import start_timeline_from_env

    start_stall_inspector(world)
    start_timeline_from_env(world)


def _stop_observability() -> None:
    """Before the world's backends go: merge the timeline on rank 0 (a collective), stop the inspector."""
    from neural_arch.distributed.stall import stop_stall_inspector
    from neural_arch.profiler import stop_timeline

    stop_timeline()
    stop_stall_inspector()


READY_DIR_ENV = "NEURAL_ARCH_READY_DIR"


def _mark_ready(environ, rank: int) -> None:
    """Tell the launcher this rank got through rendezvous: an empty ``$NEURAL_ARCH_READY_DIR/rank_N``.

    The launcher's start timeout counts only ranks that never wrote their file, so a slow first
    step is not mistaken for a stuck start. A failure to write it is logged, never raised: the
    job itself is fine. Example: ``NEURAL_ARCH_READY_DIR=/tmp/job1`` -> ``/tmp/job1/rank_3``.
    """
    folder = config.get(READY_DIR_ENV, environ)
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
    """A public id of the mpiexec/srun job (launch_env): it keeps two jobs apart, never authenticates."""
    from neural_arch.distributed.launch_env import derive_job_token

    return derive_job_token(environ)


class _StoreAuth(NamedTuple):
    """Who may join the rendezvous store (docs/security.md): ``token`` (NEURAL_ARCH_AUTH_TOKEN)
    authenticates; ``job_id`` (the public srun/mpiexec id) only separates jobs; ``allow_open``
    (NEURAL_ARCH_ALLOW_UNAUTHENTICATED) lets a multi-host job without a token run open.

    >>> _StoreAuth(None, "4242", False).job_id
    '4242'
    """

    token: str | None
    job_id: str | None
    allow_open: bool


def _launch_env(environ) -> dict | None:
    from neural_arch.distributed.launch_env import detect_launch_env

    return detect_launch_env(environ)


def _resolve_rank_world(rank, world_size, launch, init_method: str, name: str):
    """Explicit arguments win; otherwise what the launcher (RANK/WORLD_SIZE, mpiexec, SLURM) says."""
    source = "arguments"
    if launch is not None:
        # An explicit value that contradicts the launcher would make this rank rendezvous with a job
        # that does not exist (a port clash on one rank, a long wait on the others): refuse it here.
        for arg, given in (("rank", rank), ("world_size", world_size)):
            if given is not None and int(given) != int(launch[arg]):
                raise ValueError(
                    f"init_process_group(backend={name!r}): {arg}={given} contradicts the {launch['source']} "
                    f"environment ({arg}={launch[arg]}); omit {arg} (or pass -1) to take it "
                    f"from the environment, or start the job with the layout you want")
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


def _make_store(init_method: str, rank: int, world_size: int, timeout: float, auth, launch):
    """Connect to (rank 0: host) the rendezvous store named by ``init_method``; cached per address.
    ``auth`` (:class:`_StoreAuth`) says who may join; a bare token (str) is accepted too."""
    from neural_arch.distributed.rendezvous.store import FileStore, TCPStore

    if "?" in init_method:
        # torch reads ?rank=&world_size= there; here they are arguments: a query would become part of
        # a file's name or the port, so ranks spelling it differently would wait for each other in vain
        raise ValueError(f"init_method={init_method!r}: query parameters are not read; pass rank= and "
                         "world_size= to init_process_group (or set RANK/WORLD_SIZE) and drop the '?...'")
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
        if ":" in host and not (host.startswith("[") and host.endswith("]")):
            # 'tcp://::1' would read as host '::' and port 1
            raise ValueError(f"init_method={init_method!r}: write an IPv6 address in brackets, then the "
                             "port: 'tcp://[ADDR]:PORT', e.g. 'tcp://[::1]:29500'")
        port = int(port)
        if port == 0 and world_size > 1:
            raise ValueError(f"init_method={init_method!r}: port 0 lets rank 0 pick a port the other ranks "
                             "cannot know; give the port every rank connects to")
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
        if not isinstance(auth, _StoreAuth):
            auth = _StoreAuth(auth, None, False)
        store = TCPStore(bind if rank == 0 else host, port, world_size=world_size, is_master=(rank == 0),
                         timeout=timeout, auth_token=auth.token, job_id=auth.job_id,
                         allow_unauthenticated=auth.allow_open)
        _STATE.stores[key] = store
    return store


def _is_loopback(host: str) -> bool:
    try:
        return host in ("localhost", "::1") or socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _require_available(name: str) -> None:
    """ImportError saying what to install when backend ``name`` cannot run on this machine."""
    cls = get_backend_class(name)
    if cls.is_available():
        return
    why = ""
    if name == "nccl":
        from neural_arch.distributed.comm.nccl.support import missing_requirement

        why = f": {missing_requirement()}"
    raise ImportError(f"backend {name!r} is not available here{why}; installed: {_installed_backends()} "
                      "(backend='gloo' trains on CPU)")


def _create_backend(name, store, rank, world_size, timeout, rendezvous_timeout, token, generation, options):
    from neural_arch.distributed.rendezvous.store import PrefixStore

    cls = get_backend_class(name)
    # A fresh key namespace per init: destroy + re-init on the same store must not see old keys.
    scoped = PrefixStore(f"neural_arch/pg{generation}/", store)
    # Each rank publishes its host before the barrier, so after it the whole map is readable:
    # it gives local_rank / local_world_size when the launcher's variables do not.
    scoped.set(f"host/{rank}", _host_identity())
    _rendezvous_ranks(scoped, rank, world_size, rendezvous_timeout, hosts=bool(getattr(store, "is_master", False)))
    layout = _host_layout([scoped.get(f"host/{r}").decode() for r in range(world_size)], rank)
    if name == "gloo" and token is not None:
        options = dict(options, auth_token=token)
    return cls.create(scoped, rank, world_size, timeout, **options), layout


def _rendezvous_ranks(store, rank: int, world_size: int, timeout: float, hosts: bool = False) -> None:
    """Wait (up to ``timeout``) until ranks ``0..world_size-1`` all arrived with the same world size.

    Each rank sets ``world/{rank}`` to its WORLD_SIZE and also writes ``arrival/{n}`` ("rank size")
    under a number ``n`` drawn from the ``arrivals`` counter, so a waiting rank sees *every* arrival,
    also one outside its own range. Raises :class:`RendezvousError`:

    * when two ranks disagree on the world size, on every rank that arrived (instead of one rank
      naming a "missing" rank that does not exist and another timing out later in the transport):
      the rank that sees it first publishes the message under ``failed``; the others read it;
    * at the timeout, naming the ranks that never arrived;
    * when the store is lost meanwhile, naming them too (rank 0, which hosts it, gave up waiting for
      them: the missing rank is the culprit, not the store's host).

    The store's host (``hosts``) lingers a moment (at most 2 s) before raising, until the ranks that
    arrived have read the failure: its exit closes the store.

    Example (two ranks on one store)::

        _rendezvous_ranks(PrefixStore("pg1", store), rank, 2, timeout=60.0)
        # RendezvousError: rank 1 (WORLD_SIZE=3): ranks disagree on the world size at rendezvous:
        # rank 0 has WORLD_SIZE=2, rank 1 has WORLD_SIZE=3; ...
    """
    store.set(f"world/{rank}", str(world_size))
    store.set(f"arrival/{store.add('arrivals', 1)}", f"{rank} {world_size}")
    keys = [f"world/{r}" for r in range(world_size)]
    seen: dict[int, int] = {rank: world_size}   # rank -> the world size it claims, from the arrivals
    read = 0
    start = time.monotonic()
    deadline, next_log, pause = start + float(timeout), start + WAIT_LOG_S, 0.001
    try:
        while True:
            count = store.add("arrivals", 0)
            while read < count and store.check([f"arrival/{read + 1}"]):  # numbered, maybe not yet written
                r, size = (int(v) for v in store.get(f"arrival/{read + 1}").split())
                seen[r] = size
                read += 1
            if store.check(["failed"]):      # another rank saw the problem first: the same story here
                _rendezvous_failed(store, rank, world_size, seen, store.get("failed").decode(), hosts)
            problem = _world_disagreement(seen)
            if problem is None and store.check(keys):
                seen.update({r: int(store.get(k)) for r, k in enumerate(keys)})  # also read by the host's linger
                problem = _world_disagreement(seen)
                if problem is None:
                    return
            now = time.monotonic()
            if problem is None and now >= deadline:
                arrived = [r for r in range(world_size) if store.check([keys[r]])]
                missing = [r for r in range(world_size) if r not in arrived]
                problem = (f"rendezvous 'init' timed out after {float(timeout):.1f} s (rank {rank}'s rendezvous "
                           f"timeout): ranks {missing} never "
                           f"arrived ({', '.join(map(str, arrived))} did); check that every rank started and uses "
                           "the same MASTER_ADDR/MASTER_PORT")
            if problem is not None:
                store.compare_set("failed", b"", problem.encode())  # the first rank's story wins
                _rendezvous_failed(store, rank, world_size, seen, store.get("failed").decode(), hosts)
            if now >= next_log:
                next_log += WAIT_LOG_S
                log.warning("rank %d of %d has waited %.0f s at the rendezvous for ranks %s to arrive "
                            "(%.0f s left of the rendezvous timeout)", rank, world_size, now - start,
                            [r for r in range(world_size) if r not in seen], deadline - now)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
    except (ConnectionError, DistributedError) as exc:
        if isinstance(exc, RendezvousError) and not isinstance(exc, ConnectionError):
            raise
        missing = [r for r in range(world_size) if r not in seen]
        if not missing:
            raise
        raise RendezvousError(
            f"rank {rank} lost the rendezvous store while waiting for ranks {missing}, which never arrived "
            f"(ranks {sorted(seen)} did): the store's host (rank 0) most likely gave up waiting for them, "
            f"so look first at why ranks {missing} did not start or reach init_process_group. ({exc})") from exc


def _rendezvous_failed(store, rank: int, world_size: int, seen: Mapping[int, int], problem: str, hosts: bool):
    """Raise ``problem`` on this rank; the store's host first lets the ranks that arrived read it."""
    store.set(f"told/{rank}", b"1")
    if hosts:
        others = [r for r in seen if r != rank]
        until = time.monotonic() + 2.0
        while others and time.monotonic() < until and not all(store.check([f"told/{r}"]) for r in others):
            time.sleep(0.02)
    raise RendezvousError(f"rank {rank} (WORLD_SIZE={world_size}): {problem}")


def _world_disagreement(claims: Mapping[int, int]) -> str | None:
    """None when every rank in ``claims`` (rank -> world size) claims the same size; else the message."""
    if len(set(claims.values())) <= 1:
        return None
    theirs = ", ".join(f"rank {r} has WORLD_SIZE={s}" for r, s in sorted(claims.items()))
    return (f"ranks disagree on the world size at rendezvous: {theirs}. Start every rank with the same "
            "WORLD_SIZE (one launcher per node with the same --nnodes/--nproc_per_node, or the same "
            "world_size= on every rank)")


def _refuse_mpi_outside_mpiexec(environ, launch) -> None:
    """``init_process_group("mpi")`` in a process that a non-MPI launcher started is an error.

    MPI would make each such process a world of one (``get_world_size() == 1``, every all_reduce
    returning the rank's own value): silently wrong. Checked before MPI starts.
    """
    from neural_arch.distributed.launch_env import launched_by_mpiexec

    if launch is not None and launch["world_size"] > 1 and not launched_by_mpiexec(environ):
        raise DistributedError(_mpi_world_message(launch, "this process was not started by mpiexec, so MPI "
                                                          "would make every rank a world of one"))


def _check_mpi_world(launch, impl) -> None:
    """MPI's own world must be the one the launcher's RANK/WORLD_SIZE describe."""
    if launch is not None and launch["source"] != "mpiexec" and \
            (int(launch["world_size"]), int(launch["rank"])) != (impl.size, impl.rank):
        raise DistributedError(_mpi_world_message(
            launch, f"MPI started this process as rank {impl.rank} of {impl.size}"))


def _mpi_world_message(launch, why: str) -> str:
    size = int(launch["world_size"])
    return (f"init_process_group('mpi'): the {launch['source']} environment says WORLD_SIZE={size}, "
            f"RANK={launch['rank']}, but {why}. Start MPI jobs with mpiexec (`mpiexec -n {size} python "
            "script.py`); under the neural_arch launcher or torchrun use backend='gloo' (or 'nccl' on GPUs)")


class _Leave:
    """How a rank leaves the rendezvous store at ``destroy_process_group()`` (or at exit without it).

    Every rank sets ``left/{rank}`` in the group's key space; the rank whose process *hosts* the
    store (rank 0's TCPStore) then waits, at most ``min(rendezvous_timeout, LEAVE_WAIT_S)``, until every
    rank has: closing the store while a peer still finishes its own init would fail that peer with a
    lost-store error after a clean run. A rank of a failed (poisoned) group does not wait: its
    peers may be dead. Example: ``_STATE.info["leave"](wait=True)``.
    """

    def __init__(self, store, generation: int, rank: int, world_size: int, timeout: float) -> None:
        from neural_arch.distributed.rendezvous.store import PrefixStore

        self.store = PrefixStore(f"neural_arch/pg{generation}/", store)  # the backend's key space
        self.hosts = bool(getattr(store, "is_master", False))
        self.rank, self.world_size = rank, world_size
        self.limit = min(float(timeout), LEAVE_WAIT_S)
        self.done = False

    def __call__(self, wait: bool = True) -> None:
        from neural_arch.distributed.errors import StoreTimeoutError

        if self.done:
            return
        self.done = True
        try:
            self.store.set(f"left/{self.rank}", b"1")
            if not (wait and self.hosts):
                return
            keys = [f"left/{r}" for r in range(self.world_size)]
            deadline = time.monotonic() + self.limit
            while True:
                try:
                    self.store.wait(keys, timeout=max(0.0, min(deadline - time.monotonic(), 0.5)))
                    return
                except StoreTimeoutError:
                    if time.monotonic() >= deadline:
                        break
            missing = [r for r in range(self.world_size) if not self.store.check([keys[r]])]
        except (DistributedError, OSError, ValueError) as exc:  # the store is gone: nothing to wait for
            log.debug("rank %d could not mark its leaving of the rendezvous store: %s", self.rank, exc)
            return
        log.warning("rank %d hosts the rendezvous store and closes it now, although ranks %s have not "
                    "left the group (destroy_process_group() or exit) within %.1f s: they will see a lost "
                    "store", self.rank, missing, self.limit)


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
    if _STATE.world is not None and (group is None or group is GroupMember.WORLD or group is _STATE.world):
        _stop_observability()
    with _STATE.lock:
        if group is None or group is GroupMember.WORLD or group is _STATE.world:
            if _STATE.world is not None:
                # an op another thread of this rank still waits in can no longer complete: it stops now
                # with an error saying so, not after the leave wait below
                for pg in [_STATE.world, *_STATE.groups]:
                    pg.backend.interrupt_waits()
                # Before the sockets close: a peer may still be in its init. Called while an exception
                # propagates (a `finally:`), this rank is failing: no wait then.
                _leave_world(_STATE.world, failing=sys.exc_info()[0] is not None)
            targets = list(_STATE.groups)
            _unexport_torch_env(_STATE.info.pop("exported_env", None))
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


def _unexport_torch_env(names) -> None:
    from neural_arch.distributed.launch_env import unexport_launch_env

    unexport_launch_env(names, os.environ)


def _leave_world(world, failing: bool) -> None:
    """Mark this rank as gone from the world's store; its host waits for the others (see _Leave),
    unless this rank is ``failing`` or one of its groups failed (the world or a sub-group, e.g. a
    pipeline's whose stage died): then a peer may be dead or stuck in a collective with us, and
    closing at once is what makes them fail fast (a dead rank never leaves: waiting for it would
    only hold this process for the whole leave wait)."""
    leave = _STATE.info.get("leave")
    if leave is not None:
        groups_ok = all(getattr(pg.backend, "_fatal", None) is None for pg in [world, *_STATE.groups])
        leave(wait=not failing and groups_ok)


def _leave_at_exit() -> None:
    """A script that exits without destroy_process_group() still leaves the store cleanly.
    ``sys.last_value`` is set when the script died of an exception (the launcher's bootstrap sets it too)."""
    world = _STATE.world
    if world is not None:
        try:
            _leave_world(world, failing=getattr(sys, "last_value", None) is not None)
        except Exception as exc:  # noqa: BLE001 - exiting anyway
            log.debug("leaving the rendezvous at exit failed: %s", exc)


def _close_stores() -> None:
    for store in list(_STATE.stores.values()):
        try:
            store.close()
        except Exception as exc:  # noqa: BLE001 - exiting anyway
            log.debug("closing %r at exit failed: %s", store, exc)
    _STATE.stores.clear()


atexit.register(_close_stores)
atexit.register(_leave_at_exit)  # registered last, so it runs first: before the stores close


# ---------------------------------------------------------------------------------- groups
def get_default_group() -> ProcessGroup:
    """The world group; :class:`~neural_arch.distributed.errors.NotInitializedError` before
    ``init_process_group()``.

    Example::

        dist.init_process_group()
        world = dist.get_default_group()
        world.rank(), world.size()
    """
    world = _STATE.world
    if world is None:
        raise NotInitializedError("the default process group is not initialised; call "
                                  "neural_arch.distributed.init_process_group() first")
    return world


def backend_or_world_of_one(group=None, caller: str = "this operation"):
    """The backend of ``group``, or a world of one when nothing is initialised and ``group`` is None.

    The one owner of "a plain ``python`` run is a world of one" for the strategies that must also
    work without ``init_process_group()`` (DDP, DistributedSampler, SyncBatchNorm): collectives on
    the returned :class:`~neural_arch.distributed.comm.local.LocalBackend` are no-ops. A group
    that is given is resolved as every collective resolves it (NON_GROUP_MEMBER, a destroyed
    group or a missing init raise, naming ``caller``).

    >>> b = backend_or_world_of_one(None, "DistributedSampler")   # nothing initialised here
    >>> (b.rank, b.size)
    (0, 1)
    """
    if group is None and _STATE.world is None:
        return LocalBackend()
    return _resolve_group(group, caller).backend


def get_rank(group=None) -> int:
    """This process's rank in ``group`` (default: the world); -1 on a non-member (torch).

    Example::

        dist.init_process_group()
        if dist.get_rank() == 0:
            print("only rank 0 logs")
    """
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve_group(group, "get_rank").rank()


def get_world_size(group=None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 on a non-member (torch).

    Example::

        dist.init_process_group()
        per_rank_batch = global_batch // dist.get_world_size()
    """
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _resolve_group(group, "get_world_size").size()


def get_backend(group=None) -> str:
    """The backend name of ``group`` (``"gloo"``, ``"mpi"``, ``"local"``, ...).

    Example::

        dist.init_process_group()
        dist.get_backend()            # "gloo" under the launcher, "mpi" under mpiexec
    """
    return _resolve_group(group, "get_backend").backend_name


def get_group_rank(group, global_rank: int) -> int:
    """Global rank -> rank inside ``group``.

    Example::

        odds = dist.new_group([1, 3])
        dist.get_group_rank(odds, 3)    # 1
    """
    return _resolve_group(group, "get_group_rank").group_rank(global_rank, "global_rank")


def get_global_rank(group, group_rank: int) -> int:
    """Rank inside ``group`` -> global rank.

    Example::

        odds = dist.new_group([1, 3])
        dist.get_global_rank(odds, 1)   # 3
    """
    return _resolve_group(group, "get_global_rank").global_rank(group_rank)
