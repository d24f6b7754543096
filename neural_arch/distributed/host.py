"""Which machine am I on: the one notion of "same host" every layer uses.

Two processes are on the same host when they see the same hostname and kernel boot id; the
transports decide shared memory from it, ``groups`` and ``topology`` count nodes with it, the
hierarchical all-reduce forms its host groups with it. ``NEURAL_ARCH_HOST_ID`` overrides it (to
split one machine into simulated hosts in tests, or to tell apart containers that do *not* share
``/dev/shm``); :func:`machine_identity` ignores that override (the physical machine).

Example::

    >>> host_identity() == host_identity()
    True
    >>> machine_identity().count("/")
    1
"""

from __future__ import annotations

import socket

from neural_arch import config

__all__ = ["HOST_ID_ENV", "host_identity", "machine_identity"]

HOST_ID_ENV = "NEURAL_ARCH_HOST_ID"


def host_identity() -> str:
    """Same string on two processes <=> same host (hostname + kernel boot id, or ``NEURAL_ARCH_HOST_ID``).

    Example::

        >>> host_identity() == host_identity()
        True
    """
    forced = (config.get(HOST_ID_ENV) or "").strip()
    return forced or machine_identity()


def machine_identity() -> str:
    """This physical machine: hostname + kernel boot id, *ignoring* ``NEURAL_ARCH_HOST_ID`` (which
    only splits a machine into simulated hosts).

    Example::

        >>> hostname, boot_id = machine_identity().split("/")
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"
