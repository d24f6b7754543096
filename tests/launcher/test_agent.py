"""The launchers' node-0 rendezvous: the project's one handshake (purpose "agent"), layout
agreement, and every node failing at once when the job cannot form."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from polling import wait_for

from neural_arch.distributed.auth import greet
from neural_arch.distributed.run.agent import NodeAgentServer, NodeLayout, join_node0

TOKEN = "s3cret-token-" + "ab" * 8


@pytest.fixture
def server():
    srv = NodeAgentServer(0, nnodes=3, nproc_per_node=2, token=TOKEN, host="127.0.0.1")
    yield srv
    srv.close()


def join_in_background(port: int, node: int, nproc: int, token: str = TOKEN, **kw):
    """Start join_node0 on a thread; returns a dict that gets "layout" or "error"."""
    out: dict = {}

    def run():
        try:
            out["layout"] = join_node0("127.0.0.1", port, node, nproc, token, timeout=10, **kw)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out



def _wait_joined(server, node: int, timeout: float = 10.0) -> None:
    """Poll until ``node`` has joined (instead of sleeping and hoping it has)."""
    assert wait_for(lambda: node in server.joined(), timeout, interval=0.005), \
        f"node {node} did not join within {timeout} s"

@pytest.mark.timeout(20)
def test_listens_on_the_given_address_only(server):
    assert server._sock.getsockname()[0] == "127.0.0.1"


@pytest.mark.timeout(20)
def test_every_node_gets_the_same_layout_with_per_node_process_counts(server):
    a = join_in_background(server.port, 2, 1, nnodes=3)
    b = join_in_background(server.port, 1, 3, nnodes=3)
    layout = server.wait_layout(10)
    a["thread"].join(10), b["thread"].join(10)
    assert layout == a["layout"] == b["layout"] == NodeLayout((2, 3, 1))
    assert list(layout.ranks_of(2)) == [5] and layout.world_size == 6


@pytest.mark.timeout(20)
def test_a_wrong_token_is_refused_and_does_not_join(server):
    with pytest.raises(RuntimeError, match="NEURAL_ARCH_AUTH_TOKEN|job key"):
        join_node0("127.0.0.1", server.port, 1, 2, "not-the-token-" + "cd" * 8, timeout=5)
    assert server.joined() == {0}


@pytest.mark.timeout(20)
def test_an_unauthenticated_peer_learns_nothing_and_fails_nothing(server):
    # a raw client that cannot produce the MAC: refused, no job details, and the job still forms later
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        with pytest.raises(Exception) as err:
            greet(sock, b"guess", b"agent", time.monotonic() + 5, identity=1, extra=b'{"nnodes": 3}')
    assert "nproc" not in str(err.value) and TOKEN not in str(err.value)
    assert server.joined() == {0}
    a = join_in_background(server.port, 1, 2, nnodes=3)
    b = join_in_background(server.port, 2, 2, nnodes=3)
    assert server.wait_layout(10).world_size == 6
    a["thread"].join(10), b["thread"].join(10)


@pytest.mark.timeout(20)
def test_a_disagreeing_node_fails_every_node_with_the_same_reason(server):
    waiting = join_in_background(server.port, 1, 2, nnodes=3)
    _wait_joined(server, 1)  # node 1 is in and waiting for the layout
    with pytest.raises(RuntimeError, match="nnodes=4 but node 0 has nnodes=3"):
        join_node0("127.0.0.1", server.port, 2, 2, TOKEN, timeout=5, nnodes=4)
    waiting["thread"].join(10)
    assert "nnodes=4 but node 0 has nnodes=3" in str(waiting["error"])
    with pytest.raises(RuntimeError, match="nnodes=4 but node 0 has nnodes=3"):
        server.wait_layout(5)


@pytest.mark.timeout(20)
def test_a_node_rank_given_twice_fails_the_job(server):
    first = join_in_background(server.port, 1, 2, nnodes=3)
    _wait_joined(server, 1)
    with pytest.raises(RuntimeError, match="node_rank 1 joined twice"):
        join_node0("127.0.0.1", server.port, 1, 2, TOKEN, timeout=5, nnodes=3)
    first["thread"].join(10)
    assert "joined twice" in str(first["error"])


@pytest.mark.timeout(20)
def test_node0_timing_out_names_the_missing_nodes_and_tells_the_joined_ones(server):
    waiting = join_in_background(server.port, 2, 2, nnodes=3)
    _wait_joined(server, 2)
    with pytest.raises(TimeoutError, match="node 1 never joined"):
        server.wait_layout(0.5)
    waiting["thread"].join(10)
    assert "node 1 never joined" in str(waiting["error"])


@pytest.mark.timeout(20)
def test_a_server_that_does_not_know_the_token_is_not_trusted():
    impostor = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token="another-job-" + "ef" * 8, host="127.0.0.1")
    try:
        with pytest.raises(RuntimeError, match="job key|could not prove"):
            join_node0("127.0.0.1", impostor.port, 1, 1, TOKEN, timeout=5)
        assert impostor.joined() == {0}
    finally:
        impostor.close()


@pytest.mark.timeout(20)
def test_joining_without_a_token_says_what_to_export():
    with pytest.raises(RuntimeError, match="NEURAL_ARCH_AUTH_TOKEN"):
        join_node0("127.0.0.1", 1, 1, 1, "", timeout=1)


@pytest.mark.timeout(20)
def test_an_idle_connection_does_not_block_a_real_node(server):
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)  # says nothing
    try:
        a = join_in_background(server.port, 1, 2, nnodes=3)
        b = join_in_background(server.port, 2, 2, nnodes=3)
        assert server.wait_layout(4).world_size == 6  # well inside the idle socket's 5 s deadline
        a["thread"].join(10), b["thread"].join(10)
    finally:
        idle.close()
