"""Exploring properties of fault tolerance's data rules, against plain references (no processes):

* the quorum rule (``plan_quorum``, driven through a ``Lighthouse``): over random runs of replicas
  (heartbeats that stop and resume, requests, joins, commit decisions) the members of a quorum
  never step from different histories, a member that is behind is always healed, and a healer is
  always a live, up-to-date member of the quorum;
* the heal's wire format: random nested states (dicts, lists, tuples, 0-d and empty arrays, many
  dtypes incl. bool, float16 and ml_dtypes' bfloat16, scalars, strings) round trip bitwise, with
  or without ``into``, and ``into`` is filled in place where its layout matches; a Manager whose
  only loader is ``heal_into`` raises when the healer's layout differs (never a partial load).
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from loopback_pipe import Pipe

from neural_arch.distributed import ft
from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.ft import protocol, transfer
from neural_arch.distributed.ft.lighthouse import Lighthouse
from neural_arch.distributed.ft.protocol import encode_request
from neural_arch.distributed.ft.quorum import Quorum, QuorumRequest, plan_quorum
from neural_arch.distributed.ft.transfer import pack_state, recv_state, send_packed, warm_arrays, warm_buffer

# -- the heal's wire format ---------------------------------------------------------------------

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float32,
          np.float64, np.complex64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ">f8", "U3", "M8[s]",
          [("a", "<i4"), ("b", "<f8")]]


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    if draw(st.booleans()):
        shape = tuple(max(1, n) for n in shape)
    if draw(st.integers(0, 6)) == 0:
        shape = (draw(st.integers(300, 1200)),)        # large enough to go raw once SMALL_BYTES is small
    n = int(np.prod(shape))
    raw = np.frombuffer(draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize)), np.uint8)
    out = raw.view(dtype).reshape(shape) if n else np.zeros(shape, dtype)
    if out.ndim == 2 and draw(st.booleans()):
        out = out.T                                     # not C-contiguous
    return out


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.text(max_size=5), st.just(np.float32(2.5)), st.just(np.int64(-3)))
states = st.recursive(st.one_of(arrays(), scalars),
                      lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                              st.dictionaries(st.text(max_size=3), inner, max_size=4)),
                      max_leaves=12)


def assert_bitwise(got, want, path="state"):
    assert type(got) is type(want), (path, type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, (path, got.dtype, want.dtype)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_bitwise(got[k], want[k], f"{path}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bitwise(a, b, f"{path}[{i}]")
    else:
        assert got == want, path             # no NaN among the scalars drawn


def zeros_like_layout(state):
    """A receiver's own state with ``state``'s layout (C-contiguous, writable, zeroed arrays)."""
    if isinstance(state, np.ndarray):
        return np.zeros(state.shape, state.dtype)
    if isinstance(state, dict):
        return {k: zeros_like_layout(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(zeros_like_layout(v) for v in state)
    return state


def arrays_of(state):
    if isinstance(state, np.ndarray):
        return [state]
    if isinstance(state, dict):
        return [a for v in state.values() for a in arrays_of(v)]
    if isinstance(state, (list, tuple)):
        return [a for v in state for a in arrays_of(v)]
    return []


@settings(max_examples=40, deadline=None)
@given(state=states, head=st.sampled_from([None, 64, 512, 70000]), use_into=st.booleans(),
       small=st.sampled_from([None, 256]), buffers=st.booleans())
# extension and structured dtypes travelled as ``dtype.str`` ("<V2", "|V12") and came back as raw void
@example(state={"w": np.ones(3, ml_dtypes.bfloat16)}, head=None, use_into=False, small=None, buffers=False)
@example(state=[np.zeros(2, [("a", "<i4"), ("b", "<f8")])], head=None, use_into=True, small=None, buffers=False)
# a 0-d array (an optimizer's step count) came back with shape (1,)
@example(state=[np.zeros(()), np.zeros((0, 2), np.float16), np.True_], head=64, use_into=True, small=256,
         buffers=False)
# the head received into the caller's (reused) buffer: arrays without a place must not stay views into it
@example(state={"w": np.arange(4.0), "b": np.ones(3, np.float32)}, head=None, use_into=False, small=None,
         buffers=True)
def test_pack_and_recv_state_round_trip_bitwise(state, head, use_into, small, buffers):
    old = transfer.SMALL_BYTES
    transfer.SMALL_BYTES = old if small is None else small      # both ends read the same plan
    size = transfer.HEAD_BYTES if head is None else head
    # the Manager's warm buffers: longer than the head, holding an earlier heal's bytes
    out = warm_buffer(size + 100) if buffers else None
    into_head = np.full(size + 37, 0xAB, np.uint8) if buffers else None
    try:
        pipe = Pipe()
        send_packed(pipe, pack_state({"user": state, "step": 7}, head, out=out), dst=1)
        into = {"user": zeros_like_layout(state)} if use_into else None
        got = recv_state(pipe, src=0, into=into, head_bytes=head, head=into_head)
    finally:
        transfer.SMALL_BYTES = old
    assert not pipe.queue
    assert got["step"] == 7
    if buffers:      # the next heal reuses both buffers: nothing received may change with them
        out[:] = 0x5A
        into_head[:] = 0x5A
    assert_bitwise(got["user"], state)
    if use_into:   # heal in place: every array landed in the receiver's own array of that place
        for mine, received in zip(arrays_of(into["user"]), arrays_of(got["user"])):
            assert mine is received


def test_warm_arrays_keeps_every_value_and_warm_buffer_reuses_what_is_large_enough():
    """``warm_arrays`` runs on a replacement's live state before it knows whether it will be healed:
    it must not change a bit (the kernel maps the pages as they are), whatever the arrays hold."""
    rng = np.random.default_rng(3)
    fresh = np.zeros(1 << 16)                        # 512 KiB never written: the case it is for
    state = {"w": rng.normal(size=(300, 100)), "m": fresh, "small": np.arange(5),
             "view": rng.normal(size=(400, 200))[:, ::2], "ro": np.ones(1 << 14)}
    state["ro"].flags.writeable = False
    before = {k: v.copy() for k, v in state.items()}
    warmed = warm_arrays(state)
    # where the kernel has the advice (Linux 5.14+) the contiguous writable arrays of 64 KiB or more
    assert warmed in (0, state["w"].nbytes + fresh.nbytes)
    for k, v in state.items():
        assert v.tobytes() == before[k].tobytes(), k
    buf = warm_buffer(5000)
    assert buf.dtype == np.uint8 and buf.size == 5000
    assert warm_buffer(4000, buf) is buf and warm_buffer(6000, buf) is not buf
    with pytest.raises(ValueError, match="fewer than the head"):
        pack_state({"w": np.ones(3)}, out=warm_buffer(100))
    with pytest.raises(TypeError, match="uint8"):
        recv_state(Pipe(), src=0, head=np.zeros(transfer.HEAD_BYTES))


def test_a_receiver_whose_layout_differs_gets_the_senders_state_whole_never_a_partial_mix():
    """``into`` only saves memory: where it does not match (shape, dtype, missing key, other nesting)
    the array arrives in new memory and the returned state is still the sender's, complete."""
    state = {"w": np.arange(6.0).reshape(2, 3), "b": np.ones(2, np.float32), "opt": [np.int64(3), np.zeros(4)]}
    into = {"w": np.zeros((3, 2)), "b": np.zeros(2, np.float64), "opt": [np.zeros(4)], "extra": np.zeros(1)}
    pipe = Pipe()
    send_packed(pipe, pack_state(state), dst=1)
    got = recv_state(pipe, src=0, into=into)
    assert_bitwise(got, state)
    assert not np.any(into["w"]) and not np.any(into["b"]) and not np.any(into["opt"][0])   # untouched


# -- the quorum rule, simulated against a real Lighthouse (its store, no replica processes) -------------

class Replica:
    def __init__(self, name):
        self.name, self.history, self.n, self.failed, self.asked = name, (), 0, False, False

    @property
    def step(self):
        return len(self.history)


def simulate(events, min_replicas, init_sync):
    """Replay ``events`` (per round: whose heartbeat moves, who asks, whether the step commits, whether
    a replacement joins) against a ``Lighthouse``'s ``tick``; check the invariants of each quorum."""
    lighthouse = Lighthouse(min_replicas=min_replicas, port=0, join_timeout=0.5, heartbeat_timeout=0.9)
    store = lighthouse.store
    replicas = {}

    def register(name):
        replicas[name] = Replica(name)
        store.set(protocol.member_key(store.add(protocol.MEMBERS, 1) - 1), name.encode())

    try:
        for i in range(3):
            register(f"r{i}")
        for rnd, (beat_bits, ask_bits, commit, join) in enumerate(events):
            if join:
                register(f"j{rnd}")                    # a replacement, at step 0
            for i, m in enumerate(sorted(replicas)):
                r = replicas[m]
                if beat_bits >> (i % 8) & 1 or m == f"j{rnd}":
                    store.add(protocol.heartbeat_key(m), 1)
                    if ask_bits >> (i % 8) & 1 and not r.asked:
                        r.n, r.asked = r.n + 1, True
                        store.set(protocol.request_key(m), encode_request(r.n, r.step, r.failed, min_replicas,
                                                                          init_sync))
            q = lighthouse.tick(float(rnd + 1))
            if q is None:
                continue
            healthy = lighthouse.healthy(float(rnd + 1))
            for m, step in zip(q.members, q.steps):
                assert replicas[m].step == step
                assert step == q.max_step or m in q.heal, "a member behind its quorum is not healed"
            for target, source in q.heal.items():
                assert source in q.members and source in healthy and source not in q.heal
                assert replicas[source].step == q.max_step
            for target, source in q.heal.items():
                replicas[target].history = replicas[source].history
            histories = {replicas[m].history for m in q.members}
            assert len(histories) == 1, f"round {q.round}: members step from different histories {histories}"
            store.set(protocol.commit_key(q.round), b"1" if commit else b"0")
            for m in q.members:
                r = replicas[m]
                r.asked, r.failed = False, not commit
                if commit:
                    r.history = r.history + (q.round,)
    finally:
        lighthouse.stop()


@settings(max_examples=30, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255), st.booleans(),
                                 st.integers(0, 5).map(lambda x: x == 0)), min_size=1, max_size=12),
       min_replicas=st.integers(1, 2), init_sync=st.booleans())
# r1 steps alone while r0's heartbeat lapses, then r0 alone while r1's lapses: both at step 1 with
# other weights; they then stepped together with no heal (a silent divergence) before rule 6
@example(events=[(7, 0, False, False), (2, 2, True, False), (1, 1, True, False), (3, 3, True, False)],
         min_replicas=1, init_sync=False)
def test_lighthouse_never_steps_two_histories_together_and_always_heals_the_behind(events, min_replicas, init_sync):
    simulate(events, min_replicas, init_sync)


@settings(max_examples=40, deadline=None)
@given(steps=st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 4), min_size=1),
       dead=st.sets(st.sampled_from("abcdef")), init_sync=st.booleans())
def test_plan_quorum_heals_from_a_live_up_to_date_member_only(steps, dead, init_sync):
    requests = {m: QuorumRequest(m, 1, s, since=0.0, init_sync=init_sync) for m, s in steps.items()}
    healthy = set(steps) - dead
    q = plan_quorum(requests, healthy, None, 1, join_timeout=1.0, now=0.0)
    if not healthy:
        assert q is None
        return
    assert set(q.members) == healthy
    top = max(steps[m] for m in healthy)
    assert q.max_step == top
    for source in q.heal.values():
        assert source in healthy and steps[source] == top and source not in q.heal
    assert {m for m in healthy if steps[m] < top} <= set(q.heal)


# -- a heal that only ``heal_into`` loads ------------------------------------------------------------

def healing_manager(into_state, load_state_dict=None):
    """A Manager as ``_heal`` sees it (no lighthouse, no group): its group is a Pipe."""
    m = object.__new__(ft.Manager)
    m.member, m._step, m._torn, m.heals, m.heal_bytes_received, m.timings = "b", 0, False, 0, 0, {}
    m._heal_into, m._load_state_dict, m._pg = (lambda: into_state), load_state_dict, Pipe()
    m._head_buffer, m._packing = None, None
    return m


def test_a_heal_with_only_heal_into_loads_everything_in_place_or_says_what_it_cannot():
    q = Quorum(1, 1, ("a", "b"), (2, 0), heal={"b": "a"})
    healer = {"w": np.arange(3.0), "opt": {"m": np.ones(2, np.float32)}, "lr": 0.5}
    mine = {"w": np.zeros(3), "opt": {"m": np.zeros(2, np.float32)}, "lr": 0.5}
    m = healing_manager(mine)
    send_packed(m._pg, pack_state({"user": healer, "step": 2}), dst=1)
    m._heal(q)
    assert m.current_step() == 2 and np.array_equal(mine["w"], healer["w"]) and np.all(mine["opt"]["m"] == 1)
    # the receiver's m is float64, the healer's float32: before, the heal dropped it (and took step 2)
    for other in ({"w": np.zeros(3), "opt": {"m": np.zeros(2)}, "lr": 0.5},        # another dtype
                  {"w": np.zeros(3), "lr": 0.5},                                    # a missing key
                  {"w": np.zeros(3), "opt": {"m": np.zeros(2, np.float32)}, "lr": 0.1}):   # a scalar differs
        m = healing_manager(other)
        send_packed(m._pg, pack_state({"user": healer, "step": 2}), dst=1)
        with pytest.raises(DistributedError, match="heal_into"):
            m._heal(q)
        assert m.current_step() == 0
    with pytest.raises(ValueError, match="load_state_dict"):   # nothing would load a heal
        ft.Manager(state_dict=lambda: healer, lighthouse_addr="127.0.0.1:1")
