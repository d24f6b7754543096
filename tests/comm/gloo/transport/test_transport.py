"""The transport under the gloo backend: real processes on loopback, tcp / shm / auto."""

from __future__ import annotations

import glob
import os
import signal
import socket

import pytest
from polling import wait_for
from rank_snippets import reap, run_ranks, start_ranks

from neural_arch.distributed.rendezvous.store import TCPStore

pytestmark = [pytest.mark.latency_bound, pytest.mark.timeout(120)]
MODES = ["tcp", "shm", "auto"]


@pytest.fixture
def master():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=60)
    yield store
    store.close()


def _env(master, mode, **extra):
    return {"PORT": str(master.port), "MODE": mode, **{k: str(v) for k, v in extra.items()}}


# Two ranks: sizes from 0 B to 64 MiB, FIFO per channel, channels independent, huge channel numbers,
# a size mismatch named clearly, and the stream still usable afterwards.
_P2P = """
    from transport_rank import connect, info
    t, store = connect()
    peer = 1 - rank
    kinds = t.peer_kind(peer)
    sizes = [0, 1, 7, 1024, 65536 + 3, (3 << 20) + 5, 64 << 20]
    pattern = np.arange(251, dtype=np.uint8)  # a period prime to every chunk size: a misplaced chunk shows
    for i, n in enumerate(sizes):
        want = np.resize(pattern, n)  # built in uint8: the int64 arange of 64 Mi elements cost seconds
        if rank == 0:
            t.send(peer, want, 1, info(60))
        else:
            out = np.empty(n, np.uint8)
            t.recv_into(peer, out, 1, info(60))
            assert np.array_equal(out, want), n
    # channel independence: rank 0 interleaves channels 0, 5 and 2**40; rank 1 drains 2**40, then 5, then 0
    chans = [0, 5, 1 << 40]
    if rank == 0:
        handles = [t.isend(peer, np.full(4, 10 * c + k, np.int64), ch, info(30))
                   for k in range(3) for c, ch in enumerate(chans)]
        for h in handles:
            h.wait()
    else:
        for c in (2, 1, 0):
            got = []
            for k in range(3):
                out = np.empty(4, np.int64)
                t.recv_into(peer, out, chans[c], info(30))
                got.append(int(out[0]))
            assert got == [10 * c, 10 * c + 1, 10 * c + 2], (c, got)
    # a wrong-sized receive buffer: a clear ValueError, and the next message still arrives intact
    if rank == 0:
        t.send(peer, np.zeros(3, np.float64), 9, info(30))
        t.send(peer, np.arange(2.0), 9, info(30))
    else:
        try:
            t.recv_into(peer, np.empty(4, np.float64), 9, info(30))
            raise AssertionError("no size error")
        except ValueError as exc:
            assert "24 bytes" in str(exc) and "32 bytes" in str(exc), exc
        out = np.empty(2)
        t.recv_into(peer, out, 9, info(30))
        assert out.tolist() == [0.0, 1.0]
    # shapes: 0-d, 2-D float16, bool
    for arr in (np.array(3.5), np.arange(12, dtype=np.float16).reshape(3, 4), np.array([True, False])):
        if rank == 0:
            t.send(peer, arr, 2, info(30))
        else:
            out = np.empty_like(arr)
            t.recv_into(peer, out, 2, info(30))
            assert (out == arr).all()
    store.set(f"done/{rank}", b"1"); store.wait([f"done/{peer}"])
    t.close()
    report(kinds)
"""


@pytest.mark.parametrize("mode", MODES)
def test_p2p_sizes_fifo_and_channels(master, mode):
    out = run_ranks(_P2P, 2, timeout=100, env=_env(master, mode))
    expect = "tcp" if mode == "tcp" else "shm"
    assert [r[1] for r in out] == [[expect], [expect]]


# Ring and pairwise sendrecv with 3-5 ranks; messages bigger than the shm ring; pipelined isends.
_RING = """
    from transport_rank import connect, info
    t, store = connect()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in (0, 5, 4096, (2 << 20) + 17):
        for step in range(3):
            send = np.full(n, rank * 100 + step, np.int32)
            recv = np.empty(n, np.int32)
            t.sendrecv(nxt, send, prv, recv, 7, info(60))
            assert (recv == prv * 100 + step).all(), (n, step)
    # pairwise (dst == src): exchange with the xor partner where it exists
    partner = rank ^ 1
    if partner < world:
        send = np.full(1 << 20, rank, np.float32); recv = np.empty_like(send)
        t.sendrecv(partner, send, partner, recv, 8, info(60))
        assert (recv == partner).all()
    # pipelined: 8 chunks of 256 KiB around the ring with isend, receiving as they come
    chunks = [np.full(1 << 16, rank * 10 + i, np.float32) for i in range(8)]
    handles = [t.isend(nxt, c, 11, info(60)) for c in chunks]
    for i in range(8):
        out = np.empty(1 << 16, np.float32)
        t.recv_into(prv, out, 11, info(60))
        assert (out == prv * 10 + i).all()
    for h in handles:
        h.wait()
    store.set(f"done/{rank}", b"1"); store.wait([f"done/{r}" for r in range(world)])
    kinds = [t.peer_kind(p) if p != rank else "-" for p in range(world)]
    t.close()
    report(kinds)
"""


@pytest.mark.parametrize("mode,n", [("tcp", 3), ("shm", 5), ("auto", 4)])
def test_ring_and_pairwise_sendrecv(master, mode, n):
    out = run_ranks(_RING, n, timeout=110, env=_env(master, mode))
    kind = "tcp" if mode == "tcp" else "shm"
    assert [r[1][0] for r in out] == [[kind if p != r else "-" for p in range(n)] for r in range(n)]


def test_messages_larger_than_a_small_shm_ring_stream_through_it(master):
    # the default rings (1-8 MiB) hold most test messages whole: force a 64 KiB ring so that
    # sendrecv, isend pipelines and wrap-around all stream through a ring smaller than the message
    out = run_ranks(_RING, 3, timeout=110, env=_env(master, "shm", NEURAL_ARCH_SHM_RING_BYTES=65536))
    assert [r[1][0] for r in out] == [["-", "shm", "shm"], ["shm", "-", "shm"], ["shm", "shm", "-"]]


def test_default_ring_size_shrinks_with_peers_and_free_space(monkeypatch):
    from neural_arch.distributed.comm.gloo.transport import shm as S

    class Vfs:
        f_frsize = 4096
        f_bavail = (24 << 30) // 4096

    monkeypatch.setattr(S.os, "statvfs", lambda path: Vfs)
    assert S.default_ring_bytes(1) == 8 << 20
    assert S.default_ring_bytes(7) == 4 << 20          # this rank's rings stay under 32 MiB
    Vfs.f_bavail = (64 << 20) // 4096                   # a container's 64 MiB /dev/shm
    assert S.default_ring_bytes(1) == 8 << 20
    assert S.default_ring_bytes(3) == 1 << 20


def test_auto_mode_mixes_shm_within_and_tcp_across_hosts(master):
    """Ranks 0,1 on "host A" and 2,3 on "host B" (NEURAL_ARCH_HOST_ID): shm inside, tcp across."""
    from rank_snippets import reap, start_ranks

    procs = []
    for r, host in enumerate("AABB"):
        procs += start_ranks(_RING, 4, env=_env(master, "auto", NEURAL_ARCH_HOST_ID=host), ranks=[r])
    out = reap(procs, timeout=110)
    assert [o[0] for o in out] == [0] * 4, [o[2][-2000:] for o in out]
    assert [o[1][0] for o in out] == [["-", "shm", "tcp", "tcp"], ["shm", "-", "tcp", "tcp"],
                                      ["tcp", "tcp", "-", "shm"], ["tcp", "tcp", "shm", "-"]]


def test_shm_mode_refuses_peers_on_other_hosts(master):
    code = """
        from transport_rank import connect
        from neural_arch.distributed.errors import RendezvousError
        try:
            connect(timeout=20)
            report("connected")
        except RendezvousError as exc:
            report(str(exc))
    """
    procs = []
    for r, host in enumerate("AB"):
        procs += start_ranks(code, 2, env=_env(master, "shm", NEURAL_ARCH_HOST_ID=host), ranks=[r])
    out = reap(procs, timeout=60)
    assert all("runs on another host" in o[1][0] for o in out), out


# Rank 1 never reads; rank 0 blocks sending 64 MiB (or waits to receive); the test SIGKILLs rank 1.
_VICTIM = """
    from transport_rank import connect, info
    from neural_arch.distributed.errors import PeerFailureError
    t, store = connect()
    if rank == 1:
        store.set("victim_ready", b"1")
        time.sleep(120)
    store.wait(["victim_ready"])
    store.set("rank0_blocking", b"1")
    t0 = time.monotonic()
    try:
        if os.environ["WHAT"] == "send":
            t.send(1, np.ones(64 << 20, np.uint8), 3, info(60, "all_reduce", 57))
        else:
            t.recv_into(1, np.empty(10, np.uint8), 3, info(60, "all_reduce", 57))
        report("no error")
    except PeerFailureError as exc:
        first = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            t.recv_into(1, np.empty(1, np.uint8), 4, info(60))
            again = "no error"
        except PeerFailureError as exc2:
            again = str(exc2)
        report({"msg": str(exc), "s": first, "again": again, "again_s": time.monotonic() - t1})
"""


def _wait_until_blocked(pid: int, timeout: float = 10.0) -> None:
    """Poll until every thread of ``pid`` sleeps (state S: blocked in the kernel), not a fixed sleep."""
    def blocked():
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        return states and all(s == "S" for s in states)

    assert wait_for(blocked, timeout, interval=0.005), f"rank 0 (pid {pid}) never blocked within {timeout} s"


@pytest.mark.parametrize("mode,what", [("tcp", "send"), ("shm", "send"), ("tcp", "recv"), ("shm", "recv")])
def test_peer_killed_is_reported_fast(master, mode, what):
    procs = start_ranks(_VICTIM, 2, env=_env(master, mode, WHAT=what))
    try:
        master.wait(["victim_ready", "rank0_blocking"], timeout=60)
        _wait_until_blocked(procs[0].pid)  # rank 0 sleeps in its send/recv: the kill finds it blocked
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(10)
        rc, results, err = reap(procs[:1], timeout=30)[0]
    finally:
        reap(procs, timeout=1)
    assert rc == 0, err
    res = results[0]
    assert "rank 1 failed during all_reduce #57" in res["msg"], res
    assert res["s"] < 5.0, res        # well within the 60 s deadline
    assert "rank 1 failed" in res["again"] and res["again_s"] < 0.5, res
    leftovers = [f for p in procs for f in glob.glob(f"/dev/shm/na-{p.pid}-*")]
    assert not leftovers  # rings were unlinked as soon as both ranks attached


_SILENT = """
    from transport_rank import connect, info
    from neural_arch.distributed.errors import CollectiveTimeoutError
    t, store = connect()
    if rank == 0:
        t0 = time.monotonic()
        try:
            t.recv_into(1, np.empty(8, np.float32), 0, info(0.5, "broadcast", 3))
            report("no error")
        except CollectiveTimeoutError as exc:
            report({"msg": str(exc), "s": time.monotonic() - t0})
        store.set("done", b"1")
    else:
        store.wait(["done"])
    t.close()
"""


@pytest.mark.parametrize("mode", ["tcp", "shm"])
def test_deadline_names_the_silent_peer(master, mode):
    out = run_ranks(_SILENT, 2, timeout=60, env=_env(master, mode))
    res = out[0][1][0]
    assert "broadcast #3" in res["msg"] and "ranks [1] did not arrive" in res["msg"], res
    assert 0.4 < res["s"] < 3.0, res


_AUTH = """
    from transport_rank import connect, info
    import neural_arch.distributed.comm.gloo.transport.tcp as tt
    from neural_arch.distributed.rendezvous.store import TCPStore
    token = os.environ.get("TOKEN") or None
    if rank == 1:  # connect to rank 0 only after the test's rogue clients had their go
        side = TCPStore("127.0.0.1", int(os.environ["PORT"]), timeout=30, auth_token=token)
        real_connect = tt._connect
        tt._connect = lambda *a: (side.wait(["rogue_done"]), real_connect(*a))[1]
    t, store = connect(token=token)
    peer = 1 - rank
    a = np.arange(5.0)
    if rank == 0:
        t.send(peer, a, 0, info(30))
    else:
        out = np.empty(5); t.recv_into(peer, out, 0, info(30)); assert (out == a).all()
    store.set(f"done/{rank}", b"1"); store.wait([f"done/{peer}"])
    t.close()
    report("ok")
"""


@pytest.mark.parametrize("token", ["10b" * 11, None], ids=["token", "torch-style-no-token"])
def test_unauthenticated_transport_connection_is_rejected(token):
    """A local process that did not rendezvous cannot join the mesh as rank 1 -- with a token, and
    without one (torch-style env://): a zero MAC, a wrong MAC and garbage are refused, and idle
    connections left open meanwhile do not hold the rendezvous up."""
    import struct

    from neural_arch.distributed import auth as handshake

    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=60, auth_token=token)
    procs = start_ranks(_AUTH, 2, env=dict(_env(master, "tcp"), TOKEN=token or ""))
    idle = []
    try:
        addr = master.get("transport/tcp/0").decode()
        host, port = addr.rsplit(":", 1)
        for _ in range(8):   # idle connections: they never answer (concurrent handshakes ignore them)
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        answers = [bytes(32), os.urandom(32)]   # zero MAC (what a token-less rank used to send), a wrong one
        for mac in answers + [None]:
            rogue = socket.create_connection((host, int(port)), timeout=10)
            hello = rogue.recv(handshake._HELLO.size, socket.MSG_WAITALL)
            assert hello.startswith(handshake.MAGIC) and hello[8] == 1   # always keyed
            if mac is None:
                rogue.sendall(b"garbage")
                rogue.shutdown(socket.SHUT_WR)
                expected = (b"",)
            else:
                rogue.sendall(os.urandom(32) + struct.pack("!IH", 1, 0) + mac)   # claims rank 1
                expected = (b"\x00",)                                             # refused
            try:
                assert rogue.recv(1) in expected
            except ConnectionResetError:
                pass
            rogue.close()
        master.set("rogue_done", b"1")
        out = reap(procs, timeout=60)
    finally:
        for s in idle:
            s.close()
        reap(procs, timeout=1)
        master.close()
    assert [r[0] for r in out] == [0, 0], [r[2][-2000:] for r in out]
    assert [r[1] for r in out] == [["ok"], ["ok"]]


# Several threads of one process talk to the same peer at once on their own channels (sub-groups
# run their collectives on their own progress threads): frames must land with the right thread.
_THREADS = """
    import threading
    from transport_rank import connect, info
    t, store = connect()
    peer = 1 - rank
    errors = []

    def worker(ch):
        try:
            for i in range(30):
                n = (1 << 18) + ch if i % 3 == 0 else 10 + ch
                send = np.full(n, rank * 1000 + ch * 10 + i % 10, np.int32)
                recv = np.empty(n, np.int32)
                t.sendrecv(peer, send, peer, recv, ch, info(60))
                assert (recv == peer * 1000 + ch * 10 + i % 10).all(), (ch, i)
        except BaseException as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(ch,)) for ch in (1, 2, 3, 4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    store.set(f"done/{rank}", b"1"); store.wait([f"done/{peer}"])
    t.close()
    report(errors)
"""


@pytest.mark.parametrize("mode", ["tcp", "shm"])
def test_threads_share_a_peer_on_separate_channels(master, mode):
    out = run_ranks(_THREADS, 2, timeout=110, env=_env(master, mode))
    assert [r[1] for r in out] == [[[]], [[]]]


# Rank 2 dies. Rank 1 (waiting on rank 2) sees it and sends an abort frame; rank 0, which only
# waits on rank 1, must hear about rank 2 at once instead of timing out blaming rank 1.
_ABORT = """
    from transport_rank import connect, info
    from neural_arch.distributed.errors import PeerFailureError
    t, store = connect()
    store.set(f"ready/{rank}", b"1")
    if rank == 2:
        time.sleep(120)
    store.wait(["ready/0", "ready/1", "ready/2"])
    src = 1 if rank == 0 else 2
    t0 = time.monotonic()
    try:
        t.recv_into(src, np.empty(4, np.float32), 5, info(60, "all_reduce", 9))
        report("no error")
    except PeerFailureError as exc:
        report({"msg": str(exc), "s": time.monotonic() - t0})
    t.close()
"""


@pytest.mark.parametrize("mode", ["tcp", "shm"])
def test_failure_is_propagated_to_ranks_not_linked_to_the_dead_one(master, mode):
    procs = start_ranks(_ABORT, 3, env=_env(master, mode))
    try:
        master.wait(["ready/0", "ready/1", "ready/2"], timeout=60)
        for p in procs[:2]:
            _wait_until_blocked(p.pid)   # both survivors wait in their recv
        procs[2].send_signal(signal.SIGKILL)
        procs[2].wait(10)
        out = reap(procs[:2], timeout=30)
    finally:
        reap(procs, timeout=1)
    assert [o[0] for o in out] == [0, 0], [o[2][-2000:] for o in out]
    r0, r1 = out[0][1][0], out[1][1][0]
    assert "rank 2 failed during all_reduce #9 on rank 1" in r1["msg"], r1
    assert "rank 2 failed (rank 1 saw it" in r0["msg"] and "all_reduce #9 on rank 0" in r0["msg"], r0
    assert r0["s"] < 5 and r1["s"] < 5, (r0, r1)


_ABSENT = """
    from transport_rank import connect
    from neural_arch.distributed.errors import RendezvousError
    t0 = time.monotonic()
    try:
        connect(timeout=2.0)
        report("connected")
    except RendezvousError as exc:
        report({"msg": str(exc), "s": time.monotonic() - t0})
"""


def test_transport_rendezvous_names_the_rank_that_never_came(master):
    procs = start_ranks(_ABSENT, 3, env=_env(master, "auto"), ranks=[0, 1])  # rank 2 never starts
    out = reap(procs, timeout=60)
    for rc, results, err in out:
        assert rc == 0, err
        assert "ranks [2] never arrived" in results[0]["msg"] and results[0]["s"] < 10, results
