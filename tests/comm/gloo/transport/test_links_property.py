"""Property tests of the framing/demultiplexing engine (``backends/links.py``), in one process.

Two transports are joined by an in-memory stream that accepts and returns *random* amounts of
bytes per call (so headers and payloads are split at every possible place). Whatever the order of
channels and sizes, every receiver must get exactly its channel's messages, in order.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from neural_arch.distributed.comm.gloo.transport.engine import LinkTransport
from neural_arch.distributed.comm.gloo.transport.framing import Link, PeerGone
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.errors import CollectiveTimeoutError, PeerFailureError

pytestmark = pytest.mark.timeout(120)


class _Pipe(Link):
    """One direction of bytes into ``self.inbox`` of the partner; chunk sizes drawn from ``sizes``."""

    kind = "mem"

    def __init__(self, peer: int, sizes):
        super().__init__(peer)
        self.inbox = bytearray()
        self.partner: _Pipe = None
        self.sizes = sizes
        self.closed = False

    def _chunk(self) -> int:
        return next(self.sizes)

    def write_some(self, views) -> int:
        if self.partner.closed:
            raise PeerGone("partner closed")
        budget, n = self._chunk(), 0
        for v in views:
            take = min(budget - n, v.nbytes)
            self.partner.inbox += v[:take]
            n += take
            if take < v.nbytes:
                break
        return n

    def read_some(self, view) -> int:
        if not self.inbox:
            self.partner.pump_sends()  # "the other process" makes progress meanwhile
        if not self.inbox:
            if self.partner.closed:
                raise PeerGone("partner closed")
            return 0
        n = min(self._chunk(), view.nbytes, len(self.inbox))
        view[:n] = self.inbox[:n]
        del self.inbox[:n]
        return n

    def close(self) -> None:
        self.closed = True


def _pair(chunks):
    it = iter(chunks * 100000)
    a, b = _Pipe(1, it), _Pipe(0, it)
    a.partner, b.partner = b, a
    return LinkTransport(0, 2, {1: a}), LinkTransport(1, 2, {0: b})


def _info(rank, seconds=5.0):
    return OpInfo("prop", 1, [0, 1], rank, deadline=time.monotonic() + seconds)


@given(msgs=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300)), max_size=25),
       chunks=st.lists(st.integers(1, 40), min_size=1, max_size=8),
       order_seed=st.integers(0, 2**16))
def test_every_channel_gets_its_messages_in_order(msgs, chunks, order_seed):
    t0, t1 = _pair(chunks)
    handles = []
    for i, (ch, n) in enumerate(msgs):
        handles.append(t0.isend(1, np.full(n, i % 251, np.uint8), ch, _info(0)))
    # receive channel by channel, in a random channel order: others must be kept aside, in order
    chans = sorted({ch for ch, _ in msgs})
    np.random.default_rng(order_seed).shuffle(chans)
    for ch in chans:
        for i, (c, n) in enumerate(msgs):
            if c != ch:
                continue
            out = np.empty(n, np.uint8)
            t1.recv_into(0, out, ch, _info(1))
            assert (out == i % 251).all()
    for h in handles:
        h.wait()
    assert not any(t1.links[0].stash.values())


@given(chunks=st.lists(st.integers(1, 64), min_size=1, max_size=5), n=st.integers(0, 2000))
def test_sendrecv_both_ways(chunks, n):
    t0, t1 = _pair(chunks)
    a, b = np.arange(n, dtype=np.int16), -np.arange(n, dtype=np.int16)
    h = t1.isend(0, b, 3, _info(1))
    out0 = np.empty(n, np.int16)
    t0.sendrecv(1, a, 1, out0, 3, _info(0))
    out1 = np.empty(n, np.int16)
    t1.recv_into(0, out1, 3, _info(1))
    h.wait()
    assert (out0 == b).all() and (out1 == a).all()


def test_errors_name_the_peer_and_the_op():
    t0, t1 = _pair([7])
    with pytest.raises(CollectiveTimeoutError, match=r"all_gather #4 .* ranks \[1\] did not arrive"):
        t0.recv_into(1, np.empty(3), 0, OpInfo("all_gather", 4, [0, 1], 0, deadline=time.monotonic() + 0.2))
    with pytest.raises(ValueError, match="channel=-1"):
        t0.send(1, np.empty(3), -1, _info(0))
    with pytest.raises(ValueError, match="itself"):
        t0.send(0, np.empty(3), 0, _info(0))
    with pytest.raises(ValueError, match="not C-contiguous"):
        t0.send(1, np.empty((4, 4))[:, 0], 0, _info(0))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty(3)
        ro.flags.writeable = False
        t0.recv_into(1, ro, 0, _info(0))
    t1.links[0].close()
    with pytest.raises(PeerFailureError, match=r"rank 1 failed during prop #1 on rank 0"):
        t0.recv_into(1, np.empty(3), 0, _info(0))
    t0_start = time.monotonic()
    with pytest.raises(PeerFailureError):  # every later op fails at once
        t0.send(1, np.empty(3), 5, _info(0, 30))
    assert time.monotonic() - t0_start < 0.5


class _LoopShm:
    """Two real shared-memory links wired back to back in this process (tiny rings: every frame
    size, wrap-around and the whole-frame fast paths get exercised); a reader that finds its ring
    empty pumps the partner's queued sends, standing in for the other process."""

    def __init__(self, capacity: int):
        import os
        import secrets
        import tempfile

        from neural_arch.distributed.comm.gloo.transport import shm as S

        class Link(S.ShmLink):
            def read_some(self, view):
                n = super().read_some(view)
                if n == 0:
                    self.partner.pump_sends()
                    n = super().read_some(view)
                return n

        base = os.path.join(tempfile.gettempdir(), f"na-prop-{secrets.token_hex(4)}")
        w01, w10 = S._Ring(base + "01", True, capacity), S._Ring(base + "10", True, capacity)
        r01, r10 = S._Ring(base + "01", False), S._Ring(base + "10", False)
        for p in ("01", "10"):
            for suffix in ("", ".d", ".s"):
                os.unlink(base + p + suffix)
        a, b = Link(1, os.getpid(), w01, r10), Link(0, os.getpid(), w10, r01)
        a.partner, b.partner = b, a
        self.t0, self.t1 = LinkTransport(0, 2, {1: a}), LinkTransport(1, 2, {0: b})

    def close(self):
        self.t0.close()
        self.t1.close()


@given(msgs=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3000)), max_size=25),
       capacity=st.sampled_from([4096, 4099, 9000]), order_seed=st.integers(0, 2**16))
def test_shm_fast_paths_keep_every_channel_in_order(msgs, capacity, order_seed):
    loop = _LoopShm(capacity)
    t0, t1 = loop.t0, loop.t1
    try:
        handles = [t0.isend(1, np.full(n, i % 251, np.uint8), ch, _info(0)) for i, (ch, n) in enumerate(msgs)]
        chans = sorted({ch for ch, _ in msgs})
        np.random.default_rng(order_seed).shuffle(chans)
        for ch in chans:
            for i, (c, n) in enumerate(msgs):
                if c == ch:
                    out = np.empty(n, np.uint8)
                    t1.recv_into(0, out, ch, _info(1))
                    assert (out == i % 251).all()
        for h in handles:
            h.wait()
        # and plain send / sendrecv, both ways, through the same (by now wrapped) rings
        for n in (0, 5, 1000, 2500):
            a, b = np.arange(n, dtype=np.uint8), np.arange(n, dtype=np.uint8)[::-1].copy()
            t1.send(0, b, 9, _info(1))
            out0, out1 = np.empty(n, np.uint8), np.empty(n, np.uint8)
            t0.sendrecv(1, a, 1, out0, 9, _info(0))
            t1.recv_into(0, out1, 9, _info(1))
            assert (out0 == b).all() and (out1 == a).all()
        assert not any(t1.links[0].stash.values())
    finally:
        loop.close()


def test_shm_fast_path_never_overtakes_a_stashed_message():
    loop = _LoopShm(4096)
    t0, t1 = loop.t0, loop.t1
    try:
        for value, ch in ((1, 1), (2, 0), (3, 1)):   # all three sit whole in the ring
            t0.send(1, np.full(8, value, np.uint8), ch, _info(0))
        out = np.empty(8, np.uint8)
        t1.recv_into(0, out, 0, _info(1))             # keeps the first channel-1 message aside
        assert (out == 2).all()
        t1.recv_into(0, out, 1, _info(1))             # the stashed one first, not the ring's head
        assert (out == 1).all()
        t1.recv_into(0, out, 1, _info(1))
        assert (out == 3).all()
    finally:
        loop.close()
