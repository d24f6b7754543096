"""Collective schedules as plain data: build them, print them, simulate them, run them.

A *plan* says, for every rank and every step, whom to send which slice of the flat buffer
to, whom to receive which slice from, and whether the received slice is *reduced* into the
buffer or *copied* over it. The gloo backend executes exactly these plans, so the unit tests
that simulate them in pure NumPy (``tests/comm/gloo/``) test the algorithms that run.

Slices are ``(start, stop)`` element ranges of the flattened array. Within one step a rank
sends and receives concurrently (``Transport.sendrecv``), and the data it sends is the
buffer as it was *before* the step, which is what :func:`simulate` models.

The builders are pure and not memoised: the gloo executor builds a plan on a miss of its one plan
cache (``PlanExecutor._compiled_plans``, compiled per rank), so a plan is built once per group and size.

==============================  ============================================  ===================
plan                            algorithm                                     steps (p ranks)
==============================  ============================================  ===================
``ring_reduce_scatter_plan``    ring; rank r ends owning chunk r              p - 1
``ring_allgather_plan``         ring; rank r starts owning chunk r            p - 1
``ring_allreduce_plan``         the two above, back to back (bandwidth-opt.)  2(p - 1)
``recursive_doubling_plan``     allreduce, whole buffer each step; non-       log2 p (+2)
                                power-of-two fix-up (fold extra ranks in)
``binomial_broadcast_plan``     binomial tree from ``root``                   ceil(log2 p)
``chain_broadcast_plan``        pipelined chain in ``segments`` pieces        segments + p - 2
``binomial_reduce_plan``        binomial tree into ``root``                   ceil(log2 p)
``ring_reduce_plan``            ring reduce-scatter, then chunks to ``root``  2(p - 1)
``pairwise_alltoall_plan``      step s: send block r+s, receive block r-s     p (incl. self copy)
``pairwise_alltoallv_plan``     the same with blocks of their own length;     p (incl. self copy)
                                zero-length blocks send nothing
``dissemination_barrier_plan``  step k: send to r+2^k, receive from r-2^k     ceil(log2 p)
==============================  ============================================  ===================

Example::

    >>> from neural_arch.distributed.comm.gloo.plans import ring_allreduce_plan, format_plan
    >>> plan = ring_allreduce_plan(3, 7)
    >>> plan.for_rank(0)[0]
    Step(step=0, rank=0, send_to=1, send_chunk=(5, 7), recv_from=2, recv_chunk=(3, 5), action='reduce')
    >>> print(format_plan(plan))            # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

Chunk = Tuple[int, int]
_EMPTY: Chunk = (0, 0)
REDUCE = "reduce"
COPY = "copy"


@dataclass(frozen=True)
class Step:
    """One rank's part of one step: an optional send and an optional receive.

    ``send_to`` / ``recv_from`` are ranks of the group, or ``None`` for no send / receive.
    ``send_to == recv_from == rank`` is a local copy (``pairwise_alltoall_plan``'s step 0).
    ``action`` says what happens to the received slice: ``"reduce"`` into the buffer, or
    ``"copy"`` over it.

    Example::

        >>> step = Step(step=0, rank=0, send_to=1, send_chunk=(0, 4), recv_from=None, recv_chunk=(0, 0))
        >>> step.send_len, step.recv_len, step.action
        (4, 0, 'copy')
    """

    step: int
    rank: int
    send_to: Optional[int]
    send_chunk: Chunk
    recv_from: Optional[int]
    recv_chunk: Chunk
    action: str = COPY

    @property
    def send_len(self) -> int:
        return self.send_chunk[1] - self.send_chunk[0]

    @property
    def recv_len(self) -> int:
        return self.recv_chunk[1] - self.recv_chunk[0]


@dataclass(frozen=True)
class Plan:
    """A schedule for ``size`` ranks over a flat buffer of ``nelems`` elements.

    ``by_rank[r]`` is rank r's steps in execution order. ``two_buffers`` plans (alltoall)
    read sends from the input buffer and write receives into a separate output buffer.
    Iterating a plan yields every step ordered by (step, rank).

    Example::

        >>> plan = ring_allreduce_plan(3, 6)
        >>> plan.nsteps, len(plan), len(plan.for_rank(0))       # 2(p - 1) steps, each rank in each
        (4, 12, 4)
    """

    name: str
    size: int
    nelems: int
    by_rank: Tuple[Tuple[Step, ...], ...]
    two_buffers: bool = False
    root: Optional[int] = None

    def for_rank(self, rank: int) -> Tuple[Step, ...]:
        return self.by_rank[rank]

    @property
    def nsteps(self) -> int:
        return 1 + max((s.step for steps in self.by_rank for s in steps), default=-1)

    def __iter__(self) -> Iterator[Step]:
        return iter(sorted((s for steps in self.by_rank for s in steps), key=lambda s: (s.step, s.rank)))

    def __len__(self) -> int:
        return sum(len(steps) for steps in self.by_rank)


# -- chunking -----------------------------------------------------------------------------------


def chunk_bounds(nelems: int, parts: int) -> Tuple[Chunk, ...]:
    """``parts`` contiguous ranges covering ``range(nelems)``, sizes differing by at most one.

    The same boundaries as ``np.array_split``: the first ``nelems % parts`` chunks are one
    element longer. Chunks may be empty when ``nelems < parts``.

    >>> chunk_bounds(7, 3)
    ((0, 3), (3, 5), (5, 7))
    """
    if parts < 1 or nelems < 0:
        raise ValueError(f"chunk_bounds needs parts >= 1 and nelems >= 0, got parts={parts}, nelems={nelems}")
    base, extra = divmod(nelems, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def _step(step, rank, send_to, send_chunk, recv_from, recv_chunk, action) -> Step:
    # Empty slices are dropped on both ends (the slice is the same on both, so both agree):
    # no zero-byte messages on the wire.
    if send_to is not None and send_chunk[1] == send_chunk[0] and send_to != rank:
        send_to, send_chunk = None, _EMPTY
    if recv_from is not None and recv_chunk[1] == recv_chunk[0] and recv_from != rank:
        recv_from, recv_chunk = None, _EMPTY
    if send_to is None:
        send_chunk = _EMPTY
    if recv_from is None:
        recv_chunk = _EMPTY
    return Step(step, rank, send_to, send_chunk, recv_from, recv_chunk, action)


def _finish(name, size, nelems, rows: List[List[Step]], **kw) -> Plan:
    # Ranks keep only the steps in which they do something.
    by_rank = tuple(tuple(s for s in row if s.send_to is not None or s.recv_from is not None) for row in rows)
    return Plan(name, size, nelems, by_rank, **kw)


def _check(size: int, nelems: int) -> None:
    if size < 1:
        raise ValueError(f"a plan needs size >= 1, got {size}")
    if nelems < 0:
        raise ValueError(f"a plan needs nelems >= 0, got {nelems}")


# -- ring -----------------------------------------------------------------------------------------


def ring_reduce_scatter_plan(size: int, nelems: int, bounds: Optional[Tuple[Chunk, ...]] = None,
                             first_step: int = 0) -> Plan:
    """Ring reduce-scatter: after ``size - 1`` steps rank r holds the reduction of chunk r.

    At step s rank r sends chunk ``r - s - 1`` to ``r + 1`` and reduces chunk ``r - s - 2``
    received from ``r - 1`` (indices mod size). Every rank sends and receives (n/p) per
    step: bandwidth-optimal. ``bounds`` overrides the array_split chunking.

    Example::

        >>> ring_reduce_scatter_plan(3, 6).for_rank(0)[0]
        Step(step=0, rank=0, send_to=1, send_chunk=(4, 6), recv_from=2, recv_chunk=(2, 4), action='reduce')
    """
    _check(size, nelems)
    bounds = bounds or chunk_bounds(nelems, size)
    rows = []
    for r in range(size):
        nxt, prv = (r + 1) % size, (r - 1) % size
        rows.append([_step(first_step + s, r, nxt, bounds[(r - s - 1) % size], prv, bounds[(r - s - 2) % size],
                           REDUCE) for s in range(size - 1)])
    return _finish("ring_reduce_scatter", size, nelems, rows)


def ring_allgather_plan(size: int, nelems: int, bounds: Optional[Tuple[Chunk, ...]] = None,
                        first_step: int = 0) -> Plan:
    """Ring all-gather: rank r starts owning chunk r; at step s it forwards chunk ``r - s``.

    Example::

        >>> ring_allgather_plan(3, 6).for_rank(0)[0]
        Step(step=0, rank=0, send_to=1, send_chunk=(0, 2), recv_from=2, recv_chunk=(4, 6), action='copy')
    """
    _check(size, nelems)
    bounds = bounds or chunk_bounds(nelems, size)
    rows = []
    for r in range(size):
        nxt, prv = (r + 1) % size, (r - 1) % size
        rows.append([_step(first_step + s, r, nxt, bounds[(r - s) % size], prv, bounds[(r - s - 1) % size], COPY)
                     for s in range(size - 1)])
    return _finish("ring_allgather", size, nelems, rows)


def ring_allreduce_plan(size: int, nelems: int) -> Plan:
    """Ring reduce-scatter followed by ring all-gather: 2(p-1) steps of n/p elements.

    Example::

        >>> import numpy as np
        >>> plan = ring_allreduce_plan(3, 6)
        >>> simulate(plan, [np.arange(6.0)] * 3)[0]             # every rank ends with the sum
        array([ 0.,  3.,  6.,  9., 12., 15.])
    """
    rs = ring_reduce_scatter_plan(size, nelems)
    ag = ring_allgather_plan(size, nelems, first_step=size - 1)
    return Plan("ring_allreduce", size, nelems, tuple(a + b for a, b in zip(rs.by_rank, ag.by_rank)))


# -- recursive doubling -------------------------------------------------------------------------------


def _pow2_below(size: int) -> int:
    return 1 << (size.bit_length() - 1)


def recursive_doubling_plan(size: int, nelems: int) -> Plan:
    """Latency-optimal allreduce: log2(p) exchanges of the whole buffer.

    For p not a power of two, with q the largest power of two below p and ``extra = p - q``:
    ranks ``0, 2, ..., 2*extra-2`` first fold their data into their odd neighbour (step 0)
    and sit out; the remaining q ranks run recursive doubling; then each odd neighbour
    sends the result back (last step). Two ranks: one exchange.

    Example::

        >>> recursive_doubling_plan(4, 8).nsteps, recursive_doubling_plan(3, 8).nsteps
        (2, 3)
    """
    _check(size, nelems)
    whole = (0, nelems)
    q = _pow2_below(size)
    extra = size - q
    rows: List[List[Step]] = [[] for _ in range(size)]
    base = 1 if extra else 0

    def real(v: int) -> int:  # virtual rank among the q participants -> group rank
        return 2 * v + 1 if v < extra else v + extra

    for r in range(size):
        if r < 2 * extra:
            if r % 2 == 0:
                rows[r].append(_step(0, r, r + 1, whole, None, _EMPTY, REDUCE))
                rows[r].append(_step(base + q.bit_length() - 1, r, None, _EMPTY, r + 1, whole, COPY))
                continue
            rows[r].append(_step(0, r, None, _EMPTY, r - 1, whole, REDUCE))
            v = r // 2
        else:
            v = r - extra
        mask, k = 1, 0
        while mask < q:
            partner = real(v ^ mask)
            rows[r].append(_step(base + k, r, partner, whole, partner, whole, REDUCE))
            mask, k = mask << 1, k + 1
        if r < 2 * extra:
            rows[r].append(_step(base + k, r, r - 1, whole, None, _EMPTY, COPY))
    return _finish("recursive_doubling_allreduce", size, nelems, rows)


# -- trees and chains ------------------------------------------------------------------------------------


def binomial_broadcast_plan(size: int, nelems: int, root: int = 0) -> Plan:
    """Binomial tree: in round k, ranks that have the data (relative rank < 2^k) send it on.

    Example::

        >>> import numpy as np
        >>> plan = binomial_broadcast_plan(4, 2, root=1)
        >>> plan.nsteps, [b.tolist() for b in simulate(plan, [np.full(2, float(r)) for r in range(4)])]
        (2, [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    """
    _check(size, nelems)
    whole = (0, nelems)
    rows: List[List[Step]] = [[] for _ in range(size)]
    mask, k = 1, 0
    while mask < size:
        for v in range(size):
            r = (v + root) % size
            if v < mask and v + mask < size:
                rows[r].append(_step(k, r, (v + mask + root) % size, whole, None, _EMPTY, COPY))
            elif mask <= v < 2 * mask:
                rows[r].append(_step(k, r, None, _EMPTY, (v - mask + root) % size, whole, COPY))
        mask, k = mask << 1, k + 1
    return _finish("binomial_broadcast", size, nelems, rows, root=root)


def chain_broadcast_plan(size: int, nelems: int, root: int = 0, segments: int = 4) -> Plan:
    """Pipelined chain: root -> root+1 -> ...; segment i moves one hop per step.

    At step t the rank at chain position v forwards segment ``t - v`` while receiving
    segment ``t - v + 1``, so every link is busy once the pipe is full:
    ``segments + p - 2`` steps of n/segments elements (vs log2 p steps of n for a tree).

    Example::

        >>> chain_broadcast_plan(4, 8, root=0, segments=4).nsteps     # segments + p - 2
        6
    """
    _check(size, nelems)
    segs = chunk_bounds(nelems, max(1, segments))
    m = len(segs)
    rows: List[List[Step]] = [[] for _ in range(size)]
    for v in range(size):
        r = (v + root) % size
        nxt, prv = (r + 1) % size, (r - 1) % size
        for t in range(m + size - 2):
            out, inc = t - v, t - v + 1
            send = v < size - 1 and 0 <= out < m
            recv = v >= 1 and 0 <= inc < m
            rows[r].append(_step(t, r, nxt if send else None, segs[out] if send else _EMPTY,
                                 prv if recv else None, segs[inc] if recv else _EMPTY, COPY))
    return _finish("chain_broadcast", size, nelems, rows, root=root)


def binomial_reduce_plan(size: int, nelems: int, root: int = 0) -> Plan:
    """Binomial tree into ``root``: a rank reduces its children's partials, then sends up.

    Ranks other than ``root`` accumulate into a scratch copy (the executor's business):
    ``reduce`` leaves their input unchanged.

    Example::

        >>> import numpy as np
        >>> plan = binomial_reduce_plan(4, 2, root=0)
        >>> plan.nsteps, simulate(plan, [np.ones(2)] * 4)[0]
        (2, array([4., 4.]))
    """
    _check(size, nelems)
    whole = (0, nelems)
    rows: List[List[Step]] = [[] for _ in range(size)]
    for v in range(size):
        r = (v + root) % size
        mask, k = 1, 0
        while mask < size:
            if v & mask:
                rows[r].append(_step(k, r, (v - mask + root) % size, whole, None, _EMPTY, REDUCE))
                break
            if v + mask < size:
                rows[r].append(_step(k, r, None, _EMPTY, (v + mask + root) % size, whole, REDUCE))
            mask, k = mask << 1, k + 1
    return _finish("binomial_reduce", size, nelems, rows, root=root)


def ring_reduce_plan(size: int, nelems: int, root: int = 0) -> Plan:
    """Bandwidth-optimal reduce: ring reduce-scatter, then every rank sends its chunk to ``root``.

    Each rank moves about 2n/p elements in all, against n per tree level for the binomial tree.
    Ranks other than ``root`` work on a scratch copy (the executor's business).

    Example::

        >>> import numpy as np
        >>> plan = ring_reduce_plan(4, 8, root=0)
        >>> plan.nsteps, simulate(plan, [np.ones(8)] * 4)[0].tolist()
        (6, [4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])
    """
    rs = ring_reduce_scatter_plan(size, nelems)
    bounds = chunk_bounds(nelems, size)
    rows = [list(r) for r in rs.by_rank]
    k = size - 1
    for r in range(size):
        if r == root:
            continue
        rows[r].append(_step(k, r, root, bounds[r], None, _EMPTY, COPY))
        rows[root].append(_step(k, root, None, _EMPTY, r, bounds[r], COPY))
        k += 1
    return _finish("ring_reduce", size, nelems, rows, root=root)


# -- alltoall and barrier ---------------------------------------------------------------------------------


def pairwise_alltoall_plan(size: int, nelems: int) -> Plan:
    """Step 0 copies the own block; step s sends block r+s to r+s and receives block r-s.

    ``nelems`` (of the input, = of the output) must be divisible by ``size``.

    Example::

        >>> import numpy as np
        >>> plan = pairwise_alltoall_plan(2, 4)
        >>> inputs = [np.array([0.0, 1.0, 2.0, 3.0]), np.array([10.0, 11.0, 12.0, 13.0])]
        >>> [out.tolist() for out in simulate(plan, inputs)]
        [[0.0, 1.0, 10.0, 11.0], [2.0, 3.0, 12.0, 13.0]]
    """
    _check(size, nelems)
    if nelems % size:
        raise ValueError(f"pairwise_alltoall_plan: nelems={nelems} is not divisible by size={size}")
    n = nelems // size
    rows = []
    for r in range(size):
        row = [Step(0, r, r, (r * n, r * n + n), r, (r * n, r * n + n), COPY)]
        for s in range(1, size):
            dst, src = (r + s) % size, (r - s) % size
            row.append(_step(s, r, dst, (dst * n, dst * n + n), src, (src * n, src * n + n), COPY))
        rows.append(row)
    return _finish("pairwise_alltoall", size, nelems, rows, two_buffers=True)


def pairwise_alltoallv_steps(size: int, rank: int, send_counts: Sequence[int], recv_counts: Sequence[int],
                             width: int = 1) -> Tuple[Step, ...]:
    """One rank's part of the uneven pairwise all-to-all: what it needs is its own row of the split
    matrix (``send_counts[d]``: rows it sends to d) and its own column (``recv_counts[s]``: rows it
    receives from s), so the executor builds only these steps, per call (the splits change every call
    in a mixture of experts). Chunks are element ranges of the flat input (sends) and output
    (receives), ``width`` elements per row. Step 0 copies the own block; step s sends to ``rank + s``
    and receives from ``rank - s``; a zero-length block skips its message on both sides (the sender's
    ``send_counts[d]`` is the receiver's ``recv_counts[s]``, so both agree).

    Example::

        >>> [(s.send_to, s.send_chunk, s.recv_from, s.recv_chunk)
        ...  for s in pairwise_alltoallv_steps(3, 0, [1, 0, 2], [1, 3, 0])]
        [(0, (0, 1), 0, (0, 1)), (2, (1, 3), 1, (1, 4))]
    """
    if len(send_counts) != size or len(recv_counts) != size or not 0 <= rank < size:
        raise ValueError(f"pairwise_alltoallv_steps: need {size} send and receive counts and 0 <= rank < {size}")
    send_off = np.concatenate([[0], np.cumsum(send_counts)]).astype(int) * width
    recv_off = np.concatenate([[0], np.cumsum(recv_counts)]).astype(int) * width
    steps = [Step(0, rank, rank, (int(send_off[rank]), int(send_off[rank + 1])), rank,
                  (int(recv_off[rank]), int(recv_off[rank + 1])), COPY)]
    for s in range(1, size):
        dst, src = (rank + s) % size, (rank - s) % size
        steps.append(_step(s, rank, dst, (int(send_off[dst]), int(send_off[dst + 1])), src,
                           (int(recv_off[src]), int(recv_off[src + 1])), COPY))
    return tuple(st for st in steps if st.send_to is not None or st.recv_from is not None)


def pairwise_alltoallv_plan(counts, width: int = 1) -> Plan:
    """The uneven pairwise all-to-all of the whole group, from its split matrix ``counts[s][d]`` (rows
    rank s sends to rank d, ``width`` elements each): :func:`pairwise_alltoallv_steps` for every rank
    (what the tests simulate; each rank runs its own steps). ``nelems`` is the total number of
    elements moved.

    Example::

        >>> import numpy as np
        >>> plan = pairwise_alltoallv_plan([[1, 2], [0, 1]])
        >>> inputs = [np.array([0.0, 1.0, 2.0]), np.array([10.0])]
        >>> [out.tolist() for out in simulate(plan, inputs, outputs=[np.zeros(1), np.zeros(3)])]
        [[0.0], [1.0, 2.0, 10.0]]
    """
    counts = np.asarray(counts, dtype=np.int64)
    size = counts.shape[0]
    if counts.shape != (size, size) or (counts < 0).any():
        raise ValueError(f"pairwise_alltoallv_plan: counts must be a square matrix of non-negative ints, got {counts}")
    _check(size, int(counts.sum()) * width)
    by_rank = tuple(pairwise_alltoallv_steps(size, r, counts[r].tolist(), counts[:, r].tolist(), width)
                    for r in range(size))
    return Plan("pairwise_alltoallv", size, int(counts.sum()) * width, by_rank, two_buffers=True)


def dissemination_barrier_plan(size: int) -> Plan:
    """Round k: send one byte to r + 2^k, receive one from r - 2^k. Nobody leaves before all arrive.

    Example::

        >>> dissemination_barrier_plan(5).nsteps        # ceil(log2 5)
        3
    """
    _check(size, 1)
    rows: List[List[Step]] = [[] for _ in range(size)]
    dist, k = 1, 0
    while dist < size:
        for r in range(size):
            rows[r].append(Step(k, r, (r + dist) % size, (0, 1), (r - dist) % size, (0, 1), COPY))
        dist, k = dist << 1, k + 1
    return Plan("dissemination_barrier", size, 1, tuple(tuple(r) for r in rows))


# -- simulation (the oracle's engine) and printing -------------------------------------------------------


def simulate(plan: Plan, buffers: Sequence[np.ndarray], reduce: Callable[[np.ndarray, np.ndarray], None]
             = lambda dst, src: np.add(dst, src, out=dst), outputs: Optional[Sequence[np.ndarray]] = None
             ) -> List[np.ndarray]:
    """Run ``plan`` on per-rank flat ``buffers`` in one process; return the per-rank results.

    Matches every receive with the send addressed to it in the same step and raises
    ``AssertionError`` when a message is missing, unexpected or of the wrong length, so a
    plan that simulates cleanly cannot deadlock or desynchronise on the wire.
    ``reduce(dst, src)`` is applied in place for ``"reduce"`` actions.

    Example::

        >>> import numpy as np
        >>> results = simulate(ring_allreduce_plan(2, 4), [np.ones(4), np.arange(4.0)])
        >>> results[0].tolist(), results[1].tolist()
        ([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    """
    if len(buffers) != plan.size:
        raise ValueError(f"simulate: {len(buffers)} buffers for a plan of size {plan.size}")
    bufs = [np.array(b, copy=True).reshape(-1) for b in buffers]
    outs = bufs if not plan.two_buffers else [
        np.array(o, copy=True).reshape(-1) for o in (outputs if outputs is not None else
                                                    [np.zeros_like(b) for b in bufs])]
    steps: Dict[int, List[Step]] = {}
    for s in plan:
        steps.setdefault(s.step, []).append(s)
    for k in sorted(steps):
        # Sends read the buffers as they were before this step (sendrecv is concurrent).
        inbox: Dict[Tuple[int, int], np.ndarray] = {}
        for s in steps[k]:
            if s.send_to is not None:
                key = (s.rank, s.send_to)
                assert key not in inbox, f"step {k}: rank {s.rank} sends twice to {s.send_to}"
                inbox[key] = bufs[s.rank][s.send_chunk[0]:s.send_chunk[1]].copy()
        for s in steps[k]:
            if s.recv_from is None:
                continue
            key = (s.recv_from, s.rank)
            assert key in inbox, f"step {k}: rank {s.rank} waits for rank {s.recv_from}, which sends nothing"
            data = inbox.pop(key)
            assert data.size == s.recv_len, (f"step {k}: rank {s.recv_from} sends {data.size} elements to rank "
                                             f"{s.rank}, which expects {s.recv_len}")
            dst = outs[s.rank][s.recv_chunk[0]:s.recv_chunk[1]]
            if s.action == REDUCE:
                reduce(dst, data)
            else:
                dst[...] = data
        assert not inbox, f"step {k}: messages nobody receives: {sorted(inbox)}"
    return outs


def format_plan(plan: Plan, max_ranks: int = 16) -> str:
    """A table with one row per step and one column per rank, e.g. ``>1[0:3] <2[3:5]+``.

    ``>d[a:b]`` sends ``[a:b]`` to rank d, ``<s[a:b]`` receives it from rank s; a trailing
    ``+`` means the received slice is reduced into the buffer, ``=`` that it is copied.

    Example::

        >>> print(format_plan(ring_allreduce_plan(2, 4)))
        ring_allreduce (size=2, nelems=4)
        step  rank 0            rank 1
        0     >1[2:4] <1[0:2]+  >0[0:2] <0[2:4]+
        1     >1[0:2] <1[2:4]=  >0[2:4] <0[0:2]=
    """
    ranks = list(range(min(plan.size, max_ranks)))
    cells: Dict[Tuple[int, int], str] = {}
    for s in plan:
        parts = []
        if s.send_to is not None:
            parts.append(f">{s.send_to}[{s.send_chunk[0]}:{s.send_chunk[1]}]")
        if s.recv_from is not None:
            parts.append(f"<{s.recv_from}[{s.recv_chunk[0]}:{s.recv_chunk[1]}]{'+' if s.action == REDUCE else '='}")
        cells[(s.step, s.rank)] = " ".join(parts)
    header = ["step"] + [f"rank {r}" for r in ranks]
    rows = [[str(k)] + [cells.get((k, r), ".") for r in ranks] for k in range(plan.nsteps)]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
    title = f"{plan.name} (size={plan.size}, nelems={plan.nelems}" + (
        f", root={plan.root})" if plan.root is not None else ")")
    more = f"\n... {plan.size - len(ranks)} more ranks" if plan.size > len(ranks) else ""
    return "\n".join([title, line(header)] + [line(r) for r in rows]) + more


__all__ = [
    "Step", "Plan", "chunk_bounds", "ring_reduce_scatter_plan", "ring_allgather_plan", "ring_allreduce_plan",
    "recursive_doubling_plan", "binomial_broadcast_plan", "chain_broadcast_plan", "binomial_reduce_plan",
    "ring_reduce_plan",
    "pairwise_alltoall_plan", "pairwise_alltoallv_plan", "pairwise_alltoallv_steps", "dissemination_barrier_plan", "simulate", "format_plan", "REDUCE", "COPY",
]
