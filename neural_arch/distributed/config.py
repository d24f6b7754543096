"""Every ``NEURAL_ARCH_*`` environment variable: the settings table, at its distributed import path.

The table itself lives in :mod:`neural_arch.config` (standard library only, so ``core`` and
``profiler`` read their settings without importing ``neural_arch.distributed``); this module
re-exports it, and ``python -m neural_arch.distributed.config`` prints ``docs/configuration.md``.

Example::

    >>> get("NEURAL_ARCH_TIMEOUT", {"NEURAL_ARCH_TIMEOUT": "30"})
    30.0
    >>> "NEURAL_ARCH_BACKEND" in {v.name for v in VARIABLES}
    True
"""

from __future__ import annotations

from neural_arch.config import VARIABLES, EnvVar, get, markdown_document, markdown_table

__all__ = ["VARIABLES", "EnvVar", "get", "markdown_document", "markdown_table"]

if __name__ == "__main__":  # pragma: no cover - printing
    print(markdown_document(), end="")
