"""Seed 000's ``hardware_adapter`` path: ``HardwareAdapter`` is out of scope (it raises
``NotImplementedError`` saying what to use instead; see :mod:`neural_arch.distributed.scale.unsupported`).

>>> from neural_arch.distributed.scale.hardware_adapter import HardwareAdapter
"""

from __future__ import annotations

from neural_arch.distributed.scale.unsupported import HardwareAdapter

__all__ = ["HardwareAdapter"]
