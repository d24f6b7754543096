"""Datasets and the DataLoader (``from neural_arch.data import DataLoader, TensorDataset``).

Example::

    >>> import numpy as np
    >>> from neural_arch.data import DataLoader, TensorDataset
    >>> loader = DataLoader(TensorDataset(np.zeros((6, 3)), np.arange(6)), batch_size=4)
    >>> [tuple(x.shape) for x, _ in loader]
    [(4, 3), (2, 3)]
"""

from neural_arch.data.dataloader import DataLoader, default_collate
from neural_arch.data.dataset import Dataset, Subset, TensorDataset
from neural_arch.data.datasets import load_digits, make_classification_data, make_token_sequences

__all__ = [
    "Dataset", "TensorDataset", "Subset", "DataLoader", "default_collate",
    "load_digits", "make_classification_data", "make_token_sequences",
]
