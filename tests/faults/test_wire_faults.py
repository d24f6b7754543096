"""Wire-level faults, in one process: hostile headers, mismatched check words, unauthenticated
clients of a token-less store. Fast (sockets on loopback, no rank processes)."""

from __future__ import annotations

import logging
import os
import socket
import struct
import time

import numpy as np
import pytest

from neural_arch.distributed import auth as handshake
from neural_arch.distributed.comm.debug import wire_word
from neural_arch.distributed.comm.gloo.transport.engine import LinkTransport
from neural_arch.distributed.comm.gloo.transport.framing import FRAME
from neural_arch.distributed.comm.gloo.transport.tcp import TcpLink
from neural_arch.distributed.comm.work import OpInfo
from neural_arch.distributed.errors import AuthenticationError, FrameMismatchError, PeerFailureError
from neural_arch.distributed.rendezvous.store import TCPStore

pytestmark = pytest.mark.timeout(30)


def _pair():
    listener = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(listener.getsockname())
    b, _ = listener.accept()
    listener.close()
    return LinkTransport(0, 2, {1: TcpLink(1, a)}), LinkTransport(1, 2, {0: TcpLink(0, b)}), a, b


def _info(name="all_reduce", seq=1, dtype="float32", op="sum", seconds=5.0):
    return OpInfo(name, seq, [0, 1], 0, (4,), dtype, None, op, deadline=time.monotonic() + seconds,
                  wire=wire_word(name, seq, dtype, op))


@pytest.mark.parametrize("nbytes", [1 << 40, (1 << 64) - 1])
def test_a_huge_frame_header_is_a_protocol_error_not_memory_error(nbytes):
    t0, t1, _, b = _pair()
    try:
        b.sendall(FRAME.pack(7, nbytes, 0))          # a hostile peer announces 2**40 bytes
        with pytest.raises(PeerFailureError, match="protocol error.*announced"):
            t0.recv_into(1, np.empty(4, np.float32), 7, _info())
    finally:
        t0.close()
        t1.close()


@pytest.mark.parametrize("mine,theirs,what", [
    (("all_reduce", 1, "float32", "sum"), ("all_reduce", 1, "int32", "sum"), "int32"),     # dtype
    (("all_reduce", 1, "float32", "sum"), ("broadcast", 1, "float32", None), "broadcast"),  # op order
    (("all_reduce", 2, "float32", "sum"), ("all_reduce", 3, "float32", "sum"), "#3"),      # sequence
    (("all_reduce", 1, "float32", "sum"), ("all_reduce", 1, "float32", "max"), "max"),     # reduce op
])
def test_header_check_catches_every_disagreement_and_keeps_the_stream_in_step(mine, theirs, what):
    t0, t1, _, _ = _pair()
    try:
        t1.send(0, np.ones(4, np.float32), 3, _info(*theirs))
        with pytest.raises(FrameMismatchError, match=what):
            t0.recv_into(1, np.empty(4, np.float32), 3, _info(*mine))
        # the mismatched frame was consumed: the next frame of the stream is read intact
        t1.send(0, np.arange(4, dtype=np.float32), 3, _info(*mine))
        out = np.empty(4, np.float32)
        t0.recv_into(1, out, 3, _info(*mine))
        assert out.tolist() == [0, 1, 2, 3]
    finally:
        t0.close()
        t1.close()


def test_tokenless_loopback_store_refuses_a_zero_mac_client_and_serves_the_same_user():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)     # torch-style: no token
    try:
        assert master.job_secret and len(master.job_secret) == 32     # a per-job secret was made
        rogue = socket.create_connection(("127.0.0.1", master.port), timeout=5)
        hello = rogue.recv(handshake._HELLO.size, socket.MSG_WAITALL)
        assert hello[8] == 1                                          # keyed, even without a token
        rogue.sendall(os.urandom(32) + struct.pack("!IH", 0, 0) + bytes(32))
        assert rogue.recv(1) == b"\x00"                              # refused
        rogue.close()
        worker = TCPStore("127.0.0.1", master.port, timeout=5)       # same user, same host: finds it
        assert worker.job_secret == master.job_secret
        worker.set("k", "v")
        assert master.get("k") == b"v"
        worker.close()
    finally:
        master.close()


def test_a_client_without_the_secret_file_is_told_what_to_do(monkeypatch):
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    try:
        monkeypatch.setattr(handshake, "local_job_secret", lambda *a, **k: None)  # another user's view
        with pytest.raises(AuthenticationError, match="NEURAL_ARCH_AUTH_TOKEN"):
            TCPStore("127.0.0.1", master.port, timeout=5)
    finally:
        master.close()


def test_an_open_store_needs_the_opt_in_and_then_says_so_loudly_with_the_fix(caplog):
    # without a token off loopback: a refusal with the fix (it used to run open with a warning)
    with pytest.raises(AuthenticationError, match="NEURAL_ARCH_AUTH_TOKEN=.*NEURAL_ARCH_ALLOW_UNAUTHENTICATED=1"):
        TCPStore("0.0.0.0", 0, is_master=True, timeout=5)
    with caplog.at_level(logging.WARNING):
        try:
            master = TCPStore("0.0.0.0", 0, is_master=True, timeout=5, allow_unauthenticated=True)
        except Exception as exc:  # noqa: BLE001 - no non-loopback interface here
            pytest.skip(f"cannot listen on 0.0.0.0: {exc}")
        master.close()
    assert "WITHOUT authentication" in caplog.text and "NEURAL_ARCH_AUTH_TOKEN=" in caplog.text


def test_idle_connections_do_not_block_the_store():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    idle = [socket.create_connection(("127.0.0.1", master.port), timeout=5) for _ in range(20)]
    try:
        t0 = time.monotonic()
        worker = TCPStore("127.0.0.1", master.port, timeout=5)
        worker.set("x", "1")
        assert time.monotonic() - t0 < 2.0
        worker.close()
    finally:
        for s in idle:
            s.close()
        master.close()


def test_a_stalled_handshake_names_the_endpoint_and_phase():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        from neural_arch.distributed.errors import HandshakeError

        with pytest.raises(HandshakeError, match=rf"127.0.0.1:{port}.*timed out during the handshake \(hello\)"):
            handshake.greet(sock, b"k", b"store", time.monotonic() + 0.3, where=f"the store at 127.0.0.1:{port}")
        sock.close()
    finally:
        listener.close()


def test_ring_files_of_dead_ranks_are_cleaned_at_the_next_rendezvous(tmp_path):
    """A rank SIGKILLed between creating its ring and the attach barrier leaves files behind: the
    next shm rendezvous on the host removes those of dead creators, and only those."""
    import subprocess
    import sys

    from neural_arch.distributed.comm.gloo.transport.shm import clean_stale_rings

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [tmp_path / f"na-{dead.pid}-abcd1234-0to1{suffix}" for suffix in ("", ".d", ".s")]
    alive = tmp_path / f"na-{os.getpid()}-abcd1234-0to1"
    other = tmp_path / "unrelated-file"
    for p in stale + [alive, other]:
        p.write_bytes(b"x")
    removed = clean_stale_rings(str(tmp_path))
    assert sorted(removed) == sorted(str(p) for p in stale)
    assert alive.exists() and other.exists()
