"""``DistributedSampler`` (each rank's share of a data set) and ``distributed_evaluate``.

The sampler follows PyTorch's semantics exactly, so numbers are comparable:

* every rank gets the **same number** of indices (``num_samples``). Collectives in the
  training loop must line up, so a rank cannot simply stop early;
* the epoch's order is ``permutation(N)`` from ``default_rng(seed + epoch)`` (identical on all
  ranks), or ``arange(N)`` with ``shuffle=False``;
* ``drop_last=False`` **pads** the order by wrap-around (repeating its first indices) up to a
  multiple of ``num_replicas``: up to ``num_replicas - 1`` samples are seen twice per epoch.
  ``drop_last=True`` instead drops the tail, so up to ``num_replicas - 1`` samples are unseen;
* rank ``r`` takes the strided slice ``order[r::num_replicas]``.

Padding is harmless for training (one duplicate sample among many) but would bias
evaluation, so :func:`distributed_evaluate` does not use padding at all: it splits the
exact index set, evaluates each real sample once, and all-reduces (count, sums).

Both spellings of the seeds work::

    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0)   # seed 002
    sampler = DistributedSampler(dataset_size=100, num_replicas=2, rank=1)              # seed 001
    for epoch in range(3):
        sampler.set_epoch(epoch)          # reshuffle, identically on every rank
        for idx in sampler:               # python ints
            ...

Resumable: :meth:`DistributedSampler.state_dict` holds the epoch, the seed and ``processed``, the
samples of the epoch the whole group has finished (``record_batch``, which ``DataLoader.state_dict``
calls for you). The group's finished samples are always a prefix of the epoch's order
(rank ``r`` of ``W`` takes ``rest[r::W]``), so after :meth:`DistributedSampler.load_state_dict` on
a world of any size the rest of the epoch is split again and no sample is lost or repeated.

``num_replicas`` and ``rank`` default to the default process group (a world of one when
none was initialised).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from neural_arch.backend import to_host
from neural_arch.data.dataset import gathers_like_getitem

__all__ = ["DistributedSampler", "distributed_evaluate"]


def _group_rank_and_size(group=None):
    """(rank, size) of ``group`` (default group), or (0, 1) when nothing was initialised."""
    from neural_arch.distributed.groups import backend_or_world_of_one

    backend = backend_or_world_of_one(group, "DistributedSampler/distributed_evaluate")
    return backend.rank, backend.size


class DistributedSampler:
    """Indices of one rank's share of a data set, equal in length on every rank.

    Args:
        dataset: anything with ``len()`` (or an int, the data set size). Seed 002 spelling.
        num_replicas: number of ranks sharing the data (default: world size of the default group).
        rank: this rank's position in ``[0, num_replicas)`` (default: rank in the default group).
        shuffle: shuffle the order each epoch (with ``seed + epoch``; same order on every rank).
        seed: base seed of the shuffle. **Must be the same on every rank.**
        drop_last: drop the tail instead of padding it (see the module docstring).
        dataset_size: the data set size, seed 001 spelling (instead of ``dataset``).

    Example::

        >>> s = DistributedSampler(dataset_size=10, num_replicas=3, rank=2, shuffle=False)
        >>> list(s), len(s)     # 10 padded to 12 by wrap-around: position 11 holds index 1
        ([2, 5, 8, 1], 4)

    Warning: call ``set_epoch(epoch)`` before every epoch, or every epoch uses the same order.
    """

    def __init__(self, dataset=None, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, *,
                 dataset_size: int | None = None):
        if dataset is None and dataset_size is None:
            raise TypeError("DistributedSampler needs the data set: DistributedSampler(dataset, ...) "
                            "or DistributedSampler(dataset_size=N, ...)")
        if dataset is not None and dataset_size is not None and len(_as_sized(dataset)) != int(dataset_size):
            raise ValueError(f"DistributedSampler: dataset has {len(_as_sized(dataset))} samples but "
                             f"dataset_size={dataset_size}; pass only one of them")
        size = int(dataset_size) if dataset_size is not None else len(_as_sized(dataset))
        if size < 0:
            raise ValueError(f"DistributedSampler: dataset_size must be >= 0, got {size}")
        if num_replicas is None or rank is None:
            group_rank, group_size = _group_rank_and_size()
            num_replicas = group_size if num_replicas is None else num_replicas
            rank = group_rank if rank is None else rank
        num_replicas, rank = int(num_replicas), int(rank)
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is outside [0, num_replicas={num_replicas}); "
                             "pass the rank of this process in the group that shares the data")
        self.dataset = dataset
        self.dataset_size = size
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.processed = 0          # samples of this epoch the group had done when this segment began
        self._local_done = 0        # samples this rank has done since then
        self._layout()

    def _layout(self) -> None:
        """``num_samples`` and ``total_size`` of what is left of the epoch (all of it unless resumed)."""
        remaining = max(0, self.dataset_size - self.processed)
        w = self.num_replicas
        self.num_samples = remaining // w if self.drop_last else math.ceil(remaining / w)
        self.total_size = self.num_samples * w

    # -- the epoch's order ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from its first sample (call before each epoch on every rank,
        with the same value)."""
        self.epoch = int(epoch)
        self.processed, self._local_done = 0, 0
        self._layout()

    def global_order(self) -> np.ndarray:
        """The epoch's index order shared by all ranks (its rest, after a resume), padded or cut
        to ``total_size``."""
        n = self.dataset_size
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        rest = order[self.processed:]
        if self.total_size <= len(rest):
            return rest[:self.total_size]
        if len(rest) == 0:
            return rest
        # Wrap-around padding; np.resize repeats the order as often as needed (tiny data sets).
        return np.resize(rest, self.total_size)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch (an int64 array of length ``num_samples``)."""
        return self.global_order()[self.rank::self.num_replicas].astype(np.int64, copy=False)

    @property
    def num_padding(self) -> int:
        """How many padding duplicates the (rest of the) epoch contains (0 with ``drop_last=True``)."""
        return max(0, self.total_size - max(0, self.dataset_size - self.processed))

    def padding_mask(self) -> np.ndarray:
        """Booleans, one per index of :meth:`indices`: True where that index is a padding duplicate."""
        positions = np.arange(self.rank, self.total_size, self.num_replicas)
        return positions >= max(0, self.dataset_size - self.processed)

    # -- resumable position ----------------------------------------------------------------------
    def record_samples(self, count: int) -> None:
        """This rank finished ``count`` more of its samples (every rank records the same counts)."""
        if int(count) < 0:   # the position would move back: samples seen twice after a resume, silently
            raise ValueError(f"{type(self).__name__}.record_samples: count must be >= 0, got {count}")
        self._local_done = min(self.num_samples, self._local_done + int(count))

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """This rank finished batches ``0..batch_idx`` of ``batch_size`` of this segment (absolute,
        so calling it twice for the same batch is harmless). ``DataLoader.state_dict()`` calls it with
        the batches the loader yielded before it saves this sampler's state."""
        self._local_done = min(self.num_samples, (int(batch_idx) + 1) * int(batch_size))

    def processed_samples(self) -> int:
        """Samples of the epoch the whole group has finished (padding not counted)."""
        return min(self.dataset_size, self.processed + self._local_done * self.num_replicas)

    def state_dict(self) -> dict:
        """Where the epoch stands, independent of the world size: ``epoch``, ``processed`` (samples of
        the epoch done by the whole group: the first ``processed`` of the epoch's order), ``seed``,
        ``shuffle``, ``drop_last`` and ``dataset_size``. Plain ints and bools.

        Example::

            >>> s = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
            >>> s.record_batch(0, 2)            # each rank yielded a batch of 2: 4 samples done
            >>> s.state_dict()["processed"]
            4
        """
        return {"epoch": self.epoch, "processed": self.processed_samples(), "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "dataset_size": self.dataset_size}

    def load_state_dict(self, state: dict) -> None:
        """Resume the epoch of ``state`` (saved on any world size): the samples not yet processed are
        re-partitioned over this sampler's ``num_replicas``, so each is seen exactly once.

        Example::

            >>> old = DistributedSampler(dataset_size=10, num_replicas=2, rank=0, shuffle=False)
            >>> old.record_batch(0, 2)
            >>> new = DistributedSampler(dataset_size=10, num_replicas=3, rank=1, shuffle=False)
            >>> new.load_state_dict(old.state_dict())
            >>> list(new)                       # samples 4..9 over 3 ranks
            [5, 8]
        """
        if int(state.get("dataset_size", self.dataset_size)) != self.dataset_size:
            raise ValueError(f"{type(self).__name__}.load_state_dict: the state is for {state['dataset_size']} "
                             f"samples, this sampler has {self.dataset_size}")
        processed = int(state["processed"])
        if not 0 <= processed <= self.dataset_size:
            # a negative count would resume from the end of the order (Python slicing), silently
            raise ValueError(f"{type(self).__name__}.load_state_dict: 'processed' is {processed}, outside "
                             f"0..{self.dataset_size} (the samples of one epoch): a state of another run?")
        self.epoch = int(state["epoch"])
        self.seed = int(state.get("seed", self.seed))
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.drop_last = bool(state.get("drop_last", self.drop_last))
        self.processed, self._local_done = processed, 0
        self._layout()

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DistributedSampler(dataset_size={self.dataset_size}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, "
                f"epoch={self.epoch}, num_samples={self.num_samples})")


def _as_sized(dataset):
    if isinstance(dataset, (int, np.integer)):
        return range(int(dataset))
    if not hasattr(dataset, "__len__"):
        raise TypeError(f"DistributedSampler: dataset must have len() (got {type(dataset).__name__}); "
                        "or pass dataset_size=N")
    return dataset


# ------------------------------------------------------------------------------------------------
# distributed evaluation
# ------------------------------------------------------------------------------------------------

def _accuracy(output: np.ndarray, target: np.ndarray) -> np.ndarray:
    return (output.argmax(axis=-1) == target.reshape(output.shape[:-1])).astype(np.float64)


def _cross_entropy(output: np.ndarray, target: np.ndarray) -> np.ndarray:
    logits = output.astype(np.float64).reshape(-1, output.shape[-1])
    shifted = logits - logits.max(axis=1, keepdims=True)
    logz = np.log(np.exp(shifted).sum(axis=1))
    t = target.reshape(-1).astype(np.int64)
    per = logz - shifted[np.arange(len(t)), t]
    return per.reshape(output.shape[:-1])


_BUILTIN_METRICS: dict[str, Callable] = {
    "accuracy": _accuracy,
    "acc": _accuracy,
    "cross_entropy": _cross_entropy,
    "loss": _cross_entropy,
}

def _metric_table(metric: str | Callable | Sequence[str | Callable]) -> dict[str, Callable]:
    items = [metric] if isinstance(metric, str) or callable(metric) else list(metric)
    table: dict[str, Callable] = {}
    for m in items:
        if isinstance(m, str):
            if m not in _BUILTIN_METRICS:
                raise ValueError(f"distributed_evaluate: unknown metric {m!r}; use one of "
                                 f"{sorted(_BUILTIN_METRICS)} or a callable(output, target) -> per-sample array")
            table[m] = _BUILTIN_METRICS[m]
        elif callable(m):
            table[getattr(m, "__name__", f"metric{len(table)}")] = m
        else:
            raise TypeError(f"distributed_evaluate: metric must be a name or a callable, got {m!r}")
    return table


def _split_data(data):
    """(inputs, targets, n, fetch) for a (X, y) pair of arrays or a map-style dataset."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and hasattr(data[0], "shape"):
        x, y = to_host(data[0]), to_host(data[1])
        if len(x) != len(y):
            raise ValueError(f"distributed_evaluate: inputs have {len(x)} rows but targets {len(y)}")
        return len(x), lambda idx: (x[idx], y[idx])
    if gathers_like_getitem(data):   # (not any get_batch: a subclass's __getitem__ may transform rows)
        return len(data), lambda idx: tuple(to_host(a) for a in data.get_batch(idx))
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        def fetch(idx):
            items = [data[int(i)] for i in idx]
            return (np.stack([to_host(it[0]) for it in items]), np.stack([to_host(it[1]) for it in items]))
        return len(data), fetch
    raise TypeError("distributed_evaluate: data must be an (inputs, targets) pair of arrays or a "
                    f"dataset of (input, target) items, got {type(data).__name__}")


def distributed_evaluate(model, data, metric: str | Callable | Sequence[str | Callable] = "accuracy", batch_size: int = 256,
                         group=None) -> dict[str, float]:
    """Evaluate ``model`` over **exactly** the real samples of ``data``, split across ranks.

    Rank ``r`` of a group of ``R`` evaluates samples ``r, r+R, r+2R, ...`` (no padding, so
    counts may differ by one between ranks), then one all-reduce sums ``(count, metric sums)``.
    Every rank returns the same dict: ``{"<metric>": mean over all samples, ..., "num_samples": N}``.
    All ranks of ``group`` must call it (it is a collective).

    Args:
        model: a ``Module``, ``FullyShardedDataParallel`` or ``DistributedDataParallel`` (its
            ``.module`` is used: evaluation needs no gradient hooks). Run in eval mode under ``no_grad``; its mode is restored.
        data: ``(inputs, targets)`` arrays, or a dataset of ``(input, target)`` items.
        metric: ``"accuracy"``, ``"cross_entropy"`` (alias ``"loss"``), a callable
            ``fn(output_array, target_array) -> per-sample values``, or a list of those.
        batch_size: samples per forward pass on each rank.
        group: process group (default: the default group, or a world of one).

    Example::

        stats = distributed_evaluate(model, (X_test, y_test), ["accuracy", "loss"])
        stats["accuracy"], stats["num_samples"]          # e.g. (0.97, 359), the same on every rank
    """
    from neural_arch.core.tensor import Tensor, no_grad

    metrics = _metric_table(metric)
    n, fetch = _split_data(data)
    rank, size = _group_rank_and_size(group)
    from neural_arch.distributed.ddp.distributed_data_parallel import DistributedDataParallel

    # DDP only: its forward may broadcast buffers (a collective per batch, and ranks may run different
    # numbers of batches); FSDP must stay wrapped, or its root unit never gathers its parameters
    net = model.module if isinstance(model, DistributedDataParallel) else model
    mine = np.arange(rank, n, size, dtype=np.int64)
    totals = np.zeros(1 + len(metrics), dtype=np.float64)  # [count, sum of each metric]
    first = next(iter(net.parameters()), None) if hasattr(net, "parameters") else None
    device = first.device if first is not None else None  # inputs go where the model lives
    was_training = getattr(net, "training", False)
    if hasattr(net, "eval"):
        net.eval()
    try:
        with no_grad():
            for start in range(0, len(mine), int(batch_size)):
                x, y = fetch(mine[start:start + int(batch_size)])
                out = net(Tensor(x, device=device))
                out = to_host(out)  # a Tensor on any device -> NumPy (one transfer per batch)
                totals[0] += len(x)
                for i, fn in enumerate(metrics.values()):
                    totals[1 + i] += float(np.sum(fn(out, y)))
    finally:
        if was_training and hasattr(net, "train"):
            net.train()
    if size > 1:
        from neural_arch.distributed import groups as _group
        from neural_arch.distributed.comm import ReduceOp

        _group._resolve_group(group).backend.allreduce(totals, ReduceOp.SUM)
    count = totals[0]
    result = {name: (totals[1 + i] / count if count else float("nan")) for i, name in enumerate(metrics)}
    result["num_samples"] = round(count)
    return result
