"""Datasets and the DataLoader (``from neural_arch.data import DataLoader, TensorDataset``).

Example::

    >>> import numpy as np
    >>> from neural_arch.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(np.zeros((6, 3)), np.arange(6)), batch_size=4)
    >>> [tuple(x.shape) for x, _ in loader]
    [(4, 3), (2, 3)]
"""

from neural_arch.data.dataloader import DataLoader, default_collate, default_convert
from neural_arch.data.dataset import (
    ConcatDataset,
    Dataset,
    IterableDataset,
    Subset,
    TensorDataset,
    random_split,
)
from neural_arch.data.datasets import load_digits, make_classification_data, make_token_sequences
from neural_arch.data.sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from neural_arch.data.worker import WorkerInfo, get_worker_info

__all__ = [
    "BatchSampler",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "IterableDataset",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "WeightedRandomSampler",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "load_digits",
    "make_classification_data",
    "make_token_sequences",
    "random_split",
]
