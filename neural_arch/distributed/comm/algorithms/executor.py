"""The gloo backend's collective algorithms: pick a plan, then execute it over the transport.

Every collective here is a :mod:`neural_arch.distributed.comm.algorithms.plans` schedule run by
:meth:`PlanExecutor._run_plan` (step by step, ``sendrecv`` then reduce) or, for ring and chain
plans, by :meth:`PlanExecutor._run_pipelined` (each step streamed in ``PIPELINE_SEGMENT_BYTES``
segments, every segment forwarded with ``isend`` as soon as it is final), so the plans the unit
tests simulate are what runs.
Reductions happen in place with NumPy ufuncs (``out=``) into the caller's buffer; received
slices land in a per-backend scratch buffer that is allocated once per (dtype, size) and reused.

Algorithm choice (``p`` ranks, ``n`` bytes)
-------------------------------------------

===============  =====================================  ==========================================
collective       small messages                         large messages
===============  =====================================  ==========================================
all_reduce       recursive doubling (one exchange for   ring reduce-scatter + ring all-gather,
                 p = 2; non-power-of-two fix-up)        n >= ``RING_ALLREDUCE_MIN_BYTES[p]``
broadcast        binomial tree                          pipelined chain (p >= 3),
                                                        n >= ``CHAIN_BROADCAST_MIN_BYTES``
reduce           binomial tree                          ring reduce-scatter + gather (p >= 3)
all_gather       ring (p - 1 steps of n)                ring
reduce_scatter   ring                                   ring
all_to_all       pairwise exchange                      pairwise exchange
barrier          dissemination (ceil(log2 p) rounds of one byte)
===============  =====================================  ==========================================

Thresholds and the measurements behind them
-------------------------------------------

Measured with ``benchmarks/bench_collectives.py --quick`` (float32, median latency, shared
memory transport) on the development machine: 2 vCPUs shared with other jobs (load average
8-10 while measuring), so absolute numbers are dominated by the scheduler -- a rank that waits
sleeps, and its peer needs a core to make progress. The *crossovers* are what set the
thresholds; re-measure on your hardware with ``--contenders gloo-rd,gloo-ring`` (or
``gloo-tree,gloo-chain --ops broadcast``) and adjust the constants below.

all_reduce, recursive doubling (rd) vs ring, microseconds::

    size      2 ranks: rd / ring     3 ranks: rd / ring     4 ranks: rd / ring
    4 KiB        746 /   586           1384 /  1612
    16 KiB       661 /   783           1214 /  1920
    64 KiB       654 /  1193           1262 /  1796            1927 /  3375
    256 KiB      769 /   900           1493 /  2218            2091 /  4546
    512 KiB      857 /  1806           2599 /  1910            3279 /  6300
    1 MiB       1559 /  2831           5277 /  2584            7337 /  7465
    4 MiB       4847 /  6915          19116 / 15675
    4 MiB*     15751 / 11805     (* a second run: the noise is large)
    16 MiB     57032 / 46379
    64 MiB    219890 / 159905

With two ranks recursive doubling is a single exchange, so it wins until the ring's halved
reduction work pays for its second round trip (between 4 and 16 MiB here): threshold 4 MiB.
With three ranks the ring wins from 512 KiB, with four from about 1 MiB (four ranks on two
cores make the ring's 2(p-1) hops expensive).

broadcast, 3 ranks, binomial tree vs pipelined chain, microseconds::

    size      tree / chain
    64 KiB     516 /   388
    256 KiB   1014 /  1104
    1 MiB     3523 /  2635
    4 MiB    11444 /  9161
    16 MiB   51315 / 40680

The chain wins from 1 MiB. ``reduce`` uses the same 1 MiB switch to its ring variant (by
analogy; not measured separately). Pipeline segments are 512 KiB: half the shared-memory
ring (1 MiB by default), so a sender can fill one segment while the receiver drains the other.

Example::

    backend.allreduce(np.ones(1 << 20, np.float32))     # ring: 2(p-1) steps of n/p
    backend.allreduce(np.ones(16, np.float32))          # recursive doubling: log2 p exchanges
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import numpy as np

from neural_arch.backend import to_device_like, to_host

from neural_arch.distributed.comm.algorithms import plans as P
from neural_arch.distributed.comm.backend import finish_average
from neural_arch.distributed.comm.work import OpInfo, ReduceOp

# all_reduce switches from recursive doubling to the ring at this many bytes (per world size;
# sizes not listed use the default). See the module docstring for the measurements.
RING_ALLREDUCE_MIN_BYTES: Dict[int, int] = {2: 4 << 20, 3: 512 << 10, 4: 1 << 20}
RING_ALLREDUCE_DEFAULT_MIN_BYTES = 1 << 20
# broadcast/reduce switch from trees to the chain / ring at this many bytes (p >= 3 only:
# with two ranks every algorithm is one message).
CHAIN_BROADCAST_MIN_BYTES = 1 << 20
RING_REDUCE_MIN_BYTES = 1 << 20
# Segment size of the pipelined chain broadcast.
CHAIN_SEGMENT_BYTES = 256 * 1024
_MAX_SEGMENTS = 64

# all_reduces of at most this many bytes whose plan is whole-buffer exchanges only take the latency
# path (PlanExecutor._allreduce), with a scratch buffer of their own: at most this many of them.
EXCHANGE_PATH_MAX_BYTES = 64 << 10
_EXCHANGE_PATH_ENTRIES = 64

# Ring and chain plans stream in segments of this size (see PlanExecutor._run_pipelined).
# NEURAL_ARCH_GLOO_SEGMENT_BYTES overrides it (tests use tiny segments to exercise the pipeline).
PIPELINE_SEGMENT_BYTES = int(os.environ.get("NEURAL_ARCH_GLOO_SEGMENT_BYTES", str(512 * 1024)))
_PIPELINED = frozenset({"ring_allreduce", "ring_allgather", "ring_reduce_scatter", "ring_reduce",
                        "chain_broadcast"})

# NEURAL_ARCH_GLOO_ALGO forces algorithms (benchmarks, crossover measurements, tests): a comma list
# of "ring" or "rd" (all_reduce and reduce: ring vs recursive doubling / binomial tree) and "chain"
# or "tree" (broadcast), or "direct" (the shared-memory collectives of shm_direct.py wherever the
# group has them; any other forced value keeps a group off them); unset means "choose by size".
ALGO_ENV = "NEURAL_ARCH_GLOO_ALGO"


def allreduce_plan(size: int, nelems: int, nbytes: int, force: Optional[str] = None) -> P.Plan:
    """The all_reduce plan for ``size`` ranks and a buffer of ``nelems`` elements / ``nbytes`` bytes."""
    force = force or ""
    if "ring" in force:
        return P.ring_allreduce_plan(size, nelems)
    if "rd" in force:
        return P.recursive_doubling_plan(size, nelems)
    threshold = RING_ALLREDUCE_MIN_BYTES.get(size, RING_ALLREDUCE_DEFAULT_MIN_BYTES)
    if nbytes >= threshold and nelems >= size:
        return P.ring_allreduce_plan(size, nelems)
    return P.recursive_doubling_plan(size, nelems)


def broadcast_plan(size: int, nelems: int, nbytes: int, root: int, force: Optional[str] = None) -> P.Plan:
    force = force or ""
    if "tree" not in force and ("chain" in force or (size >= 3 and nbytes >= CHAIN_BROADCAST_MIN_BYTES)):
        segments = min(_MAX_SEGMENTS, max(2, nbytes // CHAIN_SEGMENT_BYTES))
        return P.chain_broadcast_plan(size, nelems, root, int(segments))
    return P.binomial_broadcast_plan(size, nelems, root)


def reduce_plan(size: int, nelems: int, nbytes: int, root: int, force: Optional[str] = None) -> P.Plan:
    force = force or ""
    if "ring" in force:   # forced (tests, measurements): also for tiny or short buffers
        return P.ring_reduce_plan(size, nelems, root)
    if "rd" not in force and size >= 3 and nbytes >= RING_REDUCE_MIN_BYTES and nelems >= size:
        return P.ring_reduce_plan(size, nelems, root)
    return P.binomial_reduce_plan(size, nelems, root)


# In-place reductions (AVG accumulates as a sum; the caller divides at the end).
_UFUNCS = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.MAX: np.maximum, ReduceOp.MIN: np.minimum,
           ReduceOp.PRODUCT: np.multiply}


def _flat(array) -> np.ndarray:
    # C-contiguous (checked by Backend) so this is a view, also for 0-d arrays.
    return array.reshape(-1)


class PlanExecutor:
    """Mixin with the collective primitives of :class:`GlooBackend`.

    Needs from the host class: ``_t`` (the transport), ``_peers`` (group rank -> transport
    rank), ``_rank``, ``_size``, ``_coll_channel`` and ``_scratch(dtype, n, slot)``.
    """

    _force_algo: Optional[str] = None
    _compiled_plans: dict
    _exchange_plans: dict     # (nelems, dtype, forced algo) -> (peers, scratch): see _exchange_only

    # -- the engine -------------------------------------------------------------------------------
    def _compiled(self, key: tuple, build) -> tuple:
        """This rank's steps of the plan ``build()``, flattened to tuples and cached under ``key``.

        Compiling once per (collective, size) keeps attribute lookups and plan selection off the
        latency-critical path of small messages.
        """
        cache = self._compiled_plans
        steps = cache.get(key)
        if steps is None:
            plan = build()
            me, peers = self._rank, self._peers
            steps = []
            for s in plan.by_rank[me]:
                local = s.send_to == me
                steps.append((None if s.send_to is None or local else peers[s.send_to], s.send_chunk[0],
                              s.send_chunk[1], None if s.recv_from is None or local else peers[s.recv_from],
                              s.recv_chunk[0], s.recv_chunk[1], s.action == P.REDUCE, local))
            steps = (plan.nelems, tuple(steps), plan.name in _PIPELINED)
            if len(cache) > 512:   # many distinct sizes: start over rather than grow without bound
                cache.clear()
            cache[key] = steps
        return steps

    def _dispatch(self, compiled: tuple, buf, op, info) -> None:
        if compiled[2]:
            self._run_pipelined(compiled, buf, op, info, PIPELINE_SEGMENT_BYTES)
        else:
            self._run_plan(compiled, buf, op, info)

    def _run_plan(self, compiled: tuple, buf: np.ndarray, op: Optional[ReduceOp], info: OpInfo,
                  out: Optional[np.ndarray] = None) -> None:
        """Execute compiled plan steps: sends read ``buf``, receives land in ``out``.

        ``out`` defaults to ``buf`` (single-buffer plans). Received slices whose action is
        "reduce" go through scratch and are folded in with a ufunc; "copy" slices are
        received straight into place (the plans never copy over a slice sent in the same step).
        """
        t, ch = self._t, self._coll_channel
        if out is None:
            out = buf
        nelems, steps, _ = compiled
        scratch = None
        for dst, sa, sb, src, ra, rb, red, local in steps:
            if local:  # alltoall's own block
                out[ra:rb] = buf[sa:sb]
                continue
            if src is not None:
                if red:
                    if scratch is None:
                        scratch = self._scratch(buf.dtype, nelems, "recv")
                    target = scratch[:rb - ra]
                else:
                    target = out[ra:rb]
                if dst is not None:
                    t.sendrecv(dst, buf[sa:sb], src, target, ch, info)
                else:
                    t.recv_into(src, target, ch, info)
                if red:
                    dst_view = out[ra:rb]
                    _UFUNCS[op](dst_view, target, out=dst_view)
            else:
                t.send(dst, buf[sa:sb], ch, info)

    def _run_pipelined(self, compiled: tuple, buf: np.ndarray, op: Optional[ReduceOp], info: OpInfo,
                       seg_bytes: int) -> None:
        """Execute a ring or chain plan in segments, forwarding each segment as soon as it is final.

        In a ring (and a chain) the slice received in step k is the slice sent in step k+1. Instead
        of waiting for the whole slice, each segment of it is reduced (or copied) and immediately
        handed to ``isend``: the next rank starts working on it while this one still receives
        the rest, and the transport's ring buffer / socket buffer absorbs the overlap.

        Safety: a step's own sends are waited for at the end of the step, and a plan never
        receives into the slice it sends in the same step, so no pending send's memory is
        written. (Recursive doubling reduces into the slice it sends: it uses :meth:`_run_plan`.)
        """
        t, ch = self._t, self._coll_channel
        nelems, steps, _ = compiled
        seg = max(1, seg_bytes // buf.itemsize)
        ufunc = _UFUNCS.get(op)
        scratch = None
        current: list = []       # handles of this step's sends
        streamed = False         # this step's sends were already issued, segment by segment
        for i, (dst, sa, sb, src, ra, rb, red, _local) in enumerate(steps):
            if dst is not None and not streamed:
                for a in range(sa, sb, seg):
                    current.append(t.isend(dst, buf[a:min(a + seg, sb)], ch, info))
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            forward = src is not None and nxt is not None and nxt[0] is not None and (nxt[1], nxt[2]) == (ra, rb)
            upcoming: list = []
            if src is not None:
                if red and scratch is None:
                    scratch = self._scratch(buf.dtype, min(seg, nelems), "recv")
                for a in range(ra, rb, seg):
                    b = min(a + seg, rb)
                    piece = buf[a:b]
                    if red:
                        target = scratch[:b - a]
                        t.recv_into(src, target, ch, info)
                        ufunc(piece, target, out=piece)
                    else:
                        t.recv_into(src, piece, ch, info)
                    if forward:
                        upcoming.append(t.isend(nxt[0], piece, ch, info))
            for h in current:
                h.wait()
            current, streamed = upcoming, forward
        for h in current:
            h.wait()

    # -- collectives --------------------------------------------------------------------------------
    def _allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        # Latency path first: a small host array whose plan is only whole-buffer exchanges (see
        # _exchange_only). One dict lookup replaces plan lookup, step decoding, slicing and the
        # scratch lookup. Measured on 1 KiB float32 with a do-nothing transport, this method went
        # from 6.4 to 1.6 us per call; 2 ranks over shm, 8-13 us less per all_reduce (A/B runs).
        if type(array) is np.ndarray:
            fast = self._exchange_plans.get((array.size, array.dtype, self._force_algo))
            if fast is not None:
                flat = array if array.ndim == 1 else array.reshape(-1)
                peers, scratch = fast
                t, ch, ufunc = self._t, self._coll_channel, _UFUNCS[op]
                for peer in peers:
                    t.sendrecv(peer, flat, peer, scratch, ch, info)
                    ufunc(flat, scratch, out=flat)
                if op is ReduceOp.AVG:
                    finish_average(flat, self._size)
                return
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            size, n, force = self._size, flat.size, self._force_algo
            plan = self._compiled(("all_reduce", n, flat.itemsize, force),
                                  lambda: allreduce_plan(size, n, n * flat.itemsize, force))
            self._dispatch(plan, flat, op, info)
            if op is ReduceOp.AVG:
                finish_average(flat, self._size)
            if host is array and n * flat.itemsize <= EXCHANGE_PATH_MAX_BYTES:
                self._exchange_only(plan, n, flat.dtype, force)
        _back(array, host)

    def _exchange_only(self, compiled: tuple, n: int, dtype, force: Optional[str]) -> None:
        """Remember ``compiled`` for the latency path if every step of it exchanges the whole buffer
        with one peer and reduces (recursive doubling on a power-of-two group: p = 2 is one step).

        Decided from the plan itself, so the fast path runs exactly the schedule the plan says.
        """
        _, steps, pipelined = compiled
        if pipelined or not steps or any(not (dst is not None and dst == src and (sa, sb, ra, rb) == (0, n, 0, n)
                                              and red and not local)
                                         for dst, sa, sb, src, ra, rb, red, local in steps):
            return
        cache = self._exchange_plans
        if len(cache) >= _EXCHANGE_PATH_ENTRIES:   # many distinct sizes: keep memory bounded
            cache.clear()
        # keyed like the plan: ranks may hold different plans (rank 2 of 3 runs one exchange), so
        # each one's fast path must stay exactly its own plan, also when the algorithm is forced
        cache[(n, dtype, force)] = (tuple(step[0] for step in steps), np.empty(n, dtype))

    def _broadcast(self, array, root: int, info: OpInfo) -> None:
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            size, n = self._size, flat.size
            force = self._force_algo
            plan = self._compiled(("broadcast", n, flat.itemsize, root, force),
                                  lambda: broadcast_plan(size, n, n * flat.itemsize, root, force))
            self._dispatch(plan, flat, None, info)
        _back(array, host)

    def _allgather(self, output, input, info: OpInfo) -> None:
        hin, hout = _to_host(input), _to_host(output)
        out = _flat(hout)
        n = hin.size
        me = self._rank
        out[me * n:(me + 1) * n] = _flat(hin)
        if n:
            size = self._size
            plan = self._compiled(("all_gather", n), lambda: P.ring_allgather_plan(
                size, n * size, tuple((r * n, (r + 1) * n) for r in range(size))))
            self._run_pipelined(plan, out, None, info, PIPELINE_SEGMENT_BYTES)
        _back(output, hout)

    def _reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        hin, hout = _to_host(input), _to_host(output)
        n = hout.size
        if n:
            # The caller's input stays untouched: reduce in a reused scratch copy.
            work = self._scratch(hin.dtype, hin.size, "work")
            np.copyto(work, _flat(hin))
            size = self._size
            plan = self._compiled(("reduce_scatter", n), lambda: P.ring_reduce_scatter_plan(
                size, n * size, tuple((r * n, (r + 1) * n) for r in range(size))))
            self._run_pipelined(plan, work, op, info, PIPELINE_SEGMENT_BYTES)
            mine = work[self._rank * n:(self._rank + 1) * n]
            if op is ReduceOp.AVG:
                finish_average(mine, self._size)
            np.copyto(_flat(hout), mine)
        _back(output, hout)

    def _reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            if self._rank == root:
                buf = flat
            else:  # non-roots leave their input unchanged
                buf = self._scratch(flat.dtype, flat.size, "work")
                np.copyto(buf, flat)
            size, n = self._size, flat.size
            force = self._force_algo
            plan = self._compiled(("reduce", n, flat.itemsize, root, force),
                                  lambda: reduce_plan(size, n, n * flat.itemsize, root, force))
            self._dispatch(plan, buf, op, info)
            if op is ReduceOp.AVG and self._rank == root:
                finish_average(flat, self._size)
        if self._rank == root:
            _back(array, host)

    def _alltoall(self, output, input, info: OpInfo) -> None:
        hin, hout = _to_host(input), _to_host(output)
        if hin.size:
            size, n = self._size, hin.size
            plan = self._compiled(("all_to_all", n), lambda: P.pairwise_alltoall_plan(size, n))
            self._run_plan(plan, _flat(hin), None, info, out=_flat(hout))
        _back(output, hout)

    def _barrier(self, info: OpInfo) -> None:
        token = self._scratch(np.dtype(np.uint8), 1, "barrier")
        size = self._size
        plan = self._compiled(("barrier",), lambda: P.dissemination_barrier_plan(size))
        self._run_plan(plan, token, None, info)


def _to_host(array) -> np.ndarray:
    """NumPy arrays as they are; device arrays copied to host (the CPU backend stages GPU data)."""
    return array if type(array) is np.ndarray else to_host(array)


def _back(array, host: np.ndarray) -> None:
    if host is not array:
        to_device_like(host, array, out=array)


def force_algo_from_env() -> Optional[str]:
    known = {"ring", "rd", "chain", "tree", "direct"}
    chosen = [v.strip() for v in os.environ.get(ALGO_ENV, "").lower().split(",") if v.strip()]
    bad = [v for v in chosen if v not in known]
    if bad:
        raise ValueError(f"{ALGO_ENV}={os.environ[ALGO_ENV]!r}: unknown algorithm(s) {bad}; use a comma list of "
                         f"{sorted(known)}, or unset it to choose by message size")
    return ",".join(chosen) or None
