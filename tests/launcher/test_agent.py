"""The launchers' node-0 handshake: binds to master_addr only, HMAC proof, token never on the wire."""

from __future__ import annotations

import socket
import threading

import pytest

from neural_arch.distributed.run.agent import NodeAgentServer, join_node0

TOKEN = "s3cret-token-" + "ab" * 8


@pytest.fixture
def server():
    srv = NodeAgentServer(0, nnodes=3, nproc_per_node=2, token=TOKEN, host="127.0.0.1")
    yield srv
    srv.close()


def raw_exchange(port: int, hello: str) -> tuple[str, str]:
    """Talk to the server by hand: returns (greeting, reply) exactly as sent over the wire."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            sock.makefile("rw", encoding="utf-8", newline="\n") as f:
        greeting = f.readline()
        f.write(hello + "\n")
        f.flush()
        return greeting, f.readline()


@pytest.mark.timeout(20)
def test_listens_on_the_given_address_only(server):
    assert server._sock.getsockname()[0] == "127.0.0.1"


@pytest.mark.timeout(20)
def test_a_node_with_the_token_joins(server):
    join_node0("127.0.0.1", server.port, 2, 2, TOKEN, timeout=5)
    assert server.joined() == {0, 2}


@pytest.mark.timeout(20)
def test_a_wrong_token_is_refused_and_does_not_join(server):
    with pytest.raises(RuntimeError, match="authentication failed"):
        join_node0("127.0.0.1", server.port, 1, 2, "not-the-token", timeout=5)
    assert server.joined() == {0}


@pytest.mark.timeout(20)
def test_the_old_clear_text_hello_gets_nothing_and_the_token_never_crosses_the_wire(server):
    greeting, reply = raw_exchange(server.port, "HELLO 1 2 -")
    assert greeting.startswith("CHALLENGE ") and reply.startswith("ERR")
    greeting, reply = raw_exchange(server.port, "HELLO 1 2 abcd " + "0" * 64)
    assert "authentication failed" in reply and "nproc" not in reply  # no details before auth
    assert TOKEN not in greeting + reply
    assert server.joined() == {0}


@pytest.mark.timeout(20)
def test_a_server_that_does_not_know_the_token_is_not_trusted():
    fake = socket.create_server(("127.0.0.1", 0))

    def answer_ok():
        conn, _ = fake.accept()
        with conn, conn.makefile("rw", encoding="utf-8", newline="\n") as f:
            f.write("CHALLENGE 00\n")
            f.flush()
            f.readline()
            f.write("OK " + "f" * 64 + "\n")
            f.flush()

    t = threading.Thread(target=answer_ok, daemon=True)
    t.start()
    try:
        with pytest.raises(RuntimeError, match="could not prove"):
            join_node0("127.0.0.1", fake.getsockname()[1], 1, 2, TOKEN, timeout=5)
    finally:
        t.join(5)
        fake.close()


@pytest.mark.timeout(20)
def test_joining_without_a_token_says_what_to_export():
    with pytest.raises(RuntimeError, match="NEURAL_ARCH_AUTH_TOKEN"):
        join_node0("127.0.0.1", 1, 1, 1, "", timeout=1)
