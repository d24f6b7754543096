"""``nn.utils.clip_grad_norm_`` on FSDP's flat shards (and ``opt.clip_grad_norm_`` on ZeRO-2's)
clips by the *global* norm, as single-process training on the global batch does (2-norm and
inf-norm); on the original parameters, whose gradients live in the shards, it refuses with a
sentence instead of returning a norm of 0. Real processes (RankPool, gloo, 2 ranks)."""

import clip_rank_fns as fns
import pytest

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(120)


def test_clip_grad_norm_of_sharded_gradients_is_the_global_norm():
    with RankPool(2, backend="gloo", timeout=60.0) as pool:
        results = pool.run(fns.clip_run, 0.05)
    for rank, r in enumerate(results):
        assert r["ref"] > 0.05  # the clip is active
        assert abs(r["fsdp"] - r["ref"]) <= 1e-10 * r["ref"], (rank, r["fsdp"], r["ref"])
        assert abs(r["fsdp_inf"] - r["ref_inf"]) <= 1e-12, (rank, r["fsdp_inf"], r["ref_inf"])
        assert r["fsdp_grads"] <= 1e-12, rank  # every piece clipped by the same (global) factor
        assert abs(r["zero2"] - r["ref"]) <= 1e-10 * r["ref"], (rank, r["zero2"], r["ref"])
        assert r["zero2_grads"] <= 1e-12, rank
        assert "fsdp.clip_grad_norm_(max_norm)" in r["fsdp_refused"], r["fsdp_refused"]
        assert "opt.clip_grad_norm_(max_norm)" in r["zero2_refused"], r["zero2_refused"]
