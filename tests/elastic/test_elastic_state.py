"""elastic.State commit/restore round trips, and ``@elastic.run`` recovering from a peer failure:
restore the last commit, re-initialise the process group (same size), continue to the same result."""

import elastic_rank_fns as fns
import numpy as np
import pytest

from neural_arch.distributed import elastic
from neural_arch.distributed.elastic.sampler import ElasticDistributedSampler
from neural_arch.distributed.testing import RankPool


def test_commit_restore_round_trips_exactly():
    from neural_arch.core.tensor import Tensor

    model, opt, X, Y = fns._setup()
    sampler = ElasticDistributedSampler(dataset_size=40, num_replicas=1, rank=0)

    def step():
        opt.zero_grad()
        ((model(Tensor(X[:8])) - Tensor(Y[:8])) ** 2).sum().backward()
        opt.step()
        sampler.record_samples(8)

    state = elastic.State(model=model, optimizer=opt, sampler=sampler, epoch=1, step=7)
    step()
    state.commit()
    saved = ([p.data.copy() for p in model.parameters()], opt.state_dict(), sampler.state_dict())
    for _ in range(3):
        step()
    state.step, state.epoch = 99, 5
    state.restore()
    assert (state.step, state.epoch) == (7, 1)
    for p, q in zip(model.parameters(), saved[0]):
        assert p.data.tobytes() == q.tobytes()
    after = opt.state_dict()
    for k, v in saved[1]["state"].items():
        for name, arr in v.items():
            assert np.array_equal(after["state"][k][name], arr) and after["state"][k]["step"] == v["step"]
    assert sampler.state_dict() == saved[2]
    with pytest.raises(AttributeError, match="pass it to State"):
        _ = state.missing


def test_durable_commit_and_resume(tmp_path):
    model, opt, _X, _Y = fns._setup()
    state = elastic.State(model=model, optimizer=opt, checkpoint_dir=tmp_path, save_every=2, step=0)
    for s in range(1, 5):
        state.step = s
        model[0].weight.data[...] = s
        state.commit()
    model2, opt2, _, _ = fns._setup(seed=1)
    state2 = elastic.State(model=model2, optimizer=opt2, checkpoint_dir=tmp_path, step=0)
    assert state2.load_latest_checkpoint() == 4
    assert state2.step == 4 and (model2[0].weight.data == 4).all()


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0, env={"NEURAL_ARCH_TIMEOUT": "15"}) as p:
        yield p


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fail_ranks", [(0, 1), (1,)], ids=["all-ranks", "one-rank"])
def test_run_restores_and_reinitialises_after_a_peer_failure(pool, fail_ranks):
    clean = pool.run(fns.train_with_failure, None, ())
    failed = pool.run(fns.train_with_failure, 7, fail_ranks)
    for (p_clean, entries_clean, gen_clean), (p_fail, entries_fail, gen_fail) in zip(clean, failed):
        assert entries_clean == [0]
        assert entries_fail == [0, 6]  # re-entered from the last commit (step 6, mid-epoch), not 0 or 7
        assert gen_fail == gen_clean + 1  # the process group was re-initialised once
        for a, b in zip(p_clean, p_fail):
            assert np.max(np.abs(a - b)) <= 1e-12
