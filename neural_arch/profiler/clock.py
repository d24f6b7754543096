"""Clock offsets between ranks, estimated NTP-style from a few ping-pong exchanges.

Every rank stamps spans with its own ``events.now()`` (a monotonic clock with an arbitrary
zero per machine). To put all ranks on one timeline, rank 0 exchanges a few messages with each
other rank and keeps the exchange with the smallest round trip: its offset estimate is off by at
most half that round trip (the asymmetry of the two directions), and the smallest round trip is
the one least disturbed by scheduling.

One exchange: rank 0 reads ``t0`` and sends; rank r reads ``t1`` on arrival and ``t2`` just before
answering; rank 0 reads ``t3`` on the answer. Then ``offset = ((t1 - t0) + (t2 - t3)) / 2`` is
rank r's clock minus rank 0's and ``rtt = (t3 - t0) - (t2 - t1)``.

>>> from neural_arch.profiler.clock import offset_from_samples
>>> # rank r's clock runs 5.0 s ahead; one-way delays 1 ms / 3 ms, and 0.5 ms / 0.5 ms
>>> offset_from_samples([(0.0, 5.001, 5.001, 0.004), (1.0, 6.0005, 6.0005, 1.001)])
(5.0, 0.001)
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from neural_arch.profiler import events

__all__ = ["DEFAULT_ROUNDS", "estimate_offsets", "offset_from_samples"]

DEFAULT_ROUNDS = 8
_TAG = 7301  # p2p tag of the clock exchange (any tag that user code is unlikely to pick)


def offset_from_samples(samples: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """``[(t0, t1, t2, t3), ...]`` -> ``(offset, rtt)`` of the exchange with the smallest round trip.

    Example::

        >>> from neural_arch.profiler.clock import offset_from_samples
        >>> # sent at 0.0, received at 10.5 by a clock 10 s ahead, answered at 10.5, back at 1.0
        >>> offset_from_samples([(0.0, 10.5, 10.5, 1.0)])
        (10.0, 1.0)
    """
    if not samples:
        raise ValueError("offset_from_samples: need at least one (t0, t1, t2, t3) exchange")
    best = None
    for t0, t1, t2, t3 in samples:
        rtt = (t3 - t0) - (t2 - t1)
        offset = ((t1 - t0) + (t2 - t3)) / 2.0
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    return round(best[0], 12), round(best[1], 12)


def estimate_offsets(backend, rounds: int = DEFAULT_ROUNDS) -> tuple[list[float], list[float]]:
    """Ping-pong between group rank 0 and every other rank of ``backend`` (a comm Backend).

    Collective: every rank of the group calls it. Returns ``(offsets, rtts)`` indexed by group
    rank, known on every rank (rank 0 broadcasts them): ``offsets[r]`` is rank r's clock minus
    rank 0's, so ``t - offsets[r]`` puts rank r's time ``t`` on rank 0's clock.

    Example::

        import neural_arch.distributed as dist
        from neural_arch.distributed.resolve import backend_of
        from neural_arch.profiler.clock import estimate_offsets
        offsets, rtts = estimate_offsets(backend_of(dist.group.WORLD))   # on every rank of the job
        # rank r's time t, on rank 0's clock: t - offsets[r]  (error at most rtts[r] / 2)
    """
    if rounds < 1:
        raise ValueError(f"estimate_offsets: rounds={rounds} must be >= 1")
    size, me = backend.size, backend.rank
    table = np.zeros((2, size), dtype=np.float64)
    if size > 1:
        ping = np.zeros(1, dtype=np.float64)
        pong = np.zeros(2, dtype=np.float64)
        for r in range(1, size):
            if me == 0:
                samples = []
                for _ in range(rounds):
                    t0 = events.now()
                    backend.send(ping, r, tag=_TAG)
                    backend.recv(pong, r, tag=_TAG)
                    t3 = events.now()
                    samples.append((t0, float(pong[0]), float(pong[1]), t3))
                table[0, r], table[1, r] = offset_from_samples(samples)
            elif me == r:
                for _ in range(rounds):
                    backend.recv(ping, 0, tag=_TAG)
                    pong[0] = events.now()
                    pong[1] = events.now()
                    backend.send(pong, 0, tag=_TAG)
        backend.broadcast(table, 0)
    return table[0].tolist(), table[1].tolist()
