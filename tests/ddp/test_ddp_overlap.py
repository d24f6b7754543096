"""DDP overlap machinery, in one process: who may spin in the shared-memory barrier, and when.

A progress thread (DDP's bucket reductions) spins and yields in the direct collectives' barrier only
while the main thread is blocked in ``Work.wait`` (then nobody needs the GIL for compute); the
counter behind that must come back to zero however a wait ends. Two "ranks" here are two threads of
this process mapping one segment (a FileStore rendezvous), so no process start is paid.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
from polling import wait_for

from neural_arch.distributed.comm import work as work_mod
from neural_arch.distributed.comm.gloo.transport import shm_segment
from neural_arch.distributed.comm.gloo.transport.shm_segment import ShmSegment
from neural_arch.distributed.comm.work import OpInfo, Work
from neural_arch.distributed.errors import CollectiveTimeoutError, GroupPoisonedError
from neural_arch.distributed.rendezvous.file_store import FileStore

pytestmark = [pytest.mark.timeout(30),
              pytest.mark.skipif(not shm_segment.direct_supported(), reason="needs Linux on x86-64")]


def _until(cond, timeout=5.0):
    assert wait_for(cond, timeout, interval=1e-3), "condition not reached in time"


def _blocked_in_work_wait(thread) -> bool:
    """``thread`` sleeps inside ``Work.wait``'s event wait (its Python stack says so)."""
    frame = sys._current_frames().get(thread.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "_blocking_wait" in names and names[0] == "wait"


# -- the counter ---------------------------------------------------------------------------------------
def test_main_thread_wait_is_counted_while_blocked_and_uncounted_after():
    work, seen = Work(), []

    def finisher():
        _until(lambda: work_mod.main_thread_waiting == 1)
        seen.append(work_mod.main_thread_waiting)
        work._set_result(7)

    t = threading.Thread(target=finisher)
    t.start()
    assert work.result() == 7
    t.join(5)
    assert seen == [1] and work_mod.main_thread_waiting == 0


def test_counter_returns_to_zero_after_a_timeout_and_an_exception():
    with pytest.raises(CollectiveTimeoutError):
        Work().wait(timeout=0.01)
    assert work_mod.main_thread_waiting == 0

    class Broken:                      # an Event whose wait is interrupted (KeyboardInterrupt, say)
        def wait(self, timeout=None):
            assert work_mod.main_thread_waiting == 1
            raise KeyboardInterrupt

    work = Work()
    work._event = Broken()
    with pytest.raises(KeyboardInterrupt):
        work.wait()
    assert work_mod.main_thread_waiting == 0


def test_a_wait_on_another_thread_is_not_counted():
    work, during = Work(), []
    t = threading.Thread(target=work.wait, daemon=True)
    t.start()
    _until(lambda: _blocked_in_work_wait(t))
    during.append(work_mod.main_thread_waiting)
    work._set_result(None)
    t.join(5)
    assert during == [0]


# -- the barrier of two thread-ranks ---------------------------------------------------------------------
@pytest.fixture
def segments(tmp_path, monkeypatch):
    # explicit phases: no load-average check (the test machine is busy), a long yield phase
    monkeypatch.setenv("NEURAL_ARCH_SHM_SPIN_S", "2e-5")
    monkeypatch.setenv("NEURAL_ARCH_SHM_YIELD_S", "5")
    store = FileStore(str(tmp_path / "store"))
    segs = [None, None]

    def connect(r):
        segs[r] = ShmSegment.connect(store, r, 2, deadline=time.monotonic() + 10, chunk=4096)

    threads = [threading.Thread(target=connect, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(segs)
    spins = []
    real = ShmSegment._spin_then_yield

    def counting(self, e, info, on_main):
        done = real(self, e, info, on_main)
        spins.append((self.rank, on_main, done))
        return done
    monkeypatch.setattr(ShmSegment, "_spin_then_yield", counting)
    yield segs, spins
    for s in segs:
        s.close()


def _info():
    return OpInfo("all_reduce", 1, (0, 1), 0, deadline=time.monotonic() + 10)


def _lane_barrier(seg, work):
    """Rank 0's progress thread: one barrier, the outcome into ``work`` (as a lane would)."""
    def run():
        try:
            seg.barrier(_info())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting main thread
            work._set_exception(exc)
        else:
            work._set_result("through")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_progress_thread_spins_in_the_barrier_while_the_main_thread_waits(segments):
    (seg0, seg1), spins = segments
    work = Work()
    lane = _lane_barrier(seg0, work)

    def late_peer():                  # arrives once the main thread has blocked, well after 2 ms slices
        _until(lambda: work_mod.main_thread_waiting == 1)
        time.sleep(0.02)              # late on purpose: the spin across slices is the case under test
        seg1.barrier(_info())

    peer = threading.Thread(target=late_peer, daemon=True)
    peer.start()
    assert work.result() == "through"
    lane.join(5)
    peer.join(5)
    # rank 0's wait finished in its spin/yield phase (not asleep on the futex); rank 1 arrived last
    assert (0, False, True) in spins


def test_progress_thread_does_not_spin_while_the_main_thread_computes(segments):
    (seg0, seg1), spins = segments
    work = Work()
    lane = _lane_barrier(seg0, work)
    time.sleep(0.03)                  # "backward": the main thread is busy, not in Work.wait
    seg1.barrier(_info())             # (the main thread arriving as rank 1 itself spins: none needed)
    _until(work.is_completed)
    lane.join(5)
    assert work.result() == "through"
    assert not [s for s in spins if s[0] == 0]


def test_poison_ends_a_progress_thread_spinning_for_the_waiting_main_thread(segments):
    (seg0, seg1), _ = segments
    work = Work()
    lane = _lane_barrier(seg0, work)

    def failing_peer():
        _until(lambda: work_mod.main_thread_waiting == 1)
        time.sleep(0.01)              # late on purpose: the poison must reach a thread already spinning
        seg1.poison("rank 1 failed on purpose")

    peer = threading.Thread(target=failing_peer, daemon=True)
    peer.start()
    t0 = time.monotonic()
    with pytest.raises(GroupPoisonedError, match="on purpose"):
        work.wait()
    assert time.monotonic() - t0 < 2.0      # at once, not after the 5 s yield phase
    lane.join(5)
    peer.join(5)
    assert work_mod.main_thread_waiting == 0
