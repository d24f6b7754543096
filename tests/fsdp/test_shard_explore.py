"""Exploring ZeRO-1/2 and FSDP (flat and ``fully_shard``) against single-process training (hypothesis).

Each example draws a world of 1-3 ranks (the first ranks of one pool of three: a cached subgroup),
layer sizes whose parameter counts do not divide the world size, SGD with momentum and weight decay
or Adam/AdamW, clipping by the global norm (2 or inf; the returned norm must equal one process's),
a frozen layer, and for ZeRO a parameter unused in some steps and a consolidated state dict loaded
into a fresh optimizer that must continue exactly; float64 <= 1e-10 (mixed precision: 1e-4).

Pinned bugs (found here, fixed in neural_arch/distributed/fsdp and optim):

* FSDP gave an all-frozen unit a zero gradient, so weight decay moved the frozen parameters;
* FSDP stepped a partly frozen unit's flat parameter as a whole (frozen elements moved under weight
  decay): it now raises at construction, torch's rule for ``use_orig_params=False``;
* ``FSDP(process_group=subgroup, sync_module_states=True)`` broadcast over the whole world (a hang,
  or another group's values: the world-2 examples in a pool of 3);
* ZeRO-2 stepped parameters that got no gradient on any rank (momentum, weight decay and Adam's step
  went on): such buckets are now skipped, and a bucket only partly unused raises.
"""

import numpy as np
import pytest
import shard_explore_rank_fns as fns
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(3, backend="gloo", timeout=120.0) as p:
        yield p


def _worst(results: list) -> dict:
    answered = [r for r in results if r]           # ranks outside the drawn world answer {}
    return {k: max(r[k] for r in answered) for k in answered[0]}


common = {
    "world": st.integers(1, 3),
    "sizes": st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(1, 3)),
    "B": st.integers(1, 2),
    "steps": st.integers(1, 3),
    "opt": st.sampled_from(["sgd", "adam", "adamw"]),
    "clip": st.none() | st.sampled_from([0.01, 10.0]),
    "norm_type": st.sampled_from([2.0, np.inf]),
}


@settings(max_examples=25)
@given(cfg=st.fixed_dictionaries({**common, "stage": st.sampled_from([1, 2]), "cap": st.sampled_from([1e-6, 25.0]),
                                  "frozen": st.booleans(), "head": st.booleans()}))
@example(cfg={"world": 2, "sizes": (3, 4, 2), "B": 2, "steps": 3, "opt": "adamw", "clip": None, "norm_type": 2.0,
              "stage": 2, "cap": 1e-6, "frozen": False, "head": True})      # ZeRO-2 stepped an unused bucket
@example(cfg={"world": 3, "sizes": (1, 1, 1), "B": 1, "steps": 2, "opt": "sgd", "clip": 0.01, "norm_type": np.inf,
              "stage": 2, "cap": 25.0, "frozen": True, "head": False})
def test_zero_equals_single_process(pool, cfg):
    if cfg["stage"] == 2 and cfg["head"] and cfg["cap"] > 1:
        # the head shares the one bucket with used parameters: a clear error on every rank, not a wrong step
        with pytest.raises(Exception, match=r"got no gradient on any rank since the last step, but share flat bucket"):
            pool.run(fns.zero_case_run, cfg)
        return
    worst = _worst(pool.run(fns.zero_case_run, cfg))
    assert all(v <= 1e-10 for v in worst.values()), (worst, cfg)


@settings(max_examples=25)
@given(cfg=st.fixed_dictionaries({**common, "kind": st.sampled_from(["fsdp", "fully_shard"]),
                                  "strategy": st.sampled_from(["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]),
                                  "wrap": st.booleans(), "frozen_layer": st.booleans(), "mp": st.booleans()}))
@example(cfg={"world": 3, "sizes": (3, 5, 2), "B": 1, "steps": 2, "opt": "sgd", "clip": None, "norm_type": 2.0,
              "kind": "fsdp", "strategy": "FULL_SHARD", "wrap": True, "frozen_layer": True, "mp": False})
@example(cfg={"world": 2, "sizes": (2, 3, 2), "B": 1, "steps": 1, "opt": "adam", "clip": None, "norm_type": 2.0,
              "kind": "fsdp", "strategy": "NO_SHARD", "wrap": False, "frozen_layer": False, "mp": False})
@example(cfg={"world": 2, "sizes": (3, 5, 2), "B": 1, "steps": 2, "opt": "adamw", "clip": 0.01, "norm_type": 2.0,
              "kind": "fsdp", "strategy": "SHARD_GRAD_OP", "wrap": False, "frozen_layer": True, "mp": False})
def test_fsdp_equals_single_process(pool, cfg):
    worst = _worst(pool.run(fns.fsdp_case_run, cfg))
    if cfg["kind"] == "fsdp" and cfg["frozen_layer"] and not cfg["wrap"]:
        assert worst == {"mixed_unit_error": 0.0}, worst       # frozen and trainable in one flat unit: torch's error
        return
    tol = 1e-4 if cfg["mp"] else 1e-10   # float32 compute and reduction against float64 training
    assert set(worst) >= {"params"} and all(v <= tol for v in worst.values()), (worst, cfg)


def test_fsdp_partly_frozen_unit_raises_naming_the_parameter(pool):
    cfg = {"world": 3, "sizes": (2, 3, 2), "B": 1, "steps": 1, "opt": "sgd", "kind": "fsdp", "strategy": "FULL_SHARD",
           "wrap": True, "frozen": True}
    assert _worst(pool.run(fns.fsdp_case_run, cfg)) == {"mixed_unit_error": 0.0}
