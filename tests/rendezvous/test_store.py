"""Rendezvous stores: real processes on loopback, auth, malformed input, timeouts that name names."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from rank_snippets import run_ranks

from neural_arch.distributed import auth as handshake
from neural_arch.distributed.errors import AuthenticationError, PeerFailureError, RendezvousError
from neural_arch.distributed.rendezvous.store import (
    FileStore,
    PrefixStore,
    StoreTimeoutError,
    TCPStore,
    store_barrier,
)

pytestmark = pytest.mark.timeout(90)
TOKEN = "5ec7e7" * 6  # 36 hex digits: the 128 bits a token needs

# Every worker: announce itself, count, race a compare_set, wait for all, read everyone's key.
_WORKER = """
    from neural_arch.distributed.rendezvous.store import TCPStore, FileStore
    if os.environ["KIND"] == "tcp":
        store = TCPStore("127.0.0.1", int(os.environ["PORT"]), timeout=20, auth_token=os.environ.get("TOKEN"))
    else:
        store = FileStore(os.environ["PATH_"], world_size=None, timeout=20)
    store.set(f"addr/{rank}", f"host{rank}")
    count = store.add("count", rank + 1)
    won = store.compare_set("leader", b"", str(rank).encode())
    store.wait([f"addr/{r}" for r in range(world)])
    peers = [store.get(f"addr/{r}").decode() for r in range(world)]
    store.set(f"done/{rank}", b"1")
    store.wait([f"done/{r}" for r in range(world)])
    report({"count": count, "leader": won.decode(), "peers": peers})
    store.close()
"""


def _check_workers(out, n):
    results = [r[1][0] for r in out]
    assert all(r["peers"] == [f"host{i}" for i in range(n)] for r in results)
    # the counter saw every increment exactly once: final value is 1+2+..+n, all partial sums distinct
    assert len({r["count"] for r in results}) == n and max(r["count"] for r in results) == n * (n + 1) // 2
    assert len({r["leader"] for r in results}) == 1  # exactly one rank won the compare_set


def test_tcp_store_across_processes():
    master = TCPStore("127.0.0.1", 0, world_size=4, is_master=True, timeout=20, auth_token=TOKEN)
    try:
        out = run_ranks(_WORKER, 3, timeout=60, env={"KIND": "tcp", "PORT": str(master.port), "TOKEN": TOKEN})
        _check_workers(out, 3)
        assert master.get("count") == b"6"
        assert master.num_keys() == 3 + 3 + 2  # addr/*, done/*, count, leader
        assert master.delete_key("leader") and not master.delete_key("leader")
        assert not master.check(["leader"]) and master.check(["addr/0", "addr/2"])
    finally:
        master.close()


def test_file_store_across_processes(tmp_path):
    path = str(tmp_path / "store")
    out = run_ranks(_WORKER, 3, timeout=60, env={"KIND": "file", "PATH_": path})
    _check_workers(out, 3)
    s = FileStore(path, timeout=1)
    assert s.get("count") == b"6" and s.num_keys() == 8
    assert s.delete_key("count") and not s.check("count") and not s.delete_key("count")
    with pytest.raises(StoreTimeoutError, match="'count'"):
        s.get("count")
    s.close()


def test_file_store_last_close_removes_file(tmp_path):
    path = str(tmp_path / "f")
    a, b = FileStore(path, world_size=2, timeout=2), FileStore(path, world_size=2, timeout=2)
    assert a.compare_set("k", b"", b"x") == b"x" and b.compare_set("k", b"y", b"z") == b"x"
    assert b.compare_set("other", b"y", b"z") == b"y"  # torch semantics: missing key, non-empty expected
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)


def test_compare_set_semantics_and_prefix_store():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    try:
        assert master.compare_set("k", b"", b"a") == b"a"
        assert master.compare_set("k", b"zz", b"b") == b"a"
        assert master.compare_set("k", b"a", b"b") == b"b"
        sub = PrefixStore("g1", master)
        sub.set("x", "1")
        assert master.get("g1/x") == b"1" and sub.get("x") == b"1" and sub.add("n", 3) == 3
        assert sub.check(["x", "n"]) and not sub.check("y")
        with pytest.raises(TypeError, match="bytes or str"):
            master.set("bad", 3)
        master.set("text", b"abc")
        with pytest.raises(ValueError, match="not an integer"):
            master.add("text", 1)
    finally:
        master.close()


def _raw(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    hello = s.recv(handshake._HELLO.size, socket.MSG_WAITALL)
    assert hello.startswith(handshake.MAGIC) and hello[8] == 1   # keyed: every connection must prove the key
    return s


def _authed(port, key=None):
    """A raw socket past the handshake (``key`` None: the per-user job secret of a token-less store)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    handshake.greet(s, key if key is not None else handshake.local_job_secret(port), b"store", time.monotonic() + 5)
    return s


def _reply(sock):
    """First byte the server sends back, or b"" when it closed (or reset) the connection."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


def test_auth_rejects_bad_clients_and_keeps_serving():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5, auth_token=TOKEN.encode())
    good = TCPStore("127.0.0.1", master.port, timeout=5, auth_token=TOKEN.encode())
    try:
        with pytest.raises(AuthenticationError, match="requires the job key"):
            TCPStore("127.0.0.1", master.port, timeout=5)
        with pytest.raises(AuthenticationError, match="wrong or missing job key"):  # the key id is gone
            TCPStore("127.0.0.1", master.port, timeout=5, auth_token="0badc0de" * 4)
        # a raw client answering with a zero MAC (what a token-less rank used to send), then a request
        # frame: refused (status 0), closed, never served
        raw = _raw(master.port)
        raw.sendall(os.urandom(32) + struct.pack("!IH", 0, 0) + bytes(32)
                    + struct.pack("!BI", 1, 2) + struct.pack("!I", 1) + b"k" + struct.pack("!I", 1) + b"v")
        assert _reply(raw) == b"\x00"  # refused
        raw.close()
        # garbage of every length, including a connection that sends nothing and hangs up
        for junk in (b"", b"\xff" * 3, os.urandom(200)):
            raw = _raw(master.port)
            raw.sendall(junk)
            raw.close()
        assert not master.check("k")
        good.set("still", "alive")
        assert master.get("still") == b"alive"
    finally:
        good.close()
        master.close()


def test_malformed_and_oversize_frames_after_auth_do_not_crash_the_server():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
    try:
        for frame in (struct.pack("!BI", 1, 1 << 30),                              # too many arguments
                      struct.pack("!BI", 1, 1) + struct.pack("!I", 0xFFFFFFFF),   # oversize length
                      struct.pack("!BI", 99, 0),                                  # unknown op: an error reply
                      struct.pack("!BI", 3, 2) + struct.pack("!I", 1) + b"k" + struct.pack("!I", 2) + b"xx"):
            s = _authed(master.port)
            s.sendall(frame)
            reply = _reply(s)
            assert reply in (b"", b"\x02")  # closed, or answered with ST_ERROR
            s.close()
        w = TCPStore("127.0.0.1", master.port, timeout=5)
        assert w.add("n", 2) == 2
        w.close()
    finally:
        master.close()


def test_get_times_out_naming_the_key_and_lost_master_fails_fast():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=0.5)
    worker = TCPStore("127.0.0.1", master.port, timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="'missing/key'"):
        worker.get("missing/key")
    assert time.monotonic() - t0 < 3
    master.close()
    worker.set_timeout(30)
    t0 = time.monotonic()
    with pytest.raises(PeerFailureError, match="lost the rendezvous store"):
        worker.get("x")
    assert time.monotonic() - t0 < 5
    worker.close()


def test_connect_retries_until_master_is_up_then_gives_up_clearly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = {}

    def late_master():
        time.sleep(0.5)
        box["m"] = TCPStore("127.0.0.1", port, is_master=True, timeout=5)

    t = threading.Thread(target=late_master)
    t.start()
    w = TCPStore("127.0.0.1", port, timeout=10)
    t.join()
    w.set("a", "b")
    assert box["m"].get("a") == b"b"
    w.close()
    box["m"].close()
    with pytest.raises(RendezvousError, match="could not reach the rendezvous store"):
        TCPStore("127.0.0.1", port, timeout=0.3)


def test_rendezvous_timeout_names_the_missing_rank():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
    errors = {}

    def rank(r):
        store = master if r == 0 else TCPStore("127.0.0.1", master.port, timeout=60)
        try:
            store_barrier(store, r, 4, "init", timeout=1.0)
        except RendezvousError as exc:
            errors[r] = str(exc)
        finally:
            if r:
                store.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1, 3)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert time.monotonic() - t0 < 5  # the short rendezvous timeout wins over the store's 60 s
    assert sorted(errors) == [0, 1, 3]
    for msg in errors.values():
        assert "rendezvous 'init' timed out after 1.0 s: ranks [2] never arrived (0, 1, 3 did)" in msg
    master.close()


def test_barrier_succeeds_across_processes():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=20)
    try:
        code = """
            from neural_arch.distributed.rendezvous.store import TCPStore, store_barrier
            s = TCPStore("127.0.0.1", int(os.environ["PORT"]), timeout=20)
            for i in range(3):
                store_barrier(s, rank + 1, world + 1, f"b{i}", timeout=20)
            report("ok")
        """
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("out", run_ranks(code, 2, 60, {"PORT": str(master.port)})))
        t.start()
        for i in range(3):
            store_barrier(master, 0, 3, f"b{i}", timeout=20)
        t.join(60)
        assert [r[1] for r in box["out"]] == [["ok"], ["ok"]]
    finally:
        master.close()


def test_wait_for_workers_and_wait_names_missing_keys(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workers = []

    def join():
        time.sleep(0.3)
        workers.append(TCPStore("127.0.0.1", port, timeout=10))

    t = threading.Thread(target=join)
    t.start()
    master = TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=10, wait_for_workers=True)
    t.join()
    try:
        assert len(workers) == 1 and master.num_keys() == 0  # internal bookkeeping keys are not counted
        master.set("a", b"1")
        with pytest.raises(StoreTimeoutError, match=r"\['b'\]"):
            workers[0].wait(["a", "b"], timeout=0.2)
        with pytest.raises(RendezvousError, match="only 0 of 2 workers"):
            TCPStore("127.0.0.1", 0, world_size=3, is_master=True, timeout=0.3, wait_for_workers=True)
    finally:
        workers[0].close()
        master.close()
    fs = FileStore(str(tmp_path / "f"), timeout=0.2)
    fs.set("a", "x")
    with pytest.raises(StoreTimeoutError, match=r"\['b'\]"):
        fs.wait(["a", "b"])
    fs.close()


@pytest.mark.parametrize("name", ["neural_arch.distributed.rendezvous.store", "neural_arch.distributed.rendezvous.file_store"])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0 and result.attempted > 0


def test_master_closing_wakes_blocked_workers_with_a_clear_error():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=30)
    worker = TCPStore("127.0.0.1", master.port, timeout=30)
    box = {}

    def blocked():
        t0 = time.monotonic()
        try:
            worker.get("never")
        except PeerFailureError as exc:
            box["err"], box["s"] = str(exc), time.monotonic() - t0

    th = threading.Thread(target=blocked)
    th.start()
    time.sleep(0.3)
    master.close()
    th.join(10)
    worker.close()
    assert "rank 0" in box["err"] and box["s"] < 5, box
