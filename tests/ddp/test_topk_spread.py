"""Top-K's spread delivery (``TopKState(spread=True)``): the arithmetic as plain data, and the hook
on two ranks simulated in one process (a tiny in-memory backend: no processes, no sockets; the
real backends' path is covered by the rank-pool tests in test_ddp.py).

What must hold: nothing is lost (delivered + pending == received, on every rank alike), an entry
that waited T steps is paid out in T equal installments, error feedback stays exact on the
sender (sent + residual == owed), and a dense step flushes everything pending.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neural_arch.distributed.algorithms.ddp_comm_hooks.comm_hook import GradBucket
from neural_arch.distributed.algorithms.ddp_comm_hooks.topk_hook import (
    Stage,
    TopKState,
    spread_delivery,
    topk_hook,
)
from neural_arch.distributed.comm.work import Work


def _fresh(n):
    return np.zeros(n), np.zeros(n), np.full(n, -1.0)


def test_an_entry_that_waited_t_steps_arrives_in_t_equal_installments():
    pending, rate, last = _fresh(3)
    got = np.array([False, True, True])
    spread_delivery(pending, rate, last, np.zeros(3), np.zeros(3, bool), 0)  # nothing yet
    out = [spread_delivery(pending, rate, last, np.array([0.0, 8.0, -3.0]), got, 3)]  # waited 4 steps
    out += [spread_delivery(pending, rate, last, np.zeros(3), np.zeros(3, bool), i) for i in range(4, 9)]
    assert [o.tolist() for o in out] == [[0.0, 2.0, -0.75]] * 4 + [[0.0, 0.0, 0.0]] * 2
    assert pending.tolist() == [0.0, 0.0, 0.0]


@settings(deadline=None, max_examples=60)
@given(seed=st.integers(0, 2 ** 16), n=st.integers(1, 12), steps=st.integers(1, 30),
       density=st.floats(0.05, 1.0))
def test_spread_delivery_loses_nothing_and_never_overpays(seed, n, steps, density):
    rng = np.random.default_rng(seed)
    pending, rate, last = _fresh(n)
    received_total, delivered_total = np.zeros(n), np.zeros(n)
    for it in range(steps):
        got = rng.random(n) < density
        received = np.where(got, rng.normal(size=n), 0.0)
        before = pending + received
        out = spread_delivery(pending, rate, last, received, got, it)
        # an installment has the sign of what is owed and never exceeds it
        assert np.all(np.abs(out) <= np.abs(before) + 1e-15) and np.all(out * before >= 0)
        received_total += received
        delivered_total += out
        assert np.max(np.abs(delivered_total + pending - received_total)) <= 1e-12
    for it in range(steps, steps + steps + 2):  # nothing more arrives: everything is paid out
        delivered_total += spread_delivery(pending, rate, last, np.zeros(n), np.zeros(n, bool), it)
    assert not pending.any()
    assert np.max(np.abs(delivered_total - received_total)) <= 1e-12


class _Exchange:
    """Two (or more) in-memory ranks: a collective completes once every rank has called it."""

    def __init__(self, world):
        self.world, self.calls = world, []

    def arrive(self, kind, out, inp, work):
        self.calls.append((kind, out, inp, work))
        if len(self.calls) == self.world:
            calls, self.calls = self.calls, []
            if kind == "allgather":
                table = np.stack([c[2] for c in calls])
                for _, o, _, w in calls:
                    o[...] = table
                    w._set_result(o)
            else:
                total = np.sum([c[1] for c in calls], axis=0)
                for _, o, _, w in calls:
                    o[...] = total
                    w._set_result(o)


class _Rank:
    def __init__(self, rank, exchange):
        self.rank, self.size, self._x = rank, exchange.world, exchange

    def allgather(self, output, input, async_op=True):
        work = Work()
        self._x.arrive("allgather", output, input.copy(), work)
        return work

    def allreduce(self, array, op=None, async_op=True):
        work = Work()
        self._x.arrive("allreduce", array, None, work)
        return work


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_two_ranks_stay_identical_and_lose_nothing(momentum):
    world, n, steps = 2, 37, 12
    exchange = _Exchange(world)
    states = [TopKState(ratio=0.1, spread=True, momentum=momentum, process_group=_Rank(r, exchange))
              for r in range(world)]
    assert states[0].schedule == [Stage(0, None, 0.1)]  # spread: no warm-up by default
    slots = [(0, 28, (4, 7)), (28, n, (9,))]
    rngs = [np.random.default_rng(40 + r) for r in range(world)]
    owed_total, delivered_total = np.zeros(n), np.zeros(n)
    velocity = [np.zeros(n) for _ in range(world)]
    for step in range(steps):
        if step == steps - 2:  # a dense step (e.g. a schedule changed by hand) flushes what is pending
            for s in states:
                s.schedule = [Stage(0, None, 1.0)]
        works, sent = [], np.zeros(n)
        for r, s in enumerate(states):
            grad = rngs[r].normal(size=n)
            velocity[r] = momentum * velocity[r] + grad / world
            owed = velocity[r] if momentum else grad / world
            owed_total += owed
            before = owed + s.residuals.get(0, np.zeros(n))
            works.append(topk_hook(s, GradBucket(0, grad.copy(), slots, params=["w", "b"], last=True)))
            sent += before - s.residuals[0]  # error feedback: sent + residual == owed, exactly
            if momentum and step < steps - 2:
                velocity[r][np.abs(before - s.residuals[0]) > 1e-9] = 0  # momentum factor masking
        results = [w.result() for w in works]
        assert np.array_equal(results[0], results[1])
        pending = [s.pending[0][0] for s in states]
        assert np.array_equal(pending[0], pending[1])
        delivered_total += results[0]
        assert np.max(np.abs(delivered_total + pending[0] + sum(s.residuals[0] for s in states)
                             - owed_total)) <= 1e-12
        if step == steps - 2:
            assert not pending[0].any() and states[0].last_sent == (n, n)
