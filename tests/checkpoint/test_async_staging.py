"""async_save with asynchronous staging (torch's DefaultStager / AsyncSaveResponse): the call
returns before the copy is made, the checkpoint equals the synchronous save bitwise (gloo, groups of
1 and 2 ranks), an optimizer step or a BatchNorm training forward right after the call waits for
the copy (the checkpoint holds the state before them, bitwise), staging and write errors surface
through the two futures, and the next async_save waits for the previous one.

A stager slowed by a test hook (its ``_copy`` waits on events) makes the orderings deterministic:
no assertion on durations."""

import threading

import async_staging_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed.checkpoint import CheckpointError, load
from neural_arch.distributed.checkpoint.api import AsyncSaveResponse, async_save
from neural_arch.distributed.checkpoint.staging import (
    AsyncStager,
    BlockingAsyncStager,
    DefaultStager,
    StagingOptions,
)
from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


class GatedStager(DefaultStager):
    """Copies only once ``go`` is set; then waits (up to ``linger`` s) for ``mutated``: if something
    changed the arrays meanwhile (a missing guard), the copy sees it and the test fails."""

    def __init__(self, linger: float = 0.0):
        super().__init__(StagingOptions(use_async_staging=True))
        self.go, self.mutated, self.linger = threading.Event(), threading.Event(), linger

    def _copy(self, chunks):
        assert self.go.wait(60), "the test never released the stager"
        if self.linger:
            self.mutated.wait(self.linger)
        return super()._copy(chunks)


@pytest.fixture
def stager():
    s = GatedStager()
    yield s
    s.go.set()
    s.close()


def _bytes(state):
    return {k: np.asarray(v).tobytes() for k, v in state.items()}


def test_the_call_returns_before_staging_and_equals_a_blocking_save(tmp_path, stager):
    state = {"w": np.arange(12.0).reshape(3, 4), "i": np.arange(5, dtype=np.int32), "step": 7}
    response = async_save(state, tmp_path / "a", async_stager=stager)
    assert isinstance(response, AsyncSaveResponse)
    returned_before_staging = not response.staging_completion.done()
    stager.go.set()
    assert response.staging_completion.result() is None
    meta = response.upload_completion.result()
    assert returned_before_staging
    blocking = async_save(state, tmp_path / "b", async_stager=BlockingAsyncStager())
    assert not isinstance(blocking, AsyncSaveResponse)
    blocking.result()
    for d in ("a", "b"):
        got = {"w": np.zeros((3, 4)), "i": np.zeros(5, np.int32), "step": 0}
        load(got, tmp_path / d)
        assert _bytes(got) == _bytes(state)
    assert sorted(meta["tensors"]) == ["i", "w"]


def test_a_step_right_after_async_save_waits_for_the_copy(tmp_path):
    from neural_arch import nn, optim
    from neural_arch.core.tensor import Tensor
    from neural_arch.optim.optimizer import register_optimizer_step_pre_hook

    rng = np.random.default_rng(0)
    model = nn.Linear(4, 3, dtype=np.float64)
    opt = optim.SGD(model.parameters(), lr=0.5)
    (model(Tensor(rng.normal(size=(2, 4)))) ** 2).sum().backward()
    live = dict(model.named_parameters())   # the live Tensors (model.state_dict() would be copies)
    before = {k: np.array(v.data) for k, v in live.items()}
    stager = GatedStager(linger=0.3)
    seen = []
    # Registered first, so it runs before async_save's guard: the step has begun, staging has not.
    hook = register_optimizer_step_pre_hook(lambda o, a, k: seen.append(stager.go.set()))
    try:
        response = async_save(live, tmp_path, async_stager=stager)
        opt.step()                      # the user forgot staging_completion: the step waits for the copy
        stager.mutated.set()
        response.upload_completion.result()
    finally:
        hook.remove()
        stager.go.set()
        stager.close()
    assert seen == [None]
    assert any(not np.array_equal(before[k], v.data) for k, v in live.items())  # the step did run
    got = {k: np.zeros_like(v) for k, v in before.items()}
    load(got, tmp_path)
    assert _bytes(got) == _bytes(before)


def test_a_batchnorm_training_forward_waits_for_the_copy(tmp_path):
    from neural_arch import nn
    from neural_arch.core.tensor import Tensor
    from neural_arch.nn.module import register_module_forward_pre_hook

    model = nn.Sequential(nn.Linear(3, 4, dtype=np.float64), nn.BatchNorm1d(4, dtype=np.float64))
    x = Tensor(np.random.default_rng(1).normal(size=(5, 3)))
    model(x)
    live = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    before = {k: np.array(v.data) for k, v in live.items()}
    stager = GatedStager(linger=0.3)
    hook = register_module_forward_pre_hook(lambda m, a: stager.go.set())
    try:
        response = async_save(live, tmp_path, async_stager=stager)
        model(x)                        # updates running_mean/var and num_batches_tracked in place
        stager.mutated.set()
        response.upload_completion.result()
    finally:
        hook.remove()
        stager.go.set()
        stager.close()
    assert int(live["1.num_batches_tracked"].data) == int(before["1.num_batches_tracked"]) + 1
    got = {k: np.zeros_like(v) for k, v in before.items()}
    load(got, tmp_path)
    assert _bytes(got) == _bytes(before)


class FailingStager(DefaultStager):
    def _copy(self, chunks):
        raise MemoryError("no room to stage")


class ForgetfulStager(AsyncStager):
    """Returns a future of a copy missing every chunk: the write must fail, not the staging."""

    def stage(self, chunks):
        from concurrent.futures import Future

        f = Future()
        f.set_result({})
        return f


def test_errors_surface_through_the_futures(tmp_path):
    failing = FailingStager()
    try:
        response = async_save({"w": np.ones(3)}, tmp_path / "a", async_stager=failing)
        with pytest.raises(MemoryError, match="no room"):
            response.staging_completion.result()
        with pytest.raises(MemoryError, match="no room"):
            response.upload_completion.result()
    finally:
        failing.close()
    response = async_save({"w": np.ones(3)}, tmp_path / "b", async_stager=ForgetfulStager())
    assert response.staging_completion.result() is None
    with pytest.raises(CheckpointError, match="returned no copy"):
        response.upload_completion.result()
    # Nothing was committed; the next save works.
    assert async_save({"w": np.ones(3)}, tmp_path / "c", async_stager=BlockingAsyncStager()).result()


def test_the_next_async_save_waits_for_the_previous(tmp_path, stager):
    first = async_save({"w": np.ones(4)}, tmp_path / "a", async_stager=stager)
    out = {}

    def second():
        r = async_save({"w": np.zeros(4)}, tmp_path / "b", async_stager=DefaultStager())
        out["first_done"] = first.upload_completion.done()
        out["meta"] = r.upload_completion.result()

    t = threading.Thread(target=second)
    t.start()
    t.join(0.2)
    blocked = t.is_alive()              # the first save cannot finish: its staging is held
    stager.go.set()
    t.join(60)
    assert blocked and out["first_done"] and out["meta"]["tensors"]["w"]["global_shape"] == [4]


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.mark.parametrize("group_size", [1, 2], ids=["gloo-1", "gloo-2"])
def test_async_staging_equals_the_synchronous_save_bitwise(pool, tmp_path, group_size):
    out = pool.run(fns.sync_and_async_equal_run, str(tmp_path), group_size)
    for rank, r in enumerate(out):
        assert r["bad"] == [], f"rank {rank}: {r['bad']}"
    leaders = [r for r in out if "crc_equal" in r]
    assert len(leaders) == 2 // group_size and all(r["crc_equal"] for r in leaders)
    if group_size == 2:
        assert leaders[0]["files"] == 2      # both ranks wrote (row blocks of the replicated table)


def test_replicas_that_differ_are_refused_by_rank_0_before_commit(pool, tmp_path):
    out = pool.run(fns.replicas_differ_run, str(tmp_path))
    assert [r["staging_error"] for r in out] == [None, None]
    assert out[0]["error"] and "CheckpointError" in out[0]["error"] and "'w'" in out[0]["error"], out[0]["error"]
    assert "nothing was committed" in out[0]["error"] and "'same'" not in out[0]["error"]
    assert out[1]["error"] is None                 # rank 1's promise: its files are durable
    assert not out[0]["committed"]


def test_ddp_training_right_after_async_save_leaves_the_checkpoint_intact(pool, tmp_path):
    for rank, r in enumerate(pool.run(fns.ddp_step_after_async_save_run, str(tmp_path))):
        assert r["changed"] and r["equal"], f"rank {rank}: {r}"
