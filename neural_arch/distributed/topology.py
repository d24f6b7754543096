"""Where the job runs: hosts, ranks per host, cores, NUMA nodes, GPUs and network interfaces.

Every rank describes its own machine (:func:`local_info`); :func:`discover` gathers those
descriptions with one ``all_gather_object`` over the group and numbers hosts and local ranks
the way rendezvous does (``groups._host_layout``, the one definition of "same host": the
transport's ``host_identity()``, overridable with ``NEURAL_ARCH_HOST_ID``). ``print(topology)``
shows the job's layout; under the launcher::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 -m neural_arch.distributed.topology

psutil (a dependency) gives cores, memory, affinity and interface speeds; without it the module
falls back to ``os``/``socket`` and leaves what it cannot know as ``None``. NUMA nodes come from
``/sys/devices/system/node`` (Linux); GPUs from CuPy when it is installed and sees devices.

>>> from neural_arch.distributed.topology import local_info, Topology
>>> info = local_info(rank=0)
>>> info.logical_cpus >= 1 and isinstance(info.interfaces, list)
True
>>> topo = Topology.from_infos([info])
>>> topo.num_hosts, topo.ranks_per_host
(1, [1])
"""
from __future__ import annotations

import glob
import os
import socket
from dataclasses import asdict, dataclass, field

from neural_arch.distributed.host import host_identity as _host_identity

__all__ = ["RankInfo", "Topology", "discover", "gpus", "interfaces", "local_info", "main", "numa_nodes"]


def _psutil():
    try:
        import psutil
    except ImportError:  # optional at run time: fall back to what os/socket know
        return None
    return psutil


def _cpulist(text: str) -> list[int]:
    """Linux cpulist syntax -> cpu ids: ``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_nodes(root: str = "/sys/devices/system/node") -> list[dict]:
    """``[{"id": 0, "cpus": [...], "memory_bytes": ...}, ...]``; ``[]`` where the kernel does not say.

    Example::

        >>> isinstance(numa_nodes(), list)
        True
        >>> numa_nodes(root="/no/such/folder")      # a kernel that does not say
        []
    """
    nodes = []
    for path in sorted(glob.glob(os.path.join(root, "node[0-9]*")), key=lambda p: int(p.rsplit("node", 1)[1])):
        node = {"id": int(path.rsplit("node", 1)[1]), "cpus": [], "memory_bytes": None}
        try:
            with open(os.path.join(path, "cpulist")) as f:
                node["cpus"] = _cpulist(f.read())
        except (OSError, ValueError):
            pass
        try:
            with open(os.path.join(path, "meminfo")) as f:
                for line in f:
                    if "MemTotal:" in line:
                        node["memory_bytes"] = int(line.split()[-2]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        nodes.append(node)
    return nodes


def gpus() -> list[dict]:
    """CUDA devices CuPy sees: ``[{"id", "name", "memory_bytes", "pci_bus_id"}]``; ``[]`` without CuPy/GPU.

    Example::

        >>> all({"id", "name"} <= set(g) for g in gpus())     # [] on a machine without CuPy or a GPU
        True
    """
    import importlib.util

    if importlib.util.find_spec("cupy") is None:  # do not pay CuPy's import where it is absent
        return []
    from neural_arch.backend import gpu_unavailable_reason

    if gpu_unavailable_reason() is not None:
        return []
    import cupy

    out = []
    for i in range(cupy.cuda.runtime.getDeviceCount()):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        name = props.get("name", b"?")
        try:
            bus = cupy.cuda.runtime.deviceGetPCIBusId(i)
        except Exception:  # noqa: BLE001 - informative only
            bus = None
        out.append({"id": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_bytes": int(props.get("totalGlobalMem", 0)), "pci_bus_id": bus})
    return out


def interfaces() -> list[dict]:
    """Network interfaces: ``[{"name", "addresses", "is_up", "speed_mbps", "mtu"}]`` (psutil; else names).

    Example::

        >>> all("name" in nic for nic in interfaces())
        True
    """
    ps = _psutil()
    if ps is None:
        return [{"name": name, "addresses": [], "is_up": None, "speed_mbps": None, "mtu": None}
                for _, name in socket.if_nameindex()]
    stats = ps.net_if_stats()
    out = []
    for name, addrs in sorted(ps.net_if_addrs().items()):
        st = stats.get(name)
        ips = [a.address for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
        out.append({"name": name, "addresses": ips, "is_up": st.isup if st else None,
                    "speed_mbps": (st.speed or None) if st else None, "mtu": st.mtu if st else None})
    return out


@dataclass
class RankInfo:
    """One rank's view of its machine.

    Example::

        >>> info = local_info(rank=0)
        >>> info.rank, info.logical_cpus >= 1
        (0, True)
    """

    rank: int
    host: str                          # host identity (same string <=> same machine)
    hostname: str
    pid: int
    logical_cpus: int
    physical_cpus: int | None
    cpu_affinity: list[int] | None     # cores this process may run on
    memory_bytes: int | None
    numa: list[dict] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)
    interfaces: list[dict] = field(default_factory=list)
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0


def local_info(rank: int = 0) -> RankInfo:
    """Describe this process's machine (no communication).

    Example::

        >>> local_info(rank=3).rank
        3
    """
    ps = _psutil()
    affinity = memory = physical = None
    if ps is not None:
        physical = ps.cpu_count(logical=False)
        memory = int(ps.virtual_memory().total)
        try:
            affinity = sorted(ps.Process().cpu_affinity())
        except (AttributeError, OSError):  # not on every platform
            affinity = None
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = sorted(os.sched_getaffinity(0))
    return RankInfo(rank=int(rank), host=_host_identity(), hostname=socket.gethostname(), pid=os.getpid(),
                    logical_cpus=os.cpu_count() or 1, physical_cpus=physical, cpu_affinity=affinity,
                    memory_bytes=memory, numa=numa_nodes(), gpus=gpus(), interfaces=interfaces())


@dataclass
class Topology:
    """The job's layout: ``ranks`` (a :class:`RankInfo` per global rank) grouped by host.

    Example::

        >>> topo = Topology.from_infos([local_info(0), local_info(1)])   # two ranks on this machine
        >>> topo.num_hosts, topo.world_size, [r.local_rank for r in topo.ranks]
        (1, 2, [0, 1])
    """

    ranks: list[RankInfo]

    @classmethod
    def from_infos(cls, infos: list[RankInfo]) -> Topology:
        """Fill local_rank / local_world_size / node_rank from the host identities (as rendezvous does)."""
        from neural_arch.distributed.groups import _host_layout

        hosts = [i.host for i in infos]
        for r, info in enumerate(infos):
            layout = _host_layout(hosts, r)
            info.local_rank, info.local_world_size = layout["local_rank"], layout["local_world_size"]
            info.node_rank = layout["node_rank"]
        return cls(list(infos))

    @property
    def hosts(self) -> dict[str, list[int]]:
        """host identity -> its global ranks, hosts in node order."""
        out: dict[str, list[int]] = {}
        for info in self.ranks:
            out.setdefault(info.host, []).append(info.rank)
        return out

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def ranks_per_host(self) -> list[int]:
        return [len(r) for r in self.hosts.values()]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "hosts": self.hosts, "ranks": [asdict(i) for i in self.ranks]}

    def __str__(self) -> str:
        lines = [f"{self.world_size} rank(s) on {self.num_hosts} host(s)"]
        for node, (host, ranks) in enumerate(self.hosts.items()):
            first = self.ranks[ranks[0]]
            mem = f"{first.memory_bytes / 2**30:.1f} GiB" if first.memory_bytes else "? GiB"
            phys = first.physical_cpus if first.physical_cpus is not None else "?"
            lines.append(f"host {node}: {first.hostname} ({host}): ranks {ranks}; {first.logical_cpus} logical / "
                         f"{phys} physical cores, {len(first.numa) or '?'} NUMA node(s), {mem}")
            for g in first.gpus:
                lines.append(f"  gpu {g['id']}: {g['name']} {g['memory_bytes'] / 2**30:.1f} GiB")
            for nic in first.interfaces:
                speed = f"{nic['speed_mbps']} Mb/s" if nic.get("speed_mbps") else "speed ?"
                up = {True: "up", False: "down", None: "?"}[nic.get("is_up")]
                lines.append(f"  nic {nic['name']}: {', '.join(nic['addresses']) or '-'} ({up}, {speed})")
            for r in ranks:
                i = self.ranks[r]
                aff = _ranges(i.cpu_affinity) if i.cpu_affinity is not None else "?"
                lines.append(f"  rank {r}: local_rank {i.local_rank}/{i.local_world_size}, pid {i.pid}, cores {aff}")
        return "\n".join(lines)


def _ranges(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, start, prev = [], None, None
    for i in sorted(ids):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)


def discover(group=None) -> Topology:
    """Gather every rank's :func:`local_info` (collective: one ``all_gather_object``; every rank of
    ``group`` calls it). Without an initialised group: this process alone.

    Example::

        topo = discover()          # on every rank, after init_process_group()
        if dist.get_rank() == 0:
            print(topo)            # hosts, ranks, cores, NUMA nodes, GPUs and NICs
    """
    from neural_arch.distributed.state import STATE

    pg = group if group is not None else STATE.world
    if pg is None:
        return Topology.from_infos([local_info(0)])
    me = pg.ranks[pg.rank()]
    infos = pg.backend.allgather_object(local_info(me))
    return Topology.from_infos(infos)


def main(argv=None) -> int:
    """``python -m neural_arch.distributed.topology [--json]``: rank 0 prints the job's layout.

    Example::

        mpiexec -n 4 python -m neural_arch.distributed.topology --json
    """
    import argparse
    import json

    p = argparse.ArgumentParser(description="print the job's hosts, ranks, cores, NUMA nodes, GPUs and NICs")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    from neural_arch.distributed import groups as dist

    dist.init_process_group()
    try:
        topo = discover()
        if dist.get_rank() == 0:
            print(json.dumps(topo.to_dict(), indent=1) if args.json else topo, flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
