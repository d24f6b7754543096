"""``get_distributed_info()``: what the distributed setup of this process looks like.

Split from :mod:`neural_arch.distributed.groups` (which owns the state this reads). Works before
``init_process_group()`` too. Example::

    >>> from neural_arch.distributed import get_distributed_info
    >>> info = get_distributed_info()
    >>> info["world_size"], info["rank"], "cpu" in info["devices"]
    (1, 0, True)
"""

from __future__ import annotations

import importlib.util
import os
import socket
from typing import Any

from neural_arch.distributed.comm.registry import installed_backends
from neural_arch.distributed.comm.runner import debug_mode_from_env
from neural_arch.distributed.launch_env import detect_launch_env
from neural_arch.distributed.state import STATE


def get_distributed_info() -> dict[str, Any]:
    """A dict describing the distributed setup; works before init too (world 1, rank 0).

    Keys: available, initialized, world_size, rank, local_rank, local_world_size, node_rank,
    backend, backend_impl, installed_backends, init_method, rank_source, timeout,
    rendezvous_timeout, transport, devices, debug, num_groups, hostname, pid, mpi.
    Example::

        info = get_distributed_info()
        print(info["backend"], info["rank"], info["world_size"])
    """

    world = STATE.world
    launch = STATE.info.get("launch") if world is not None else None
    if world is None:
        try:
            launch = detect_launch_env(os.environ)
        except ValueError:
            launch = None
    info: dict[str, Any] = {
        "available": True,  # gloo needs nothing beyond NumPy
        "initialized": world is not None,
        "world_size": world.size() if world is not None else 1,
        "rank": world.rank() if world is not None else 0,
        **_local_info(world, launch),
        "backend": world.backend_name if world is not None else None,
        "backend_impl": type(world.backend).__name__ if world is not None else None,
        "installed_backends": installed_backends(),
        "init_method": STATE.info.get("init_method") if world is not None else None,
        "rank_source": STATE.info.get("rank_source") if world is not None else None,
        "launcher_detected": (launch or {}).get("source"),
        "timeout": world.timeout if world is not None else None,
        "rendezvous_timeout": STATE.info.get("rendezvous_timeout") if world is not None else None,
        "transport": _transport(world),
        "devices": _usable_devices(world),
        "debug": world.backend.debug if world is not None else debug_mode_from_env(),
        "num_groups": len(STATE.groups) if world is not None else 0,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "mpi": _mpi_info(world),
    }
    return info


# Variables with which a launcher states the node layout (launch_env guesses one node without them).
_LOCAL_LAYOUT_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE",
                      "SLURM_LOCALID")


def _local_info(world, launch) -> dict[str, int]:
    """local_rank / local_world_size / node_rank: what the launcher states, else what the
    rendezvous measured (ranks publish their host), else the launcher's guess, else one node."""
    if world is None:
        return {"local_rank": 0, "local_world_size": 1, "node_rank": 0}

    layout = STATE.info.get("layout")
    stated = launch is not None and any(os.environ.get(v, "").strip() for v in _LOCAL_LAYOUT_VARS)
    if layout is not None and not stated:
        return {k: layout[k] for k in ("local_rank", "local_world_size", "node_rank")}
    if launch is not None:
        return {k: launch[k] for k in ("local_rank", "local_world_size", "node_rank")}
    return {"local_rank": 0, "local_world_size": 1, "node_rank": 0}


def _usable_devices(world) -> list[str]:
    """Devices this process can hand to the backend: "cpu", plus "cuda" when the backend takes
    CuPy arrays *and* CuPy sees a GPU (not merely "the backend could, given a GPU")."""
    devices = ["cpu"]
    supported = world.backend.devices if world is not None else ("cpu", "cuda")
    if "cuda" in supported and importlib.util.find_spec("cupy") is not None:
        from neural_arch.backend import is_cupy_available

        if is_cupy_available():
            devices.append("cuda")
    return devices


def _transport(world) -> str | None:
    """"shm", "tcp", "shm+tcp" (gloo, per peer), "mpi", or None for a world of one."""
    if world is None:
        return None
    kinds = getattr(world.backend, "transport_kinds", None)
    if callable(kinds):
        try:
            found = sorted(set(kinds().values()))
        except Exception:  # noqa: BLE001 - info must never fail
            found = []
        return "+".join(found) or None
    return getattr(world.backend, "transport", None)


def _mpi_info(world) -> dict[str, Any] | None:
    if world is None or world.backend_name != "mpi":
        return None
    describe = getattr(world.backend, "describe", None)
    return describe() if callable(describe) else None
