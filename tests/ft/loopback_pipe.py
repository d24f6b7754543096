"""A process group of two ends in one process, for the heal's transfer tests: what one end sends, the
other receives, in order (a copy: no aliasing with the sender).

Example::

    pipe = Pipe()
    send_state(pipe, {"w": np.ones(3)}, dst=1)
    got = recv_state(pipe, src=0)
"""

from __future__ import annotations

import numpy as np


class Pipe:
    """``send``/``recv`` as a process group's point-to-point calls, through a queue."""

    def __init__(self):
        self.queue = []

    def send(self, array, dst, tag=0):
        self.queue.append(np.array(array, copy=True))

    def recv(self, array, src, tag=0):
        got = self.queue.pop(0)
        assert got.shape == array.shape and got.dtype == array.dtype
        array[...] = got
