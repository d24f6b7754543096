"""Denial of service against the rendezvous store (docs/security.md, "Bounded resources"): an accept
error must not end the server, a connection flood is shed below the descriptor limit, announced
sizes are not allocated, and one client's waits cannot fail another client's requests.

Real sockets on loopback. The descriptor tests run the store in its own process (its descriptor
limit lowered); the memory and waiter tests run it in this process, to measure it, with the
attacker on raw sockets that passed the handshake (the attacks need an authenticated client)."""

from __future__ import annotations

import socket
import struct
import threading
import time
import tracemalloc

import pytest
from security_procs import kill, start

from neural_arch.distributed import auth as handshake
from neural_arch.distributed.rendezvous import tcp_store
from neural_arch.distributed.rendezvous.store import StoreTimeoutError, TCPStore

pytestmark = pytest.mark.timeout(60)

TOKEN = "feed" * 9   # 144 bits

# The victim: a store whose process has 64 descriptors; it fills them all (as a leak elsewhere in
# the process would) until the test says "go", then frees them.
_SMALL_FD_STORE = """
    import resource
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=30, auth_token=os.environ["TOKEN"])
    fillers = []
    try:
        while True:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    ready(master.port)
    sys.stdin.readline()
    for fd in fillers:
        os.close(fd)
    time.sleep(60)
"""


def _client(port, timeout=8.0):
    return TCPStore("127.0.0.1", port, timeout=timeout, auth_token=TOKEN)


def test_an_accept_error_is_waited_out_and_a_flood_is_shed():
    """EMFILE used to end the accept loop for good: every later rank timed out. Now the server backs
    off and keeps accepting; and a flood of idle connections is closed at once beyond the cap of
    connections in the handshake (a quarter of the descriptor limit), never reaching the limit."""
    proc, port = start(_SMALL_FD_STORE, env={"TOKEN": TOKEN}, stdin=__import__("subprocess").PIPE)
    flood = []
    try:
        box = {}

        def join():
            t0 = time.monotonic()
            try:
                c = _client(port)
                c.set("joined", "yes")
                box["ok"] = time.monotonic() - t0
                c.close()
            except Exception as exc:  # noqa: BLE001 - reported below
                box["error"] = repr(exc)

        # The accept thread already holds a descriptor for its next connection: this one takes it,
        # and the server's next accept() fails with EMFILE at once.
        flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.2)
        t = threading.Thread(target=join)
        t.start()
        time.sleep(0.5)                    # the server meets EMFILE meanwhile
        proc.stdin.write("go\n")
        proc.stdin.flush()
        t.join(15)
        assert "ok" in box, box
        flood.pop().close()

        for _ in range(100):               # the flood: connections that never answer the hello
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        shed = 0
        for s in flood:
            s.settimeout(0.05)
            try:
                hello = s.recv(handshake._HELLO.size)
            except TimeoutError:
                continue
            except ConnectionError:
                hello = b""
            shed += hello == b""
        assert shed >= 100 - 16 - 4, shed  # at most 16 (64 // 4) wait in the handshake
        for s in flood:
            s.close()
        flood = []
        c = _client(port)                  # and the store still serves
        assert c.get("joined") == b"yes"
        c.close()
    finally:
        for s in flood:
            s.close()
        kill(proc)


def _authed(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    handshake.greet(s, TOKEN.encode(), b"store", time.monotonic() + 5)
    s.settimeout(5)
    return s


def _closed(sock) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _announce(sock, size):
    """A SET whose value announces ``size`` bytes; none of them is sent (yet)."""
    sock.sendall(struct.pack("!BI", tcp_store.OP_SET, 2) + struct.pack("!I", 3) + b"big" + struct.pack("!I", size))


def test_announced_sizes_are_not_allocated_and_the_memory_budget_holds(monkeypatch):
    """Three 9-byte headers used to take the store from 37 to 805 MiB: frames are now buffered as
    their bytes arrive, and beyond a store-wide budget a connection is closed, not served."""
    monkeypatch.setattr(tcp_store, "MEMORY_BUDGET", 3 << 20, raising=False)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, auth_token=TOKEN)
    conns = []
    try:
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                conns.append(_authed(master.port))
                _announce(conns[-1], tcp_store.MAX_FRAME - 8)
            time.sleep(0.5)
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert grown < 16 << 20, f"{grown >> 20} MiB for three headers"
        for c in conns:
            c.close()
        conns = []
        time.sleep(0.3)                                   # the server notices, gives their pieces back
        # the budget: one client buffers 2 MiB of a value, a second one's 2 MiB do not fit
        hog, second = _authed(master.port), _authed(master.port)
        conns += [hog, second]
        _announce(hog, 2 << 20)
        hog.sendall(b"x" * ((2 << 20) - 1))
        time.sleep(0.2)
        _announce(second, 2 << 20)
        second.sendall(b"y" * (2 << 20))
        assert _closed(second)                            # closed, not served
        good = _client(master.port, timeout=5)            # small requests do not wait on the budget
        good.set("small", "fine")
        hog.sendall(b"x")                                 # the first client's request completes
        assert hog.recv(1) == bytes([tcp_store.ST_OK])
        assert len(master.get("big")) == 2 << 20 and master.get("small") == b"fine"
        good.close()
    finally:
        for c in conns:
            c.close()
        master.close()


def test_one_clients_waits_do_not_fail_another_clients_get(monkeypatch):
    """2048 blocking waits from one client used to make every other client's get fail, even of
    present keys (a global count). Scaled down here (the old cap monkeypatched to 8, nine waits):
    a get of a present key never waits, and each connection holds only its own wait."""
    monkeypatch.setattr(tcp_store, "MAX_WAITERS", 8, raising=False)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, auth_token=TOKEN)
    waiters = []
    try:
        master.set("present", b"here")
        for _ in range(9):
            s = _authed(master.port)
            s.sendall(struct.pack("!BI", tcp_store.OP_WAIT, 2) + struct.pack("!I", 5) + b"never"
                      + struct.pack("!I", 8) + struct.pack("!Q", 20_000))
            waiters.append(s)
        time.sleep(0.3)
        other = _client(master.port, timeout=5)
        assert other.get("present") == b"here"
        with pytest.raises(StoreTimeoutError, match="later"):
            other.wait(["later"], timeout=0.2)        # its own wait still works: a timeout, not "too many"
        master.set("never", b"now")                   # releases the nine
        for s in waiters:
            assert s.recv(1) == bytes([tcp_store.ST_OK])
        other.close()
    finally:
        for s in waiters:
            s.close()
        master.close()
