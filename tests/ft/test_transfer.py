"""The heal's wire format: the skeleton in a head of a fixed size or of the size the receiver asked for
(with the first bundle when it fits),
small arrays in bundles, large ones raw, and ``into`` receives in place into the receiver's own
arrays (no process group: a pipe of two ends in one process)."""

import numpy as np
import pytest

from neural_arch.distributed.ft import transfer
from neural_arch.distributed.ft.transfer import inline_offset, plan_messages, recv_state, send_state


class Pipe:
    """What one end sends, the other receives, in order; counts the messages."""

    def __init__(self):
        self.queue, self.messages = [], 0

    def send(self, array, dst, tag=0):
        self.queue.append(np.array(array, copy=True))
        self.messages += 1

    def recv(self, array, src, tag=0):
        got = self.queue.pop(0)
        assert got.shape == array.shape and got.dtype == array.dtype
        array[...] = got


def test_small_arrays_share_a_message_large_ones_go_raw_into_the_receivers_own_arrays(monkeypatch):
    monkeypatch.setattr(transfer, "SMALL_BYTES", 256)
    monkeypatch.setattr(transfer, "BUNDLE_BYTES", 512)
    rng = np.random.default_rng(0)
    big = rng.normal(size=(8, 8))                                   # 512 bytes: raw
    small = [rng.normal(size=3), np.arange(5, dtype=np.int16), np.float32(2.5) * np.ones((2, 2), np.float32),
             rng.normal(size=20)]                                    # 24 + 10 + 16 + 160 bytes: bundled
    state = {"user": {"w": big, "b": small[:2], "opt": {"m": small[2], "v": small[3], "step": 7},
                      "empty": np.zeros((0, 3))}, "step": 4}
    plan = plan_messages([a.nbytes for a in (big, *small)], small=256, bundle=512)
    assert plan == [("bundle", [(1, 0), (2, 64), (3, 128), (4, 192)], 352), ("raw", 0)]

    mine_w, mine_v = np.zeros((8, 8)), np.zeros(20)
    into = {"user": {"w": mine_w, "opt": {"m": np.zeros((2, 2)), "v": mine_v}}}   # m: other dtype -> not used
    pipe = Pipe()
    send_state(pipe, state, dst=1)
    got = recv_state(pipe, src=0, into=into)
    assert not pipe.queue and pipe.messages == 1 + 1                # the head (skeleton + the bundle), one raw
    assert got["user"]["w"] is mine_w and got["user"]["opt"]["v"] is mine_v
    assert np.array_equal(mine_w, big) and np.array_equal(mine_v, small[3])
    assert got["user"]["opt"]["m"].dtype == np.float32 and np.array_equal(got["user"]["opt"]["m"], small[2])
    assert got["user"]["b"][1].dtype == np.int16 and np.array_equal(got["user"]["b"][1], small[1])
    assert got["user"]["empty"].shape == (0, 3) and got["step"] == 4 and got["user"]["opt"]["step"] == 7


def test_a_small_state_is_one_message_and_a_long_skeleton_or_a_large_bundle_travels_after_the_head():
    rng = np.random.default_rng(1)
    tiny = {"user": {"b": rng.normal(size=4), "step": 3, "pos": np.arange(2)}, "step": 9}
    pipe = Pipe()
    sent = send_state(pipe, tiny, dst=1)
    assert pipe.messages == 1 and sent == transfer.HEAD_BYTES       # skeleton and both arrays in the head
    got = recv_state(pipe, src=0, into={"user": {"b": np.zeros(4)}})
    assert np.array_equal(got["user"]["b"], tiny["user"]["b"]) and np.array_equal(got["user"]["pos"], [0, 1])
    assert got["step"] == 9 and got["user"]["step"] == 3

    # hundreds of small arrays: the skeleton outgrows the head (its rest follows), the bundle goes alone
    many = {"user": [rng.normal(size=i % 5) for i in range(400)], "step": 1, "name": "x" * 5000}
    pipe = Pipe()
    send_state(pipe, many, dst=1)
    assert pipe.messages == 3                                       # head, the skeleton's rest, one bundle
    got = recv_state(pipe, src=0)
    assert not pipe.queue and got["name"] == many["name"]
    assert all(np.array_equal(a, b) for a, b in zip(got["user"], many["user"]))
    # a bundle larger than the head's room travels on its own; a plan that starts raw has nothing inline
    assert inline_offset(plan_messages([8, 16]), 100) == 128
    assert inline_offset(plan_messages([4000]), 100) is None and inline_offset(plan_messages([1 << 20]), 10) is None


def test_a_head_sized_by_the_receivers_own_state_carries_every_small_array_in_one_message():
    rng = np.random.default_rng(2)
    layout = {"w": np.zeros(1000), "m": [np.zeros(1000), np.zeros(3, np.float32)], "pos": 5}   # 8 KiB of small arrays
    live = {"user": {"w": rng.normal(size=1000), "m": [rng.normal(size=1000), np.ones(3, np.float32)], "pos": 9},
            "step": 12}
    head = transfer.head_bytes_for({"user": layout, "step": 0})     # the replacement's own state
    assert transfer.HEAD_BYTES < head <= transfer.MAX_HEAD_BYTES
    pipe = Pipe()
    sent = send_state(pipe, live, dst=1, head_bytes=head)
    assert pipe.messages == 1 and sent == head                       # skeleton and both bundled arrays in the head
    mine = np.zeros(1000)
    got = recv_state(pipe, src=0, into={"user": {"w": mine}}, head_bytes=head)
    assert got["user"]["w"] is mine and np.array_equal(mine, live["user"]["w"])
    assert np.array_equal(got["user"]["m"][0], live["user"]["m"][0]) and got["user"]["m"][1].dtype == np.float32
    assert got["step"] == 12 and got["user"]["pos"] == 9

    # the healer's layout differs (a bigger state than the replacement predicted): what does not fit follows
    bigger = {"user": {"w": rng.normal(size=3000), "extra": [rng.normal(size=50) for _ in range(40)]}, "step": 1}
    pipe = Pipe()
    send_state(pipe, bigger, dst=1, head_bytes=head)
    assert pipe.messages == 2                                        # the head (skeleton), then the bundle
    got = recv_state(pipe, src=0, head_bytes=head)
    assert not pipe.queue and np.array_equal(got["user"]["w"], bigger["user"]["w"])
    assert all(np.array_equal(a, b) for a, b in zip(got["user"]["extra"], bigger["user"]["extra"]))
    # a large array travels raw whatever the head; a head outside the bounds is refused before any I/O
    assert transfer.head_bytes_for({"w": np.zeros(1 << 20)}) == transfer.HEAD_BYTES
    for bad in (0, transfer.MAX_HEAD_BYTES + 1):
        with pytest.raises(ValueError, match="head_bytes"):
            send_state(Pipe(), live, dst=1, head_bytes=bad)
