"""Node 0's elastic agent round logic, with in-process fake launchers: threads-free ElasticMember
clients speaking the real protocol over loopback (real sockets, real handshake)."""

from __future__ import annotations

import pytest
from polling import wait_for

from neural_arch.distributed.elastic.agent import ElasticAgentServer, ElasticMember

TOKEN = "elastic-" + "cd" * 8


def server(min_nodes=1, max_nodes=3, **kw):
    kw.setdefault("last_call", 0.3)
    return ElasticAgentServer(0, min_nodes, max_nodes, TOKEN, start_timeout=kw.pop("start_timeout", 10), **kw)


def member(srv, identity, nproc=1, spec=None):
    return ElasticMember("127.0.0.1", srv.port, identity, nproc, TOKEN, timeout=5,
                         nnodes_spec=spec or f"{srv.min_nodes}:{srv.max_nodes}")


def expect(m, key, timeout=5.0):
    msg = m.get(timeout)
    assert msg is not None and key in msg, msg
    return msg


@pytest.mark.timeout(30)
def test_rounds_are_dense_in_join_order_with_node0_first_and_a_fresh_port_each():
    srv = server(max_restarts=1)
    late, zero = member(srv, 2, nproc=3), None
    try:
        assert wait_for(lambda: srv.joined() == {2}, 5)  # node 2's join is on record before node 0 comes
        zero = member(srv, 0, nproc=2)  # joins second, still node rank 0
        a, b = expect(zero, "round"), expect(late, "round")
        assert (a["node_rank"], b["node_rank"]) == (0, 1) and a["layout"] == b["layout"] == [2, 3]
        assert a["master_port"] == b["master_port"] and a["restart"] == 0
        late.send({"failed": 0, "code": 7, "summary": "rank 2 exit code 7"})
        assert expect(zero, "stop")["stop"] == 0
        zero.send({"stopped": 0})
        a2, b2 = expect(zero, "round"), expect(late, "round")
        assert (a2["round"], a2["restart"], b2["node_rank"]) == (1, 1, 1)
        assert a2["master_port"] != a["master_port"]
        assert [r["nodes"] for r in srv.rounds] == [[0, 2], [0, 2]]
    finally:
        for m in (late, zero):
            if m is not None:
                m.close()
        srv.close()


@pytest.mark.timeout(30)
def test_a_node_joining_mid_round_restarts_the_group_with_it_and_a_lost_node_shrinks_it_at_once():
    # a last call far longer than the expectations below: re-forming with survivors must skip it
    srv = server(min_nodes=1, max_nodes=3, max_restarts=1, last_call=1.5)  # time for node 1 to join too
    zero, one = member(srv, 0), member(srv, 1)
    two = None
    try:
        assert expect(zero, "round")["layout"] == [1, 1]
        expect(one, "round")
        assert srv.rounds[0]["nodes"] == [0, 1]
        srv.last_call = 60.0
        two = member(srv, 2, nproc=4)           # joins while round 0 runs, with room (MAX 3): restart
        for m in (zero, one):
            assert "node 2 is waiting to join round 1" in expect(m, "stop")["reason"]
            m.send({"stopped": 0})
        rounds = [expect(m, "round") for m in (zero, one, two)]  # MAX reached: no last call
        assert [r["node_rank"] for r in rounds] == [0, 1, 2] and rounds[0]["layout"] == [1, 1, 4]
        assert {r["restart"] for r in rounds} == {0}       # a membership change is not a restart
        one.close()                             # node 1 dies: survivors only, formed at once
        for m in (zero, two):
            assert "disconnected" in expect(m, "stop")["reason"]
            m.send({"stopped": 1})
        r1, r2 = expect(zero, "round"), expect(two, "round")
        assert r1["layout"] == [1, 4] and (r1["round"], r1["restart"], r2["node_rank"]) == (2, 1, 1)
        late = member(srv, 1)                   # back while round 2 runs, but restarts are used up:
        for m in (zero, two):                   # joining costs none
            assert "waiting to join round 3" in expect(m, "stop")["reason"]
            m.send({"stopped": 2})
        assert [expect(m, "round")["layout"] for m in (zero, two, late)] == [[1, 4, 1]] * 3
        for m in (zero, two, late):
            m.send({"done": 3})
        assert expect(zero, "finished") and expect(two, "finished") and expect(late, "finished")
        assert srv.result[0] == 0 and [r["restart"] for r in srv.rounds] == [0, 0, 1, 1]
        late.close()
    finally:
        zero.close()
        if two is not None:
            two.close()
        srv.close()


@pytest.mark.timeout(30)
def test_a_node_joining_while_the_ranks_finish_does_not_restart_the_job():
    srv = server(min_nodes=2, max_nodes=3, last_call=0.0)
    # The server handles its events in arrival order: node 2 must come after node 0's "done" arrived.
    arrived, put = [], srv._events.put
    srv._events.put = lambda event, *a, **kw: (arrived.append(event), put(event, *a, **kw))
    zero, one = member(srv, 0), member(srv, 1)
    try:
        expect(zero, "round"), expect(one, "round")
        zero.send({"done": 0})                  # node 0's ranks finished: the job is ending
        assert wait_for(lambda: any(kind == "msg" and msg == {"done": 0} for kind, _, msg in arrived), 5)
        late = member(srv, 2)
        assert one.get(0.5) is None             # no restart for the newcomer
        one.send({"done": 0})
        assert expect(zero, "finished") and expect(one, "finished") and expect(late, "finished")
        assert len(srv.rounds) == 1
        late.close()
    finally:
        zero.close(), one.close()
        srv.close()


@pytest.mark.timeout(30)
def test_restarts_used_up_ends_the_job_on_every_node_with_the_summary():
    srv = server(min_nodes=2, max_nodes=2, max_restarts=0)
    zero, one = member(srv, 0), member(srv, 1)
    try:
        expect(zero, "round"), expect(one, "round")
        zero.send({"failed": 0, "code": 3, "summary": "job failed: rank 1 exit code 3"})
        expect(one, "stop")
        one.send({"stopped": 0})
        for m in (zero, one):
            msg = expect(m, "exit")
            assert msg["exit"] == 3 and "rank 1 exit code 3" in msg["reason"]
            assert "restarts used: 0 of 0" in msg["reason"]
    finally:
        zero.close(), one.close()
        srv.close()


@pytest.mark.timeout(30)
def test_too_few_nodes_within_the_start_timeout_names_the_missing_ones():
    srv = server(min_nodes=2, max_nodes=3, max_restarts=3, start_timeout=1.5)
    zero, one = member(srv, 0), member(srv, 1)
    try:
        expect(zero, "round"), expect(one, "round")
        one.close()
        expect(zero, "stop")
        zero.send({"stopped": 0})
        msg = expect(zero, "exit", timeout=8)
        assert "round 1: only 1 node(s) [0] connected within 1.5 s" in msg["reason"]
        assert "at least 2" in msg["reason"] and "missing: node 1" in msg["reason"]
    finally:
        zero.close()
        srv.close()


@pytest.mark.timeout(30)
def test_a_disagreeing_or_duplicate_joiner_is_refused_without_failing_the_job():
    srv = server(min_nodes=1, max_nodes=2)
    zero = member(srv, 0)
    try:
        with pytest.raises(RuntimeError, match="nnodes=1:3 but node 0 has nnodes=1:2"):
            member(srv, 1, spec="1:3")
        with pytest.raises(RuntimeError, match="node_rank 0 is already connected"):
            member(srv, 0)
        with pytest.raises(RuntimeError, match="job key|could not prove"):
            ElasticMember("127.0.0.1", srv.port, 1, 1, "0e1f" * 10, timeout=3, nnodes_spec="1:2")
        assert expect(zero, "round")["layout"] == [1]
        zero.send({"done": 0})
        expect(zero, "finished")
    finally:
        zero.close()
        srv.close()


@pytest.mark.timeout(30)
def test_node0_going_away_ends_the_job_for_the_members():
    srv = server(min_nodes=1, max_nodes=2, last_call=0.0)
    one = member(srv, 1)
    try:
        assert one.get(0.5) is None   # no round without node 0, the rendezvous host
        srv.close()
        assert "stopped the job" in expect(one, "exit")["reason"]
        assert "node 0 hosts the rendezvous, so the job ends" in expect(one, "lost")["lost"]
    finally:
        one.close()
