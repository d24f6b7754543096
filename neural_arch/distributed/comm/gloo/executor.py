"""The gloo backend's collective algorithms: pick a plan, then execute it over the transport.

Every collective here is a :mod:`neural_arch.distributed.comm.gloo.plans` schedule run by
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
all_to_allv      pairwise exchange of uneven blocks     pairwise exchange of uneven blocks
                 (one host: the shared segment)
barrier          dissemination: ceil(log2 p) rounds of  dissemination
                 one byte
===============  =====================================  ==========================================

Thresholds
----------

The crossovers were measured with ``benchmarks/bench_collectives.py --quick --contenders
gloo-rd,gloo-ring`` (and ``gloo-tree,gloo-chain --ops broadcast``); the tables are in
``docs/benchmarks.md`` ("gloo plan thresholds"). With two ranks recursive doubling is a single
exchange, so it wins until the ring's halved reduction work pays for its second round trip: 4 MiB.
With three ranks the ring wins from 512 KiB, with four from about 1 MiB; with three ranks the
pipelined chain broadcast wins from 1 MiB (``reduce`` switches to its ring variant there too, by
analogy). Pipeline segments are 512 KiB: half the shared-memory ring (1 MiB by default), so a
sender can fill one segment while the receiver drains the other. Re-measure on your hardware and
adjust the constants below.

Example::

    backend.allreduce(np.ones(1 << 20, np.float32))     # ring: 2(p-1) steps of n/p
    backend.allreduce(np.ones(16, np.float32))          # recursive doubling: log2 p exchanges
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from neural_arch import config
from neural_arch.backend import to_device_like, to_host
from neural_arch.distributed.comm.dtypes import REDUCE_UFUNCS, finish_average
from neural_arch.distributed.comm.gloo import plans as P
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
# path (PlanExecutor.allreduce; CompiledPlan.exchange_peers).
EXCHANGE_PATH_MAX_BYTES = 64 << 10
# the plan cache starts over past this many entries (many distinct sizes): memory stays bounded
_PLAN_CACHE_ENTRIES = 512

# Ring and chain plans stream in segments of this size (see PlanExecutor._run_pipelined).
# NEURAL_ARCH_GLOO_SEGMENT_BYTES overrides it (tests use tiny segments to exercise the pipeline).
PIPELINE_SEGMENT_BYTES = config.get("NEURAL_ARCH_GLOO_SEGMENT_BYTES")
_PIPELINED = frozenset({"ring_allreduce", "ring_allgather", "ring_reduce_scatter", "ring_reduce",
                        "chain_broadcast"})

# NEURAL_ARCH_GLOO_ALGO forces algorithms (benchmarks, crossover measurements, tests): a comma list
# of "ring" or "rd" (all_reduce and reduce: ring vs recursive doubling / binomial tree) and "chain"
# or "tree" (broadcast), or "direct" (the shared-memory collectives of shm_direct.py wherever the
# group has them; any other forced value keeps a group off them); unset means "choose by size".
ALGO_ENV = "NEURAL_ARCH_GLOO_ALGO"


def allreduce_algorithm(size: int, nelems: int, nbytes: int, force: Optional[str] = None) -> str:
    """The name of the all_reduce plan for ``size`` ranks and ``nelems`` elements / ``nbytes`` bytes.

    Example::

        >>> allreduce_algorithm(4, nelems=16, nbytes=64)
        'recursive_doubling_allreduce'
        >>> allreduce_algorithm(4, nelems=1 << 22, nbytes=1 << 24)
        'ring_allreduce'
        >>> allreduce_algorithm(4, nelems=16, nbytes=64, force="ring")
        'ring_allreduce'
    """
    force = force or ""
    if "ring" in force:
        return "ring_allreduce"
    if "rd" in force:
        return "recursive_doubling_allreduce"
    threshold = RING_ALLREDUCE_MIN_BYTES.get(size, RING_ALLREDUCE_DEFAULT_MIN_BYTES)
    if nbytes >= threshold and nelems >= size:
        return "ring_allreduce"
    return "recursive_doubling_allreduce"


def allreduce_plan(size: int, nelems: int, nbytes: int, force: Optional[str] = None) -> P.Plan:
    """The all_reduce plan for ``size`` ranks and a buffer of ``nelems`` elements / ``nbytes`` bytes.

    Example::

        >>> plan = allreduce_plan(2, nelems=8, nbytes=32)
        >>> plan.name, plan.size, len(plan.by_rank[0])      # p = 2: one exchange
        ('recursive_doubling_allreduce', 2, 1)
    """
    if allreduce_algorithm(size, nelems, nbytes, force) == "ring_allreduce":
        return P.ring_allreduce_plan(size, nelems)
    return P.recursive_doubling_plan(size, nelems)


def broadcast_algorithm(size: int, nbytes: int, force: Optional[str] = None) -> str:
    """The name of the broadcast plan for ``size`` ranks and ``nbytes`` bytes: a binomial tree, or a
    pipelined chain for large messages on three ranks or more.

    Example::

        >>> broadcast_algorithm(3, nbytes=64), broadcast_algorithm(3, nbytes=1 << 24)
        ('binomial_broadcast', 'chain_broadcast')
    """
    force = force or ""
    if "tree" not in force and ("chain" in force or (size >= 3 and nbytes >= CHAIN_BROADCAST_MIN_BYTES)):
        return "chain_broadcast"
    return "binomial_broadcast"


def broadcast_plan(size: int, nelems: int, nbytes: int, root: int, force: Optional[str] = None) -> P.Plan:
    """The broadcast plan from ``root`` (:func:`broadcast_algorithm` picks it; a chain is cut into
    segments so that every rank forwards while it receives).

    Example::

        >>> broadcast_plan(4, nelems=8, nbytes=32, root=0).name
        'binomial_broadcast'
    """
    if broadcast_algorithm(size, nbytes, force) == "chain_broadcast":
        segments = min(_MAX_SEGMENTS, max(2, nbytes // CHAIN_SEGMENT_BYTES))
        return P.chain_broadcast_plan(size, nelems, root, int(segments))
    return P.binomial_broadcast_plan(size, nelems, root)


def reduce_algorithm(size: int, nelems: int, nbytes: int, force: Optional[str] = None) -> str:
    """The name of the reduce plan: a binomial tree, or ring reduce-scatter + gather for large
    buffers on three ranks or more.

    Example::

        >>> reduce_algorithm(3, nelems=16, nbytes=64), reduce_algorithm(3, nelems=1 << 22, nbytes=1 << 24)
        ('binomial_reduce', 'ring_reduce')
    """
    force = force or ""
    if "ring" in force:   # forced (tests, measurements): also for tiny or short buffers
        return "ring_reduce"
    if "rd" not in force and size >= 3 and nbytes >= RING_REDUCE_MIN_BYTES and nelems >= size:
        return "ring_reduce"
    return "binomial_reduce"


def reduce_plan(size: int, nelems: int, nbytes: int, root: int, force: Optional[str] = None) -> P.Plan:
    """The reduce plan to ``root`` (:func:`reduce_algorithm` picks it).

    Example::

        >>> reduce_plan(4, nelems=8, nbytes=32, root=1).name
        'binomial_reduce'
    """
    if reduce_algorithm(size, nelems, nbytes, force) == "ring_reduce":
        return P.ring_reduce_plan(size, nelems, root)
    return P.binomial_reduce_plan(size, nelems, root)


# The plan each collective runs whatever the size (its name, as the plan builder gives it).
_FIXED_ALGORITHMS = {"all_gather": "ring_allgather", "reduce_scatter": "ring_reduce_scatter",
                     "all_to_all": "pairwise_alltoall", "barrier": "dissemination_barrier"}


def _flat(array) -> np.ndarray:
    # C-contiguous (checked by Backend) so this is a view, also for 0-d arrays.
    return array.reshape(-1)


@dataclass(frozen=True, slots=True)
class PlanStep:
    """One of this rank's steps of a :class:`~neural_arch.distributed.comm.gloo.plans.Plan`,
    compiled for execution: peers are *transport* ranks (``None``: no send / no receive), slices are
    ``[start, stop)`` element ranges of the flat buffer, ``reduce`` says whether the received slice
    is folded in with the op's ufunc (else copied over), ``local`` marks all_to_all's own block.

    A slotted record: reading its fields costs about what unpacking the 8-tuples it replaced did
    (a NamedTuple is slower, unpacked or read by name), and a step prints with its names.

    >>> PlanStep(1, 0, 4, 1, 4, 8, True, False)
    PlanStep(send_to=1, send_start=0, send_stop=4, recv_from=1, recv_start=4, recv_stop=8, reduce=True, local=False)
    """

    send_to: Optional[int]
    send_start: int
    send_stop: int
    recv_from: Optional[int]
    recv_start: int
    recv_stop: int
    reduce: bool
    local: bool


class CompiledPlan(NamedTuple):
    """This rank's part of one plan, ready to run, as the backend's one plan cache keeps it.

    ``exchange_peers`` is set when every step exchanges the *whole* buffer with one peer and reduces
    (recursive doubling on a power-of-two group; p = 2 is one step): a small all_reduce of that
    shape then takes the latency path (:meth:`PlanExecutor.allreduce`), which runs exactly these
    exchanges with ``exchange_scratch`` as the receive buffer and skips step decoding and slicing.
    (A named tuple: the first three fields keep the order of the tuples it replaced.)

    Example::

        >>> import numpy as np
        >>> plan = CompiledPlan(nelems=8, steps=(), pipelined=False, algorithm="none", op="all_reduce",
        ...                     dtype=np.dtype("float32"))
        >>> plan.algorithm, plan.exchange_peers
        ('none', None)
    """

    nelems: int
    steps: Tuple[PlanStep, ...]
    pipelined: bool
    algorithm: str
    op: str
    dtype: Optional[np.dtype]
    exchange_peers: Optional[Tuple[int, ...]] = None
    exchange_scratch: Optional[np.ndarray] = None


class PlanExecutor:
    """Runs one group's collectives as plans over its transport: a component that
    :class:`~neural_arch.distributed.comm.gloo.backend.GlooBackend` holds (``backend.plans``).

    Built from what it needs and nothing else: the ``transport`` (send/recv of slices over
    channels), ``peers`` (group rank -> transport rank), this ``rank`` in a group of ``size``, and
    ``channel``, the channel block of the group's collectives. It owns its receive buffers and the
    one plan cache, ``(op, nelems, dtype[, root], forced algorithm)`` -> :class:`CompiledPlan`
    (plans are built on a cache miss only, by the pure builders of ``plans``). ``force`` is the
    forced algorithm (:func:`parse_algorithms`' form; ``None``: choose by size).

    Tests and notebooks read it through :meth:`compiled_plans` and :meth:`chosen_algorithm`, and
    force an algorithm with :meth:`forced_algorithm` (the backend offers the same three names).

    >>> ex = PlanExecutor(None, [0], 0, 1, channel=0)
    >>> ex.chosen_algorithm("all_reduce", np.ones(4, np.float32))    # a group of one sends nothing
    'none'
    """

    def __init__(self, transport, peers: Sequence[int], rank: int, size: int, channel: int,
                 force: Optional[str] = None):
        self._t = transport
        self._peers = peers
        self._rank = rank
        self._size = size
        self._coll_channel = channel
        #: The forced algorithm, or None to choose by size (see :meth:`forced_algorithm`).
        self.force: Optional[str] = force
        self._compiled_plans: Dict[tuple, CompiledPlan] = {}   # the one plan cache
        # all_to_allv's steps by (sends, receives, row width): apart from the plan cache, as they are
        # this rank's steps for one split matrix row and column, not a plan of the group
        self._alltoallv_steps: Dict[tuple, Tuple[PlanStep, ...]] = {}
        self._buffers: Dict[tuple, np.ndarray] = {}

    def _scratch(self, dtype, n: int, slot: str) -> np.ndarray:
        """A reusable buffer of at least ``n`` elements of ``dtype`` for ``slot`` (grown, never shrunk)."""
        key = (dtype, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[:n]

    def clear(self) -> None:
        """Drop the plan cache and the buffers (the group shut down)."""
        self._buffers.clear()
        self._compiled_plans.clear()
        self._alltoallv_steps.clear()

    # -- the public testing seam ------------------------------------------------------------------
    @contextlib.contextmanager
    def forced_algorithm(self, algo: Optional[str]) -> Iterator:
        """Run this group's collectives with ``algo`` forced inside the ``with`` block (what
        ``NEURAL_ARCH_GLOO_ALGO`` does for a whole process): a comma list of ``ring``, ``rd``,
        ``chain``, ``tree``, ``direct``; ``None`` chooses by size (also when the variable is set).
        For tests and crossover measurements; the previous setting comes back on exit.

        >>> with backend.forced_algorithm("ring"):          # doctest: +SKIP
        ...     backend.allreduce(x)                        # the ring, whatever the size
        """
        chosen = parse_algorithms(algo, "forced_algorithm(...)")
        before = self.force
        self.force = chosen
        try:
            yield self
        finally:
            self.force = before

    def chosen_algorithm(self, op: str, array=None, root: int = 0) -> str:
        """The algorithm a collective ``op`` (``"all_reduce"``, ``"broadcast"``, ...) of ``array`` on
        this group would run now: a plan's name (``"ring_allreduce"``, ``"recursive_doubling_allreduce"``,
        ``"chain_broadcast"``, ...) or ``"none"`` (a group of one, an empty buffer). Decided by the
        same functions the executor calls; nothing is sent.

        >>> backend.chosen_algorithm("all_reduce", np.ones(1 << 20, np.float32))   # doctest: +SKIP
        'ring_allreduce'
        """
        if self._size == 1:
            return "none"
        if op == "barrier":
            return _FIXED_ALGORITHMS[op]
        if op == "all_to_allv":    # a rank with no rows of its own still receives
            return "pairwise_alltoallv"
        n, nbytes, force = int(array.size), int(array.nbytes), self.force
        if n == 0:
            return "none"
        if op == "all_reduce":
            return allreduce_algorithm(self._size, n, nbytes, force)
        if op == "broadcast":
            return broadcast_algorithm(self._size, nbytes, force)
        if op == "reduce":
            return reduce_algorithm(self._size, n, nbytes, force)
        if op in _FIXED_ALGORITHMS:
            return _FIXED_ALGORITHMS[op]
        raise ValueError(f"chosen_algorithm: {op!r} is not a collective of this backend; use one of "
                         f"{['all_reduce', 'broadcast', 'reduce', 'all_to_allv', *_FIXED_ALGORITHMS]}")

    def compiled_plans(self) -> List[CompiledPlan]:
        """The plans this group compiled so far (its plan cache), oldest first: what ran, with names."""
        return list(self._compiled_plans.values())

    # -- the engine -------------------------------------------------------------------------------
    def _compiled(self, key: tuple, dtype, build) -> CompiledPlan:
        """This rank's steps of the plan ``build()``, compiled to :class:`PlanStep` records and cached
        under ``key`` (its first element is the op's name).

        Compiling once per (collective, size, dtype) keeps attribute lookups and plan selection off
        the latency-critical path of small messages.
        """
        cache = self._compiled_plans
        compiled = cache.get(key)
        if compiled is None:
            plan = build()
            compiled = CompiledPlan(plan.nelems, self._plan_steps(plan.by_rank[self._rank]), plan.name in _PIPELINED,
                                    plan.name, key[0], dtype)
            if key[0] == "all_reduce":
                compiled = self._with_exchange_path(compiled, dtype)
            if len(cache) >= _PLAN_CACHE_ENTRIES:   # many distinct sizes: start over rather than grow
                cache.clear()
            cache[key] = compiled
        return compiled

    def _plan_steps(self, steps: Sequence[P.Step]) -> Tuple[PlanStep, ...]:
        """This rank's plan steps as :class:`PlanStep` records (group ranks -> transport ranks)."""
        me, peers = self._rank, self._peers
        out = []
        for s in steps:
            local = s.send_to == me
            out.append(PlanStep(None if s.send_to is None or local else peers[s.send_to], s.send_chunk[0],
                                s.send_chunk[1], None if s.recv_from is None or local else peers[s.recv_from],
                                s.recv_chunk[0], s.recv_chunk[1], s.action == P.REDUCE, local))
        return tuple(out)

    def _with_exchange_path(self, compiled: CompiledPlan, dtype) -> CompiledPlan:
        """``compiled`` with its latency path filled in when every step exchanges the whole buffer
        with one peer and reduces (see :class:`CompiledPlan`), and the buffer is small.

        Decided from the plan itself, so the fast path runs exactly the schedule the plan says --
        also per rank: ranks may hold different plans (rank 2 of 3 runs one exchange).
        """
        n, steps = compiled.nelems, compiled.steps
        if (compiled.pipelined or not steps or n * dtype.itemsize > EXCHANGE_PATH_MAX_BYTES
                or any(not (s.send_to is not None and s.send_to == s.recv_from and s.reduce and not s.local
                            and (s.send_start, s.send_stop, s.recv_start, s.recv_stop) == (0, n, 0, n))
                       for s in steps)):
            return compiled
        # one receive buffer per dtype, shared by every exchange plan (never regrown, so the views
        # stay valid): a group runs one collective at a time
        scratch = self._scratch(dtype, EXCHANGE_PATH_MAX_BYTES // dtype.itemsize, "exchange")[:n]
        return compiled._replace(exchange_peers=tuple(s.send_to for s in steps), exchange_scratch=scratch)

    def _dispatch(self, compiled: CompiledPlan, buf, op, info) -> None:
        if compiled.pipelined:
            self._run_pipelined(compiled, buf, op, info, PIPELINE_SEGMENT_BYTES)
        else:
            self._run_plan(compiled, buf, op, info)

    def _run_plan(self, compiled: CompiledPlan, buf: np.ndarray, op: Optional[ReduceOp], info: OpInfo,
                  out: Optional[np.ndarray] = None) -> None:
        """Execute compiled plan steps: sends read ``buf``, receives land in ``out``.

        ``out`` defaults to ``buf`` (single-buffer plans). Received slices whose action is
        "reduce" go through scratch and are folded in with a ufunc; "copy" slices are
        received straight into place (the plans never copy over a slice sent in the same step).
        """
        t, ch = self._t, self._coll_channel
        if out is None:
            out = buf
        scratch = None
        for s in compiled.steps:
            ra, rb = s.recv_start, s.recv_stop
            if s.local:  # alltoall's own block
                out[ra:rb] = buf[s.send_start:s.send_stop]
                continue
            src, dst = s.recv_from, s.send_to
            if src is not None:
                if s.reduce:
                    if scratch is None:
                        scratch = self._scratch(buf.dtype, compiled.nelems, "recv")
                    target = scratch[:rb - ra]
                else:
                    target = out[ra:rb]
                if dst is not None:
                    t.sendrecv(dst, buf[s.send_start:s.send_stop], src, target, ch, info)
                else:
                    t.recv_into(src, target, ch, info)
                if s.reduce:
                    dst_view = out[ra:rb]
                    REDUCE_UFUNCS[op](dst_view, target, out=dst_view)
            else:
                t.send(dst, buf[s.send_start:s.send_stop], ch, info)

    def _run_pipelined(self, compiled: CompiledPlan, buf: np.ndarray, op: Optional[ReduceOp], info: OpInfo,
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
        nelems, steps = compiled.nelems, compiled.steps
        seg = max(1, seg_bytes // buf.itemsize)
        ufunc = REDUCE_UFUNCS.get(op)
        scratch = None
        current: list = []       # handles of this step's sends
        streamed = False         # this step's sends were already issued, segment by segment
        for i, s in enumerate(steps):
            dst, src, ra, rb = s.send_to, s.recv_from, s.recv_start, s.recv_stop
            if dst is not None and not streamed:
                sb = s.send_stop
                for a in range(s.send_start, sb, seg):
                    current.append(t.isend(dst, buf[a:min(a + seg, sb)], ch, info))
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            forward = (src is not None and nxt is not None and nxt.send_to is not None
                       and (nxt.send_start, nxt.send_stop) == (ra, rb))
            upcoming: list = []
            if src is not None:
                if s.reduce and scratch is None:
                    scratch = self._scratch(buf.dtype, min(seg, nelems), "recv")
                for a in range(ra, rb, seg):
                    b = min(a + seg, rb)
                    piece = buf[a:b]
                    if s.reduce:
                        target = scratch[:b - a]
                        t.recv_into(src, target, ch, info)
                        ufunc(piece, target, out=piece)
                    else:
                        t.recv_into(src, piece, ch, info)
                    if forward:
                        upcoming.append(t.isend(nxt.send_to, piece, ch, info))
            for h in current:
                h.wait()
            current, streamed = upcoming, forward
        for h in current:
            h.wait()

    # -- collectives --------------------------------------------------------------------------------
    def allreduce(self, array, op: ReduceOp, info: OpInfo) -> None:
        """In place, as :meth:`Backend._allreduce <neural_arch.distributed.comm.backend.Backend._allreduce>`
        (AVG comes out averaged); arguments were validated by the backend.

        >>> ex.allreduce(x, ReduceOp.SUM, info)          # doctest: +SKIP
        """
        # Latency path first: a small host array whose plan is only whole-buffer exchanges (see
        # CompiledPlan.exchange_peers). One dict lookup replaces plan lookup, step decoding, slicing
        # and the scratch lookup (docs/benchmarks.md has what that saves per call).
        if type(array) is np.ndarray:
            fast = self._compiled_plans.get(("all_reduce", array.size, array.dtype, self.force))
            if fast is not None and fast.exchange_peers is not None:
                flat = array if array.ndim == 1 else array.reshape(-1)
                scratch = fast.exchange_scratch
                t, ch, ufunc = self._t, self._coll_channel, REDUCE_UFUNCS[op]
                for peer in fast.exchange_peers:
                    t.sendrecv(peer, flat, peer, scratch, ch, info)
                    ufunc(flat, scratch, out=flat)
                if op is ReduceOp.AVG:
                    finish_average(flat, self._size)
                return
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            size, n, force = self._size, flat.size, self.force
            plan = self._compiled(("all_reduce", n, flat.dtype, force), flat.dtype,
                                  lambda: allreduce_plan(size, n, n * flat.itemsize, force))
            self._dispatch(plan, flat, op, info)
            if op is ReduceOp.AVG:
                finish_average(flat, self._size)
        _back(array, host)

    def broadcast(self, array, root: int, info: OpInfo) -> None:
        """Copy ``root``'s ``array`` into every rank's, in place (a binomial tree or a pipelined chain)."""
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            size, n = self._size, flat.size
            force = self.force
            plan = self._compiled(("broadcast", n, flat.dtype, root, force), flat.dtype,
                                  lambda: broadcast_plan(size, n, n * flat.itemsize, root, force))
            self._dispatch(plan, flat, None, info)
        _back(array, host)

    def allgather(self, output, input, info: OpInfo) -> None:
        """``output[r] = input of rank r`` (a pipelined ring)."""
        hin, hout = _to_host(input), _to_host(output)
        out = _flat(hout)
        n = hin.size
        me = self._rank
        out[me * n:(me + 1) * n] = _flat(hin)
        if n:
            size = self._size
            plan = self._compiled(("all_gather", n, out.dtype), out.dtype, lambda: P.ring_allgather_plan(
                size, n * size, tuple((r * n, (r + 1) * n) for r in range(size))))
            self._run_pipelined(plan, out, None, info, PIPELINE_SEGMENT_BYTES)
        _back(output, hout)

    def reduce_scatter(self, output, input, op: ReduceOp, info: OpInfo) -> None:
        """This rank's chunk of the reduced ``input`` into ``output``; ``input`` stays untouched (a ring)."""
        hin, hout = _to_host(input), _to_host(output)
        n = hout.size
        if n:
            # The caller's input stays untouched: reduce in a reused scratch copy.
            work = self._scratch(hin.dtype, hin.size, "work")
            np.copyto(work, _flat(hin))
            size = self._size
            plan = self._compiled(("reduce_scatter", n, work.dtype), work.dtype, lambda: P.ring_reduce_scatter_plan(
                size, n * size, tuple((r * n, (r + 1) * n) for r in range(size))))
            self._run_pipelined(plan, work, op, info, PIPELINE_SEGMENT_BYTES)
            mine = work[self._rank * n:(self._rank + 1) * n]
            if op is ReduceOp.AVG:
                finish_average(mine, self._size)
            np.copyto(_flat(hout), mine)
        _back(output, hout)

    def reduce(self, array, root: int, op: ReduceOp, info: OpInfo) -> None:
        """Reduce into ``root``'s ``array``; the other ranks' arrays are left unchanged."""
        host = _to_host(array)
        flat = _flat(host)
        if flat.size:
            if self._rank == root:
                buf = flat
            else:  # non-roots leave their input unchanged
                buf = self._scratch(flat.dtype, flat.size, "work")
                np.copyto(buf, flat)
            size, n = self._size, flat.size
            force = self.force
            plan = self._compiled(("reduce", n, flat.dtype, root, force), flat.dtype,
                                  lambda: reduce_plan(size, n, n * flat.itemsize, root, force))
            self._dispatch(plan, buf, op, info)
            if op is ReduceOp.AVG and self._rank == root:
                finish_average(flat, self._size)
        if self._rank == root:
            _back(array, host)

    def alltoall(self, output, input, info: OpInfo) -> None:
        """Chunk d of ``input`` to rank d, chunk s of ``output`` from rank s (pairwise exchanges)."""
        hin, hout = _to_host(input), _to_host(output)
        if hin.size:
            size, n = self._size, hin.size
            plan = self._compiled(("all_to_all", n, hin.dtype), hin.dtype, lambda: P.pairwise_alltoall_plan(size, n))
            self._run_plan(plan, _flat(hin), None, info, out=_flat(hout))
        _back(output, hout)

    def alltoallv(self, output, input, output_splits: Sequence[int], input_splits: Sequence[int],
                  info: OpInfo) -> None:
        """``input_splits[d]`` rows of ``input`` to rank d, ``output_splits[s]`` rows from rank s into
        ``output``, straight between the caller's buffers: pairwise exchanges of blocks of their own
        length (:func:`~neural_arch.distributed.comm.gloo.plans.pairwise_alltoallv_steps`), no padding
        and no staging copy of host arrays; a zero-length block sends no message. This rank's steps are
        cached by its split row and column and the row width (a mixture of experts repeats its splits
        across the layers of a step and its backward); the cache starts over past
        ``_PLAN_CACHE_ENTRIES`` entries.

        >>> ex.alltoallv(out, inp, [1, 3], [1, 2], info)     # doctest: +SKIP
        """
        hin, hout = _to_host(input), _to_host(output)
        shape = hin.shape
        width = 1
        for d in shape[1:]:                                           # elements per row
            width *= d
        key = (tuple(input_splits), tuple(output_splits), width)
        cache = self._alltoallv_steps
        steps = cache.get(key)
        if steps is None:
            steps = self._plan_steps(P.pairwise_alltoallv_steps(self._size, self._rank, input_splits,
                                                                output_splits, width))
            if len(cache) >= _PLAN_CACHE_ENTRIES:
                cache.clear()
            cache[key] = steps
        self._run_steps(steps, _flat(hin), _flat(hout), info)
        _back(output, hout)

    def _run_steps(self, steps: Tuple[PlanStep, ...], buf: np.ndarray, out: np.ndarray, info: OpInfo) -> None:
        """Copy-only steps (all_to_allv's): sends read ``buf``, receives land in ``out``; what
        :meth:`_run_plan` does for them, without a :class:`CompiledPlan` around the steps."""
        t, ch = self._t, self._coll_channel
        for s in steps:
            if s.local:
                out[s.recv_start:s.recv_stop] = buf[s.send_start:s.send_stop]
            elif s.recv_from is None:
                t.send(s.send_to, buf[s.send_start:s.send_stop], ch, info)
            elif s.send_to is None:
                t.recv_into(s.recv_from, out[s.recv_start:s.recv_stop], ch, info)
            else:
                t.sendrecv(s.send_to, buf[s.send_start:s.send_stop], s.recv_from, out[s.recv_start:s.recv_stop],
                           ch, info)

    def barrier(self, info: OpInfo) -> None:
        """Return once every rank of the group arrived (dissemination: ceil(log2 p) rounds of one byte)."""
        token = self._scratch(np.dtype(np.uint8), 1, "barrier")
        size = self._size
        plan = self._compiled(("barrier",), token.dtype, lambda: P.dissemination_barrier_plan(size))
        self._run_plan(plan, token, None, info)


def _to_host(array) -> np.ndarray:
    """NumPy arrays as they are; device arrays copied to host (the CPU backend stages GPU data)."""
    return array if type(array) is np.ndarray else to_host(array)


def _back(array, host: np.ndarray) -> None:
    if host is not array:
        to_device_like(host, array, out=array)


_KNOWN_ALGORITHMS = frozenset({"ring", "rd", "chain", "tree", "direct"})


def parse_algorithms(text: Optional[str], source: str = ALGO_ENV) -> Optional[str]:
    """A forced-algorithm setting, normalised (``" Ring,rd "`` -> ``"ring,rd"``; empty -> None).
    An unknown name is a ValueError naming ``source`` and the known ones.

    Example::

        >>> parse_algorithms(" Ring,rd "), parse_algorithms("")
        ('ring,rd', None)
    """
    chosen = [v.strip() for v in (text or "").lower().split(",") if v.strip()]
    bad = [v for v in chosen if v not in _KNOWN_ALGORITHMS]
    if bad:
        raise ValueError(f"{source}={text!r}: unknown algorithm(s) {bad}; use a comma list of "
                         f"{sorted(_KNOWN_ALGORITHMS)}, or unset it to choose by message size")
    return ",".join(chosen) or None


def force_algo_from_env() -> Optional[str]:
    """``NEURAL_ARCH_GLOO_ALGO``, parsed (None: choose by size).

    Example::

        # NEURAL_ARCH_GLOO_ALGO=ring python train.py   -> every all_reduce uses the ring
        force = force_algo_from_env()       # "ring"
    """
    return parse_algorithms(config.get(ALGO_ENV), ALGO_ENV)
