"""Seed 000's ``hardware_abstraction`` names (the seed's ``kernel_pytorch.hardware_abstraction``):
``HardwareAbstractionLayer`` is out of scope (it raises ``NotImplementedError`` saying what to use
instead; see :mod:`neural_arch.distributed.scale.unsupported`).

>>> from neural_arch.distributed.scale.hardware_abstraction import HardwareAbstractionLayer
"""

from __future__ import annotations

from neural_arch.distributed.scale.unsupported import HardwareAbstractionLayer

__all__ = ["HardwareAbstractionLayer"]
