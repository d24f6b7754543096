"""``Manager`` and ``Lighthouse`` in one process: replicas are threads here (the multi-process proof
with a SIGKILL is test_ft_heal.py). Healing, one commit decision for all, and a hung replica."""

import threading
import time

import numpy as np
import pytest

from neural_arch.distributed import ft
from neural_arch.distributed.ft.transfer import head_bytes_for


def replica(lighthouse, name, w, steps, grads, before_allreduce=None, timeout=5.0, registered=None):
    """Train a parameter vector ``w`` with plain SGD: ``w -= averaged grad`` on every committed step.
    ``registered``: a ``threading.Barrier`` the replicas pass once all of them registered."""
    m = ft.Manager(pg=ft.ProcessGroupGloo(timeout=timeout, transport="tcp"), replica_id=name,
                   lighthouse_addr=lighthouse.address, timeout=timeout, heartbeat_interval=0.02, init_sync=False,
                   state_dict=lambda: {"w": w}, load_state_dict=lambda s: w.__setitem__(Ellipsis, s["w"]))
    record = []
    if registered is not None:
        registered.wait(30)
    try:
        while m.current_step() < steps:
            m.start_quorum()
            g = np.full_like(w, grads(m.current_step(), name))
            if before_allreduce is not None:
                before_allreduce(m)
            m.allreduce(g)
            committed = m.should_commit()
            if committed:
                w -= g
            record.append((m.quorum.round, m.num_participants(), committed))
        return m.heals, record
    finally:
        m.shutdown()


def in_threads(*jobs):
    out, errors = {}, []

    def wrap(key, fn):
        try:
            out[key] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append((key, exc))
    threads = [threading.Thread(target=wrap, args=job, daemon=True) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.mark.timeout(90)
def test_a_late_replica_heals_from_a_live_peer_then_both_average():
    with ft.Lighthouse(min_replicas=1, heartbeat_timeout=1.0, join_timeout=1.0) as lighthouse:
        wa, wb = np.zeros(4), np.full(4, 99.0)
        late = threading.Event()

        def let_b_in(m):    # after two steps alone, a waits (mid-step) until b registered
            if m.current_step() == 2 and not late.is_set():
                late.set()
                deadline = time.monotonic() + 30
                while len(lighthouse.members) < 2 and time.monotonic() < deadline:
                    time.sleep(0.005)

        def a():
            return replica(lighthouse, "a", wa, 5, lambda step, _: 1.0, before_allreduce=let_b_in)

        def b():
            late.wait(30)
            return replica(lighthouse, "b", wb, 5, lambda step, _: 3.0)
        out = in_threads(("a", a), ("b", b))
    assert out["b"][0] == 1 and out["a"][0] == 0                 # b copied a's state, a healed nobody's
    assert np.array_equal(wa, wb)
    # b, new, asked for a head sized by its own state; the quorum handed that number to its healer
    (healing,) = [q for q in lighthouse.quorums if q.heal]
    assert list(healing.heal_head.values()) == [head_bytes_for({"user": {"w": wb}, "step": 0})]
    # a alone commits its own gradient (1.0); together the average is 2.0; wa ends at -(k*1 + j*2)
    alone = sum(1 for _r, size, ok in out["a"][1] if ok and size == 1)
    together = sum(1 for _r, size, ok in out["a"][1] if ok and size == 2)
    assert alone == 3 and together == 2
    assert np.allclose(wa, -(alone * 1.0 + together * 2.0))


@pytest.mark.timeout(90)
def test_a_failure_on_one_replica_voids_the_step_on_all_and_the_group_is_rebuilt():
    with ft.Lighthouse(min_replicas=2, heartbeat_timeout=1.0, join_timeout=1.0) as lighthouse:
        ws = {"a": np.zeros(2), "b": np.zeros(2)}
        ids = {"a": [], "b": []}

        def fail_once(m):
            ids[m.replica_id].append(m.quorum.quorum_id)
            if m.replica_id == "b" and m.current_step() == 1 and len(ids["b"]) == 2:
                m.report_error(RuntimeError("loss is NaN"))          # e.g. the user's own check
        out = in_threads(*[(n, lambda n=n: replica(lighthouse, n, ws[n], 3, lambda s, _: 1.0, fail_once))
                           for n in ("a", "b")])
    for n in ("a", "b"):
        assert [ok for _r, _s, ok in out[n][1]] == [True, False, True, True]
        assert ids[n][1] == ids[n][0] and ids[n][2] == ids[n][1] + 1     # kept, then rebuilt after the failure
    assert np.array_equal(ws["a"], ws["b"]) and np.allclose(ws["a"], -3.0)


@pytest.mark.timeout(90)
def test_a_hung_replica_is_left_out_after_the_timeouts_and_heals_when_it_wakes():
    with ft.Lighthouse(min_replicas=1, heartbeat_timeout=5.0, join_timeout=0.3) as lighthouse:
        ws = {"a": np.zeros(2), "b": np.zeros(2)}

        alone = threading.Event()

        def hang(m):
            if m.replica_id == "b" and m.current_step() == 1 and not alone.is_set():
                alone.wait(30)      # b hangs in user code (its heartbeat goes on) until a went on alone
            if m.num_participants() == 1:
                alone.set()
                time.sleep(0.1)     # a is slow alone: b, awake again, rejoins before a's last step
        both = threading.Barrier(2)     # both registered before either asks: the first quorum is two
        out = in_threads(*[(n, lambda n=n: replica(lighthouse, n, ws[n], 5, lambda s, _: 1.0, hang, timeout=0.5,
                                                   registered=both)) for n in ("a", "b")])
        sizes = [q.size for q in lighthouse.quorums]
    assert 1 in sizes and sizes[0] == 2 and sizes[-1] == 2, sizes   # a went on alone, b came back
    assert out["b"][0] == 1 and not out["b"][1][1][2]               # b's hung step was void; it healed
    assert np.array_equal(ws["a"], ws["b"]) and np.allclose(ws["a"], -5.0)
