"""``Manager``: one replica's side of per-step fault tolerance (torchft's ``Manager``).

Every step is a transaction across the replicas of the current quorum::

    manager.start_quorum()          # ask the lighthouse who steps; rebuild the group if it changed;
                                    # heal from a live peer if this replica is behind
    ...forward, backward...
    manager.allreduce(grad)         # sum across the quorum / num_participants (an error is recorded,
                                    # not raised)
    if manager.should_commit():     # every member's step succeeded: apply it
        optimizer.step()            # else every member discards it, and the next start_quorum
                                    # re-forms the quorum without the failed replica

With ``use_async_quorum`` (the default, as in torchft) ``start_quorum`` only sends the request:
the answer, the group rebuild and any state sent to a replacement are awaited on a background
thread while the forward and backward run, and the first ``allreduce`` (or ``should_commit``,
``num_participants`` ...) waits for them; a replica that may be behind waits and heals inside
``start_quorum`` instead, before its forward.

No process restarts and nothing is read from disk: survivors keep their (uncommitted, so still
consistent) state and redo the step with the new quorum; a replacement replica copies weights,
optimizer state, step, RNG and data position (whatever ``state_dict()`` returns) from an
up-to-date peer over the new process group (:mod:`~neural_arch.distributed.ft.transfer`) inside
its first ``start_quorum``, then steps with the others.

The commit decision is taken once per quorum round in the lighthouse's store: each member votes,
and the first member that knows the outcome (a failure of its own, or every vote in) sets it with
compare-and-set; everyone reads that one value, so no two members ever disagree about a step, even
when a member dies between its vote and the others'. A missing vote counts as a failure after
``timeout`` seconds.

A replica is one process, or several that shard it (ZeRO/FSDP or tensor parallelism inside a
replica): then every rank
of the replica runs a ``Manager`` with the same ``replica_id`` and its ``shard=(index, count)``; the
lighthouse takes a replica into a quorum only when all its shards asked, each shard index
reduces across the replicas in a group of its own (its *lane*: ``allreduce`` averages this shard
over the replicas), the commit vote covers every shard of every replica (one transaction), and a
replica that is behind heals shard by shard from the peer with the same shard index. The
replica's own sharded collectives (reduce-scatter, all-gather) stay in its own group; ZeRO-2 and
``fully_shard`` reach the lane through :class:`~neural_arch.distributed.ft.managed_group.ManagedProcessGroup`
(their ``replicate_group``); under tensor parallelism each rank's local gradients are plain data
parallelism over its lane (:class:`~neural_arch.distributed.ft.ddp.DistributedDataParallel`), while
the tensor-parallel all-reduces stay in the replica's group.

Example::

    manager = Manager(pg=ProcessGroupGloo(timeout=10), load_state_dict=load, state_dict=save,
                      min_replica_size=2, replica_id="replica_1", lighthouse_addr="10.0.0.1:29510")
    for batch in batches:
        manager.start_quorum()
        loss = loss_fn(model(batch)); loss.backward()
        for p in model.parameters():
            manager.allreduce(p.grad)
        if manager.should_commit():
            optimizer.step()
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid

import numpy as np

from neural_arch.distributed.comm.work import ReduceOp
from neural_arch.distributed.errors import DistributedError, StoreTimeoutError
from neural_arch.distributed.ft import protocol
from neural_arch.distributed.ft.quorum import Quorum
from neural_arch.distributed.ft.replica_group import ProcessGroupGloo
from neural_arch.distributed.ft.transfer import (
    HEAD_BYTES,
    PackedState,
    head_bytes_for,
    pack_state,
    recv_state,
    send_packed,
    split_arrays,
    warm_arrays,
    warm_buffer,
)
from neural_arch.distributed.rendezvous.tcp_store import TCPStore

__all__ = ["Manager"]

log = logging.getLogger("neural_arch.distributed.ft")


class Manager:
    """Quorum, gradient all-reduce, commit vote and healing for one replica (module docstring).

    Args:
        pg: the cross-replica group (default :class:`~neural_arch.distributed.ft.replica_group.ProcessGroupGloo`
            with ``timeout``); rebuilt for every new quorum.
        load_state_dict: ``fn(state)`` that loads what ``state_dict()`` returned on a live peer
            (model, optimizer, sampler position, RNG ...): how a replacement heals.
        state_dict: ``fn() -> state``: nested dicts/lists of NumPy arrays and plain values.
        min_replica_size: the smallest quorum this replica steps in.
        replica_id: this replica group's name (a replacement may reuse the dead one's; a random
            suffix keeps the two members apart).
        lighthouse_addr: ``"host:port"`` of the :class:`~neural_arch.distributed.ft.lighthouse.Lighthouse`.
        timeout: seconds for each collective, the heal transfer and the commit vote.
        quorum_timeout: seconds ``start_quorum`` waits for the lighthouse's answer.
        heartbeat_interval: seconds between heartbeats (the lighthouse's ``heartbeat_timeout``
            must be several of these).
        auth_token: the lighthouse store's token (None: loopback, per-user secret).
        init_sync: at step 0, copy the first member's state to the others (set False when every
            replica initialises from the same seed: then nothing is sent at step 0).
        shard: ``(index, count)``: this rank holds shard ``index`` of a replica sharded over ``count``
            ranks (each runs a Manager with the same ``replica_id``); None: the process is the replica.
        heal_into: ``fn() -> state`` nested like ``state_dict()`` whose arrays a heal fills in place
            (e.g. the live parameters): matching arrays (same place, shape and dtype) are received
            straight into them, so healing needs no second copy of the state and no fresh memory
            (:func:`~neural_arch.distributed.ft.transfer.recv_state`). If a heal fails midway they
            hold a mix of old and new values: the replica is still behind, so the next quorum heals it
            again before it steps, and ``start_quorum`` raises if no up-to-date peer is left to heal
            from. None: every array is received into new memory (a failed heal leaves the old state).
            Without ``load_state_dict`` it is the only loader: a heal whose state holds a part it has
            no place for (another shape, dtype or key) raises instead of loading part of it.
        use_async_quorum: ``start_quorum`` sends the request and returns at once; the lighthouse's
            answer, the group rebuild and sending state to a replacement run on a background thread
            while the forward and backward run, and the first call that needs the quorum
            (``allreduce``, ``should_commit``, ``num_participants``, ``participating_rank``,
            ``quorum``, ``wait_quorum``) waits for it (torchft's ``use_async_quorum``, on by
            default there too). False: ``start_quorum`` waits for all of it. A replica
            that may be behind (new, or its last step was not committed) waits in ``start_quorum``
            and heals before its step, as without overlap. ``state_dict()`` may then be called on
            the background thread during the step: it must not return what the forward or backward
            changes (docs/fault_tolerance.md, "Overlapping the quorum with compute").

    Example::

        manager = Manager(load_state_dict=load, state_dict=save, replica_id="r0",
                          lighthouse_addr=lighthouse.address, timeout=5.0)
        manager.start_quorum()        # a new replica waits here (it may heal); later steps return
                                      # None at once: the quorum is awaited beside the compute
        manager.num_participants(), manager.participating_rank(), manager.current_step()
    """

    def __init__(self, pg=None, load_state_dict=None, state_dict=None, min_replica_size: int = 1,
                 replica_id: str | None = None, lighthouse_addr: str | None = None, timeout: float = 60.0,
                 quorum_timeout: float = 120.0, heartbeat_interval: float = 0.1, auth_token=None,
                 init_sync: bool = True, shard: tuple[int, int] | None = None, heal_into=None,
                 use_async_quorum: bool = True):
        if lighthouse_addr is None:
            raise ValueError("Manager(lighthouse_addr='host:port') is required: the address of the Lighthouse "
                             "that decides the quorums (Lighthouse(...).address)")
        host, _, port = str(lighthouse_addr).rpartition(":")
        self.timeout, self.quorum_timeout = float(timeout), float(quorum_timeout)
        self._pg = pg if pg is not None else ProcessGroupGloo(timeout=self.timeout)
        self._load_state_dict, self._state_dict = load_state_dict, state_dict
        self._heal_into = heal_into
        if state_dict is not None and load_state_dict is None and heal_into is None:
            # a heal would move the step count on and drop the state it received: a replica at the
            # quorum's step with its old weights
            raise ValueError("Manager(state_dict=...) needs load_state_dict=... (or heal_into=...): how a "
                             "replica that is behind loads the state it heals from")
        self._torn = False     # a heal into the live arrays failed midway: they must be healed again
        self.min_replica_size = int(min_replica_size)
        self.init_sync = bool(init_sync)
        self._auth_token = auth_token
        self.replica_id = str(replica_id if replica_id is not None else uuid.uuid4().hex[:8])
        self.shard, self.num_shards = (int(shard[0]), int(shard[1])) if shard is not None else (0, 1)
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"Manager(shard=(index, count)) needs 0 <= index < count, got {shard}")
        self._sharded = shard is not None
        suffix = f"/s{self.shard}" if self._sharded else ""
        self.member = f"{self.replica_id}{suffix}:{uuid.uuid4().hex[:8]}"
        self._store = TCPStore(host, int(port), timeout=self.quorum_timeout, auth_token=auth_token)
        # the heartbeat has its own connection: a long blocking get on the main one must not stop it
        self._beat_store = TCPStore(host, int(port), timeout=self.quorum_timeout, auth_token=auth_token)
        index = int(self._store.add(protocol.MEMBERS, 1)) - 1
        self._store.set(protocol.member_key(index), self.member)
        self._stop = threading.Event()
        self._beat_interval = float(heartbeat_interval)
        self._beat_store.add(protocol.heartbeat_key(self.member), 1)
        self._beater = threading.Thread(target=self._heartbeat, name=f"ft-heartbeat-{self.member}", daemon=True)
        self._beater.start()
        self._step = 0
        self._requests = 0
        self._quorum: Quorum | None = None
        self._quorum_id: int | None = None
        self._error: BaseException | None = None
        self._last_committed = True
        self.use_async_quorum = bool(use_async_quorum)
        self._pending: threading.Thread | None = None      # the quorum being waited for in the background
        self._pending_exc: BaseException | None = None     # what that thread raised, re-raised by wait_quorum
        self._error_lock = threading.Lock()                 # report_error may race the background rebuild
        #: how many times this replica healed, and the bytes it received / sent doing so
        self.heals, self.heal_bytes_received, self.heal_bytes_sent = 0, 0, 0
        # the heal's first message is built in / received into memory already mapped (transfer.warm_buffer):
        # a replacement warms it while it waits for its quorum, a healer packs while its new group connects
        self._head_buffer: np.ndarray | None = None
        self._packing: tuple | None = None     # (thread, result dict) of a pack running beside configure
        #: Timings of the last group rebuild and heal as seen by this replica. Keys ``configure_s``
        #: (seconds the group took to connect), ``send_started_at`` and ``send_s`` (this replica
        #: sent a state; ``pack_s`` of it went to reading and packing the state), ``recv_started_at``
        #: and ``loaded_at`` (this replica received one). The
        #: ``*_at`` values are ``time.time()``, so on one host ``loaded_at - max(send_started_at,
        #: recv_started_at)`` is the transfer, whatever either side waited for before it.
        #: ``quorum_at`` is the ``time.monotonic()`` at which the last quorum's answer arrived.
        self.timings: dict[str, float] = {}

    # -- heartbeat ---------------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        key = protocol.heartbeat_key(self.member)
        while not self._stop.wait(self._beat_interval):
            try:
                self._beat_store.add(key, 1)
            except Exception as exc:  # noqa: BLE001 - the lighthouse is gone: start_quorum will say so
                log.warning("ft %s: heartbeat stopped: %s", self.member, exc)
                return

    # -- the step ------------------------------------------------------------------------------------
    def start_quorum(self) -> Quorum | None:
        """Join the next quorum: ask the lighthouse, rebuild the group if the quorum changed, heal.

        Blocks until the lighthouse answers (``quorum_timeout``) and returns the quorum; with
        ``use_async_quorum`` it returns None at once instead when this replica is up to date (the
        answer is awaited in the background, see ``wait_quorum``). A failure while rebuilding the
        group or healing is recorded like a failed all-reduce: ``should_commit`` returns False.
        """
        if self._pending is not None:      # the previous step never waited (no collective, no vote)
            self.wait_quorum()
        self._error = None
        self._requests += 1
        n = self._requests
        reconfigure = not self._last_committed or self._quorum_id is None
        head = self._heal_head()
        self._store.set(protocol.request_key(self.member),
                        protocol.encode_request(n, self._step, reconfigure, self.min_replica_size, self.init_sync,
                                                self.replica_id if self._sharded else "", self.shard,
                                                self.num_shards, head))
        self._store.add(protocol.REQ_SEQ, 1)
        if head:
            self._prepare_heal(head)
        # a replica that may be behind heals before its forward, so it cannot overlap the wait
        if not self.use_async_quorum or reconfigure or self._torn:
            return self._join(n, overlapped=False)
        self._pending_exc = None
        self._pending = threading.Thread(target=self._join_in_background, args=(n,),
                                         name=f"ft-quorum-{self.member}", daemon=True)
        self._pending.start()
        return None

    def _heal_head(self) -> int:
        """The heal's first-message size to ask for (0: the default): only a replica that is new or
        torn asks -- it is the one likely to be healed, and it is idle until then -- so a step of a
        replica in the quorum never pays for it. Computed from this replica's own state, which has
        the healer's layout when both run the same model and optimizer (``transfer.head_bytes_for``)."""
        if self._quorum is not None and not self._torn:
            return 0
        source = self._state_dict if self._state_dict is not None else self._heal_into
        if source is None:
            return 0
        try:
            return head_bytes_for({"user": source(), "step": self._step})
        except Exception as exc:  # noqa: BLE001 - only a hint: the heal works with the default head
            log.debug("ft %s: no heal head size from the local state: %s", self.member, exc)
            return 0

    def _prepare_heal(self, head: int) -> None:
        """While a replica that may be healed waits for its answer: map the memory the heal will
        write (its head buffer, the ``heal_into`` arrays; ``transfer.warm_buffer``/``warm_arrays``),
        so the transfer does not pay a page fault per 4 KiB of fresh memory."""
        try:
            self._finish_packing()      # (a pack left by a failed rebuild may still write the buffer)
            self._head_buffer = warm_buffer(head, self._head_buffer)
            if self._heal_into is not None:
                warm_arrays(self._heal_into())
        except Exception as exc:  # noqa: BLE001 - only a warm-up: the heal works without it
            log.debug("ft %s: could not warm the heal's memory: %s", self.member, exc)

    def wait_quorum(self) -> Quorum:
        """Wait for the quorum ``start_quorum`` asked for (at once without ``use_async_quorum``);
        raise what the background wait raised (no answer within ``quorum_timeout``)."""
        pending = self._pending
        if pending is not None:
            pending.join()
            self._pending = None
            if self._pending_exc is not None:
                exc, self._pending_exc = self._pending_exc, None
                raise exc
        if self._quorum is None:
            raise RuntimeError("Manager.wait_quorum() before start_quorum()")
        return self._quorum

    def _join_in_background(self, n: int) -> None:
        try:
            self._join(n, overlapped=True)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread by wait_quorum
            self._pending_exc = exc

    def _join(self, n: int, overlapped: bool) -> Quorum:
        """Wait for answer ``n``, rebuild the group if the quorum changed, heal (either side)."""
        key = protocol.answer_key(self.member, n)
        try:
            if overlapped:
                self._await_answer(key)
            raw = self._store.get(key)
        except StoreTimeoutError as exc:
            raise DistributedError(f"ft {self.member}: the lighthouse gave no quorum within {self.quorum_timeout:g} s "
                                   f"(fewer than min_replicas replicas alive?)") from exc
        self.timings["quorum_at"] = time.monotonic()
        quorum = self._quorum = Quorum.from_json(json.loads(raw))
        rank = quorum.rank_of(self.member)
        if self._torn and self.member not in quorum.heal:
            raise DistributedError(f"ft {self.member}: a heal into the live state failed midway and no member of "
                                   f"the new quorum is ahead of this replica to heal it again; restart it "
                                   f"from a checkpoint (or use heal_into=None, which keeps the old state)")
        try:
            if quorum.quorum_id != self._quorum_id:
                self._quorum_id = None
                self._start_packing(quorum)       # beside the connect below: it waits on sockets
                start = time.perf_counter()
                prefix = protocol.pg_prefix(quorum.quorum_id, self.shard if self._sharded else None)
                self._pg.configure(self._store, prefix, rank, quorum.size, auth_token=self._auth_token)
                self.timings["configure_s"] = time.perf_counter() - start
                with self._error_lock:
                    if self._error is None:
                        self._quorum_id = quorum.quorum_id
                    else:       # the user reported an error during the rebuild: void the new group too
                        self._pg.abort(f"replica {self.member} failed its step: {self._error}")
            if overlapped and self.member in quorum.heal:
                # the forward already ran on the old state: void the step; the next start_quorum
                # waits (this step was not committed) and heals before computing
                raise DistributedError(f"ft {self.member}: found behind its quorum during an overlapped step")
            self._heal(quorum)
        except Exception as exc:  # noqa: BLE001 - any failure here voids the step on every member
            self.report_error(exc)
        return quorum

    def _await_answer(self, key: str) -> None:
        """Wait for ``key`` in short slices: the store connection is free between them (``shutdown``
        says goodbye on it) and a shutdown ends the wait."""
        deadline = time.monotonic() + self.quorum_timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreTimeoutError(f"store key {key!r} did not appear within {self.quorum_timeout:g} s")
            try:
                self._store.wait([key], timeout=min(0.25, remaining))
                return
            except StoreTimeoutError:
                continue
        raise DistributedError(f"ft {self.member}: shut down while waiting for a quorum")

    def _pack_outgoing(self, quorum: Quorum) -> dict[str, PackedState]:
        """``{target: packed state}`` for every member this replica heals in ``quorum``: the state is
        read once and packed once per head size the targets asked for (the most common head in this
        replica's warm buffer)."""
        targets = sorted(t for t, src in quorum.heal.items() if src == self.member)
        start = time.perf_counter()
        state = {"user": self._state_dict() if self._state_dict is not None else None, "step": self._step}
        by_head: dict = {}
        packed = {}
        for target in targets:
            head = quorum.heal_head.get(target)
            if head not in by_head:
                out = None
                if not by_head:                  # the first head goes in the warm buffer, others in new memory
                    out = self._head_buffer = warm_buffer(head or HEAD_BYTES, self._head_buffer)
                by_head[head] = pack_state(state, head, out=out)
            packed[target] = by_head[head]
        self.timings["pack_s"] = time.perf_counter() - start
        return packed

    def _start_packing(self, quorum: Quorum) -> None:
        """Pack the heals this replica sends in ``quorum`` on a thread while its new group connects
        (the connect waits on sockets; packing copies arrays: both let the other run); ``_heal``
        takes the result. The state is read as it is now, as it would be right after the connect:
        nothing between the two changes it (the optimizer steps only after ``should_commit``)."""
        self._finish_packing()           # a pack left by a failed rebuild: it uses the same buffer
        if not any(src == self.member for src in quorum.heal.values()):
            return
        result: dict = {}

        def pack():
            try:
                result["packed"] = self._pack_outgoing(quorum)
            except BaseException as exc:  # noqa: BLE001 - re-raised by _heal on the quorum's thread
                result["error"] = exc
        thread = threading.Thread(target=pack, name=f"ft-pack-{self.member}", daemon=True)
        thread.start()
        self._packing = (thread, result, quorum.quorum_id)

    def _finish_packing(self) -> tuple | None:
        """Wait for the pack ``_start_packing`` started, if any: ``(result, quorum_id)``."""
        packing, self._packing = self._packing, None
        if packing is None:
            return None
        thread, result, quorum_id = packing
        start = time.perf_counter()
        thread.join()
        self.timings["pack_wait_s"] = time.perf_counter() - start
        return result, quorum_id

    def _packed_outgoing(self, quorum: Quorum) -> dict[str, PackedState]:
        """What ``_start_packing`` packed for ``quorum`` (waited for), else packed now."""
        done = self._finish_packing()
        if done is None or done[1] != quorum.quorum_id:
            return self._pack_outgoing(quorum)
        result = done[0]
        if "error" in result:
            raise result["error"]
        return result["packed"]

    def _heal(self, quorum: Quorum) -> None:
        source = quorum.heal.get(self.member)
        if source is not None:
            self.timings["recv_started_at"] = time.time()
            into = {"user": self._heal_into()} if self._heal_into is not None else None
            self._torn = self._torn or into is not None
            head = quorum.heal_head.get(self.member)
            buffer = self._head_buffer if self._head_buffer is not None and self._head_buffer.size >= (
                head or HEAD_BYTES) else None
            state = recv_state(self._pg, quorum.rank_of(source), into=into, head_bytes=head, head=buffer)
            if self._load_state_dict is not None:
                self._load_state_dict(state["user"])
            else:
                lost = _not_filled_in_place(state["user"], into["user"] if into is not None else None)
                if lost:     # only heal_into() loads: a part it has no place for would be dropped silently
                    raise DistributedError(f"ft {self.member}: healed from {source}, but heal_into() has no array of "
                                           f"the same place, shape and dtype for {', '.join(lost[:5])} and there is "
                                           f"no load_state_dict to load it: the replicas' states differ in layout")
            self._step = int(state["step"])
            self._torn = False
            self.timings["loaded_at"] = time.time()
            self.heals += 1
            self.heal_bytes_received += _nbytes(state)
            log.info("ft %s: healed from %s at step %d", self.member, source, self._step)
        if any(src == self.member for src in quorum.heal.values()):
            start = time.perf_counter()
            self.timings["send_started_at"] = time.time()
            for target, packed in self._packed_outgoing(quorum).items():
                self.heal_bytes_sent += send_packed(self._pg, packed, quorum.rank_of(target))
            self.timings["send_s"] = time.perf_counter() - start

    def allreduce(self, tensor):
        """Average ``tensor`` (a Tensor or NumPy array, in place) across the quorum's members.

        Sums, then divides by ``num_participants``. A failure (a peer died, timed out or
        poisoned the group) is recorded, not raised: ``should_commit`` then returns False.
        After a failure the call does nothing. Returns ``tensor``.
        """
        if self._pending is not None:
            self.wait_quorum()
        if self._error is not None:
            return tensor
        array = tensor if isinstance(tensor, np.ndarray) else tensor.data   # a Tensor's array
        try:
            self._pg.allreduce(array, ReduceOp.SUM)
        except Exception as exc:  # noqa: BLE001 - recorded: the step is void on every member
            self.report_error(exc)
            return tensor
        array /= self.num_participants()
        return tensor

    def report_error(self, exc: BaseException) -> None:
        """Mark this step as failed here (it will not be committed anywhere), and abort the group so
        peers blocked in a collective with this replica fail at once instead of at their timeout."""
        with self._error_lock:
            if self._error is None:
                log.warning("ft %s: step %d failed: %s: %s", self.member, self._step, type(exc).__name__, exc)
                self._error = exc
                self._quorum_id = None     # the next quorum rebuilds the group
                self._pg.abort(f"replica {self.member} failed its step: {type(exc).__name__}: {exc}")

    def errored(self) -> BaseException | None:
        """The error recorded in this step, or None."""
        return self._error

    def should_commit(self) -> bool:
        """Vote, then return the quorum's one decision: True (apply the step) only if it succeeded on
        every member. On True the step counter moves on."""
        if self._quorum is None and self._pending is None:
            raise RuntimeError("Manager.should_commit() before start_quorum()")
        quorum = self.wait_quorum()
        ok = self._error is None
        self._store.set(protocol.vote_key(quorum.round, self.member), b"1" if ok else b"0")
        decision = self._decide(quorum, ok)
        self._last_committed = decision
        if decision:
            self._step += 1
        return decision

    def _decide(self, quorum: Quorum, ok: bool) -> bool:
        key = protocol.commit_key(quorum.round)
        if not ok:
            return self._store.compare_set(key, b"", b"0") == b"1"
        votes = [protocol.vote_key(quorum.round, m) for m in quorum.members]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._store.wait(votes, timeout=max(0.0, min(0.05, deadline - time.monotonic())))
            except StoreTimeoutError:
                if self._store.check(key):
                    return self._store.get(key) == b"1"
                if time.monotonic() >= deadline:
                    return self._store.compare_set(key, b"", b"0") == b"1"
                continue
            outcome = b"1" if all(self._store.get(v) == b"1" for v in votes) else b"0"
            return self._store.compare_set(key, b"", outcome) == b"1"

    # -- what the training loop reads ------------------------------------------------------------------
    def current_step(self) -> int:
        """Committed steps (the same on every member of a quorum after healing)."""
        return self._step

    def num_participants(self) -> int:
        """Replicas in the current quorum (what ``allreduce`` divides by)."""
        if self._pending is not None:
            self.wait_quorum()
        return self._quorum.size if self._quorum is not None else 0

    def participating_rank(self) -> int:
        """This replica's index in the current quorum (its share of the data)."""
        if self._pending is not None:
            self.wait_quorum()
        return self._quorum.rank_of(self.member) if self._quorum is not None else 0

    @property
    def quorum(self) -> Quorum | None:
        """The current :class:`~neural_arch.distributed.ft.quorum.Quorum`."""
        if self._pending is not None:
            self.wait_quorum()
        return self._quorum

    def shutdown(self) -> None:
        """Leave: tell the lighthouse (it drops this replica at once), stop the heartbeat, drop the group."""
        self._stop.set()                   # also ends a background wait for a quorum (see _await_answer)
        try:
            self._store.set(protocol.left_key(self.member), b"1")
        except Exception as exc:  # noqa: BLE001 - the lighthouse is gone already
            log.debug("ft %s: could not say goodbye: %s", self.member, exc)
        self._beater.join(2.0)
        if self._pending is not None:      # a rebuild or heal under way ends within its timeout
            self._pending.join(2 * self.timeout + 1.0)
            self._pending = None
        self._pg.shutdown()
        self._store.close()
        self._beat_store.close()


def _not_filled_in_place(received, into, path: str = "state") -> list[str]:
    """Where ``received`` (a healed state) holds something ``into`` did not take in place: an array
    that is not ``into``'s own array of that place, or a plain value that differs from ``into``'s.

    Example:
        >>> w = np.zeros(2)
        >>> _not_filled_in_place({"w": w, "b": np.ones(1), "step": 3}, {"w": w, "step": 3})
        ["state['b']"]
    """
    if isinstance(received, np.ndarray):
        return [] if received is into else [path]
    if isinstance(received, dict):
        if not isinstance(into, dict):
            return [path]
        return [p for k, v in received.items() for p in _not_filled_in_place(v, into.get(k), f"{path}[{k!r}]")]
    if isinstance(received, (list, tuple)):
        if not isinstance(into, (list, tuple)) or len(into) != len(received):
            return [path]
        return [p for i, (v, w) in enumerate(zip(received, into)) for p in _not_filled_in_place(v, w, f"{path}[{i}]")]
    try:
        return [] if bool(received == into) else [path]
    except Exception:  # noqa: BLE001 - a value with no plain equality: not known to be loaded
        return [path]


def _nbytes(state) -> int:
    return sum(a.nbytes for a in split_arrays(state)[1]) if state is not None else 0
