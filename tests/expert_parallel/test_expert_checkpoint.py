"""Distributed checkpoints of expert-parallel MoE models under ZeRO and FSDP (issue 31).

Saved once with ``dcp.save``: a dp 2 x ep 2 MoE model (4 gloo ranks) after two Adam steps under
DDP + ZeRO-1. The state dicts name each expert by its **global** index (``moe.experts.3.fc1.weight``
on the ranks that hold expert 3), so the checkpoint holds every expert once, written by one rank of
the expert-data-parallel group holding it, and loads bitwise into the same layout, ep = 4 under
ZeRO-2, ep = 2 under FSDP, and one process without any parallelism (ep = 1); a whole state dict
(every expert) loads into each rank's slice with ``set_state_dict(strict=True)``. The same save under
FSDP (each expert its own flat unit over its expert-data-parallel group) loads into one process. Its full state dict
equals one process trained on the union batch (float64 <= 1e-10). One RankPool for the file.
"""

import json
import os
import re

import expert_ckpt_rank_fns as fns
import pytest
from ep_rank_fns import E  # experts of the test model

from neural_arch.distributed.testing import RankPool

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pool():
    with RankPool(4, backend="gloo", timeout=120.0) as p:
        yield p


@pytest.fixture(scope="module")
def saved(pool, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("ep_ckpt") / "zero1_ep2")
    full_model, full_optim, ref_model, ref_optim = pool.run(fns.save_run, "zero1", 2, directory)[0]
    return directory, (full_model, full_optim), (ref_model, ref_optim)


def test_saved_state_is_one_process_training_under_global_expert_names(saved):
    _, full, ref = saved
    assert sorted(full[0]) == sorted(ref[0])             # the plain model's names: experts 0 .. E-1
    assert fns.largest_difference(full, ref) <= 1e-10


def test_each_expert_is_written_once_by_a_rank_holding_it(saved):
    directory, _, _ = saved
    with open(os.path.join(directory, ".metadata")) as fh:
        meta = json.load(fh)
    entries = meta["tensors"]
    expert_keys = [k for k in entries if ".moe.experts." in k]
    assert {k.split(".moe.experts.")[1].split(".")[0] for k in expert_keys} == {str(e) for e in range(E)}
    for key in expert_keys:
        expert = int(key.split(".moe.experts.")[1].split(".")[0])
        writers = {int(re.match(r"__(\d+)_", chunk["file"]).group(1)) for chunk in entries[key]["chunks"]}
        # ep 2 inside dp 4: expert e lives on ep rank e // (E / 2), i.e. on world ranks r with r % 2 == that
        assert len(writers) == 1 and all(r % 2 == expert // (E // 2) for r in writers), (key, writers)


@pytest.mark.parametrize("wrapper, ep", [("zero1", 2), ("zero2", 4), ("fsdp", 2)])
def test_load_reshards_bitwise(pool, saved, wrapper, ep):
    directory, full, _ = saved
    for rank, got in enumerate(pool.run(fns.load_run, wrapper, ep, directory)):
        assert fns.differences(got, full) == [], f"{wrapper} ep={ep} rank {rank}"


def test_load_into_one_process_without_expert_parallelism_bitwise(saved, world_of_one):
    directory, full, _ = saved
    assert fns.differences(fns.load_run("one", 1, directory), full) == []


def test_whole_state_dict_loads_into_each_ranks_experts(pool, saved):
    directory, full, _ = saved            # every expert on every rank: the others' are not "unexpected"
    for rank, got in enumerate(pool.run(fns.load_run, "zero1", 2, directory, full)):
        assert fns.differences(got, full) == [], f"rank {rank}"


def test_fsdp_save_loads_into_one_process_bitwise(pool, tmp_path, world_of_one):
    directory = str(tmp_path / "fsdp_ep2")       # FSDP over dp 4, each expert a unit over its edp group, ep 2 inside
    full_model, full_optim, ref_model, ref_optim = pool.run(fns.save_run, "fsdp", 2, directory)[0]
    assert fns.largest_difference((full_model, full_optim), (ref_model, ref_optim)) <= 1e-10
    assert fns.differences(fns.load_run("one", 1, directory), (full_model, full_optim)) == []
