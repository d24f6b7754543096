"""In-process elastic training (Horovod's ``hvd.elastic`` model): commit, fail, re-form, restore.

A training loop keeps its state in a :class:`State` and calls :meth:`State.commit` every few
steps. When a peer dies (``PeerFailureError``), a collective times out
(``CollectiveTimeoutError``) or another rank's operation failed (``GroupPoisonedError``), the
function wrapped by :func:`run` does not crash: every surviving process restores the last commit,
aborts its process group (so peers still waiting in a collective fail at once instead of at
``NEURAL_ARCH_TIMEOUT``), destroys it and calls ``init_process_group()``
again from the environment (the size it finds there), re-partitions the sampler, and re-enters
the function, which continues from ``state.epoch`` / ``state.step``::

    import neural_arch.distributed as dist
    from neural_arch.distributed import elastic
    from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler

    dist.init_process_group()
    sampler = ElasticDistributedSampler(dataset_size=len(data))
    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=0, step=0,
                          checkpoint_dir="ckpts", save_every=10)   # every 10th commit is durable

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, 5):
            for idx in batches(sampler):            # the sampler resumes mid-epoch
                ...                                 # forward, backward, step
                sampler.record_samples(len(idx))
                state.step += 1
                state.commit()
            sampler.set_epoch(state.epoch + 1)

    train(state)

What is *not* here: finding the new members. ``init_process_group()`` joins whatever the
environment describes (RANK/WORLD_SIZE/MASTER_ADDR); re-rendezvous of a changing set of hosts is
the launcher's job (``--nnodes MIN:MAX``: after a lost node the launchers re-form the job and
restart every rank at the new size; the script resumes from its last durable commit). An
in-process reset re-forms a world of the same size only.
"""

from __future__ import annotations

import copy
import functools
import logging

from neural_arch.distributed.errors import CollectiveTimeoutError, GroupPoisonedError, PeerFailureError

__all__ = ["RESETTABLE_ERRORS", "State", "run"]

log = logging.getLogger("neural_arch.distributed.elastic")

# GroupPoisonedError: another rank's op failed (or it aborted the group to reset): the group
# must be re-created on every rank, which is what a reset does.
RESETTABLE_ERRORS = (PeerFailureError, CollectiveTimeoutError, GroupPoisonedError)


class State:
    """Everything a training loop needs to continue after a failure: model, optimizer, sampler, scalars.

    Args:
        model: a ``Module`` (or DDP wrapper): its ``state_dict`` is snapshotted.
        optimizer: an ``Optimizer`` (``state_dict`` / ``load_state_dict``).
        sampler: e.g. :class:`~neural_arch.distributed.elastic.sampler.ElasticDistributedSampler`
            (``state_dict`` / ``load_state_dict`` / ``reset``).
        checkpoint_dir: also save durably (distributed checkpoint via ``CheckpointManager``) ...
        save_every: ... on every ``save_every``-th commit (default: every commit when a dir is given).
        keep_last: checkpoints the manager keeps.
        **scalars: plain values (``epoch=0, step=0``), readable and writable as attributes.

    ``commit()`` takes an in-memory deep copy (cheap for the small models trained here; the
    durable save is the distributed checkpoint). ``restore()`` puts the last commit back.

    Example:
        >>> state = State(epoch=0, step=0)
        >>> state.step = 5; state.commit()
        >>> state.step = 9                 # progress lost in a failure ...
        >>> state.restore(); state.step    # ... and the last commit back
        5
    """

    def __init__(self, model=None, optimizer=None, sampler=None, *, checkpoint_dir=None, save_every: int | None = None,
                 keep_last: int = 2, **scalars):
        object.__setattr__(self, "_scalars", dict(scalars))
        self.model, self.optimizer, self.sampler = model, optimizer, sampler
        self._callbacks: list = []
        self._commits = 0
        self._snapshot = None
        self.manager = None
        if checkpoint_dir is not None:
            from neural_arch.distributed.checkpoint.manager import CheckpointManager

            self.manager = CheckpointManager(checkpoint_dir, keep_last=keep_last)
        self.save_every = None if checkpoint_dir is None else max(1, int(save_every or 1))
        self.commit_memory()

    # scalars as attributes ------------------------------------------------------------------------
    def __getattr__(self, name):
        scalars = object.__getattribute__(self, "_scalars")
        if name in scalars:
            return scalars[name]
        raise AttributeError(f"State has no attribute {name!r}; pass it to State(..., {name}=...)")

    def __setattr__(self, name, value):
        if name in self._scalars:
            self._scalars[name] = value
        else:
            object.__setattr__(self, name, value)

    # snapshot -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"model", "optimizer", "sampler", "scalars"}`` (the parts that exist), as copies."""
        out = {"scalars": copy.deepcopy(self._scalars)}
        if self.model is not None:
            out["model"] = dict(self.model.state_dict())
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        if self.sampler is not None and hasattr(self.sampler, "state_dict"):
            out["sampler"] = self.sampler.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        state = copy.deepcopy(state)  # the snapshot must survive later training steps
        if self.model is not None and "model" in state:
            self.model.load_state_dict(state["model"])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.sampler is not None and "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        self._scalars.update(state["scalars"])

    def commit_memory(self) -> None:
        """Snapshot in memory only (no collective, no disk)."""
        self._snapshot = self.state_dict()

    def commit(self) -> None:
        """Snapshot in memory; every ``save_every``-th commit also saves a distributed checkpoint
        (a collective: every rank commits at the same steps)."""
        self.commit_memory()
        self._commits += 1
        if self.manager is not None and self._commits % self.save_every == 0:
            self.manager.save(self._snapshot, step=int(self._scalars.get("step", self._commits)))

    def restore(self) -> None:
        """Put the last commit back (model, optimizer, sampler, scalars)."""
        self.load_state_dict(self._snapshot)

    def load_latest_checkpoint(self) -> int | None:
        """After a whole-job restart: load the newest durable checkpoint (its step, or None)."""
        if self.manager is None:
            raise ValueError("State.load_latest_checkpoint(): pass checkpoint_dir=... to State")
        target = self.state_dict()
        step = self.manager.load_latest(target)
        if step is not None:
            self.load_state_dict(target)
            self.commit_memory()
        return step

    def sync(self) -> None:
        """Make every rank hold rank 0's committed state (after a re-formed world, new ranks join)."""
        from neural_arch.distributed import groups
        from neural_arch.distributed.collectives import broadcast_object_list

        if not groups.is_initialized() or groups.get_world_size() == 1:
            return
        box = [self._snapshot]
        broadcast_object_list(box, src=0)  # trusted peers only (pickle), like every *_object helper
        self._snapshot = box[0]
        self.restore()

    # resets ---------------------------------------------------------------------------------------
    def register_reset_callbacks(self, callbacks) -> None:
        """Call each ``callback()`` after a reset (e.g. to rescale the learning rate to the new size)."""
        self._callbacks.extend(callbacks)

    def on_reset(self) -> None:
        if self.sampler is not None and hasattr(self.sampler, "reset"):
            self.sampler.reset()
        for callback in self._callbacks:
            callback()


def _reinit_process_group(reason: str = "") -> None:
    from neural_arch.distributed import groups

    backend = groups.get_backend() if groups.is_initialized() else None
    if groups.is_initialized():
        # Tell the peers first (torch's ProcessGroup.abort): a rank whose own step raised leaves
        # the others blocked in their next collective, which would otherwise end only at
        # NEURAL_ARCH_TIMEOUT; poisoned, it fails at once and they reset too.
        try:
            groups.get_default_group().backend.abort(f"rank {groups.get_rank()} is re-forming the group "
                                                     f"after {reason or 'a failure'}")
        except Exception as exc:  # noqa: BLE001 - best effort: the group is being torn down anyway
            log.debug("elastic: could not abort the old group: %s", exc)
    groups.destroy_process_group()
    groups.init_process_group(backend=backend)


def run(func):
    """Decorator: run ``func(state, ...)``; on a peer failure, restore the last commit, re-form the
    process group and call it again. ``NEURAL_ARCH_ELASTIC_MAX_RESETS`` (default 5) bounds the resets.

    Example::

        @elastic.run
        def train(state):
            ...
        train(state)
    """

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        from neural_arch import config

        limit = int(config.get("NEURAL_ARCH_ELASTIC_MAX_RESETS"))
        resets = 0
        state.sync()
        while True:
            try:
                return func(state, *args, **kwargs)
            except RESETTABLE_ERRORS as exc:
                resets += 1
                if resets > limit:
                    raise
                log.warning("elastic: %s: %s; restoring the last commit and re-forming the group (reset %d of %d)",
                            type(exc).__name__, exc, resets, limit)
                state.restore()
                _reinit_process_group(f"{type(exc).__name__}: {exc}")
                state.on_reset()
                state.sync()

    wrapper.resets = 0
    return wrapper
