"""``save``, ``async_save``, ``load`` and ``verify``: the distributed checkpoint itself.

Save, on every rank of the group (a collective):

1. flatten the state dict; describe each array leaf as (key, global shape, dtype, region);
2. exchange those descriptions and compute the same plan on every rank (``plan.py``): each
   distinct chunk gets one writer (big replicated arrays split into row blocks over their
   holders, bytes balanced), after checking that all ranks agree on shapes/dtypes and that the
   chunks tile each array. While no rank's layout changes, the exchange is one small all-gather
   of digests and the last plan is reused. Then every piece several ranks hold (written once)
   is compared over them by CRC-32 (one more small all-gather; :class:`_ReplicaCheck`): a
   difference raises on every rank, naming the leaves, before anything is written;
3. each rank streams its chunks into one safetensors file (one pass: a CRC-32 per block computed
   as each block is written, no serialized copy; see ``chunkio``) and a manifest (atomic, fsynced);
4. rank 0 waits for every manifest, writes ``.metadata`` last (atomic rename + directory fsync):
   only then is the checkpoint visible. Files of the checkpoint it replaces are removed after.

``async_save`` does 1-2 and copies this rank's chunks to host staging buffers (kept for the next
call) in the caller, then 3-4 in a background thread: no collective runs in that thread (rank 0
finds the manifests on disk), so it cannot interleave with the training loop's collectives. A
new save first waits for the previous one. With an ``async_stager`` whose ``stage`` returns a
future (``staging.DefaultStager``, torch's asynchronous staging) the copy is made after the call
returns, while training goes on; it returns an :class:`AsyncSaveResponse`, and until the copy is
done every optimizer ``step()`` (and a training-mode forward of a module whose buffers are staged)
waits for it, so no update reaches the checkpoint.

Load reads only ``.metadata`` and the blocks of the chunks that overlap what this rank asks for,
straight into the destination arrays, checking each block's CRC (no collective).
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from neural_arch import backend as _backend
from neural_arch.distributed.checkpoint.chunkio import (
    ChunkReader,
    _crc32,  # the fastest CRC-32 installed (isal, zlib-ng, zlib)
    verify_file,
    write_data_file,
)
from neural_arch.distributed.checkpoint.flatten import (
    decode_object,
    flatten_state_dict,
    is_array_leaf,
    to_host,
)
from neural_arch.distributed.checkpoint.plan import PlanCache, describe, my_pieces
from neural_arch.distributed.checkpoint.sharded import Region, ShardedArray
from neural_arch.distributed.checkpoint.staging import _ChunkCopier
from neural_arch.distributed.checkpoint.storage import (
    FORMAT_VERSION,
    METADATA_NAME,
    CheckpointError,
    CheckpointMismatchError,
    byte_view,
    data_file_name,
    file_sha256,
    fsync_dir,
    is_checkpoint_file_name,
    manifest_name,
    read_metadata,
    write_json_atomic,
)
from neural_arch.utils.atomic_file import TMP_MARK

__all__ = ["AsyncSaveResponse", "async_save", "load", "remove_orphans", "save", "verify"]

_pending_lock = threading.Lock()
_pending: Future | None = None
# async_save's host staging buffers, kept for the next call (the stagers' copier): the previous save
# has always finished writing before the next one stages (see _wait_previous).
_copier = _ChunkCopier(reuse=True)
# The last save plan, reused while every rank's layout is unchanged (one small all-gather per save).
_plans = PlanCache()


# ------------------------------------------------------------------------------------ helpers
def _group_info(process_group):
    from neural_arch.distributed import groups
    from neural_arch.distributed.resolve import _resolve_group

    if process_group is None and not groups.is_initialized():
        return None, 0, 1
    pg = _resolve_group(process_group, "checkpoint")
    return pg, pg.backend.rank, pg.backend.size


def _commit_timeout() -> float:
    from neural_arch import config

    return float(config.get("NEURAL_ARCH_TIMEOUT"))


def _wait_previous() -> None:
    global _pending
    with _pending_lock:
        previous, _pending = _pending, None
    if previous is not None:
        previous.exception()  # wait; its error (if any) was already given to its own caller


# ------------------------------------------------------------------------------------ save
def _write_mine(directory: str, rank: int, uid: str, tensors: dict, replica_crcs=None) -> None:
    """Write this rank's chunks ``{name: array}`` (maybe none) and its manifest (with this rank's
    replica CRCs when rank 0 compares them: see ``_ReplicaCheck.defer``)."""
    manifest = {"rank": rank, "chunks": {}, "file": None}
    if replica_crcs is not None:
        manifest["replica_crcs"] = [int(v) for v in replica_crcs]
    if tensors:
        fname = data_file_name(rank, uid)
        info, manifest["chunks"] = write_data_file(os.path.join(directory, fname), tensors)
        manifest["file"] = dict(info, name=fname)
    write_json_atomic(os.path.join(directory, manifest_name(rank, uid)), manifest)
    fsync_dir(directory)


def _commit(directory: str, uid: str, world: int, entries: dict, objects: dict, extra, timeout: float,
            replicas: list | None = None) -> dict:
    """Rank 0: gather the manifests from disk, then write ``.metadata`` (the commit point).
    ``replicas``: the shared pieces' names, when their CRCs travel in the manifests (compared here)."""
    deadline = time.monotonic() + timeout
    manifests = {}
    while len(manifests) < world:
        for r in range(world):
            if r not in manifests:
                try:
                    manifests[r] = read_json(os.path.join(directory, manifest_name(r, uid)))
                except FileNotFoundError:
                    pass
        if len(manifests) < world:
            if time.monotonic() > deadline:
                missing = sorted(set(range(world)) - set(manifests))
                raise CheckpointError(f"save to {directory!r}: ranks {missing} did not finish writing within "
                                      f"{timeout:.0f} s; the checkpoint was not committed (the previous one is intact)")
            time.sleep(0.005)
    if replicas:
        table = np.array([manifests[r]["replica_crcs"] for r in range(world)], dtype=np.int64)
        _raise_if_replicas_differ(replicas, table, "nothing was committed (the previous checkpoint is "
                                  "intact; remove_orphans(checkpoint_id) deletes this save's files)")
    # The plan's entries may be cached for the next save: fill in a copy.
    entries = {k: dict(e, chunks=[dict(c) for c in e["chunks"]]) for k, e in entries.items()}
    files = {}
    for r, m in manifests.items():
        if m["file"]:
            files[m["file"]["name"]] = {k: v for k, v in m["file"].items() if k != "name"}
    for entry in entries.values():
        for chunk in entry["chunks"]:
            m = manifests[chunk.pop("rank")]
            chunk["file"] = m["file"]["name"]
            chunk.update(m["chunks"][chunk["name"]])  # offset, nbytes, crc32
    meta = {"version": FORMAT_VERSION, "uid": uid, "world_size": world, "created": time.time(),
            "extra": extra if extra is not None else {}, "files": files, "tensors": entries, "objects": objects}
    previous = None
    try:
        previous = read_metadata(directory)
    except CheckpointError:
        pass
    write_json_atomic(os.path.join(directory, METADATA_NAME), meta)
    fsync_dir(directory)
    # Only now may the replaced checkpoint's files and this save's manifests go.
    stale = set(previous["files"]) - set(files) if previous else set()
    for name in list(stale) + [manifest_name(r, uid) for r in range(world)]:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    return meta


def read_json(path: str) -> dict:
    with open(path, "rb") as f:
        return json.loads(f.read())


class _ReplicaCheck:
    """Pieces that several ranks hold (a plain array, a plain value, or the same ``ShardedArray``
    region) are written once, by one of them: so they must be equal on every rank holding them,
    or the checkpoint silently keeps one rank's values (FSDP's ``optimizer.state_dict()`` holds
    each rank's shard of Adam's moments under the same key and shape on every rank).

    Which pieces are shared is worked out once per plan (one ``all_gather_object`` of the piece
    names when the plan was not reused); every save then sends one CRC-32 per shared piece (one
    small all-gather) and compares. A difference raises :class:`~neural_arch.distributed.checkpoint.storage.CheckpointError` on every rank,
    naming the leaves and the ranks, before anything is written.
    """

    def __init__(self) -> None:
        self._last = None  # (group, plan entries object, {piece: slot}, [(name, holders)])

    def _slots(self, pg, entries, arrays: dict, objects: dict):
        last = self._last
        if last is not None and last[0] is pg and last[1] is entries:
            return last[2], last[3]  # the plan was reused: every rank's pieces are unchanged
        from neural_arch.distributed.collectives import all_gather_object

        mine = [("a", key, rkey) for key, rkey in arrays] + [("o", key, None) for key in objects]
        every = [None] * pg.backend.size
        all_gather_object(every, mine, group=pg)
        holders: dict = {}
        for r, pieces in enumerate(every):
            for piece in pieces:
                holders.setdefault(piece, []).append(r)
        shared = sorted((p for p, ranks in holders.items() if len(ranks) > 1), key=repr)
        slots = {p: i for i, p in enumerate(shared)}
        names = [(repr(p[1]) if p[0] == "o" else f"{p[1]!r} {_region_text(p[2])}", holders[p]) for p in shared]
        self._last = (pg, entries, slots, names)
        return slots, names

    def check(self, pg, rank: int, world: int, entries, arrays: dict, objects: dict) -> None:
        deferred = self.defer(pg, world, entries, arrays, objects)
        if deferred is None:
            return
        names, crcs = deferred
        table = np.empty((world, len(names)), dtype=np.int64)
        pg.backend.allgather(table, crcs())
        _raise_if_replicas_differ(names, table, "nothing was written")

    def defer(self, pg, world: int, entries, arrays: dict, objects: dict):
        """The collective part of :meth:`check` only: ``(names, crcs)`` or None (nothing shared).
        ``crcs()`` computes this rank's CRC vector without any collective (another thread may run
        it); rank 0 compares the vectors of every rank (``_commit``)."""
        if world < 2:
            return None
        slots, names = self._slots(pg, entries, arrays, objects)
        if not slots:
            return None
        return names, lambda: _replica_crcs(slots, arrays, objects)


def _replica_crcs(slots: dict, arrays: dict, objects: dict) -> np.ndarray:
    """This rank's CRC-32 of every shared piece it holds (bit 32 set), by slot; 0 where it holds none."""
    held = 1 << 32  # bit 32 marks "this rank holds the piece"; the CRC-32 is below it
    mine = np.zeros(len(slots), dtype=np.int64)
    for (key, rkey), (local, _) in arrays.items():
        i = slots.get(("a", key, rkey))
        if i is not None:
            mine[i] = held | _crc32(byte_view(local))
    for key, (_, value) in objects.items():
        i = slots.get(("o", key, None))
        if i is not None:
            text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
            mine[i] = held | _crc32(text)
    return mine


def _raise_if_replicas_differ(names: list, table: np.ndarray, outcome: str) -> None:
    """Raise naming the shared pieces whose CRCs (``table[rank, slot]``) differ between their holders."""
    bad = []
    for i, (name, ranks) in enumerate(names):
        values = {}
        for r in ranks:
            values.setdefault(int(table[r, i]), []).append(r)
        if len(values) > 1:
            bad.append(f"{name} (" + " vs ".join(f"ranks {g}" for g in values.values()) + ")")
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        what = "1 leaf is" if len(bad) == 1 else f"{len(bad)} leaves are"
        raise CheckpointError(
            f"save: {what} held by several ranks (the same key and region), so treated as replicated and "
            f"written once, but the values differ between ranks: {shown}. "
            f"The checkpoint would keep one rank's values: {outcome}. A sharded model or optimizer "
            "(FSDP, ZeRO) must "
            "give its shards as ShardedArray: save get_state_dict(model, optimizer) from "
            "neural_arch.distributed.checkpoint.state_dict (or FSDP.optim_state_dict) instead of "
            "optimizer.state_dict(); a value that really differs per rank needs a per-rank key; replicas "
            "that drift apart (BatchNorm running statistics under DDP, which DDP's next forward replaces by "
            "rank 0's) need a broadcast from rank 0 before saving")


def _region_text(rkey) -> str:
    if rkey[0] == "flat":
        return f"(flat elements {rkey[1]}..{rkey[1] + rkey[2] - 1})"
    if not any(rkey[1]):
        return "(whole)"  # a plain array, or a ShardedArray box covering all of it
    return f"(box at {list(rkey[1])}, size {list(rkey[2])})"


_replicas = _ReplicaCheck()


def _prepare(state_dict, checkpoint_id, process_group, while_waiting=None, defer_replica_check=False):
    """Describe, agree on the plan (``while_waiting(arrays, rank, owners)`` overlaps the exchange
    when the cached plan applies: see ``PlanCache.exchange``), check that what several ranks
    hold is equal on all of them (``defer_replica_check``: only its collective part; the last
    value returned is then ``_ReplicaCheck.defer``'s), create the directory."""
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(f"checkpoint_id must be a directory path, got {checkpoint_id!r}")
    directory = os.fspath(checkpoint_id)
    pg, rank, world = _group_info(process_group)
    arrays, my_objects, plan = describe(state_dict)
    early_fn = None if while_waiting is None else (lambda owners: while_waiting(arrays, rank, owners))
    uid, entries, owners, objects, early = _plans.exchange(pg, rank, world, plan, early_fn)
    if defer_replica_check:
        early = _replicas.defer(pg, world, entries, arrays, my_objects)
    else:
        _replicas.check(pg, rank, world, entries, arrays, my_objects)
    os.makedirs(directory, exist_ok=True)
    return directory, pg, rank, world, uid, arrays, entries, owners, objects, early


def save(state_dict, checkpoint_id, process_group=None, *, extra: dict | None = None) -> dict | None:
    """Save ``state_dict`` to the directory ``checkpoint_id``; every rank of the group calls it.

    Each array leaf is replicated (a plain array) or a :class:`~neural_arch.distributed.checkpoint.sharded.ShardedArray`; each distinct chunk
    is written once. Returns the metadata dict on rank 0 (None elsewhere) after the checkpoint is
    committed on every rank. ``extra``: small JSON values stored in the metadata (e.g. metrics).

    Example::

        save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 10}, "ckpt/step_10")
    """
    _wait_previous()
    directory, pg, rank, world, uid, arrays, entries, owners, objects, _ = _prepare(
        state_dict, checkpoint_id, process_group)
    error = None
    meta = None
    try:
        _write_mine(directory, rank, uid, {name: a for _, name, a in my_pieces(arrays, owners, rank)})
        if rank == 0:
            meta = _commit(directory, uid, world, entries, objects, extra, _commit_timeout())
    except BaseException as exc:  # noqa: BLE001 - still join the barrier below, so peers do not hang on us
        error = exc
    if world > 1:
        from neural_arch.distributed.collectives import barrier

        barrier(group=pg)
    if error is not None:
        raise error
    return meta


@dataclass
class AsyncSaveResponse:
    """What :func:`async_save` returns when its ``async_stager`` stages asynchronously (torch's
    ``AsyncSaveResponse``): two ``concurrent.futures.Future`` objects.

    ``staging_completion`` (result None) is done once this rank's chunks are copied: wait for it
    before changing the saved arrays in place (optimizer steps and training-mode forwards that
    update staged buffers wait for it by themselves). ``upload_completion`` is done once the
    checkpoint is written: on rank 0 its result is the metadata, elsewhere None. A staging error is
    raised by both.

    Example::

        >>> import tempfile
        >>> import numpy as np
        >>> from neural_arch.distributed.checkpoint.staging import DefaultStager
        >>> stager = DefaultStager()
        >>> response = async_save({"w": np.zeros(2)}, tempfile.mkdtemp(), async_stager=stager)
        >>> response.staging_completion.result(), sorted(response.upload_completion.result()["tensors"])
        (None, ['w'])
        >>> stager.close()
    """

    staging_completion: Future
    upload_completion: Future


def async_save(state_dict, checkpoint_id, process_group=None, *, extra: dict | None = None,
               async_stager=None) -> Future | AsyncSaveResponse:
    """Like :func:`save`, but write in a background thread; returns a ``concurrent.futures.Future``.

    The arrays are copied to host staging buffers before it returns, so training may update
    them right away (only the chunks this rank writes). The buffers are kept and reused by the
    next ``async_save`` of the same arrays (copying into memory already touched is several times
    faster): one host copy of this rank's chunks stays allocated between saves. ``future.result()`` on rank 0 returns the metadata once the checkpoint is
    committed; on other ranks it returns None once that rank's files are durable. A later
    ``save``/``async_save`` in this process waits for this one first.

    ``async_stager`` (torch's argument, see :mod:`~neural_arch.distributed.checkpoint.staging`)
    makes the copy instead. One whose ``stage`` returns a future (``DefaultStager()``: asynchronous
    staging) lets this call return before the copy is made, with an :class:`AsyncSaveResponse`:
    run the forward and backward, then wait for ``response.staging_completion`` before changing the
    arrays. A forgotten wait is still correct: until the copy is done, every optimizer's ``step()``
    waits for it (a global step pre-hook), and so does the forward of a module in training mode
    whose buffers are being staged (BatchNorm's running statistics); other in-place writes to the
    saved arrays (your own code, a ``load`` into them waits too) must wait for it themselves.
    ``BlockingAsyncStager`` copies before returning and gives a ``Future``, like no stager.
    With any stager no collective runs after the plan exchange: pieces held by several ranks that
    differ (see :func:`save`) are found by rank 0 just before it commits, so rank 0's future raises
    and nothing is committed (another rank's future only says its files are durable). Every rank
    passes a stager, or none.

    Example::

        fut = async_save(state, "ckpt/step_20")
        train_more()
        fut.result()          # raises if the save failed

        response = async_save(state, "ckpt/step_30", async_stager=DefaultStager())
        loss = compute_loss(model, batch); loss.backward()    # overlaps the staging copy
        response.staging_completion.result()                  # optimizer.step() would wait anyway
        optimizer.step()
        response.upload_completion.result()
    """
    _wait_previous()
    if async_stager is not None:
        return _async_save_with_stager(state_dict, checkpoint_id, process_group, extra, async_stager)
    # Stage (copy) only the chunks this rank writes: a replicated chunk (or row block of one)
    # written by another rank is never read here. With an unchanged layout the copy runs while
    # the plan's digests travel between the ranks.
    directory, _pg, rank, world, uid, arrays, entries, owners, objects, staged = _prepare(
        state_dict, checkpoint_id, process_group, while_waiting=_stage_all)
    if staged is None:
        staged = _stage_all(arrays, rank, owners)
    tensors = {name: a for (_, name), a in staged.items()}
    timeout = _commit_timeout()

    def write():
        _write_mine(directory, rank, uid, tensors)
        return _commit(directory, uid, world, entries, objects, extra, timeout) if rank == 0 else None

    return _start_write(write)


def _start_write(write) -> Future:
    """Run ``write()`` on the writer thread as the pending save; its result or error goes to the
    returned future (the next save waits for it: ``_wait_previous``)."""
    global _pending
    future: Future = Future()

    def work():
        try:
            meta = write()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        else:
            future.set_result(meta)

    with _pending_lock:
        _pending = future
    _writer_submit(work)
    return future


def _async_save_with_stager(state_dict, checkpoint_id, process_group, extra, stager):
    """``async_save`` whose copy ``stager.stage`` makes (maybe after this returns: see ``staging``).

    No collective may run outside the caller, so the replica check keeps only its collective part
    here (cached with the plan); each rank's CRCs of the shared pieces travel in its manifest and
    rank 0 compares them before it commits. Under asynchronous staging the CRCs are computed in the
    writer thread while the stager copies, and staging completes only when both are done (the
    live arrays are read until then)."""
    directory, _pg, rank, world, uid, arrays, entries, owners, objects, replicas = _prepare(
        state_dict, checkpoint_id, process_group, defer_replica_check=True)
    names, crcs = replicas if replicas is not None else (None, None)
    chunks = {name: piece for _, name, piece in my_pieces(arrays, owners, rank)}
    staged = stager.stage(chunks)
    asynchronous = isinstance(staged, Future)
    # Synchronous staging: the arrays may change once this returns, so their CRCs are taken now.
    crc_now = crcs() if crcs is not None and not asynchronous else None
    staging: Future = Future()   # asynchronous staging: the copy and the replica CRCs are done
    staging_completion = _guard_until_staged(staging, arrays) if asynchronous else None
    timeout = _commit_timeout()

    def write():
        if asynchronous:
            try:
                replica_crcs = crcs() if crcs is not None else None
                tensors = staged.result()
            except BaseException as exc:  # the staging failed: both futures say so
                staging.set_exception(exc)
                raise
            staging.set_result(None)
        else:
            tensors, replica_crcs = staged, crc_now
        missing = [name for name in chunks if name not in tensors]
        if missing:
            raise CheckpointError(f"async_save: the stager {type(stager).__name__} returned no copy of the "
                                  f"chunks {missing[:5]}; stage() must return every chunk it was given")
        _write_mine(directory, rank, uid, {name: tensors[name] for name in chunks}, replica_crcs)
        return _commit(directory, uid, world, entries, objects, extra, timeout, names) if rank == 0 else None

    upload = _start_write(write)
    if not asynchronous:
        if stager.should_synchronize_after_execute:
            stager.synchronize_staging()
        return upload
    return AsyncSaveResponse(staging_completion=staging_completion, upload_completion=upload)


# The asynchronous staging in flight (None when none): load() into the saved arrays waits for it.
_staging_in_flight: Future | None = None


def _root_id(array) -> int:
    """Identity of the array owning ``array``'s memory (a row-block or flat view names its base)."""
    while isinstance(array, np.ndarray) and isinstance(array.base, np.ndarray):
        array = array.base
    return id(array)


def _guard_until_staged(staged: Future, arrays: dict) -> Future:
    """Until ``staged`` is done, make optimizer steps and training-mode forwards of modules whose
    buffers are being staged wait for it; return the ``staging_completion`` future (result None).

    Why these two: they are what a training loop changes in place between ``async_save`` and the
    next save; a step waiting here costs nothing a correct loop would not wait anyway."""
    global _staging_in_flight
    from neural_arch.nn.module import register_module_forward_pre_hook
    from neural_arch.optim.optimizer import register_optimizer_step_pre_hook

    roots = {_root_id(local) for local, _ in arrays.values()}
    completion: Future = Future()

    def before_step(optimizer, args, kwargs):
        staged.exception()  # wait; an error reaches the caller through the futures

    def before_forward(module, args):
        if not module.training:
            return
        # A module's own buffers: BatchNorm updates its running statistics in its forward. DDP's
        # forward (broadcast_buffers) first copies rank 0's buffers into every module below it.
        buffers = module.buffers() if vars(module).get("broadcast_buffers") else module._buffers.values()
        for buf in buffers:
            if buf is not None and _root_id(getattr(buf, "data", buf)) in roots:
                staged.exception()
                break

    step_hook = register_optimizer_step_pre_hook(before_step)
    forward_hook = register_module_forward_pre_hook(before_forward)

    def settle(done: Future) -> None:
        global _staging_in_flight
        step_hook.remove()
        forward_hook.remove()
        with _pending_lock:
            if _staging_in_flight is done:
                _staging_in_flight = None
        error = CheckpointError("async_save: staging was cancelled") if done.cancelled() else done.exception()
        if error is None:
            completion.set_result(None)
        else:
            completion.set_exception(error)

    with _pending_lock:
        _staging_in_flight = staged
    staged.add_done_callback(settle)  # runs now if staging is already done
    return completion


def _wait_staging() -> None:
    with _pending_lock:
        in_flight = _staging_in_flight
    if in_flight is not None:
        in_flight.exception()


# One long-lived writer thread: Thread.start waits until the new thread runs, so starting a thread
# per save would block the caller on every async_save (measured in docs/benchmarks.md).
_writer: tuple[threading.Thread, queue.SimpleQueue] | None = None


def _writer_loop(jobs: queue.SimpleQueue) -> None:
    while True:
        jobs.get()()  # each job reports its own outcome through its future


def _writer_submit(job) -> None:
    global _writer
    with _pending_lock:
        if _writer is None or not _writer[0].is_alive():
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_writer_loop, args=(jobs,), name="neural_arch-async-save", daemon=True)
            thread.start()
            _writer = (thread, jobs)
        _writer[1].put(job)


def _forget_writer_after_fork() -> None:
    global _writer
    _writer = None  # a forked child has no copy of the thread


os.register_at_fork(after_in_child=_forget_writer_after_fork)


def _stage_all(arrays: dict, rank: int, owners: dict) -> dict:
    """{(rk, chunk name): staged copy} of every chunk ``rank`` writes under ``owners``."""
    return _copier.copy({(rk, name): piece for rk, name, piece in my_pieces(arrays, owners, rank)})


def _wait_at_exit() -> None:
    with _pending_lock:
        pending = _pending
    if pending is not None:
        pending.exception()


import atexit

atexit.register(_wait_at_exit)


# ------------------------------------------------------------------------------------ load
def _set_path(root, path: list, value) -> None:
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _empty_containers(node, path=(), out=None):
    out = {} if out is None else out
    if isinstance(node, dict):
        if not node:
            out[tuple(path)] = node
        for k, v in node.items():
            _empty_containers(v, path + (k,), out)
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _empty_containers(v, path + (i,), out)
    return out


def _fill(reader, entry: dict, target: np.ndarray, region: Region, key: str) -> None:
    covered = 0
    for chunk in entry["chunks"]:
        src_region = Region.from_json(entry["global_shape"], chunk)
        if not src_region.numel or not _may_overlap(src_region, region):
            continue
        covered += reader.read_into(key, entry, chunk, region, target)
    if covered != region.numel:
        raise CheckpointError(f"load: {key!r}: the checkpoint covers {covered} of the {region.numel} elements "
                              "asked for; it is incomplete")


def _may_overlap(a: Region, b: Region) -> bool:
    if a.is_flat or b.is_flat:
        sa, la = a.runs()
        sb, lb = b.runs()
        return bool(len(sa) and len(sb) and sa[0] < sb[-1] + lb and sb[0] < sa[-1] + la)
    return all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(a.offsets, a.sizes, b.offsets, b.sizes))


def load(state_dict, checkpoint_id, process_group=None, *, verify: bool = True, strict: bool = True) -> dict:
    """Load the checkpoint in ``checkpoint_id`` into ``state_dict`` **in place** (torch DCP semantics).

    Each array leaf receives its values: a plain array the whole global array, a
    :class:`~neural_arch.distributed.checkpoint.sharded.ShardedArray` its own region (from whichever chunks the saving ranks wrote, so any
    layout loads any other). Plain values (numbers, strings) are replaced in their container.
    An empty dict in ``state_dict`` (e.g. a fresh optimizer's ``state``) is filled with every
    saved key under it, as whole arrays. Only the blocks of the chunks that overlap each leaf are
    read, straight into its array where the overlap is contiguous, and each block's CRC-32 is
    verified (``verify=False`` skips that). No collective: ranks load independently. When a
    CheckpointError is raised for corrupt data, arrays already filled keep what was read.

    Returns ``state_dict``. Raises :class:`~neural_arch.distributed.checkpoint.storage.CheckpointError` when data is
    corrupt or incomplete, and its subclass ``CheckpointMismatchError`` when a key is missing (``strict=False``
    skips it) or a shape, dtype or kind differs (an array where the checkpoint holds a plain value).

    Example::

        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        load(sd, "ckpt/step_10")
        model.load_state_dict(sd["model"]); opt.load_state_dict(sd["optim"])
    """
    del process_group  # accepted for torch compatibility: loading needs no collective
    _wait_staging()  # an async_save may still be copying the arrays this load writes into
    directory = os.fspath(checkpoint_id)
    meta = read_metadata(directory)
    with ChunkReader(directory, meta, verify) as reader:
        _load_into(state_dict, directory, meta, reader, strict)
    return state_dict


def _load_into(state_dict, directory: str, meta: dict, reader: ChunkReader, strict: bool) -> None:
    tensors, objects = meta["tensors"], meta["objects"]
    empties = _empty_containers(state_dict)
    # Check every leaf against the checkpoint before reading any (torch plans the whole load
    # first): a mismatch raises with the state dict untouched, never after a partial load.
    plan = []
    for key, path, leaf in flatten_state_dict(state_dict):
        if key in objects:
            value = decode_object(objects[key]["value"])
            plan.append(("object", key, path, _object_slot(key, leaf, value), value))
            continue
        if key not in tensors:
            if strict:
                raise CheckpointMismatchError(f"load: {key!r} is not in the checkpoint {directory!r}; it has "
                                              f"{len(tensors) + len(objects)} keys (pass strict=False to skip "
                                              "missing keys)")
            continue
        if not is_array_leaf(leaf):
            leaf = None  # a plain value where the checkpoint has an array: replace it
        plan.append(("array", key, path, leaf, _fit(tensors[key], key, leaf)))
    for kind, key, path, leaf, arg in plan:
        if kind == "array":
            _load_leaf(reader, tensors[key], key, path, leaf, state_dict, arg)
        elif leaf is None:  # a plain value: replace the leaf
            _set_path(state_dict, path, arg)
        else:  # a number into a 0-d array leaf, in place
            leaf[...] = arg
    # Fill empty containers (a fresh optimizer's state) with every saved key below them.
    if empties:
        for table in (tensors, objects):
            for key, item in table.items():
                path = item["path"]
                for n in range(len(path) - 1, -1, -1):
                    if tuple(path[:n]) in empties:
                        _build_path(state_dict, path)
                        if table is objects:
                            _set_path(state_dict, path, decode_object(item["value"]))
                        else:
                            _load_leaf(reader, item, key, path, None, state_dict, _fit(item, key, None))
                        break


def _holder(leaf):
    """The array a leaf's values live in (a Tensor's array, a ShardedArray's piece)."""
    holder = leaf.local if isinstance(leaf, ShardedArray) else leaf
    if not isinstance(holder, (np.ndarray, np.generic)) and not _backend.is_device_array(holder) \
            and hasattr(holder, "data"):
        holder = holder.data  # a Tensor: load into its array (a CuPy array's .data is not its array)
    return holder


def _object_slot(key, leaf, value):
    """Where a plain saved value goes: None (it replaces the plain leaf), or the 0-d array a number
    is written into. Any other array leaf (a parameter, a DTensor or ShardedArray piece) is refused:
    replacing it in the dict would leave the array the caller holds (the model's) silently unloaded."""
    if not is_array_leaf(leaf) or isinstance(leaf, np.generic):
        return None
    holder = _holder(leaf)
    if isinstance(value, (bool, int, float)) and not isinstance(leaf, ShardedArray) and np.ndim(holder) == 0:
        return holder
    raise CheckpointMismatchError(f"load: {key!r} is a plain value ({type(value).__name__}) in the checkpoint but "
                                  f"an array of shape {tuple(np.shape(holder))} here; load it into a plain value")


def _build_path(root, path: list) -> None:
    node = root
    for p in path[:-1]:
        if p not in node:
            node[p] = {}
        node = node[p]


def _fit(entry, key, leaf):
    """The region ``leaf`` takes of the saved array ``key`` and the array to fill (None, None for a
    leaf to create); raises ``CheckpointMismatchError`` when its shape or dtype does not fit."""
    dtype = np.dtype(entry["dtype"])
    gshape = tuple(entry["global_shape"])
    if leaf is None:
        return None, None
    if isinstance(leaf, ShardedArray):
        if leaf.global_shape != gshape:
            raise CheckpointMismatchError(f"load: {key!r} has global shape {gshape} in the checkpoint but "
                                          f"{leaf.global_shape} here")
        region = Region.of(leaf)
    else:
        region = Region(tuple(int(s) for s in np.shape(to_host(leaf))), (0,) * len(gshape), gshape)
        if region.global_shape != gshape:
            raise CheckpointMismatchError(f"load: {key!r} has shape {gshape} in the checkpoint but "
                                          f"{region.global_shape} here")
    holder = _holder(leaf)
    host_dtype = np.dtype(holder.dtype)
    if host_dtype != dtype:
        raise CheckpointMismatchError(f"load: {key!r} is {dtype} in the checkpoint but {host_dtype} here; load into "
                                      f"an array of dtype {dtype} and cast afterwards")
    return region, holder


def _load_leaf(reader, entry, key, path, leaf, root, fit) -> None:
    dtype = np.dtype(entry["dtype"])
    region, holder = fit
    if leaf is None:
        target = np.empty(tuple(entry["global_shape"]), dtype=dtype)
        _fill(reader, entry, target, Region.of(target), key)
        _set_path(root, path, target)
        return
    writable = isinstance(holder, np.ndarray) and holder.flags.writeable and holder.flags.c_contiguous
    target = holder if writable else np.empty(np.shape(holder), dtype=dtype)
    _fill(reader, entry, target, region, key)
    if writable:
        return
    reader.finish()   # a temporary target reaches the holder only once its checksums have passed
    if isinstance(holder, np.generic):
        _set_path(root, path, target[()])
    elif isinstance(holder, np.ndarray):
        holder[...] = target  # read-only or strided: copy through a contiguous buffer
    else:  # a device array: one host-to-device copy into it
        _backend.to_device_like(target, holder, out=holder)


# ------------------------------------------------------------------------------------ verify
def verify(checkpoint_id) -> dict:
    """Check every data file whole against the metadata (size, header, every chunk's checksums).

    Reads every byte (unlike :func:`load`, which checks only the blocks it reads). Returns the
    metadata; raises :class:`~neural_arch.distributed.checkpoint.storage.CheckpointError` naming
    the file and chunk that is corrupt.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> d = tempfile.mkdtemp()
        >>> _ = save({"w": np.arange(4.0)}, checkpoint_id=d)     # a world of one
        >>> verify(d)["tensors"]["w"]["global_shape"]
        [4]
    """
    directory = os.fspath(checkpoint_id)
    meta = read_metadata(directory)
    if meta["version"] == 1:
        for fname, info in meta["files"].items():
            path = os.path.join(directory, fname)
            if not os.path.exists(path):
                raise CheckpointError(f"{directory!r}: data file {fname} is missing")
            if os.path.getsize(path) != info["size"] or file_sha256(path) != info["sha256"]:
                raise CheckpointError(f"{path} does not match its checksum in {METADATA_NAME}; the checkpoint is corrupt")
        return meta
    by_file: dict[str, list] = {name: [] for name in meta["files"]}
    for key, entry in meta["tensors"].items():
        for chunk in entry["chunks"]:
            by_file[chunk["file"]].append(dict(chunk, key=key))
    for fname, info in meta["files"].items():
        verify_file(directory, fname, info, by_file[fname])
    return meta


def remove_orphans(checkpoint_id) -> int:
    """Delete files of saves that never committed (crash leftovers) from a checkpoint directory.

    Call from one process while no save into that directory is running (e.g. at start-up).
    Returns how many files were removed.

    Example:
        >>> import os, tempfile
        >>> d = tempfile.mkdtemp()
        >>> _ = open(os.path.join(d, "__1_dead.safetensors"), "wb").write(b"half")   # a crashed save's file
        >>> remove_orphans(d), os.listdir(d)
        (1, [])
    """
    directory = os.fspath(checkpoint_id)
    try:
        keep = set(read_metadata(directory)["files"])
    except CheckpointError:
        keep = set()
    removed = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        # only the project's own names: a stale data file, or an interrupted atomic write of one of them
        base = name.split(TMP_MARK, 1)[0]
        ours = is_checkpoint_file_name(base) or base == METADATA_NAME
        if (is_checkpoint_file_name(name) and name not in keep) or (TMP_MARK in name and ours):
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except FileNotFoundError:
                pass
    return removed
