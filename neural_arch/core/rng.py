"""The global random generator used by initialisers and dropout (a ``generator=`` argument picks
another stream: :func:`~neural_arch.core.rng.numpy_generator`; the ``Generator`` objects live in :mod:`.generator`).

Example::

    >>> from neural_arch.core.rng import manual_seed, get_generator
    >>> manual_seed(0)
    >>> a = get_generator().standard_normal(2)
    >>> manual_seed(0)
    >>> bool((a == get_generator().standard_normal(2)).all())
    True
"""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["manual_seed", "get_generator", "numpy_generator", "seed"]

_generator = np.random.default_rng()
_seed = None


def manual_seed(seed: int) -> None:
    """Reseed the global generator (and CuPy's, if CuPy is already imported).

    Everything drawn afterwards (parameter initialisation, dropout masks, shuffling that uses
    :func:`get_generator`) is deterministic.

    Example::

        >>> import neural_arch as na
        >>> na.manual_seed(42)
        >>> first = na.rand(3).tolist()
        >>> na.manual_seed(42)
        >>> na.rand(3).tolist() == first
        True
    """
    global _generator, _seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"manual_seed(seed): seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"manual_seed(seed): seed must be >= 0, got {seed}")
    _seed = int(seed)
    _generator = np.random.default_rng(_seed)
    cp = sys.modules.get("cupy")  # only if someone already paid for importing it
    if cp is not None:
        try:
            cp.random.seed(_seed)
        except Exception:  # no usable GPU: nothing to seed
            pass


def get_generator() -> np.random.Generator:
    """The global ``numpy.random.Generator`` (replaced by each :func:`manual_seed` call).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import get_generator
        >>> na.manual_seed(0)
        >>> type(get_generator()).__name__
        'Generator'
    """
    return _generator


def seed() -> int | None:
    """The last seed given to :func:`manual_seed` (``None`` if never called).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core import rng
        >>> na.manual_seed(7)
        >>> rng.seed()
        7
    """
    return _seed


def numpy_generator(generator=None) -> np.random.Generator:
    """The ``numpy.random.Generator`` to draw from for a ``generator=`` argument.

    ``None`` means the global generator; a :class:`Generator` gives its own stream; a
    ``numpy.random.Generator`` is used as is (accepted before :class:`Generator` existed).

    Example::

        >>> import neural_arch as na
        >>> from neural_arch.core.rng import numpy_generator, get_generator
        >>> numpy_generator(None) is get_generator(), type(numpy_generator(na.Generator())).__name__
        (True, 'Generator')
    """
    if generator is None:
        return _generator
    if isinstance(generator, np.random.Generator):
        return generator
    # A neural_arch.Generator, known by its stream: importing its class here would pull
    # Tensor (its get_state returns one) below the ops that import this module.
    stream = getattr(generator, "_stream", None)
    if isinstance(stream, np.random.Generator):
        return stream
    raise TypeError(f"generator must be a neural_arch.Generator (or a numpy.random.Generator), "
                    f"got {type(generator).__name__}")
