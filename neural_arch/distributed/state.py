"""The process-wide distributed state: one owner, imported by every module that reads it.

``init_process_group`` fills it, ``destroy_process_group`` resets it; :mod:`.groups`,
:mod:`.process_group` and :mod:`.info` read it. Kept apart so that none of them needs to
import another late (the cycle this file replaces).

Example::

    >>> from neural_arch.distributed.state import STATE
    >>> STATE.world is None or STATE.world.size() >= 1
    True
"""

from __future__ import annotations

import threading
from typing import Any


class _State:
    """Everything ``init_process_group`` set up, in one place (reset by destroy)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.world = None          # the default ProcessGroup, or None before init
        self.groups: list = []     # every ProcessGroup made by new_group, in creation order
        self.generation = 0
        self.info: dict[str, Any] = {}
        # Stores outlive destroy_process_group(): re-initialising on the same MASTER_PORT then
        # reuses the connection instead of racing a closing server for the port.
        self.stores: dict[tuple, Any] = {}


STATE = _State()
