"""``Manager(use_async_quorum=True)``: the quorum is awaited on a background thread while the step
computes (torchft's async quorum). Replicas are threads here; the multi-process SIGKILL proof with
the quorum overlapped is test_ft_heal.py's ``async_quorum`` case."""

import threading
import time

import numpy as np
import pytest
from test_manager import in_threads

from neural_arch.distributed import ft

JOIN_TIMEOUT = 1.0     # how long the lighthouse waits for a silent member: the quorum's known delay


def manager(lighthouse, name, w, timeout=5.0):
    return ft.Manager(pg=ft.ProcessGroupGloo(timeout=timeout, transport="tcp"), replica_id=name,
                      lighthouse_addr=lighthouse.address, timeout=timeout, heartbeat_interval=0.02,
                      init_sync=False, use_async_quorum=True,
                      state_dict=lambda: {"w": w}, load_state_dict=lambda s: w.__setitem__(Ellipsis, s["w"]))


@pytest.mark.timeout(60)
def test_the_forward_runs_before_a_delayed_quorum_arrives_and_the_step_still_commits():
    with ft.Lighthouse(min_replicas=1, heartbeat_timeout=10.0, join_timeout=JOIN_TIMEOUT) as lighthouse:
        w = np.zeros(3)
        a = manager(lighthouse, "a", w)
        silent = None
        try:
            # a new replica may be behind: its first start_quorum waits for the quorum (and would heal)
            assert a.start_quorum() is not None
            assert a.timings["quorum_at"] <= time.monotonic()
            g = np.ones(3)
            a.allreduce(g)
            assert a.should_commit()
            w -= g

            # a healthy member that does not ask holds the next quorum back by JOIN_TIMEOUT
            silent = manager(lighthouse, "silent", np.zeros(3))
            deadline = time.monotonic() + 30
            while len(lighthouse.members) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert a.start_quorum() is None               # returned at once: the answer is on its way
            returned = time.monotonic()
            g = np.full(3, 2.0)                           # "forward and backward"
            computed = time.monotonic()
            a.allreduce(g)                                # waits for the quorum, then averages
            arrived = a.timings["quorum_at"]
            assert returned <= computed < arrived         # the step computed before its quorum arrived
            assert arrived - returned > JOIN_TIMEOUT / 2  # ... which the lighthouse held back
            assert a.quorum.members == (a.member,) and a.num_participants() == 1
            assert a.should_commit() and a.current_step() == 2
            w -= g
        finally:
            a.shutdown()
            if silent is not None:
                silent.shutdown()
    assert np.allclose(w, -3.0)


@pytest.mark.timeout(60)
def test_a_replica_found_behind_in_an_overlapped_step_voids_it_then_heals_before_computing():
    """b pauses between steps until a went on alone: b's next (overlapped) quorum says it is behind,
    but its forward already ran on the old state, so the step is void on both; the next start_quorum
    of b waits and heals first, and both end equal."""
    with ft.Lighthouse(min_replicas=1, heartbeat_timeout=10.0, join_timeout=0.3) as lighthouse:
        ws = {"a": np.zeros(2), "b": np.zeros(2)}
        alone = threading.Event()
        registered = threading.Barrier(2)     # both registered before either asks: the first quorum is two

        def replica(name, steps=4):
            w = ws[name]
            m = manager(lighthouse, name, w)
            record = []
            registered.wait(30)
            try:
                while m.current_step() < steps:
                    if name == "b" and m.current_step() == 1 and not alone.is_set():
                        alone.wait(30)        # b is slow between steps: a commits a step alone
                    pending = m.start_quorum() is None
                    g = np.ones_like(w)
                    m.allreduce(g)
                    if m.num_participants() == 1:
                        alone.set()
                        time.sleep(0.05)      # alone, a is slow enough for b to rejoin
                    committed = m.should_commit()
                    if committed:
                        w -= g
                    record.append((m.num_participants(), pending, committed))
                return m.heals, record
            finally:
                m.shutdown()
        out = in_threads(*[(n, lambda n=n: replica(n)) for n in ("a", "b")])
    heals_b, record_b = out["b"]
    assert heals_b == 1 and out["a"][0] == 0
    assert (2, True, False) in record_b        # the overlapped step in which b was behind: void
    assert any(pending and ok for _n, pending, ok in out["a"][1])   # a overlapped committed steps too
    assert np.array_equal(ws["a"], ws["b"]) and np.allclose(ws["a"], -4.0)


@pytest.mark.timeout(60)
def test_shutdown_while_the_quorum_is_awaited_returns_without_waiting_for_it():
    with ft.Lighthouse(min_replicas=1, heartbeat_timeout=10.0, join_timeout=30.0) as lighthouse:
        a = manager(lighthouse, "a", np.zeros(2))
        late = None
        try:
            assert a.start_quorum() is not None                 # alone: the first quorum goes at once
            a.allreduce(np.ones(2))
            assert a.should_commit()
            late = manager(lighthouse, "late", np.zeros(2))      # registered, never asks: holds the next back 30 s
            deadline = time.monotonic() + 30
            while len(lighthouse.members) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert a.start_quorum() is None
            start = time.monotonic()
            a.shutdown()
            assert time.monotonic() - start < 5.0                # not the lighthouse's 30 s
        finally:
            if late is not None:
                late.shutdown()
