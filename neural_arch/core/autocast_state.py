"""Autocast's per-thread state, kept in the core so layers below ``amp`` can read and restore it.

``neural_arch.amp.autocast`` opens *regions*; each thread has its own stack of them (torch's
autocast state is thread-local too), innermost last, each ``(enabled, dtype)``. Code that must
replay a forward exactly -- activation checkpointing recomputes it inside backward, where the
user's ``with autocast(...)`` block is long closed -- reads the region open at the first run with
:func:`current` and reopens it with :func:`restore`. Opening a region needs ``amp`` (it installs
the casting wrappers), which sits above this module: ``amp`` registers its opener here when it
is imported; before that no region can exist, so there is nothing to restore.

Example::

    >>> from neural_arch.core import autocast_state
    >>> autocast_state.current() is None          # no region open in this thread
    True
    >>> with autocast_state.restore(None):         # "as it was": no region, nothing to undo
    ...     autocast_state.current() is None
    True
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["current", "regions", "register_opener", "restore"]

_local = threading.local()
_opener = None      # amp's ``autocast(device_type, dtype=, enabled=)``, registered at its import


def regions() -> list:
    """This thread's open regions, innermost last: ``(enabled, dtype)`` each (the list itself).

    Example::

        >>> regions()
        []
    """
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current():
    """The innermost region open in this thread as ``(enabled, dtype)``, or None.

    Example::

        >>> current() is None
        True
    """
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def register_opener(opener) -> None:
    """Called by ``neural_arch.amp.autocast_mode`` at import: how :func:`restore` opens a region.

    Example::

        >>> from neural_arch.amp.autocast_mode import autocast
        >>> register_opener(autocast)      # what importing amp does
    """
    global _opener
    _opener = opener


def restore(state):
    """A context in which autocast is as ``state`` (from :func:`current`) says, whatever regions
    are open around it: that region reopened, or, for None, any enabled region switched off.

    Example::

        >>> with restore(None):
        ...     current() is None
        True
    """
    if state is not None:
        enabled, dtype = state
        # a region's casts do not depend on its device type; "cpu" accepts both lower dtypes
        return _opener("cpu", dtype=dtype, enabled=enabled)
    now = current()
    if now is not None and now[0]:
        return _opener("cpu", dtype=now[1], enabled=False)
    return contextlib.nullcontext()
