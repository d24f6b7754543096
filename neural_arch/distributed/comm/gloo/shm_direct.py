"""Same-host collectives on one shared segment: no messages, no rings, one copy in and one out.

Every rank of a group on one host maps one :class:`~neural_arch.distributed.comm.gloo.transport.shm_segment.ShmSegment`.

* **all_reduce**: each rank copies its input into its slot; barrier; each rank reduces its 1/n slice
  across all slots (one ``ufunc.reduce(..., axis=0, out=...)`` over an (n, slice) view: no
  temporaries) into the result area; barrier; each rank copies the whole result out. Every rank reads
  the same result bytes, so every rank gets the bitwise-same answer (the reduction order differs from
  the ring's, so float sums may differ from it in the last bits; integers are exact).
* **Pipelining**: buffers larger than a chunk (``seg.chunk`` bytes per rank, 1 MiB by default) go
  in chunks through two buffers, one barrier per chunk: in phase j a rank reduces chunk j-1 (written
  by everyone just before the barrier, so still in cache), copies out chunk j-2 and copies in
  chunk j. The buffer index continues across ops, so an op's last barrier-free phase never races
  the next op's first.
* **reduce_scatter / all_gather / broadcast / reduce / barrier** work the same way.
* **Small messages** (<= ``SMALL_BYTES`` per rank) take a latency path: slots indexed by the op's
  parity, one barrier, then every rank reduces the whole (tiny) buffer itself in rank order. Two
  slot sets suffice: a rank that writes op k+2's set (op k's) has passed op k+1's barrier, which
  every rank reached only after reading op k's. The op words, the barrier and their check are one
  call (``ShmSegment.sync``): at this size the Python calls are the cost.
* **Mismatch**: each op writes its op word (``comm.debug.wire_word``: kind, dtype, reduce op,
  sequence number), byte count and root into its control line before the first barrier and compares
  all ranks' after it -- a different op, dtype, size, root or order is a CollectiveMismatchError on
  every rank, never a wrong result.

When the direct path is used (:func:`choose`): the table ``ALGORITHMS`` below, keyed by world
size and byte count, measured with ``benchmarks/bench_collectives.py`` (see the numbers there). Ops
and dtypes outside it (all_to_all, gather, scatter, CuPy arrays, sub-groups spanning hosts) use the plans.

Example (the selection table, as data and as text)::

    >>> choose(2, 1 << 20)
    'direct'
    >>> print(format_table().splitlines()[2])
    2 | any | direct
"""

from __future__ import annotations

import numpy as np

from neural_arch.distributed.comm.dtypes import REDUCE_UFUNCS
from neural_arch.distributed.comm.gloo.transport.shm_segment import _AUX_BITS, pack_words
from neural_arch.distributed.comm.work import ReduceOp

# (world size or None for "any other") -> list of (up to this many bytes, algorithm), first match
# wins. "direct": this module; "plans": the ring / tree schedules of executor.py over the shm rings.
# (TCP is the transport's choice, made at rendezvous: on one host it lost to both at every size.)
# Measured with bench_collectives.py --quick --ops all_reduce at 2, 4 and 8 ranks (the table is in
# docs/benchmarks.md, "direct shared-memory selection"; load average 7-18 on 2 cores, so single runs
# vary 2-10x). Direct led at 2 and 4 ranks at every size; at 8 ranks (oversubscribed) one run had the
# rings ahead at 1 KiB and 4 MiB, and an 8-rank A/B of the two alone had direct ahead at every size
# but 16 KiB in one round -- so every row says "direct"; a row is kept per world size so that a
# machine where this changes needs only a new number here.
ALGORITHMS: dict = {
    2: [(1 << 62, "direct")],
    4: [(1 << 62, "direct")],
    8: [(1 << 62, "direct")],
    None: [(1 << 62, "direct")],
}
#: dtypes the direct path reduces with NumPy ufuncs; others (bfloat16, ...) use the plans
DIRECT_DTYPES = frozenset(np.dtype(t) for t in ("float16", "float32", "float64", "int8", "uint8", "int32",
                                                 "int64", "bool"))
DIRECT_OPS = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "barrier")

_AVG = ReduceOp.AVG


def direct_for_every_size(world: int) -> bool:
    """Whether :func:`choose` says "direct" for every byte count on ``world`` ranks (then callers can
    skip asking per op).

    Example::

        >>> direct_for_every_size(4)
        True
    """
    rows = ALGORITHMS.get(world, ALGORITHMS[None])
    return all(algo == "direct" for _, algo in rows) and rows[-1][0] >= 1 << 62


def choose(world: int, nbytes: int) -> str:
    """``"direct"`` or ``"plans"`` for a collective of ``nbytes`` bytes per rank on ``world`` ranks.

    Example::

        >>> choose(4, 1024)
        'direct'
    """
    for limit, algo in ALGORITHMS.get(world, ALGORITHMS[None]):
        if nbytes <= limit:
            return algo
    return "plans"


def format_table() -> str:
    """The selection table as text (for notebooks and docs).

    Example::

        >>> print(format_table().splitlines()[0])
        world size | up to bytes | algorithm
    """
    lines = ["world size | up to bytes | algorithm", "--- | --- | ---"]
    for world, rows in ALGORITHMS.items():
        for limit, algo in rows:
            lines.append(f"{world if world is not None else 'other'} | "
                         f"{'any' if limit >= 1 << 62 else limit} | {algo}")
    return "\n".join(lines)


class DirectCollectives:
    """The direct collectives of one group over its segment ``seg``.

    Arrays are flat, C-contiguous host NumPy arrays; ``info`` is the op's ``OpInfo`` (deadline,
    check word). Every method leaves the group consistent or raises (the backend then poisons it).

    Example::

        # on every rank of a one-host group, over the segment they all mapped
        direct = DirectCollectives(segment)
        direct.all_reduce(flat_grads, ReduceOp.SUM, info)     # info: the op's OpInfo
        direct.barrier(info)
    """

    def __init__(self, seg):
        self.seg = seg
        self.size, self.rank = seg.size, seg.rank
        self._views: dict = {}
        self._reduce_views: dict = {}      # dtype -> {elements: _reduce_plan}
        self._small_bytes = seg.small
        self._sync = seg.sync       # bound once: the small path's one segment call per op

    def close(self) -> None:
        self._views.clear()
        self._reduce_views.clear()
        self.seg.close()

    # -- views into the segment, cached per dtype -----------------------------------------------------
    def _small(self, dtype):
        """[parity] -> (n, SMALL // itemsize) array of the small slots."""
        key = ("small", dtype)
        v = self._views.get(key)
        if v is None:
            seg, n = self.seg, self.size
            per = seg.small // dtype.itemsize
            v = [np.frombuffer(seg.mm, dtype, n * per, seg.small_off + p * n * seg.small).reshape(n, per)
                 for p in (0, 1)]
            self._views[key] = v
        return v

    def _large(self, dtype):
        """([buffer] -> (n, chunk elems) slots, [buffer] -> (chunk elems,) result)."""
        key = ("large", dtype)
        v = self._views.get(key)
        if v is None:
            seg, n = self.seg, self.size
            per = seg.chunk // dtype.itemsize
            slots = [np.frombuffer(seg.mm, dtype, n * per, seg.large_off + b * n * seg.chunk).reshape(n, per)
                     for b in (0, 1)]
            res = [np.frombuffer(seg.mm, dtype, per, seg.result_off + b * seg.chunk) for b in (0, 1)]
            v = self._views[key] = (slots, res)
        return v

    def _next_parity(self) -> int:
        """This op's parity (which set of small slots and op words it uses); counts the op."""
        seg = self.seg
        parity = seg.ops & 1
        seg.ops += 1
        return parity

    def _begin(self, info, nbytes: int, aux: int = -1) -> int:
        """A multi-barrier op: count it and publish its words (checked after its first barrier)."""
        parity = self._next_parity()
        self.seg.announce(parity, info.wire, nbytes, aux)
        return parity

    # -- all_reduce / reduce ------------------------------------------------------------------------------
    def _small_views(self, dtype, m: int):
        """[parity] -> (my slot[:m], every slot[:m] in rank order), cached per (dtype, m)."""
        key = (dtype, m)
        v = self._views.get(key)
        if v is None:
            if len(self._views) > 256:      # many distinct sizes: start over rather than grow
                self._views.clear()
                self._reduce_views.clear()
            v = tuple((sl[self.rank, :m], tuple(sl[r, :m] for r in range(self.size)))
                      for sl in self._small(dtype))
            self._views[key] = v
        return v

    def _reduce_plan(self, dtype, m: int):
        """[parity] -> (my slot[:m], slot 0, slot 1, the other slots): the small all_reduce's views,
        cached per dtype then element count (two lookups without building a key tuple)."""
        v = self._small_views(dtype, m)
        plan = tuple((mine, slots[0], slots[1], slots[2:]) for mine, slots in v)
        self._reduce_views.setdefault(dtype, {})[m] = plan
        return plan

    def all_reduce(self, flat: np.ndarray, op: ReduceOp, info, root: int = -1) -> None:
        """In place on every rank (``root >= 0``: a reduce; only the caller decides what to keep)."""
        seg = self.seg
        nbytes = flat.nbytes
        ops = seg.ops
        seg.ops = ops + 1
        parity = ops & 1
        ufunc = REDUCE_UFUNCS[op]
        if nbytes <= self._small_bytes:
            # the latency path: per-call Python and NumPy overhead is the cost here, so the views come
            # from two dict lookups (no key tuple), the segment is called once (sync: words, barrier,
            # check) and every ufunc gets ``out`` positionally (a keyword argument is slower to parse)
            plan = self._reduce_views.get(flat.dtype)
            plan = plan.get(flat.size) if plan is not None else None
            if plan is None:
                plan = self._reduce_plan(flat.dtype, flat.size)
            mine, first, second, rest = plan[parity]
            mine[...] = flat            # (cheaper than np.copyto for a few KiB)
            self._sync(parity, info.wire, (nbytes << _AUX_BITS) | (root + 1), info)   # pack_words, inline
            # every rank folds all slots in rank order: the same operations, the same bits everywhere
            ufunc(first, second, flat)
            for slot in rest:
                ufunc(flat, slot, flat)
            if op is _AVG:
                np.true_divide(flat, self.size, flat)
            return
        seg.announce(parity, info.wire, nbytes, root)
        self._all_reduce_large(flat, ufunc, op is _AVG, parity, info)

    def _all_reduce_large(self, flat, ufunc, avg: bool, parity: int, info) -> None:
        # Rank r reduces slice r of every chunk. Nobody else reads that slice of r's input, so r never
        # copies it in: r folds the other ranks' slots straight into its own buffer, then publishes the
        # slice in the result area for the others (with 2 ranks: 1.5 copies of the buffer, not 2).
        seg, n, me = self.seg, self.size, self.rank
        slots, res = self._large(flat.dtype)
        per = slots[0].shape[1]
        total = flat.size
        k = -(-total // per)
        base = seg.buffer
        seg.buffer = base + k
        others = [r for r in range(n) if r != me]
        copy, barrier = np.copyto, seg.barrier
        for j in range(k + 2):
            if 1 <= j <= k:       # reduce my slice of chunk j-1 (the others wrote it before the barrier)
                b = (base + j - 1) & 1
                a = (j - 1) * per
                length = min(per, total - a)
                lo, hi = me * length // n, (me + 1) * length // n
                if hi > lo:
                    dst = flat[a + lo:a + hi]
                    sl = slots[b]
                    for r in others:
                        ufunc(dst, sl[r, lo:hi], out=dst)
                    if avg:
                        np.true_divide(dst, n, out=dst)
                    copy(res[b][lo:hi], dst)
            if j >= 2:            # copy the others' slices of chunk j-2's result out
                b = (base + j - 2) & 1
                a = (j - 2) * per
                length = min(per, total - a)
                lo, hi = me * length // n, (me + 1) * length // n
                rb = res[b]
                if lo:
                    copy(flat[a:a + lo], rb[:lo])
                if hi < length:
                    copy(flat[a + hi:a + length], rb[hi:length])
            if j < k:             # copy chunk j in, all but my own slice
                b = (base + j) & 1
                a = j * per
                length = min(per, total - a)
                lo, hi = me * length // n, (me + 1) * length // n
                row = slots[b][me]
                if lo:
                    copy(row[:lo], flat[a:a + lo])
                if hi < length:
                    copy(row[hi:length], flat[a + hi:a + length])
            if j <= k:
                barrier(info)
                if j == 0:
                    seg.check_words(parity, info)

    # -- reduce_scatter ---------------------------------------------------------------------------------------
    def reduce_scatter(self, out: np.ndarray, inp: np.ndarray, op: ReduceOp, info) -> None:
        """``out`` (m elements) = the reduction of block ``rank`` of every rank's ``inp`` (n*m elements)."""
        seg, n, me = self.seg, self.size, self.rank
        ufunc = REDUCE_UFUNCS[op]
        avg = op is ReduceOp.AVG
        m = out.size
        blocks = inp.reshape(n, m)
        if inp.nbytes <= seg.small:
            parity = self._next_parity()
            mine, slots = self._small_views(inp.dtype, inp.size)[parity]
            np.copyto(mine, inp)
            self._sync(parity, info.wire, pack_words(inp.nbytes, -1), info)
            lo, hi = me * m, (me + 1) * m
            ufunc(slots[0][lo:hi], slots[1][lo:hi], out=out)
            for r in range(2, n):
                ufunc(out, slots[r][lo:hi], out=out)
            if avg:
                np.true_divide(out, n, out=out)
            return
        parity = self._begin(info, inp.nbytes)
        slots, _ = self._large(inp.dtype)
        per = max(1, slots[0].shape[1] // n)     # elements of each destination block per chunk
        k = -(-m // per)
        base = seg.buffer
        seg.buffer = base + k
        others = [r for r in range(n) if r != me]
        for j in range(k + 1):
            if j >= 1:            # my block of chunk j-1: my own input plus the others' slots
                b = (base + j - 1) & 1
                a = (j - 1) * per
                length = min(per, m - a)
                dst = out[a:a + length]
                np.copyto(dst, blocks[me, a:a + length])
                sl = slots[b]
                for r in others:
                    ufunc(dst, sl[r, me * per:me * per + length], out=dst)
                if avg:
                    np.true_divide(dst, n, out=dst)
            if j < k:             # chunk j of every destination block but mine
                b = (base + j) & 1
                a = j * per
                length = min(per, m - a)
                grid = slots[b][me, :n * per].reshape(n, per)
                if me:
                    np.copyto(grid[:me, :length], blocks[:me, a:a + length])
                if me + 1 < n:
                    np.copyto(grid[me + 1:, :length], blocks[me + 1:, a:a + length])
            # a final barrier too: the last phase reads slots that the next op's first phase may write
            seg.barrier(info)
            if j == 0:
                seg.check_words(parity, info)

    # -- all_gather ---------------------------------------------------------------------------------------------
    def all_gather(self, out: np.ndarray, inp: np.ndarray, info) -> None:
        """``out`` viewed as (n, m) gets every rank's ``inp`` (m elements) in rank order."""
        seg, n, me = self.seg, self.size, self.rank
        m = inp.size
        rows = out.reshape(n, m)
        if inp.nbytes <= seg.small:
            parity = self._next_parity()
            slots = self._small(inp.dtype)[parity]
            np.copyto(slots[me, :m], inp)
            self._sync(parity, info.wire, pack_words(inp.nbytes, -1), info)
            np.copyto(rows, slots[:, :m])
            return
        parity = self._begin(info, inp.nbytes)
        slots, _ = self._large(inp.dtype)
        per = slots[0].shape[1]
        k = -(-m // per)
        base = seg.buffer
        seg.buffer = base + k
        for j in range(k + 1):
            if j >= 1:
                b = (base + j - 1) & 1
                a = (j - 1) * per
                length = min(per, m - a)
                np.copyto(rows[:, a:a + length], slots[b][:, :length])
            if j < k:
                b = (base + j) & 1
                a = j * per
                length = min(per, m - a)
                np.copyto(slots[b][me, :length], inp[a:a + length])
                seg.barrier(info)
                if j == 0:
                    seg.check_words(parity, info)

    # -- broadcast ------------------------------------------------------------------------------------------------
    def broadcast(self, flat: np.ndarray, root: int, info) -> None:
        seg, me = self.seg, self.rank
        if flat.nbytes <= seg.small:
            parity = self._next_parity()
            slots = self._small(flat.dtype)[parity]
            m = flat.size
            if me == root:
                np.copyto(slots[root, :m], flat)
            self._sync(parity, info.wire, pack_words(flat.nbytes, root), info)
            if me != root:
                np.copyto(flat, slots[root, :m])
            return
        parity = self._begin(info, flat.nbytes, root)
        _, res = self._large(flat.dtype)
        per = res[0].size
        total = flat.size
        k = -(-total // per)
        base = seg.buffer
        seg.buffer = base + k
        for j in range(k + 1):
            if j >= 1 and me != root:
                b = (base + j - 1) & 1
                a = (j - 1) * per
                length = min(per, total - a)
                np.copyto(flat[a:a + length], res[b][:length])
            if j < k:
                if me == root:
                    b = (base + j) & 1
                    a = j * per
                    length = min(per, total - a)
                    np.copyto(res[b][:length], flat[a:a + length])
                seg.barrier(info)
                if j == 0:
                    seg.check_words(parity, info)

    # -- barrier ----------------------------------------------------------------------------------------------------
    def barrier(self, info) -> None:
        self._sync(self._next_parity(), info.wire, pack_words(0, -1), info)
