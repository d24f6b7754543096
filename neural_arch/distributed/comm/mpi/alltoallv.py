"""The MPI backend's uneven all-to-all (``all_to_allv``): the split sizes inside the call check, then
the blocks as point-to-point messages, with what both need built once per group.

**Why a plan per group.** A mixture-of-experts layer exchanges its tokens twice per layer and step,
and at decode or small-batch sizes the exchange moves less data than the Python around it costs:
rebuilding the split table as a NumPy array, comparing it through a generator, reshaping the buffers
to bytes and slicing them per block were most of a small exchange (``benchmarks/bench_moe.py --part
a2a``, docs/benchmarks.md). :class:`AlltoallvPlan` holds, per group, a ``struct`` that writes this
rank's splits straight into its slot of the call check, two ``operator.itemgetter`` that read every
rank's sends and the matching receives from the gathered table in one call each, and the private
communicator, tag and byte datatype the blocks travel with; each block is a message spec
``[array, (bytes, offset), BYTE]`` on the caller's array (no view, no slice object).

**What the check still guarantees.** Every rank writes its send and receive counts into its slot
*before* the check's allgather and no block is sent before every rank has read the whole gathered
table: a rank whose sends disagree with a peer's receives makes every rank raise the same
:class:`~neural_arch.distributed.errors.CollectiveMismatchError` (naming the op and the pairs) with
nothing exchanged and ``output`` untouched, and a rank in another collective fails the header
comparison as before. Only the *receives* are posted before the check (that moves no data); on a
mismatch they are cancelled, which always succeeds because no rank sends after that verdict. The
blocks go on the check's private communicator with one tag; matching by (source, tag) alone is safe
because nothing else uses that tag there, every earlier all_to_allv completed every receive it
posted (so no older block is in flight), no block of this op is sent before the check proved every
rank is in it with these splits, and MPI never lets a later message of one sender overtake an
earlier one. A peer that dies or never arrives leaves the check's (or the blocks') wait to the
watchdog: a ``CollectiveTimeoutError`` naming the op and the late ranks.

Example (what ``MPIBackend`` does; run under ``mpiexec -n 2``)::

    plan = AlltoallvPlan(MPI, backend._check, backend._agree, backend._watchdog, backend._wait_failed)
    plan.exchange(out, inp, [1, 3], [1, 2], info)     # receives posted, the check, then the sends, one wait
"""

from __future__ import annotations

import operator
import struct

import numpy as np

from neural_arch.distributed.comm.mpi.check import DATA_INLINE, HEADER_BYTES, CallCheck
from neural_arch.distributed.comm.mpi.progress import DeadlinePassed
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.errors import CollectiveMismatchError

__all__ = ["P2P_MAX_RANKS", "AlltoallvPlan"]

#: groups of up to this many ranks post the blocks as point-to-point messages (:meth:`AlltoallvPlan.exchange`);
#: larger groups use ``Ialltoallv``, whose algorithms pace many peers
P2P_MAX_RANKS = 8
_TAG = 1                # the blocks' tag on the call check's private communicator (which carries no other p2p)


class AlltoallvPlan:
    """One group's all_to_allv (see the module docstring). ``check`` is the group's call check,
    ``agree`` the backend's ``_agree`` (raises on a header mismatch), ``watchdog`` its deadline
    watchdog (None below ``MPI_THREAD_MULTIPLE``: then the blocks go through ``Ialltoallv``) and
    ``wait_failed`` its ``_wait_failed(info, exc)``.

    ``carries_splits`` says whether the split table fits the check's slots (``2 * size`` int64:
    groups of up to 128 ranks); larger groups check the header only.

    Example::

        plan = AlltoallvPlan(MPI, check, backend._agree, watchdog, backend._wait_failed)
        plan.carries_splits, plan.point_to_point         # (True, True) on 2 ranks with the watchdog
    """

    __slots__ = ("BYTE", "_MPI", "_agree", "_offset", "_pack", "_peers", "_receives", "_sends", "_stamp", "_table",
                 "_wait", "_wait_failed", "_wait_one", "carries_splits", "check", "comm", "point_to_point", "rank", "size")

    def __init__(self, MPI, check: CallCheck, agree, watchdog, wait_failed):
        size = check.size
        self._MPI = MPI
        self.check = check
        self.comm = check.comm
        self.rank, self.size = check.rank, size
        self._peers = tuple(range(size))
        self.BYTE = MPI.BYTE
        self._agree = agree
        self._wait = None if watchdog is None else watchdog.wait
        self._wait_one = None if watchdog is None else watchdog.wait_one
        self._wait_failed = wait_failed
        self.carries_splits = 16 * size <= check.inline_bytes
        self.point_to_point = watchdog is not None and size <= P2P_MAX_RANKS
        if self.carries_splits:
            # this rank's slot: its sends to every rank, then its receives from every rank (int64)
            self._pack = struct.Struct(f"<{2 * size}q").pack_into
            self._stamp = check.stamper(f"{2 * size}q")      # the header and the splits in one pack
            self._offset = check.rank * check.slot_bytes + HEADER_BYTES
            self._table = check.gathered[:, HEADER_BYTES:HEADER_BYTES + 16 * size].view(np.int64)
            # in the flattened table (row s: s's sends, then s's receives), s's send to d must equal
            # d's receive from s: two getters that list both sides in the same order
            self._sends = operator.itemgetter(*[s * 2 * size + d for s in range(size) for d in range(size)])
            self._receives = operator.itemgetter(*[d * 2 * size + size + s for s in range(size) for d in range(size)])

    def check_splits(self, info: OpInfo, input_splits: list, output_splits: list) -> None:
        """The call check for ``info`` with this rank's splits in its slot: returns when every rank's
        header agrees and every rank's sends match its peers' receives; otherwise raises the same
        :class:`~neural_arch.distributed.errors.CollectiveMismatchError` on every rank (nothing was sent)."""
        if not self.carries_splits:
            self._agree(info, info.nbytes)
            return
        check = self.check
        if self._wait_one is None:
            self._pack(check._flat, self._offset, *input_splits, *output_splits)
            self._agree(info, info.nbytes, -1, DATA_INLINE)
        else:   # what _agree does, with the header and the splits written in one call
            try:
                self._wait_one(self._stamp(info, info.nbytes, DATA_INLINE, *input_splits, *output_splits), info)
            except (DeadlinePassed, self._MPI.Exception) as exc:
                raise self._wait_failed(info, exc) from None
            if not check.agreed():
                raise check.error(info)
        flat = self._table.ravel().tolist()      # (a strided view: ravel copies the few int64)
        if self._sends(flat) != self._receives(flat):
            raise self.mismatch(info)

    def exchange(self, output, input, output_splits: list, input_splits: list, info: OpInfo) -> None:
        """The whole op for two NumPy arrays of under 2**31 bytes (``point_to_point`` plans only): this
        rank's receives posted first, then the call check with the splits (:meth:`check_splits`), and
        only once every rank agreed the sends, the own block's copy and one wait for all. Posting the
        receives before the check moves no data (nothing is sent before the verdict) and lets every
        peer's block land in ``output`` at once instead of in MPI's queue of unexpected messages;
        on a mismatch (the same verdict on every rank, so no peer sends) they are cancelled before
        the error is raised. On two ranks this was faster than MPICH's ``Ialltoallv`` and its blocking
        ``Alltoallv`` alike (``benchmarks/bench_moe.py``; MPICH builds a schedule per call)."""
        comm, me, byte, row = self.comm, self.rank, self.BYTE, info.nbytes
        requests = []
        sends = []
        out_at = in_at = own_out = own_in = 0          # byte offsets
        for peer in self._peers:
            n_in = output_splits[peer] * row
            n_out = input_splits[peer] * row
            if peer != me:
                if n_in:
                    requests.append(comm.Irecv([output, (n_in, out_at), byte], peer, _TAG))
                if n_out:
                    sends.append(([input, (n_out, in_at), byte], peer))
            else:
                own_out, own_in = out_at, in_at
            out_at += n_in
            in_at += n_out
        try:
            self.check_splits(info, input_splits, output_splits)
        except CollectiveMismatchError:
            for request in requests:     # unmatched: every rank took the same verdict and sent nothing
                request.Cancel()
                request.Wait()
            raise
        # (after a timeout the receives stay posted, like the check's own request: the group is unusable
        # and the job is aborted at exit, see comm/mpi/failure.py)
        for spec, peer in sends:
            requests.append(comm.Isend(spec, peer, _TAG))
        n = output_splits[me]
        if n and row:                    # (rows of zero bytes: nothing to copy)
            # the own block, while the peers' blocks travel (rows: any dtype, any row shape)
            own_out //= row
            own_in //= row
            output[own_out:own_out + n] = input[own_in:own_in + n]
        if requests:
            try:
                self._wait(requests, info)
            except (DeadlinePassed, self._MPI.Exception) as exc:
                raise self._wait_failed(info, exc) from None

    def mismatch(self, info: OpInfo) -> CollectiveMismatchError:
        """The error every rank raises when the gathered split table disagrees (each rank reads the same)."""
        size, ranks = self.size, info.group_ranks
        sends, receives = self._table[:, :size], self._table[:, size:]
        pairs = [f"rank {ranks[s]} sends {int(sends[s, d])} rows to rank {ranks[d]}, which expects "
                 f"{int(receives[d, s])}" for s in range(size) for d in range(size)
                 if sends[s, d] != receives[d, s]]
        return CollectiveMismatchError(
            f"{info.describe()} on group {list(ranks)}: the split sizes disagree ({'; '.join(pairs[:4])}"
            f"{'; ...' if len(pairs) > 4 else ''}). Rank s's input_split_sizes[d] must equal rank d's "
            "output_split_sizes[s]. Nothing was exchanged; this group is unusable now (raised on every rank).")
