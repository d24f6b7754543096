"""Small built-in data sets: scikit-learn's digits, and two synthetic generators.

* :func:`load_digits` -- 1,797 8x8 handwritten digits bundled with scikit-learn (no download).
* :func:`make_classification_data` -- Gaussian blobs, one per class.
* :func:`make_token_sequences` -- a learnable next-token task for language-model tests.

Example::

    >>> from neural_arch.data import make_token_sequences
    >>> x, y = make_token_sequences(4, seq_len=8, vocab_size=10, seed=0)
    >>> x.shape, y.shape, bool((x[:, 1:] == y[:, :-1]).all())
    ((4, 8), (4, 8), True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["load_digits", "make_classification_data", "make_token_sequences"]


def load_digits(test_size: float = 0.2, seed: int = 0, dtype=np.float32):
    """The scikit-learn digits data set, scaled to [0, 1] and split into train and test.

    Returns ``(X_train, y_train, X_test, y_test)``: ``X`` of shape ``(n, 64)`` and ``dtype``,
    ``y`` int64 class labels 0..9. The split is stratified (each class split in the same
    proportion) and fixed by ``seed``; with the defaults 1,438 train and 359 test samples.

    Raises ImportError when scikit-learn is missing: ``pip install neural_arch[examples]``.

    Example::

        >>> from neural_arch.data.datasets import load_digits
        >>> X_train, y_train, X_test, y_test = load_digits()       # needs scikit-learn  # doctest: +SKIP
        >>> X_train.shape, X_test.shape                                                  # doctest: +SKIP
        ((1438, 64), (359, 64))
    """
    try:
        from sklearn.datasets import load_digits as _sk_load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_digits needs scikit-learn (it ships the data set); install the examples extra: "
            "pip install neural_arch[examples]"
        ) from exc
    if not 0.0 < float(test_size) < 1.0:
        raise ValueError(f"load_digits: test_size must be in (0, 1), got {test_size}")
    bunch = _sk_load_digits()
    x = (bunch.data / 16.0).astype(dtype)  # pixels are 0..16 in the original
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test_idx = []
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        test_idx.append(members[: int(round(len(members) * test_size))])
    test_mask = np.zeros(len(y), dtype=bool)
    test_mask[np.concatenate(test_idx)] = True
    train = rng.permutation(np.flatnonzero(~test_mask))
    test = np.flatnonzero(test_mask)
    return x[train], y[train], x[test], y[test]


def make_classification_data(n_samples: int = 1000, n_features: int = 20, n_classes: int = 4,
                             seed: int = 0, class_sep: float = 1.0, dtype=np.float32):
    """Gaussian blobs: class centres ~ N(0, class_sep**2), samples = centre + N(0, 1).

    Returns ``(X, y)``: ``X`` of shape ``(n_samples, n_features)`` and ``dtype``, ``y`` int64 in
    ``[0, n_classes)``, classes balanced up to one sample. Deterministic for a given ``seed``.

    Example::

        >>> from neural_arch.data.datasets import make_classification_data
        >>> X, y = make_classification_data(n_samples=100, n_features=5, n_classes=3)
        >>> X.shape, sorted(set(y.tolist()))
        ((100, 5), [0, 1, 2])
    """
    if n_samples <= 0 or n_features <= 0 or n_classes < 2:
        raise ValueError(
            f"make_classification_data: need n_samples > 0, n_features > 0, n_classes >= 2; got "
            f"{n_samples}, {n_features}, {n_classes}"
        )
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, class_sep, size=(n_classes, n_features))
    y = rng.permutation(np.arange(n_samples) % n_classes).astype(np.int64)
    x = centres[y] + rng.normal(size=(n_samples, n_features))
    return x.astype(dtype), y


def make_token_sequences(n_sequences: int, seq_len: int, vocab_size: int, seed: int = 0,
                         task: str = "sum"):
    """A synthetic next-token task with a learnable rule; returns ``(inputs, targets)``.

    Both are int64 arrays of shape ``(n_sequences, seq_len)``; ``targets`` is ``inputs`` shifted
    left by one (the usual language-model setup), so ``targets[:, t]`` is the token after ``inputs[:, t]``.

    Tasks:
        ``"sum"``: two random start tokens, then ``x[t] = (x[t-1] + x[t-2]) % vocab_size``
        (a Fibonacci sequence mod V); every target after the first is predictable from the two
        previous tokens.
        ``"copy"``: a random prefix of length ``k = (seq_len + 1) // 2`` repeated; the second half
        is predictable by attending ``k`` positions back.

    Example::

        >>> from neural_arch.data.datasets import make_token_sequences
        >>> inputs, targets = make_token_sequences(2, 6, vocab_size=10, task="sum")
        >>> inputs.shape, bool((targets[:, :-1] == inputs[:, 1:]).all())
        ((2, 6), True)
    """
    if n_sequences <= 0 or seq_len <= 1 or vocab_size < 2:
        raise ValueError(
            f"make_token_sequences: need n_sequences > 0, seq_len > 1, vocab_size >= 2; got "
            f"{n_sequences}, {seq_len}, {vocab_size}"
        )
    rng = np.random.default_rng(seed)
    total = seq_len + 1
    seq = np.empty((n_sequences, total), dtype=np.int64)
    if task == "sum":
        seq[:, :2] = rng.integers(0, vocab_size, size=(n_sequences, 2))
        for t in range(2, total):
            seq[:, t] = (seq[:, t - 1] + seq[:, t - 2]) % vocab_size
    elif task == "copy":
        k = total // 2
        seq[:, :k] = rng.integers(0, vocab_size, size=(n_sequences, k))
        for t in range(k, total):
            seq[:, t] = seq[:, t - k]
    else:
        raise ValueError(f"make_token_sequences: task must be 'sum' or 'copy', got {task!r}")
    return seq[:, :-1].copy(), seq[:, 1:].copy()
