"""``dist.all_reduce`` goes hierarchical by itself on gloo groups that span several hosts.

The decision has two parts, both taken identically on every rank of the group without a message:

1. **Does the group span hosts?** (once per group, on its first ``all_reduce``; cached on the group
   as the byte threshold the hot path compares with). The gloo transport knows, per peer, whether it
   shares this host: a shared-memory link (``transport_kinds()``), TCP otherwise. If the group spans
   two or more hosts, *every* member has a TCP peer in it, so "some peer is not shm" is the same
   answer on every rank. Single-host groups get an infinite threshold: ``all_reduce`` then pays one
   attribute read and one identity test per call, nothing more.
2. **Which form, from which size?** A message of at least :data:`MIN_BYTES` (the same size on every
   rank: all_reduce requires it) goes hierarchical. The first such call builds the group's host
   layout: one all-gather of (host key, machine key) over the group and ``backend.new_group`` for
   the host, leader and cross-host sub-communicators (gloo sub-groups share the transport: no
   sockets, no messages). Every member is inside that same all_reduce, in the same order, so this
   collective set-up cannot deadlock; it works the same for the world and for sub-groups. Then
   :func:`~.hierarchical.choose_algorithm` picks ``"leader"`` or ``"2d"`` by size and layout.

``NEURAL_ARCH_HIERARCHICAL``: ``auto`` (the default: as above, on hosts that are different
*machines*), ``1`` (every size, on any group spanning hosts, simulated ones included), ``0`` (always
flat). Read at a group's first ``all_reduce``. Stays flat under ``auto``:

* hosts simulated on one machine (``NEURAL_ARCH_HOST_ID``): between them TCP runs over loopback,
  where it costs what shared memory does, and ``bench_collectives.py --hierarchical`` measured the
  hierarchical forms no faster than flat there (flat/leader 0.6-1.3x, flat/2d 0.4-1.0x, 2 hosts x 2
  ranks on 2 shared cores; with the host groups on the direct shared-memory segment 0.4-0.9x and
  0.5-1.1x at load 8-11, where their ring-plan references measured 0.5-0.8x and 0.4-0.7x); the machine key
  (hostname + boot id, ignoring the override) tells them apart;
* MPI and NCCL groups (MPICH and NCCL already run host-aware algorithms inside their all-reduce);
* ``async_op=True`` calls (three dependent collectives on three sub-communicators cannot ride one
  Work without a thread of their own);
* groups with one rank per host, and groups whose transport is TCP everywhere on one host (the host
  keys then show one host).

Why it pays between real machines: a flat ring over 2 hosts x 2 ranks pushes 1.5 N bytes per
all_reduce through each host's network interface, both hierarchical forms N (2 (H - 1) / H N for H
hosts), so a job bound by its network gets up to 1.5x from them ((HP - 1) / (P (H - 1)) for H hosts
x P ranks); the 2-D form also spreads that traffic over every local rank's connection instead of
one leader's, which matters when one Python process cannot fill the link. Measured with simulated
hosts behind an emulated 1 Gbit/s link (``bench_collectives.py --hierarchical --link-gbit 1``, see
docs/benchmarks.md): 1.45-1.49x at 2 x 2 and 1.62-1.73x at 2 x 4 from 1 MiB up.
Both forms pipeline large messages (:mod:`.hierarchical_pipeline`): the shared-memory steps of one
piece overlap the network transfer of the next, so the link does not idle while the host works.

Example (every rank of 2 hosts x 2 ranks)::

    from neural_arch.distributed.algorithms.hierarchical_auto import all_reduce_algorithm
    all_reduce_algorithm(1024)         # 'flat'  (below MIN_BYTES)
    all_reduce_algorithm(16 << 20)     # '2d' between machines, 'flat' on simulated hosts (collective
                                       # the first time: builds the layout)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neural_arch import config
from neural_arch.distributed.algorithms.hierarchical import (
    _check_in_place,
    choose_algorithm,
    host_key,
    hosts_from_keys,
    identity_key,
    run_leader,
    run_two_d,
    start_average,
    wire_op,
)
from neural_arch.distributed.host import machine_identity
from neural_arch.distributed.process_group import FLAT_ALWAYS as _NEVER

__all__ = ["MIN_BYTES", "all_reduce", "all_reduce_algorithm", "min_bytes", "setting"]

#: ``auto``: a message this large or larger goes hierarchical on a group spanning machines. Below it
#: the extra latency of three steps outweighs any saving; at 1 MiB the leader form was about even
#: with flat on simulated hosts, where the "network" is as fast as memory: a slower network tips it
#: (the measurements are in docs/benchmarks.md, "hierarchical all-reduce").
MIN_BYTES = 1 << 20
#: the threshold of groups that stay flat (collectives' object: its hot path tests identity)
NEVER = _NEVER
_LIMIT = "_hierarchical_min_bytes"      # ProcessGroup attribute read by collectives.all_reduce
_LAYOUT = "_hierarchical_layout"


def setting(environ=None) -> str:
    """``NEURAL_ARCH_HIERARCHICAL`` as ``"auto"``, ``"1"`` or ``"0"`` (ValueError for anything else).

    Example:
        >>> setting({"NEURAL_ARCH_HIERARCHICAL": "0"}), setting({})
        ('0', 'auto')
    """
    raw = str(config.get("NEURAL_ARCH_HIERARCHICAL", environ) or "auto").strip().lower()
    value = {"auto": "auto", "1": "1", "true": "1", "on": "1", "yes": "1",
             "0": "0", "false": "0", "off": "0", "no": "0"}.get(raw)
    if value is None:
        raise ValueError(f"NEURAL_ARCH_HIERARCHICAL={raw!r}: use auto, 1 (always, on groups spanning hosts) "
                         "or 0 (never)")
    return value


def _spans_hosts(backend) -> bool:
    kinds = getattr(backend, "transport_kinds", None)
    return kinds is not None and any(kind != "shm" for kind in kinds().values())


def min_bytes(pg) -> float:
    """The smallest message ``all_reduce`` on ``pg`` sends hierarchically (``NEVER``: always
    flat). Decided without I/O the first time and cached on the group.

    Example::

        min_bytes(dist.group.WORLD)         # the threshold on the world group, in bytes
    """
    limit = getattr(pg, _LIMIT, None)
    if limit is not None:
        return limit
    mode = setting()
    limit = NEVER
    if mode != "0" and pg.backend.name == "gloo" and pg.size() > 1 and _spans_hosts(pg.backend):
        limit = 0 if mode == "1" else MIN_BYTES
    setattr(pg, _LIMIT, limit)
    return limit


def machine_key() -> int:
    """This physical machine as an int64, *ignoring* ``NEURAL_ARCH_HOST_ID`` (which only splits a
    machine into simulated hosts for transports)."""
    return identity_key(machine_identity())


@dataclass
class Layout:
    """A group's hosts (group ranks), this rank's sub-communicators (backends), and whether
    ``auto`` keeps this group flat anyway (``stay_flat``: no hierarchy, or every host on one machine)."""

    hosts: list
    intra: object
    inter: object      # None on ranks that do not lead their host
    cross: object      # None when the hosts differ in size
    stay_flat: bool = False


def layout(pg) -> Layout:
    """The host layout of ``pg`` (collective over ``pg`` the first time; cached on the group)."""
    cached = getattr(pg, _LAYOUT, None)
    if cached is not None:
        return cached
    b = pg.backend
    keys = np.empty((b.size, 2), dtype=np.int64)
    b.allgather(keys, np.array([host_key(), machine_key()], dtype=np.int64))
    hosts = hosts_from_keys(keys[:, 0].tolist())
    # Hosts simulated on one machine talk over loopback, where TCP costs what shared memory does:
    # measured there, every hierarchical form lost to flat (docs/benchmarks.md), so auto stays flat.
    one_machine = len(set(keys[:, 1].tolist())) == 1
    no_hierarchy = len(hosts) < 2 or all(len(h) == 1 for h in hosts)
    stay_flat = no_hierarchy or (one_machine and setting() == "auto")
    # every member creates every sub-communicator, in this order (gloo numbers them by creation)
    intra = [b.new_group(h) for h in hosts]
    inter = b.new_group([h[0] for h in hosts])
    cross = None
    if len(hosts) > 1 and len({len(h) for h in hosts}) == 1:
        cross = [b.new_group([h[i] for h in hosts]) for i in range(len(hosts[0]))]
        cross = next(c for c in cross if c is not None)
    mine = next(c for c in intra if c is not None)
    result = Layout(hosts, mine, inter, cross, stay_flat)
    setattr(pg, _LAYOUT, result)
    return result


def all_reduce(pg, array, op) -> bool:
    """Run ``all_reduce`` on ``pg`` hierarchically if its layout calls for it (in place); False:
    the caller runs the flat one (and, when the layout has no hierarchy, always will).

    Example::

        if not hierarchical_auto.all_reduce(pg, array, ReduceOp.SUM):
            pg.backend.allreduce(array, op=ReduceOp.SUM)      # the flat one
    """
    lay = layout(pg)
    if lay.stay_flat:
        setattr(pg, _LIMIT, NEVER)   # flat at every size from now on: one attribute test per call
        return False
    algorithm = choose_algorithm(array.nbytes, array.size, lay.hosts)
    if algorithm == "flat":
        return False
    _check_in_place(array)   # before start_average scales it: a refused call leaves the caller's array as it was
    wire, avg = wire_op(op, array.dtype)
    divide = avg and start_average(array, pg.size())
    if algorithm == "2d":
        run_two_d(array, wire, lay.intra, lay.cross)
    else:
        run_leader(array, wire, lay.intra, lay.inter)
    if divide:
        array /= array.dtype.type(pg.size())
    return True


def all_reduce_algorithm(tensor, group=None) -> str:
    """What a synchronous ``all_reduce(tensor, group=group)`` runs: ``"flat"``, ``"leader"`` or
    ``"2d"``. ``tensor`` may be a byte count. Collective over the group the first time a size at or
    above the threshold is asked on a group spanning hosts (it builds the layout, as that
    all_reduce would): call it on every rank then.

    Example::

        all_reduce_algorithm(64 << 20)      # "2d" on 2 hosts x 4 ranks; "flat" on one host
    """
    from neural_arch.distributed.resolve import _buf, _group

    pg = _group(group, "all_reduce_algorithm")
    if pg is None:
        return "flat"
    if isinstance(tensor, (int, np.integer)):
        nbytes = nelems = int(tensor)
    else:
        data = _buf(tensor)
        nbytes, nelems = data.nbytes, data.size
    if nbytes < min_bytes(pg):
        return "flat"
    lay = layout(pg)
    if lay.stay_flat:
        setattr(pg, _LIMIT, NEVER)
        return "flat"
    return choose_algorithm(nbytes, nelems, lay.hosts)
