"""``ElasticDistributedSampler``: a ``DistributedSampler`` that resumes mid-epoch at any world size.

Why it works: the epoch's order is ``permutation(N)`` from ``seed + epoch`` (the same on every rank)
and rank ``r`` of ``W`` takes ``remaining[r::W]``. After every rank consumed ``k`` samples, the
samples consumed by the whole group are exactly the first ``k * W`` of ``remaining``: a prefix.
So a commit needs one number, ``processed`` (samples of this epoch done), whatever the world
size; after a restart at a new size ``W'``, rank ``r'`` takes ``order[processed:][r'::W']``.
No sample of the epoch is skipped or repeated (apart from the marked padding, see below).

With ``drop_last=False`` the remaining samples are padded by wrap-around to a multiple of the
world size (every rank yields the same count, so collectives line up);
:meth:`~neural_arch.distributed.data.sampler.DistributedSampler.padding_mask` marks the duplicates,
and :meth:`~neural_arch.distributed.data.sampler.DistributedSampler.record_batch` never counts past
the epoch's end. All of that is :class:`~neural_arch.distributed.data.sampler.DistributedSampler`'s;
this class adds :meth:`ElasticDistributedSampler.reset`, re-partitioning in place when the world changes.

Example::

    sampler = ElasticDistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
    it = list(sampler)                   # [0, 2, 4, 6, 8]
    sampler.record_batch(0, 2)           # this rank finished batch 0 of size 2: 4 samples processed
    saved = sampler.state_dict()         # {"epoch": 0, "processed": 4, ...}
    new = ElasticDistributedSampler(dataset_size=10, num_replicas=3, rank=1, shuffle=False)
    new.load_state_dict(saved)
    list(new)                            # [5, 8]  (remaining 4..9 split over 3 ranks)
"""

from __future__ import annotations

from neural_arch.distributed.data.sampler import DistributedSampler, _group_rank_and_size

__all__ = ["ElasticDistributedSampler"]


class ElasticDistributedSampler(DistributedSampler):
    """A ``DistributedSampler`` that re-partitions the rest of its epoch in place when the world changes.

    :class:`~neural_arch.distributed.data.sampler.DistributedSampler` already resumes mid-epoch on any
    world size from its state; call its ``record_batch`` (or ``record_samples``) after each batch so its
    ``state_dict`` knows how far the epoch got. After the world changes, ``reset()`` re-reads the
    group's rank and size (``elastic.State`` does this for you).

    Example:
        >>> sampler = ElasticDistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
        >>> list(sampler)
        [0, 2, 4, 6, 8]
        >>> sampler.record_batch(0, 2)                 # batch 0 of size 2 done on every rank
        >>> resumed = ElasticDistributedSampler(dataset_size=10, num_replicas=3, rank=1, shuffle=False)
        >>> resumed.load_state_dict(sampler.state_dict())
        >>> list(resumed)                              # samples 4..9 split over 3 ranks
        [5, 8]
    """

    def reset(self, num_replicas: int | None = None, rank: int | None = None) -> None:
        """Re-partition the rest of the epoch for a new world (default: the default group's)."""
        done = self.processed_samples()
        if num_replicas is None or rank is None:
            group_rank, group_size = _group_rank_and_size()
            num_replicas = group_size if num_replicas is None else num_replicas
            rank = group_rank if rank is None else rank
        if not 0 <= int(rank) < int(num_replicas):
            raise ValueError(f"ElasticDistributedSampler.reset: rank {rank} is outside [0, {num_replicas})")
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.processed, self._local_done = done, 0
        self._layout()

    def __repr__(self) -> str:
        return (f"ElasticDistributedSampler(dataset_size={self.dataset_size}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, epoch={self.epoch}, processed={self.processed_samples()}, "
                f"num_samples={self.num_samples})")
