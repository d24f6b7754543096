"""Seed 000's bandwidth scheduler: a plan of gradient buckets under a per-link bandwidth budget.

Gradients arrive in reverse parameter order during backward, and DDP all-reduces them in buckets.
This planner sizes the buckets so that one bucket's ring all-reduce holds a link of
``link_gbit_per_s`` for at most ``max_bucket_seconds`` (a ring all-reduce sends
``2 (n - 1) / n`` times the bucket through each rank's link), splits a gradient larger than that
into pieces, and keeps backward's order: the first bucket is ready first. The plan is plain data,
printable, and ``BucketPlan.bucket_cap_mb`` feeds
``DistributedDataParallel(model, bucket_cap_mb=...)``.

What it does not do: it moves no byte and reorders nothing at run time, and where the link is not
the bottleneck (ranks on one host, or compute slower than the network) smaller or larger buckets
change nothing measurable: the estimate of seconds per bucket is the link's share of the time only.

>>> plan = BandwidthScheduler(link_gbit_per_s=8, max_bucket_seconds=0.001).plan(
...     {"w1": 1_000_000, "b1": 1_000, "w2": 3_000_000}, world_size=2)
>>> [(b.names, b.nbytes) for b in plan.buckets]
[(['w2'], 1000000), (['w2'], 1000000), (['w2'], 1000000), (['b1', 'w1'], 1000000), (['w1'], 1000)]
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BandwidthScheduler", "Bucket", "BucketPlan", "create_bandwidth_scheduler"]


@dataclass
class Bucket:
    """One all-reduce: the gradients (or pieces of one) it carries, in backward order.

    Example::

        >>> Bucket(0, ["w"], 4096, 0.0, 0.001).end_seconds
        0.001
    """

    index: int
    names: list[str]
    nbytes: int
    start_seconds: float      # when the link starts on it, if the buckets went back to back
    link_seconds: float       # the link's share: bytes through one rank's link / bandwidth

    @property
    def end_seconds(self) -> float:
        return self.start_seconds + self.link_seconds


@dataclass
class BucketPlan:
    """The buckets, in the order they go on the link, and the cap that made them.

    Example::

        >>> plan = BandwidthScheduler(link_gbit_per_s=1).plan({"w": 10}, world_size=2)
        >>> len(plan.buckets), plan.total_bytes
        (1, 10)
    """

    cap_bytes: int
    world_size: int
    link_gbit_per_s: float
    buckets: list[Bucket] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def link_seconds(self) -> float:
        """The link's time for the whole step, back to back (the same for any bucket size)."""
        return sum(b.link_seconds for b in self.buckets)

    @property
    def bucket_cap_mb(self) -> float:
        """The cap in MiB, as ``DistributedDataParallel(bucket_cap_mb=...)`` takes it."""
        return self.cap_bytes / 2**20

    def __str__(self) -> str:
        lines = [(f"{len(self.buckets)} bucket(s), cap {self.cap_bytes} B ({self.bucket_cap_mb:.3f} MiB), "
                  f"{self.world_size} ranks, link {self.link_gbit_per_s:g} Gbit/s")]
        for b in self.buckets:
            lines.append(f"  bucket {b.index}: {b.nbytes} B, link {b.start_seconds * 1e3:.3f}-"
                         f"{b.end_seconds * 1e3:.3f} ms: {', '.join(b.names)}")
        return "\n".join(lines)


class BandwidthScheduler:
    """Plans bucket sizes and order under a per-link bandwidth budget (see the module docstring:
    a plan only; where the link is not the bottleneck it changes nothing).

    ``link_gbit_per_s``: one rank's link to the others; ``max_bucket_seconds``: how long one
    bucket may hold it (smaller: earlier overlap with backward, more messages).

    Example::

        >>> BandwidthScheduler(link_gbit_per_s=8, max_bucket_seconds=0.01).cap_bytes(world_size=2)
        10000000
    """

    def __init__(self, link_gbit_per_s: float = 10.0, max_bucket_seconds: float = 0.02) -> None:
        if link_gbit_per_s <= 0 or max_bucket_seconds <= 0:
            raise ValueError("link_gbit_per_s and max_bucket_seconds must be > 0")
        self.link_gbit_per_s, self.max_bucket_seconds = float(link_gbit_per_s), float(max_bucket_seconds)

    def _ring_factor(self, world_size: int) -> float:
        return 2 * (world_size - 1) / world_size if world_size > 1 else 0.0

    def cap_bytes(self, world_size: int) -> int:
        """The largest bucket whose ring all-reduce holds the link for at most ``max_bucket_seconds``.

        Example::

            >>> BandwidthScheduler(link_gbit_per_s=8, max_bucket_seconds=0.001).cap_bytes(4)
            666666
        """
        budget = self.link_gbit_per_s * 1e9 / 8 * self.max_bucket_seconds
        factor = self._ring_factor(world_size)
        return max(1, int(budget / factor)) if factor else max(1, int(budget))

    def plan(self, gradients, world_size: int) -> BucketPlan:
        """Buckets for ``gradients`` (``{name: nbytes}`` or ``[(name, nbytes)]`` in *parameter*
        order; planned in reverse, the order backward produces them).

        Example::

            >>> print(BandwidthScheduler(8, 0.001).plan([("a", 10), ("b", 20)], world_size=2))
            1 bucket(s), cap 1000000 B (0.954 MiB), 2 ranks, link 8 Gbit/s
              bucket 0: 30 B, link 0.000-0.000 ms: b, a
        """
        items = list(gradients.items()) if isinstance(gradients, dict) else [tuple(g) for g in gradients]
        cap = self.cap_bytes(world_size)
        factor = self._ring_factor(world_size)
        rate = self.link_gbit_per_s * 1e9 / 8
        groups: list[tuple[list[str], int]] = []
        names: list[str] = []
        size = 0
        for name, nbytes in reversed(items):
            nbytes = int(nbytes)
            if nbytes < 0:
                raise ValueError(f"gradient {name!r}: {nbytes} bytes")
            while nbytes > 0:
                room = cap - size
                if room == 0:
                    groups.append((names, size))
                    names, size, room = [], 0, cap
                take = min(room, nbytes)
                names.append(name)
                size += take
                nbytes -= take
        if names:
            groups.append((names, size))
        plan = BucketPlan(cap, int(world_size), self.link_gbit_per_s)
        start = 0.0
        for i, (bucket_names, nbytes) in enumerate(groups):
            seconds = nbytes * factor / rate
            plan.buckets.append(Bucket(i, bucket_names, nbytes, start, seconds))
            start += seconds
        return plan


def create_bandwidth_scheduler(link_gbit_per_s: float = 10.0, max_bucket_seconds: float = 0.02) -> BandwidthScheduler:
    """A :class:`BandwidthScheduler` (a plan of gradient buckets; it changes nothing where the link is
    not the bottleneck).

    Example::

        >>> create_bandwidth_scheduler(link_gbit_per_s=100).link_gbit_per_s
        100.0
    """
    return BandwidthScheduler(link_gbit_per_s, max_bucket_seconds)
