"""Exploring ``DistributedTrainer`` against a plain single-process loop (hypothesis).

* gradient accumulation: ``K`` micro-batches equal one step on their union (float64 <= 1e-10) when they
  are the same size; a window of unequal micro-batches (a short last batch, a window that ``end_window``
  closes early) is the documented ``sum_j loss_j / K`` step -- each micro-batch's mean weighted ``1/K``,
  as torch's usual loop and Accelerate do, **not** the mean over the window's samples (see the report);
  with ``count_items`` (samples, or targets that are not padding) each micro-batch weighs its items
  over the window's items on every rank, and the window equals one step on its union's mean again
  (a hand-written loop with ``window_items`` and ``fit``; two ranks with unequal, padded micro-batches);
* clipping and the LR schedule run once per optimizer step, never per micro-batch; ``grad_norm`` is the
  window's accumulated gradient's norm before clipping;
* ``step=None`` (the trainer counts): a window closed early by ``end_window`` used to shorten the next
  one to ``(micro_step + 1) % K`` -- a one-micro-batch step with a ``1/K`` weight, silently -- now the next
  window has ``K`` micro-batches again;
* resume after a crash anywhere equals the uninterrupted run bitwise (same samples in the same order,
  same dropout draws, same parameters, same LR), with a DistributedSampler and with
  ``DataLoader(shuffle=True)``: resumed from an epoch's end checkpoint, the latter used to shuffle the
  next epoch as its first one (a fresh generator), training on another order without a word.

Every strategy that runs in one process (ddp, zero1, zero2, fsdp, fully_shard) is driven in this
process (a world of one that the trainer creates and destroys); the two-rank runs are in
``trainer_explore_rank_fns`` (one module-scoped RankPool).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import trainer_explore_rank_fns as fns
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.distributed as dist
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)

IN_PROCESS = ["ddp", "zero1", "zero2", "fsdp", "fully_shard"]


@pytest.fixture(autouse=True)
def _no_leftover_group():
    yield
    assert not dist.is_initialized(), "the trainer left its process group behind"


@st.composite
def _schedules(draw):
    """(K, micro-batch sizes, end_window flags): a run of micro-batches, some windows closed early."""
    k = draw(st.integers(1, 3))
    n = draw(st.integers(1, 7))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    early = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ends = [True if i == n - 1 else (True if e and draw(st.booleans()) else None) for i, e in enumerate(early)]
    return k, sizes, ends


@settings(max_examples=12)
@given(_schedules(), st.sampled_from(IN_PROCESS), st.sampled_from([None, 0.05, 10.0]), st.booleans())
@example((2, [2, 2, 2, 2, 2, 2], [None, None, True, None, None, True]), "ddp", None, False)   # the window bug
@example((3, [2, 2, 2, 2, 2, 2], [None] * 5 + [True]), "fully_shard", 0.05, True)            # K equal: the union
@example((2, [3, 3, 3, 1], [None, None, None, True]), "zero2", 0.05, False)                  # a short last batch
def test_accumulation_clip_and_schedule_equal_a_plain_loop(schedule, strategy, clip, adam):
    k, sizes, ends = schedule
    got = fns.trainer_run(strategy, k, sizes, ends, clip, adam)
    want = fns.reference_run(k, sizes, ends, clip, adam)
    assert got["accumulating"] == want["accumulating"]
    assert got["steps"] == want["steps"] and got["lrs"] == want["lrs"]
    np.testing.assert_allclose(got["grad_norms"], want["grad_norms"], rtol=1e-12, atol=1e-12)
    for name, value in want["params"].items():
        assert np.abs(got["params"][name] - value).max() <= 1e-10, (name, strategy)


def test_a_scheduler_that_needs_a_metric_is_refused_before_the_step():
    """ReduceLROnPlateau.step(metrics) cannot be stepped per optimizer step: a clear error before the
    optimizer moves (it used to be a TypeError after the step, with the window's counters half updated)."""
    from neural_arch.optim.lr_scheduler import ReduceLROnPlateau

    with fns.trainer(k=1) as (t, opt, batch):
        t.lr_scheduler = ReduceLROnPlateau(opt)
        before = [p.data.copy() for p in t.module.parameters()]
        with pytest.raises(TypeError, match="ReduceLROnPlateau.step needs one"):
            t.train_step(batch, opt, fns.cross_entropy)
        assert all(np.array_equal(a, p.data) for a, p in zip(before, t.module.parameters()))


def test_equal_micro_batches_are_one_step_on_their_union():
    """The house proof in its plainest form: K=3 micro-batches of 2 == one step on the 6 samples."""
    got = fns.trainer_run("ddp", 3, [2] * 6, [None] * 5 + [True], 0.05, True)
    want = fns.union_run(3, 2, 2, 0.05, True)
    for name, value in want.items():
        assert np.abs(got["params"][name] - value).max() <= 1e-10


@pytest.mark.parametrize("strategy, k, every, shuffle", [
    ("ddp", 2, 1, "loader"),             # found: DataLoader(shuffle=True) resumed from an epoch's end re-drew
    ("fully_shard", 2, None, "loader"),  # the first epoch's order (fresh generator), silently other parameters
    ("fsdp", 3, 2, "sampler"),
])
def test_resume_after_a_crash_anywhere_equals_the_uninterrupted_run(strategy, k, every, shuffle, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # a crash mid-window: fit's checkpoints are at windows' ends
        ref = fns.fit_run(str(tmp_path / "uninterrupted"), strategy, k, every, shuffle=shuffle)
        for crash in (2, 5, 8, 11):          # micro-batches of epoch 0 and 1 (7 per epoch, the last short)
            root = str(tmp_path / f"crash_{crash}")
            assert fns.fit_run(root, strategy, k, every, crash_at=crash, shuffle=shuffle) is None
            got = fns.fit_run(root, strategy, k, every, shuffle=shuffle)
            assert got["global_step"] == ref["global_step"] and got["lr"] == ref["lr"], crash
            for name, value in ref["params"].items():
                np.testing.assert_array_equal(got["params"][name], value, err_msg=f"crash at {crash}: {name}")


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


def test_two_ranks_accumulate_with_early_window_ends_as_one_process(pool):
    """Two ranks, every strategy that splits data, ``step=None`` with windows closed early: the same
    parameters as one process stepping on the union of each window's micro-batches of both ranks."""
    cfg = {"k": 3, "ends": [None, True, None, None, None, None, True], "clip": 0.05}
    results = pool.run(fns.two_rank_windows, cfg)
    want = fns.two_rank_reference(cfg)
    for rank, per in enumerate(results):
        for strategy, r in per.items():
            assert r["accumulating"] == want["accumulating"], (rank, strategy)
            assert r["lrs"] == want["lrs"], (rank, strategy)
            for name, value in want["params"].items():
                assert np.abs(r["params"][name] - value).max() <= 1e-10, (rank, strategy, name)


# -- count_items: each micro-batch weighs its items (Hugging Face's num_items_in_batch) ---------------

@settings(max_examples=10)
@given(_schedules(), st.sampled_from(IN_PROCESS), st.sampled_from([None, 0.05]), st.booleans(),
       st.sampled_from([None, 1, 2, 3]), st.booleans())
# a short last micro-batch: under 1/K its 1 sample weighed as much as the other 3 (not the union's mean)
@example((2, [3, 1, 3, 1], [None, None, None, True]), "ddp", None, False, None, True)
# padding: a micro-batch with no target left weighs 0 (its mean is 0/0), the window is still one mean
@example((2, [2, 3, 2, 2], [None, None, None, True]), "fully_shard", 0.05, True, [0, 1, 5], False)
def test_count_items_makes_a_window_one_mean_over_its_items(schedule, strategy, clip, adam, mask, use_fit):
    k, sizes, ends = schedule
    if use_fit:      # fit closes windows every K micro-batches and at the epoch's last one only
        ends = [None] * (len(sizes) - 1) + [True]
    got = fns.item_trainer_run(strategy, k, sizes, ends, clip, adam, mask, use_fit)
    want = fns.item_reference_run(k, sizes, ends, clip, adam, mask)
    assert got["steps"] == want["steps"]
    for name, value in want["params"].items():
        assert np.abs(got["params"][name] - value).max() <= 1e-10, (name, strategy)


def test_count_items_is_checked_at_the_call():
    import neural_arch.nn.functional as F
    from neural_arch.distributed.trainer import DistributedTrainer

    with pytest.raises(ValueError, match="count_items must be None, 'samples' or a function"):
        DistributedTrainer(fns.build(0), count_items="tokens")
    with fns.trainer(k=2) as (t, opt, batch):
        with pytest.raises(ValueError, match="needs DistributedTrainer\\(count_items=...\\)"):
            t.train_step(batch, opt, F.cross_entropy, window_items=4)
        with pytest.raises(ValueError, match="the trainer counts no items"):
            t.window_items([batch])
    with DistributedTrainer(fns.build(0), gradient_accumulation_steps=2, count_items="samples") as t:
        opt, _ = fns._optimizer(t.module.parameters(), adam=False)
        with pytest.raises(ValueError, match="pass train_step\\(..., window_items=trainer.window_items"):
            t.train_step(batch, opt, F.cross_entropy)
        with pytest.raises(ValueError, match="fewer than this micro-batch's 2 items"):
            t.train_step(batch, opt, F.cross_entropy, window_items=1)
        assert t.window_items([batch, batch]) == 4 and t.micro_step == 0     # nothing ran


def test_two_ranks_with_unequal_padded_micro_batches_train_as_one_mean(pool):
    """Rank 0 and rank 1 hold micro-batches of other sizes and other padding (one of each rank's has no
    target left); with ``count_items`` DDP and fully_shard equal one process on each window's mean over
    every kept target of both ranks (the window's count is all-reduced)."""
    cfg = {"k": 2, "sizes": [[3, 1, 2, 2], [1, 2, 3, 1]], "mask": [0, 4, 5, 9, 10, 11]}
    results = pool.run(fns.two_rank_items, cfg)
    want = fns.two_rank_items_reference(cfg)
    for rank, per in enumerate(results):
        for strategy, params in per.items():
            for name, value in want.items():
                assert np.abs(params[name] - value).max() <= 1e-10, (rank, strategy, name)
