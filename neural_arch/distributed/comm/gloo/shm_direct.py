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
* **all_to_allv** (uneven, the token exchange of a mixture of experts): the op's small area holds
  the split table twice, ``sends[s][d]`` (rank s writes its row) and ``receives[s][d]`` (rank d writes
  its column: what it expects from each s); each rank writes those and its whole input into its large
  slot, then one ``sync``. Every rank then reads the table, checks it in one comparison (the two
  halves are equal exactly when every rank's sends are its peers' receives: else a
  CollectiveMismatchError on every rank, nothing exchanged, every output untouched) and copies its
  block out of each sender's slot, whose offset the sender's row gives. Inputs larger than a chunk
  go in chunks through the two buffers, one barrier per chunk (the table says how many every rank
  needs). No plan and no message: one copy in, one copy out per block.
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
and dtypes outside it (all_to_all, gather, scatter, CuPy arrays, sub-groups spanning hosts) use the plans;
all_to_allv moves bytes, so it takes the direct path for every dtype (:func:`alltoallv_fits`).

Example (the selection table, as data and as text)::

    >>> choose(2, 1 << 20)
    'direct'
    >>> print(format_table().splitlines()[2])
    2 | any | direct
"""

from __future__ import annotations

import struct
from array import array

import numpy as np

from neural_arch.distributed.comm.dtypes import REDUCE_UFUNCS
from neural_arch.distributed.comm.gloo.transport.shm_segment import _AUX_BITS, SMALL_BYTES, pack_words
from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.errors import CollectiveMismatchError

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


def alltoallv_fits(world: int, small_bytes: int = SMALL_BYTES) -> bool:
    """Whether a group of ``world`` ranks can run all_to_allv directly: its split table (two
    ``world x world`` int64 matrices) must fit the small area of one parity (``world`` slots of
    ``small_bytes``). Every rank decides the same.

    Example::

        >>> alltoallv_fits(5), alltoallv_fits(1024)
        (True, False)
    """
    return 16 * world * world <= world * small_bytes


_EMPTY = memoryview(b"")


def _byte_view(array: np.ndarray) -> memoryview:
    """A flat byte view of a C-contiguous host array (a memoryview: slicing and copying it is the
    cheapest way Python has to move a few KiB between buffers)."""
    if not array.nbytes:
        return _EMPTY          # memoryview refuses to cast a shape with a zero in it
    try:
        return memoryview(array).cast("B")
    except (TypeError, ValueError):       # dtypes without a buffer format (bfloat16)
        return memoryview(array.reshape(-1).view(np.uint8))


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
        self._a2a = None            # all_to_allv's structs and slot views (built at its first call)

    def close(self) -> None:
        self._views.clear()
        self._reduce_views.clear()
        self._a2a = None
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

    # -- all_to_allv ----------------------------------------------------------------------------------------------
    def _alltoallv_layout(self):
        """(write my sends row, [parity] -> its offset, [parity] -> my receives column (a slice of the
        segment's int64 words), read the table, [parity] -> its offset, [buffer] -> [rank] -> its large slot as bytes,
        [buffer] -> my slot), built once per segment."""
        seg, n, me = self.seg, self.size, self.rank
        table = [seg.small_off + p * n * seg.small for p in (0, 1)]   # the sends, then the receives matrix
        write = struct.Struct(f"{n}q").pack_into
        row = [t + 8 * me * n for t in table]
        # my receives column as a strided slice of the segment's int64 words (one assignment)
        column = [slice((t + 8 * (n * n + me)) // 8, (t + 8 * (2 * n * n)) // 8, n) for t in table]
        read = struct.Struct(f"{2 * n * n}q").unpack_from
        whole = memoryview(seg.mm)
        slots = [[whole[seg.large_off + (b * n + r) * seg.chunk:seg.large_off + (b * n + r + 1) * seg.chunk]
                  for r in range(n)] for b in (0, 1)]
        self._a2a = (write, row, column, read, table, slots, [slots[0][me], slots[1][me]])
        return self._a2a

    def alltoallv(self, out: np.ndarray, inp: np.ndarray, out_splits: list, in_splits: list, row_bytes: int,
                  info) -> None:
        """``in_splits[d]`` rows of ``inp`` to rank d, ``out_splits[s]`` rows from rank s into ``out``
        (rank order; both C-contiguous host arrays, rows of ``row_bytes`` bytes; the lengths and sums
        were checked by the caller). See the module docstring; the group must pass
        :func:`alltoallv_fits`.

        Example::

            # rank 0 of 2 keeps 1 row and sends 2; rank 1 sends it 3 (info: the op's OpInfo)
            direct.alltoallv(out, inp, [1, 3], [1, 2], inp.itemsize * 4, info)
        """
        # the latency path of a mixture of experts' token exchange: the Python calls are the cost at
        # its sizes, so the layout comes from one attribute and the views, offsets and checks are inline
        seg, n, me = self.seg, self.size, self.rank
        ops = seg.ops
        seg.ops = ops + 1
        parity = ops & 1
        write, row_off, column, read, table_off, slots, my_slots = self._a2a or self._alltoallv_layout()
        mm = seg.mm
        write(mm, row_off[parity], *in_splits)
        seg._q[column[parity]] = array("q", out_splits)
        try:
            src = memoryview(inp).cast("B")
        except (TypeError, ValueError):      # no rows, or a dtype without a buffer format
            src = _byte_view(inp)
        chunk = seg.chunk
        base = seg.buffer
        nbytes = src.nbytes
        if nbytes:
            if nbytes <= chunk:
                my_slots[base & 1][:nbytes] = src
            else:
                my_slots[base & 1][:] = src[:chunk]
        # the op words (row bytes as the size: the same on every rank), the barrier, their check
        self._sync(parity, info.wire, (row_bytes << _AUX_BITS) & 0xFFFFFFFFFFFFFFFF, info)
        table = read(mm, table_off[parity])
        nn = n * n
        # every rank checks every pair at once (the same table everywhere: all raise or none does)
        if table[:nn] != table[nn:]:
            raise self._split_mismatch(table, info)
        try:
            dst = memoryview(out).cast("B")
        except (TypeError, ValueError):
            dst = _byte_view(out)
        # one phase when every input fit its slot: surely so when all of them together fit one
        if sum(table[:nn]) * row_bytes > chunk:
            longest = max(sum(table[s * n:s * n + n]) for s in range(n)) * row_bytes
            if longest > chunk:
                self._alltoallv_chunks(dst, src, table, row_bytes, -(-longest // chunk), base, info)
                return
        seg.buffer = base + 1
        got = slots[base & 1]
        o = 0
        for s in range(n):
            length = out_splits[s] * row_bytes
            if length:
                at = sum(table[s * n:s * n + me]) * row_bytes
                dst[o:o + length] = (src if s == me else got[s])[at:at + length]
                o += length

    def _alltoallv_chunks(self, dst, src, table, row_bytes: int, phases: int, base: int, info) -> None:
        """The rest of an all_to_allv whose largest input spans ``phases`` chunks (chunk 0 is in the
        slots, behind the first barrier): phase j reads the pieces of chunk j-1 that are this rank's,
        writes chunk j, and ends on a barrier (as all_gather's pipeline; the last read needs none:
        the next op starts on the other buffer)."""
        seg, n, me = self.seg, self.size, self.rank
        chunk = seg.chunk
        slots = self._a2a[5]
        seg.buffer = base + phases
        # (sender, its block's byte range in its input, where that lands in the output)
        blocks = []
        o = 0
        for s in range(n):
            row = table[s * n:s * n + n]
            length = row[me] * row_bytes
            if length:
                at = sum(row[:me]) * row_bytes
                if s == me:
                    dst[o:o + length] = src[at:at + length]
                else:
                    blocks.append((s, at, at + length, o))
                o += length
        total = src.nbytes
        for j in range(1, phases + 1):
            lo, hi = (j - 1) * chunk, j * chunk
            got = slots[(base + j - 1) & 1]
            for s, a, b, at in blocks:
                a2, b2 = max(a, lo), min(b, hi)
                if a2 < b2:
                    dst[at + a2 - a:at + b2 - a] = got[s][a2 - lo:b2 - lo]
            if j < phases:
                a, b = j * chunk, min(total, (j + 1) * chunk)
                if a < b:
                    slots[(base + j) & 1][me][:b - a] = src[a:b]
                seg.barrier(info)

    def _split_mismatch(self, table, info) -> CollectiveMismatchError:
        """The error every rank raises when the split table disagrees (each reads the same table)."""
        n, names = self.size, self.seg.names
        nn = n * n
        pairs = [f"rank {names[s]} sends {table[s * n + d]} rows to rank {names[d]}, which expects "
                 f"{table[nn + s * n + d]}" for s in range(n) for d in range(n)
                 if table[s * n + d] != table[nn + s * n + d]]
        return CollectiveMismatchError(
            f"{info.describe()} on group {names}: the split sizes disagree ({'; '.join(pairs[:4])}"
            f"{'; ...' if len(pairs) > 4 else ''}). Rank s's input_split_sizes[d] must equal rank d's "
            "output_split_sizes[s]. Nothing was exchanged; this group is unusable now (raised on every rank).")
