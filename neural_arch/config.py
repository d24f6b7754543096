"""Every ``NEURAL_ARCH_*`` environment variable, in one table: name, type, default, what it does.

The table is data (:data:`VARIABLES`, named records); :func:`get` reads a variable with its type
and default, so a typo in a name is an error instead of a silently ignored setting, and
``python -m neural_arch.config`` prints ``docs/configuration.md`` (a test keeps the
file, the table and the code in step: every ``NEURAL_ARCH_*`` name the package uses is listed
here, and only this module reads one from the environment).

It lives at the top of the package, standard library only, so that every layer can read its
settings without an upward import: ``core`` (``NEURAL_ARCH_EAGER_CHECKS``) and ``profiler``
(``NEURAL_ARCH_TIMELINE``) must not import ``neural_arch.distributed``, whose
``neural_arch.config`` re-exports this module (torch-style import path, and the
``python -m`` entry point). The child bootstrap, which starts a rank without importing the
package, loads this file by path (``run/bootstrap.py``; ``launch_env.py``'s ``setting`` reads it).

Example::

    >>> get("NEURAL_ARCH_RENDEZVOUS_TIMEOUT", {})
    60.0
    >>> get("NEURAL_ARCH_RENDEZVOUS_TIMEOUT", {"NEURAL_ARCH_RENDEZVOUS_TIMEOUT": "5"})
    5.0
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["VARIABLES", "EnvVar", "get", "markdown_document", "markdown_table"]


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: ``kind`` is ``str``, ``int``, ``float`` or ``bool``; ``area`` is
    who reads it (``user`` settings vs ``internal`` ones the launcher/pool set for their children).

    Example::

        >>> from neural_arch import config
        >>> var = next(v for v in config.VARIABLES if v.name == "NEURAL_ARCH_BACKEND")
        >>> var.kind.__name__, var.area
        ('str', 'user')
    """

    name: str
    kind: type
    default: Any
    area: str
    doc: str


def _v(name, kind, default, area, doc) -> EnvVar:
    return EnvVar(f"NEURAL_ARCH_{name}", kind, default, area, doc)


VARIABLES: tuple[EnvVar, ...] = (
    # -- process groups and rendezvous ------------------------------------------------------------
    _v("BACKEND", str, None, "user", "backend when init_process_group() gets none: gloo, mpi, nccl, local"),
    _v("BLAS_IDLE_SLEEP", bool, True, "user", "0 leaves OpenBLAS's idle-thread spin alone (importing neural_arch sets OPENBLAS_THREAD_TIMEOUT=4 unless set, so idle BLAS threads sleep instead of holding a core: neural_arch/blas_idle.py)"),
    _v("MALLOC_TUNE", bool, True, "user", "0 leaves glibc's malloc thresholds alone (importing neural_arch raises them so a step's temporaries stay in the heap: neural_arch/allocator.py)"),
    _v("TIMEOUT", float, 300.0, "user", "seconds a collective may wait before it fails (init_process_group's timeout)"),
    _v("RENDEZVOUS_TIMEOUT", float, 60.0, "user", "seconds every rank has to reach the rendezvous (and MPI_Init)"),
    _v("FT_AUTH_TOKEN", str, None, "user", "the fault-tolerance lighthouse's token (python -m neural_arch.distributed.ft.lighthouse and examples/ft_train.py); unset: the loopback per-user secret"),
    _v("AUTH_TOKEN", str, None, "user", "job secret: authenticates store, TCP mesh and node agents (docs/security.md)"),
    _v("ALLOW_UNAUTHENTICATED", bool, False, "user", "1 on every rank lets a multi-host job without NEURAL_ARCH_AUTH_TOKEN run its store and TCP mesh open to anyone who can reach the ports (trusted networks only; docs/security.md)"),
    _v("HOST_ID", str, None, "user", "overrides host identity (split one machine into 'hosts'; containers without shared /dev/shm)"),
    _v("BIND_ADDR", str, None, "user", "where the gloo TCP transport listens: an address, a host name, or a network interface's name (eth0, ib0: its IPv4 address, so one value fits every node)"),
    _v("DISTRIBUTED_DEBUG", str, "OFF", "user", "OFF / INFO / DETAIL: DETAIL checks every collective across ranks first"),
    # -- gloo transport and algorithms -------------------------------------------------------------
    _v("GLOO_TRANSPORT", str, "auto", "user", "auto / tcp / shm: force the gloo transport"),
    _v("GLOO_DIRECT", bool, True, "user", "0 turns the direct shared-memory collectives off (ring/tree over messages)"),
    _v("GLOO_ALGO", str, None, "user", "force gloo algorithms (comma list, e.g. ring, direct): benchmarks and tests"),
    _v("HIERARCHICAL", str, "auto", "user", "auto / 1 / 0: all_reduce of gloo groups spanning hosts goes hierarchical (auto: from 1 MiB; 1: always; 0: never)"),
    _v("HIERARCHICAL_PIPELINE_BYTES", int, 1 << 20, "user", "piece size of the pipelined hierarchical all-reduce on gloo (0: its steps one after the other, e.g. on a fast network where CPU is the bottleneck; messages under two pieces are never pipelined)"),
    _v("GLOO_SEGMENT_BYTES", int, 512 * 1024, "user", "pipeline segment of the ring algorithms"),
    _v("SHM_RING_BYTES", int, None, "user", "size of each shared-memory ring"),
    _v("SHM_CHUNK_BYTES", int, None, "user", "pipeline chunk per rank slot of the direct shared-memory collectives (default 1 MiB, halved while /dev/shm is small)"),
    _v("SHM_SPIN_S", float, None, "user", "spin on shared memory before yielding (default 20 us when every local rank has a core and the host is not busy, else 0; on the main thread, or on a progress thread while the main thread waits)"),
    _v("SHM_YIELD_S", float, None, "user", "sched_yield phase after the spin, before sleeping on a futex (default 20 ms under the same conditions, else 0)"),
    _v("SPIN_S", float, None, "user", "spin of the transport engine's waits before blocking"),
    _v("MAX_FRAME_BYTES", int, 64 << 30, "user", "largest transport frame a peer may announce (protocol error above)"),
    # -- MPI ---------------------------------------------------------------------------------------
    _v("MPI_WATCHDOG_S", float, 0.1, "user", "poll interval of the MPI timeout watchdog"),
    _v("MPI_SPIN_S", float, 0.001, "user", "spin of MPI nonblocking waits before sleeping"),
    _v("MPI_PAIRWISE_MAX_BYTES", int, 32 << 10, "user", "2-rank MPI groups: all_reduces of 16 KiB up to this many bytes are one whole-buffer exchange + a NumPy reduction instead of MPICH's Iallreduce (0: off; every rank must agree)"),
    _v("MPI_ABORT_ON_EXCEPTION", bool, True, "user", "an uncaught exception on one rank of an MPI job calls MPI_Abort once the MPI backend is up, so the other ranks end at once instead of waiting out their timeout (0: off)"),
    # -- observability -----------------------------------------------------------------------------
    _v("TIMELINE", str, None, "user", "directory: every rank records a Chrome trace, rank 0 merges them"),
    _v("STALL_WARNING_S", float, 60.0, "user", "warn (naming the missing ranks) when a collective waits this long; 0 = off"),
    _v("FLIGHT_RECORDER_SIZE", int, 2000, "user", "records of each rank's flight recorder (its last collective and point-to-point ops, dumped on a timeout, poisoning, a peer's failure or SIGUSR1; analyzed by python -m neural_arch.distributed.flight_recorder DIR); 0 = off"),
    _v("FLIGHT_RECORDER_CALLER", bool, False, "user", "1 adds the caller's file:line to every flight-recorder record (a stack walk per op: most of the recorder's cost on small all_reduces, docs/benchmarks.md); off, dumps still name op, group, sequence number, shapes and state"),
    _v("FLIGHT_RECORDER_DIR", str, None, "user", "directory for the flight recorder's dumps (one rank<R>.json per rank); unset: the rendezvous store when there is one (MPI jobs have none: set it there)"),
    _v("FLIGHT_RECORDER_POLL_S", float, 1.0, "user", "seconds between a rank's checks for a peer's dump request (the first rank whose collective fails asks every rank to dump, through the dump folder or the rendezvous store, so a rank idle in user code dumps too, with no SIGUSR1); 0 = off"),
    _v("INTRAOP_THREADS", int, None, "user", "threads of the core's elementwise pool (GELU, layer norm, attention over heads, AdamW; neural_arch/core/thread_pool.py); unset: the BLAS's thread count now (threadpoolctl / OMP_NUM_THREADS rule it); 1: off"),
    _v("EAGER_CHECKS", bool, False, "user", "check device-side cross_entropy targets eagerly (one sync per call; core reads it)"),
    # -- parallel strategies -----------------------------------------------------------------------
    _v("FSDP_SHARD_SIZE", int, None, "user", "ranks per shard group of HYBRID_SHARD (default: LOCAL_WORLD_SIZE)"),
    _v("ELASTIC_MAX_RESETS", int, 5, "user", "how many times @elastic.run re-forms the group before giving up"),
    # -- set by the launcher / pool for their children (not for users) -----------------------------
    _v("RESTART_COUNT", int, 0, "internal", "restart attempt of this job (torchelastic's TORCHELASTIC_RESTART_COUNT)"),
    _v("MAX_RESTARTS", int, 0, "internal", "the launcher's --max_restarts"),
    _v("READY_DIR", str, None, "internal", "folder where each rank marks that it passed rendezvous (start timeout)"),
    _v("PARENT_PID", int, None, "internal", "the launcher's pid: ranks exit when it is gone"),
    _v("POOL_ADDR", str, None, "internal", "RankPool: where the worker connects back"),
    _v("POOL_KEY", str, None, "internal", "RankPool: the worker's authentication key"),
    _v("POOL_INIT", bool, True, "internal", "RankPool: whether the worker calls init_process_group"),
    _v("POOL_LAUNCHER", str, None, "internal", "RankPool: how the workers were started"),
)

_BY_NAME = {v.name: v for v in VARIABLES}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def get(name: str, environ: Mapping[str, str] | None = None):
    """The value of ``name`` (typed; its default when unset). Unknown names raise ``KeyError``;
    a value of the wrong type raises ``ValueError`` naming the variable and what it expects.

    Example::

        >>> from neural_arch import config
        >>> config.get("NEURAL_ARCH_BACKEND", environ={"NEURAL_ARCH_BACKEND": "gloo"})
        'gloo'
        >>> config.get("NEURAL_ARCH_BACKEND", environ={}) is None       # unset: its default
        True
    """
    var = _BY_NAME.get(name)
    if var is None:
        raise KeyError(f"{name} is not a neural_arch setting; the settings are listed in "
                       f"neural_arch/config.py (python -m neural_arch.config)")
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or (raw.strip() == "" and var.kind is not str):
        return var.default
    text = raw.strip()
    try:
        if var.kind is bool:
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        return var.kind(text)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {var.kind.__name__} ({var.doc})") from None


def markdown_table() -> str:
    """The table as Markdown (what ``docs/configuration.md`` holds).

    Example::

        >>> from neural_arch import config
        >>> config.markdown_table().splitlines()[0]
        '| variable | type | default | who | what |'
    """
    rows = ["| variable | type | default | who | what |", "| --- | --- | --- | --- | --- |"]
    for v in VARIABLES:
        default = "-" if v.default is None else repr(v.default)
        rows.append(f"| `{v.name}` | {v.kind.__name__} | {default} | {v.area} | {v.doc} |")
    return "\n".join(rows) + "\n"


_PREAMBLE = """\
# Configuration: every `NEURAL_ARCH_*` environment variable

Generated by `python -m neural_arch.config` from `neural_arch/config.py`
(the one table; `tests/distributed/test_config_table.py` checks that this file, the table and the
code agree). *user*: settings you may export; *internal*: what the launcher and the test pool set
for their children.

"""


def markdown_document() -> str:
    """``docs/configuration.md``: a short preamble and :func:`markdown_table`.

    Example::

        >>> from neural_arch import config
        >>> config.markdown_document().startswith("# ")
        True
    """
    return _PREAMBLE + markdown_table()


if __name__ == "__main__":  # pragma: no cover - printing
    print(markdown_document(), end="")
