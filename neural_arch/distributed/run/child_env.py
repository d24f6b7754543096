"""The environment a launcher gives each rank it starts, and the one marker a rank leaves for it.

:func:`rank_env` is what the launcher, ``launch()`` and ``RankPool`` all give a rank (its identity,
the job's rendezvous and token, ``PYTHONPATH`` so it imports this same package);
:func:`report_ready` is the rank's side of ``--start_timeout``.

Example::

    >>> env = rank_env({}, rank=0, world_size=2, master_port=29500, token="t")
    >>> env["WORLD_SIZE"], env["NEURAL_ARCH_BACKEND"]
    ('2', 'gloo')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from neural_arch.config import get as setting
from neural_arch.distributed.launch_env import MPI_ENV_PREFIXES

__all__ = ["free_port", "package_root", "port_taken", "rank_env", "report_ready", "set_python_path"]

# Per-launch variables that must not leak from an outer job into the ranks of an inner one.
_PER_LAUNCH = ("NEURAL_ARCH_READY_DIR", "NEURAL_ARCH_PARENT_PID", "RANK", "LOCAL_RANK", "ROLE_RANK",
               "ROLE_WORLD_SIZE")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the usual, slightly racy, bind-to-0 trick).

    >>> 0 < free_port() < 65536
    True
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_taken(host: str, port: int) -> bool:
    """Whether another process listens on ``host:port``, so rank 0's store could not bind it there.

    Binds the way the store does (``SO_REUSEADDR``, so sockets of a finished job lingering in
    TIME_WAIT do not count); only "address in use" answers True: any other failure (an address of
    another host, a name that does not resolve) is for the ranks to report.

    >>> import socket
    >>> with socket.socket() as s:
    ...     s.bind(("127.0.0.1", 0)); s.listen(1)
    ...     port_taken("127.0.0.1", s.getsockname()[1])
    True
    """
    import errno
    import socket

    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def package_root() -> str:
    """Folder that contains the ``neural_arch`` package, so children import the same code.

    Example::

        >>> import os
        >>> os.path.isdir(os.path.join(package_root(), "neural_arch"))
        True
    """
    here = os.path.abspath(__file__)  # <root>/neural_arch/distributed/run/child_env.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))


def rank_env(base: Mapping[str, str] | None = None, *, rank: int | None, world_size: int,
             master_port: int, token: str, backend: str = "gloo", master_addr: str = "127.0.0.1",
             local_rank: int | None = None, local_world_size: int | None = None,
             node_rank: int = 0, restart_count: int = 0, parent_pid: int | None = None,
             python_path: tuple = ()) -> dict:
    """The environment of one rank: what the launcher, ``launch()`` and ``RankPool`` all give.

    Starts from ``base`` (default ``os.environ``) without MPI identity variables or an outer job's
    per-launch ones, and sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
    ``NODE_RANK``/``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, ``NEURAL_ARCH_BACKEND``,
    ``NEURAL_ARCH_AUTH_TOKEN``, ``NEURAL_ARCH_RESTART_COUNT``/``TORCHELASTIC_RESTART_COUNT``,
    ``NEURAL_ARCH_PARENT_PID`` (when given, for the parent-death watch), ``PYTHONUNBUFFERED=1``
    and ``PYTHONPATH`` = this package's folder, ``python_path``, then the inherited entries.
    ``rank=None`` leaves ``RANK``/``LOCAL_RANK`` unset (ranks started by mpiexec learn them from it).

    >>> env = rank_env({}, rank=1, world_size=2, master_port=29500, token="t")
    >>> env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]
    ('1', '1', '2', '127.0.0.1')
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith(MPI_ENV_PREFIXES) and k not in _PER_LAUNCH}
    local_world_size = world_size if local_world_size is None else local_world_size
    env.update({
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(local_world_size),
        "NODE_RANK": str(node_rank), "GROUP_RANK": str(node_rank),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "NEURAL_ARCH_BACKEND": backend, "NEURAL_ARCH_AUTH_TOKEN": token,
        "NEURAL_ARCH_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
    })
    if rank is not None:
        env["RANK"] = str(rank)
        env["LOCAL_RANK"] = str(rank % max(local_world_size, 1) if local_rank is None else local_rank)
    if parent_pid is not None:
        env["NEURAL_ARCH_PARENT_PID"] = str(parent_pid)
    env.setdefault("PYTHONUNBUFFERED", "1")
    set_python_path(env, python_path)
    return env


def set_python_path(env: dict, extra: Sequence[str] = ()) -> None:
    """``env["PYTHONPATH"]`` = this package's folder, ``extra``, then the entries ``env`` had, each once
    (what every process we start needs to import the same neural_arch).

    >>> env = {"PYTHONPATH": "/b"}
    >>> set_python_path(env, ["/a", "/b"]); env["PYTHONPATH"].split(os.pathsep)[1:]
    ['/a', '/b']
    """
    paths = [package_root(), *extra, *env.get("PYTHONPATH", "").split(os.pathsep)]
    seen: set = set()
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p and not (p in seen or seen.add(p)))



# --------------------------------------------------------------------------- rendezvous marker
def report_ready(environ: Mapping[str, str] | None = None) -> bool:
    """Tell the launcher that this rank reached rendezvous (its ``--start_timeout`` waits for it).

    The contract: when ``NEURAL_ARCH_READY_DIR`` is set (our launcher sets a fresh folder per
    attempt), a rank creates the empty file ``$NEURAL_ARCH_READY_DIR/rank_{RANK}`` once its
    rendezvous succeeded. ``init_process_group()`` does that; a script that never calls it (no
    collectives at all) calls this instead, or the launcher's ``--start_timeout`` ends the job.
    Returns True when a marker was written; without the variable it does nothing.

    >>> report_ready({})
    False
    """
    env = os.environ if environ is None else environ
    folder = setting("NEURAL_ARCH_READY_DIR", env)
    if not folder:
        return False
    try:
        with open(os.path.join(folder, f"rank_{int(env.get('RANK', '0'))}"), "w"):
            pass
    except (OSError, ValueError):
        return False  # the launcher is gone or its folder was removed: nobody is waiting
    return True
