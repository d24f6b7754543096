"""FULL_SHARD frees a unit's parameters after its forward and re-gathers them before its backward
(into the buffer the graph's saved views read), with every prefetch setting, under activation
checkpointing and with two forwards per backward: training stays equal to single-process
training (float64 <= 1e-10), the gather buffers give their memory back after forward (and a
unit's, parameter by parameter, during its backward) without a wrong value being read, and at
most two units are gathered at once. Real processes (RankPool, gloo, 2 ranks)."""

import fsdp_reshard_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, backend="gloo", timeout=120.0) as p:
        yield p


CASES = {
    "backward-pre": {},
    "backward-pre-unlimited": {"limit_all_gathers": False},
    "no-prefetch": {"backward_prefetch": None},
    "backward-post": {"backward_prefetch": "BACKWARD_POST"},
    "forward-prefetch": {"forward_prefetch": True},
    "two-forwards": {"twice": True, "forward_prefetch": True},
    "checkpointed": {"ckpt": True},
    "checkpointed-two-forwards": {"ckpt": True, "twice": True},
}


@pytest.mark.parametrize("name", list(CASES))
def test_full_shard_reshards_and_matches_single_process(pool, name):
    cfg = CASES[name]
    for rank, (diff, held) in enumerate(pool.run(fns.reshard_run, cfg)):
        assert diff <= 1e-10, f"rank {rank}: {name} differs from single-process training by {diff:g}"
        if cfg.get("limit_all_gathers", True):
            # torch's rate limiter: never more than two units' parameters gathered at once
            assert held["max_gathered"] <= 2, held
        elif cfg.get("backward_prefetch", "x") is not None:
            # the block in backward and the prefetched one, never the root as well: the root's
            # buffer goes when the blocks' backward begins, since no node left reads it (the
            # embedding's backward keeps the indices, not the table; see the next assertion)
            assert held["max_gathered"] == 2, held
        twice = cfg.get("twice", False)
        if not twice:
            assert not held["root_in_blocks"], held
        # a unit that ran once gives back the pages under each parameter as soon as its gradient
        # is final; one that ran twice keeps them (its other call still reads them)
        assert held["shrunk"] is (not twice), held
        if storage_can_release():
            # after forward every gather buffer has given its memory back under the graph's views
            # (each unit re-gathers into its buffer before its backward reads it), not just the
            # blocks': torch's resharding after forward
            assert held["held"] == 0 < held["all_units"], held


def storage_can_release() -> bool:
    from neural_arch.distributed.fsdp import storage

    return storage._CAN_RELEASE


def test_owner_pieces_cover_every_element_once():
    # FSDP's gradient goes, parameter by parameter, to the ranks owning its elements: the pieces
    # must tile the flat buffer exactly as the shards do (padding excluded), for odd world sizes too
    import numpy as np

    from neural_arch.distributed.flat_param import FlatLayout
    from neural_arch.distributed.fsdp.owner_reducer import owner_pieces

    shapes = [(5,), (2, 3), (), (7, 1), (1,)]
    for world in (1, 2, 3, 4, 5, 8, 40):
        lay = FlatLayout(shapes, world)
        hits = np.zeros(lay.padded_numel, dtype=int)
        for k in range(len(shapes)):
            for r, a, b, at in owner_pieces(lay, k):
                assert 0 <= at and at + (b - a) <= lay.shard_size
                dst = r * lay.shard_size + at
                assert dst == lay.offsets[k] + a    # the piece sits where the flat layout puts it
                hits[dst:dst + (b - a)] += 1
        assert hits[:lay.numel].tolist() == [1] * lay.numel and not hits[lay.numel:].any(), world
