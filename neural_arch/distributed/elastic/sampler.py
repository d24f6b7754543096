"""``ElasticDistributedSampler``: a ``DistributedSampler`` that resumes mid-epoch at any world size.

Why it works: the epoch's order is ``permutation(N)`` from ``seed + epoch`` (the same on every rank)
and rank ``r`` of ``W`` takes ``remaining[r::W]``. After every rank consumed ``k`` samples, the
samples consumed by the whole group are exactly the first ``k * W`` of ``remaining``: a prefix.
So a commit needs one number, ``processed`` (samples of this epoch done), whatever the world
size; after a restart at a new size ``W'``, rank ``r'`` takes ``order[processed:][r'::W']``.
No sample of the epoch is skipped or repeated (apart from the marked padding, see below).

With ``drop_last=False`` the remaining samples are padded by wrap-around to a multiple of the
world size (every rank yields the same count, so collectives line up); :meth:`~neural_arch.distributed.elastic.sampler.ElasticDistributedSampler.padding_mask`
marks the duplicates, and :meth:`~neural_arch.distributed.elastic.sampler.ElasticDistributedSampler.record_batch` never counts past the epoch's end.

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

import math

import numpy as np

from neural_arch.distributed.data.sampler import DistributedSampler, _group_rank_and_size

__all__ = ["ElasticDistributedSampler"]


class ElasticDistributedSampler(DistributedSampler):
    """Like :class:`~neural_arch.distributed.data.sampler.DistributedSampler` (same arguments and
    epoch order), plus mid-epoch resume.

    Call :meth:`record_batch` (or :meth:`record_samples`) after each batch so :meth:`state_dict`
    knows how far the epoch got; after the world changes, :meth:`reset` re-reads the group's
    rank and size (``elastic.State`` does this for you).

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

    def __init__(self, dataset=None, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *, dataset_size: int | None = None):
        super().__init__(dataset, num_replicas, rank, shuffle, seed, drop_last, dataset_size=dataset_size)
        self.processed = 0          # samples of this epoch done by the whole group at start of this segment
        self._local_done = 0        # samples this rank has done since then
        self._layout()

    def _layout(self) -> None:
        remaining = max(0, self.dataset_size - self.processed)
        w = self.num_replicas
        self.num_samples = remaining // w if self.drop_last else math.ceil(remaining / w)
        self.total_size = self.num_samples * w

    # -- progress ---------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first sample."""
        super().set_epoch(epoch)
        self.processed, self._local_done = 0, 0
        self._layout()

    def record_samples(self, count: int) -> None:
        """This rank finished ``count`` more of its samples (every rank records the same counts)."""
        self._local_done = min(self.num_samples, self._local_done + int(count))

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """This rank finished batches ``0..batch_idx`` of ``batch_size`` (Horovod's spelling)."""
        self._local_done = min(self.num_samples, (int(batch_idx) + 1) * int(batch_size))

    def processed_samples(self) -> int:
        """Samples of the epoch the whole group has finished (padding not counted)."""
        return min(self.dataset_size, self.processed + self._local_done * self.num_replicas)

    def state_dict(self) -> dict:
        """Epoch, samples processed, seed, dataset size and shuffle: what ``load_state_dict`` resumes from."""
        return {"epoch": self.epoch, "processed": self.processed_samples(), "seed": self.seed,
                "dataset_size": self.dataset_size, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state`` (from any world size); the remaining samples are split over this one."""
        if int(state.get("dataset_size", self.dataset_size)) != self.dataset_size:
            raise ValueError(f"ElasticDistributedSampler.load_state_dict: the state is for {state['dataset_size']} "
                             f"samples, this sampler has {self.dataset_size}")
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.processed, self._local_done = int(state["processed"]), 0
        self._layout()

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

    # -- the order ----------------------------------------------------------------------------------
    def global_order(self) -> np.ndarray:
        """The rest of the epoch's order (from ``processed``), padded or cut to ``total_size``."""
        n = self.dataset_size
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle \
            else np.arange(n, dtype=np.int64)
        rest = order[self.processed:]
        if self.total_size <= len(rest):
            return rest[:self.total_size]
        if len(rest) == 0:
            return rest
        return np.resize(rest, self.total_size)

    @property
    def num_padding(self) -> int:
        return max(0, self.total_size - max(0, self.dataset_size - self.processed))

    def padding_mask(self) -> np.ndarray:
        """Booleans, one per index this rank yields: True where that index is a padding duplicate."""
        positions = np.arange(self.rank, self.total_size, self.num_replicas)
        return positions >= max(0, self.dataset_size - self.processed)

    def __repr__(self) -> str:
        return (f"ElasticDistributedSampler(dataset_size={self.dataset_size}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, epoch={self.epoch}, processed={self.processed_samples()}, "
                f"num_samples={self.num_samples})")
