"""The quorum rule (``plan_quorum``) as plain data, and the heal's wire format: no processes."""

import numpy as np
from loopback_pipe import Pipe

from neural_arch.distributed.ft.protocol import decode_request, encode_request
from neural_arch.distributed.ft.quorum import Quorum, QuorumRequest, plan_quorum
from neural_arch.distributed.ft.transfer import recv_state, send_state


def reqs(steps: dict, since: float = 0.0, **flags) -> dict:
    return {m: QuorumRequest(m, n=1, step=s, since=since, **flags.get(m, {})) for m, s in steps.items()}


def test_everyone_healthy_asked_gives_one_quorum_and_it_is_kept_while_members_stay():
    first = plan_quorum(reqs({"b": 1, "a": 1, "c": 1}), {"a", "b", "c"}, None, 2, 1.0, now=0.0)
    assert (first.round, first.quorum_id, first.members, first.heal) == (1, 1, ("a", "b", "c"), {})
    again = plan_quorum(reqs({"a": 1, "b": 1, "c": 1}), {"a", "b", "c"}, first, 2, 1.0, now=0.1)
    assert (again.round, again.quorum_id) == (2, 1)                    # same group, next round
    redo = plan_quorum(reqs({"a": 1, "b": 1, "c": 1}, b={"reconfigure": True}), {"a", "b", "c"}, again, 2, 1.0, 0.2)
    assert (redo.round, redo.quorum_id) == (3, 2)                      # b's last step failed: a fresh group


def test_a_dead_member_is_dropped_and_its_request_ignored():
    prev = Quorum(4, 3, ("a", "b", "c"), (5, 5, 5))
    q = plan_quorum(reqs({"a": 5, "b": 5, "c": 5}), {"a", "c"}, prev, 2, 1.0, now=0.0)
    assert q.members == ("a", "c") and q.quorum_id == 4


def test_a_healthy_member_that_does_not_ask_is_waited_for_join_timeout_then_left_out():
    requests = reqs({"a": 2, "c": 2}, since=10.0)
    assert plan_quorum(requests, {"a", "b", "c"}, None, 2, join_timeout=1.0, now=10.5) is None
    q = plan_quorum(requests, {"a", "b", "c"}, None, 2, join_timeout=1.0, now=11.0)
    assert q.members == ("a", "c")


def test_too_few_replicas_wait_and_a_request_can_raise_the_floor():
    assert plan_quorum(reqs({"a": 0}), {"a"}, None, 2, 1.0, now=5.0) is None
    assert plan_quorum(reqs({"a": 0, "b": 0}, a={"min_replicas": 3}), {"a", "b"}, None, 1, 1.0, 9.0) is None
    assert plan_quorum({}, {"a"}, None, 1, 1.0, 9.0) is None


def test_members_behind_heal_from_up_to_date_ones_round_robin():
    q = plan_quorum(reqs({"a": 5, "b": 5, "c": 0, "d": 0, "e": 3}), set("abcde"), None, 1, 1.0, 0.0)
    assert q.max_step == 5 and q.heal == {"c": "a", "d": "b", "e": "a"}
    assert Quorum.from_json(q.to_json()) == q and q.rank_of("d") == 3


def test_at_step_zero_everyone_takes_the_first_members_state_unless_seeded_alike():
    q = plan_quorum(reqs({"b": 0, "a": 0, "c": 0}), set("abc"), None, 1, 1.0, 0.0)
    assert q.heal == {"b": "a", "c": "a"}
    flags = {m: {"init_sync": False} for m in "abc"}
    assert plan_quorum(reqs({"b": 0, "a": 0, "c": 0}, **flags), set("abc"), None, 1, 1.0, 0.0).heal == {}


def test_requests_round_trip_through_the_store_encoding():
    r = decode_request("m", encode_request(4, 9, True, 2), since=1.5)
    assert r == QuorumRequest("m", 4, 9, 1.5, True, 2, True)

def test_a_state_crosses_as_raw_arrays_plus_a_skeleton():
    rng = np.random.default_rng(0)
    state = {"user": {"model": {"w": rng.normal(size=(3, 2)), "b": np.zeros(0)},
                      "optim": {"state": {0: {"step": 4, "exp_avg": rng.normal(size=(3, 2)).T}},
                                "param_groups": [{"lr": 0.1, "params": [0]}]},
                      "rng": np.random.default_rng(7).bit_generator.state, "ints": np.arange(5, dtype=np.int32)},
             "step": 12}
    pipe = Pipe()
    sent = send_state(pipe, state, dst=1)
    assert sent >= 3 * 2 * 8 * 2 + 5 * 4
    got = recv_state(pipe, src=0)
    assert not pipe.queue and got["step"] == 12
    assert np.array_equal(got["user"]["model"]["w"], state["user"]["model"]["w"])
    assert got["user"]["model"]["b"].shape == (0,)
    assert np.array_equal(got["user"]["optim"]["state"][0]["exp_avg"], state["user"]["optim"]["state"][0]["exp_avg"])
    assert got["user"]["ints"].dtype == np.int32 and got["user"]["rng"] == state["user"]["rng"]


def test_the_lighthouse_reads_requests_from_its_store_and_forgets_old_rounds():
    from neural_arch.distributed.ft import protocol
    from neural_arch.distributed.ft.lighthouse import KEEP_ROUNDS, Lighthouse

    lighthouse = Lighthouse(min_replicas=2, heartbeat_timeout=1.0, join_timeout=1.0)   # ticked by hand
    store = lighthouse.store
    try:
        for i, member in enumerate(("b", "a")):
            store.add(protocol.MEMBERS, 1)
            store.set(protocol.member_key(i), member)
        rounds = KEEP_ROUNDS + 3
        for n in range(1, rounds + 1):
            for member in ("a", "b"):
                store.add(protocol.heartbeat_key(member), 1)
                store.set(protocol.request_key(member), encode_request(n, n - 1, False, 1, init_sync=False))
                store.set(protocol.vote_key(n, member), b"1")
            q = lighthouse.tick(now=float(n))
            assert q is not None and (q.round, q.quorum_id, q.members) == (n, 1, ("a", "b"))
            assert lighthouse.tick(now=float(n)) is None             # answered: nothing pending
        assert not store.check(protocol.answer_key("a", 1)) and not store.check(protocol.vote_key(3, "b"))
        assert store.check(protocol.answer_key("a", rounds)) and store.check(protocol.vote_key(rounds, "b"))
        store.add(protocol.heartbeat_key("a"), 1)                    # b's heartbeat stops ...
        store.set(protocol.request_key("a"), encode_request(rounds + 1, rounds, False, 1))
        assert lighthouse.tick(now=rounds + 0.5) is None              # ... not yet stale; a waits
        store.add(protocol.heartbeat_key("a"), 1)
        assert lighthouse.tick(now=rounds + 1.5) is None              # b dead: one member < min_replicas
        assert lighthouse.healthy(rounds + 1.5) == {"a"}
    finally:
        lighthouse.stop()


def test_a_replacements_head_size_reaches_its_healer_through_the_quorum():
    requests = reqs({"a": 5, "b": 5, "c": 0}, c={"heal_head": 250_000}, a={"heal_head": 9000})
    q = plan_quorum(requests, set("abc"), None, 1, 1.0, 0.0)
    assert q.heal == {"c": "a"} and q.heal_head == {"c": 250_000}    # a is not healed: its number is not used
    assert Quorum.from_json(q.to_json()) == q
    assert Quorum.from_json({k: v for k, v in q.to_json().items() if k != "heal_head"}).heal_head == {}
    assert decode_request("c", encode_request(1, 0, True, 1, heal_head=250_000), 0.0).heal_head == 250_000
    assert b"heal_head" not in encode_request(1, 0, True, 1)           # a step in the quorum does not carry it


def test_a_member_left_behind_cannot_step_alone_while_the_one_ahead_is_alive():
    """Rule 5 (never two lines of history): a went on alone (its step 2 committed: it holds step 3);
    b, slow, asks at step 2 with a absent. Going on would give two replicas at step 3 with different
    weights: b waits, past join_timeout, until a asks (then heals from a) or a's heartbeat stops."""
    alone_b = reqs({"b": 2}, since=10.0)
    assert plan_quorum(alone_b, {"a", "b"}, None, 1, 1.0, now=10.5, known_steps={"a": 3}) is None
    assert plan_quorum(alone_b, {"a", "b"}, None, 1, 1.0, now=99.0, known_steps={"a": 3}) is None
    both = plan_quorum(reqs({"a": 3, "b": 2}, since=10.0), {"a", "b"}, None, 1, 1.0, now=10.1)
    assert both.members == ("a", "b") and both.heal == {"b": "a"}
    assert plan_quorum(alone_b, {"b"}, None, 1, 1.0, now=10.5, known_steps={"a": 3}).members == ("b",)  # a died
    # a slow member that is not ahead is still left out after join_timeout (rule 4 unchanged)
    assert plan_quorum(alone_b, {"a", "b"}, None, 1, 1.0, now=11.0, known_steps={"a": 2}).members == ("b",)


def test_the_lighthouse_knows_who_may_be_ahead_from_its_quorums_and_their_commit_decisions():
    from neural_arch.distributed.ft import protocol
    from neural_arch.distributed.ft.lighthouse import Lighthouse

    lighthouse = Lighthouse(min_replicas=1, heartbeat_timeout=100.0, join_timeout=1.0)   # ticked by hand
    store = lighthouse.store

    def ask(member, n, step):
        store.add(protocol.heartbeat_key(member), 1)
        store.set(protocol.request_key(member), encode_request(n, step, False, 1, init_sync=False))

    try:
        for i, member in enumerate(("a", "b")):
            store.add(protocol.MEMBERS, 1)
            store.set(protocol.member_key(i), member)
        ask("a", 1, 0), ask("b", 1, 0)
        assert lighthouse.tick(now=0.0).members == ("a", "b")
        store.set(protocol.commit_key(1), b"1")                  # both at step 1 now
        ask("a", 2, 1)                                           # b is slow: a goes on alone
        assert lighthouse.tick(now=0.5) is None
        assert lighthouse.tick(now=1.6).members == ("a",)        # round 2 in flight: a may reach step 2
        ask("b", 2, 1)
        assert lighthouse.tick(now=5.0) is None
        assert lighthouse.tick(now=7.0) is None                  # past join_timeout: b must not step alone from 1
        store.set(protocol.commit_key(2), b"0")                  # a's step was voided: a holds step 1
        q = lighthouse.tick(now=7.1)
        assert q is not None and q.members == ("b",) and q.max_step == 1
    finally:
        lighthouse.stop()
