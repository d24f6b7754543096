"""torch's ``Generator``: a seeded random stream of its own, passed as ``generator=`` to the
random functions (``randn``, ``randint``, ``multinomial``...), independent of the global stream
of :mod:`.rng`.

Example::

    >>> import neural_arch as na
    >>> g = na.Generator().manual_seed(0)
    >>> na.randint(0, 10, (3,), generator=g).tolist() == na.randint(
    ...     0, 10, (3,), generator=na.Generator().manual_seed(0)).tolist()
    True
"""

from __future__ import annotations

import json
import secrets

import numpy as np

from neural_arch import backend as _backend
from neural_arch.core.tensor import Tensor

__all__ = ["Generator"]

#: torch's seed for a fresh ``torch.Generator()``: fresh generators are deterministic, not random.
_DEFAULT_GENERATOR_SEED = 67280421310721
_UINT64 = 1 << 64


class Generator:
    """A seeded random stream of its own (``torch.Generator``), independent of the global one.

    Pass it as ``generator=`` to :func:`~neural_arch.randn`, ``rand``, ``randint``, ``randperm``,
    ``multinomial`` and the ``*_like`` functions. It wraps a ``numpy.random.Generator``; draws are
    made on the host, so one seed gives the same numbers whatever the ``device`` (values differ
    from torch's: same seed, different algorithm). As in torch, a fresh ``Generator()`` starts
    from a fixed seed (:meth:`initial_seed`), so two fresh generators give the same draws.

    Example::

        >>> import neural_arch as na
        >>> g = na.Generator().manual_seed(42)
        >>> a = na.randn(3, generator=g)
        >>> g.manual_seed(42) is g
        True
        >>> na.randn(3, generator=g).tolist() == a.tolist()
        True
        >>> state = g.get_state()
        >>> b = na.rand(2, generator=g)
        >>> _ = g.set_state(state)
        >>> na.rand(2, generator=g).tolist() == b.tolist()
        True
    """

    def __init__(self, device="cpu") -> None:
        self.device = _backend.parse_device(device)
        self.manual_seed(_DEFAULT_GENERATOR_SEED)

    def manual_seed(self, seed: int) -> Generator:
        """Reseed this generator and return it (so ``Generator().manual_seed(0)`` chains).

        Negative seeds are taken modulo 2**64, as torch does.

        Example::

            >>> from neural_arch.core.generator import Generator
            >>> Generator().manual_seed(-1).initial_seed() == 2**64 - 1
            True
        """
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed(seed): seed must be an int, got {type(seed).__name__}")
        seed = int(seed)
        if not -(_UINT64 >> 1) <= seed < _UINT64:
            raise RuntimeError(f"Overflow when unpacking long: seed {seed} is outside "
                               f"[-2**63, 2**64)")
        self._seed = seed % _UINT64
        self._stream = np.random.default_rng(self._seed)
        return self

    def seed(self) -> int:
        """Reseed from the operating system's entropy and return the new seed.

        Example::

            >>> from neural_arch.core.generator import Generator
            >>> g = Generator()
            >>> g.seed() == g.initial_seed()
            True
        """
        self.manual_seed(secrets.randbits(63))
        return self._seed

    def initial_seed(self) -> int:
        """The seed this generator was last seeded with.

        Example::

            >>> from neural_arch.core.generator import Generator
            >>> Generator().manual_seed(3).initial_seed()
            3
        """
        return self._seed

    def get_state(self):
        """The generator's state as a ``uint8`` tensor (torch's ``ByteTensor``), for :meth:`set_state`.

        Example::

            >>> from neural_arch.core.generator import Generator
            >>> Generator().get_state().dtype
            dtype('uint8')
        """
        # JSON, not pickle: a state read back from a checkpoint can never run code.
        blob = json.dumps({"seed": self._seed, "bit_generator": self._stream.bit_generator.state})
        return Tensor(np.frombuffer(blob.encode(), dtype=np.uint8).copy())

    def set_state(self, new_state) -> Generator:
        """Restore a state from :meth:`get_state` and return the generator.

        Example::

            >>> from neural_arch.core.generator import Generator
            >>> g = Generator()
            >>> state = g.get_state()
            >>> g.set_state(state) is g
            True
        """
        data = getattr(new_state, "data", new_state)
        arr = np.asarray(data)
        if arr.dtype != np.uint8 or arr.ndim != 1:
            raise TypeError(f"set_state(new_state): expected a 1-d uint8 tensor from get_state(), "
                            f"got dtype {arr.dtype} with {arr.ndim} dimension(s)")
        try:
            state = json.loads(arr.tobytes().decode())
            rng = np.random.default_rng()
            rng.bit_generator.state = state["bit_generator"]
            seed_value = int(state["seed"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"set_state(new_state): not a state made by Generator.get_state() "
                               f"({exc})") from None
        self._stream, self._seed = rng, seed_value
        return self

    def __repr__(self) -> str:
        return f"Generator(device={str(self.device)!r}, initial_seed={self._seed})"
