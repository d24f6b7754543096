"""Distributed checkpoints: every rank writes its own shards; any layout loads any other.

Names and semantics follow ``torch.distributed.checkpoint`` (DCP)::

    import neural_arch.distributed.checkpoint as dcp
    from neural_arch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)           # by parameter name; FSDP/ZeRO: ShardedArrays
    state = {"model": model_sd, "optim": optim_sd, "epoch": 3}
    dcp.save(state, checkpoint_id="ckpt/step_100")           # collective; atomic
    fut = dcp.async_save(state, checkpoint_id="ckpt/step_200")  # returns at once; fut.result() later
    resp = dcp.async_save(state, checkpoint_id="ckpt/step_300",   # torch's asynchronous staging: returns
                          async_stager=DefaultStager())           # before the copy (AsyncSaveResponse)
    dcp.load(state, checkpoint_id="ckpt/step_100")            # in place, into *this* layout
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

``model.state_dict()`` / ``opt.state_dict()`` work too for replicated training (one process,
DDP, FSDP's full model state dict), but not for a sharded optimizer: under FSDP or ZeRO-2 its
state arrays are each rank's shard under the same key and shape, and ``save`` refuses them (it
checks that whatever several ranks hold is equal on all of them, see below).

What is stored: one safetensors file per rank that owns data (each chunk a tensor of its own) and
one JSON ``.metadata``: for every dotted key (nested dicts are flattened: ``optim.state.0.exp_avg``)
its global shape, dtype, and the chunks (region, file, tensor name, byte offset, a CRC-32 per MiB);
for every file its size and header CRC; plain values (ints, floats, strings, tuples) as JSON.
Each rank streams its chunks into its file in one pass (checksums computed as the bytes go out). ``.metadata`` is
written last, by atomic rename, after every rank's files are fsynced: a directory without it is
not a checkpoint, and a crash at any moment leaves the previous checkpoint loadable.

The contract for parallel layouts (what a strategy puts in its state dict)
--------------------------------------------------------------------------

* **Replicated** (DDP, a single process): a plain array. Every rank holding it has the whole
  array, the *same* array: ``save`` compares a CRC-32 of it over the ranks holding it (one small
  all-gather per save) and raises :class:`~neural_arch.distributed.checkpoint.storage.CheckpointError` naming the leaf and the ranks when
  they differ, before writing anything (plain values and identical ``ShardedArray`` regions held
  by several ranks are checked alike). It is written once: a big one (>= 256 KiB) as row blocks, one per rank holding it, the
  others whole, each by the holder with the fewest bytes to write so far (see ``plan``).
* **Box shards** (tensor parallel): ``ShardedArray(local, global_shape, offsets)``: ``local`` is
  ``global[offsets[0]:offsets[0]+local.shape[0], ...]``; the same key on every rank, pieces tile the
  global array exactly (a key may be absent on ranks that hold no piece of it).
* **DTensors** (tensor parallel and ``fully_shard`` parameters, what ``state_dict.get_state_dict``
  gives for them): under ``Shard``/``Replicate`` placements this rank's piece is a box, saved as
  one (see ``dtensor_box``); load fills the DTensors of any mesh in place. ``Partial`` is refused.
* **Flat shards** (FSDP / ZeRO-2; what ``state_dict.get_state_dict`` gives for them): give
  **each parameter** (and each optimizer-state array) as
  ``ShardedArray(piece_1d, global_shape=param.shape, flat_offset=k)``: ``piece_1d`` is the part of
  this rank's flat shard that falls inside that parameter, i.e. elements ``k .. k+len-1`` of
  ``param.reshape(-1)`` (C order). Padding is never saved; a rank whose shard does not touch a
  parameter passes an empty piece (``flat_offset=0``), or leaves the key out (but note that
  ``load`` fills an *empty dict* with everything saved below it). Keys are the unsharded model's
  parameter names, so a flat checkpoint loads into a DDP model, a TP layout or another world size.

Load gives every leaf its region: a plain array receives the whole global array; a
``ShardedArray`` receives its own box or flat range, assembled from whichever saved chunks overlap
it (only the blocks it needs are read, straight into the destination array; each block's CRC is
checked). ``verify(dir)`` checks every byte of every file. :class:`CheckpointManager` adds numbered checkpoints,
resume, keep-last-k cleanup and best-metric tracking.
"""

from neural_arch.distributed.checkpoint.api import AsyncSaveResponse, async_save, load, remove_orphans, save, verify
from neural_arch.distributed.checkpoint.manager import CheckpointManager
from neural_arch.distributed.checkpoint.sharded import ShardedArray
from neural_arch.distributed.checkpoint.storage import CheckpointError, CheckpointMismatchError

__all__ = ["AsyncSaveResponse", "CheckpointError", "CheckpointManager", "CheckpointMismatchError", "ShardedArray",
           "async_save", "load", "remove_orphans", "save", "verify"]
