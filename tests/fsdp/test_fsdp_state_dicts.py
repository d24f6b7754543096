"""FSDP's state dicts are a component it holds (FSDPStateDicts), not a base class."""

from __future__ import annotations

import numpy as np

from neural_arch import nn
from neural_arch.distributed.fsdp import FullyShardedDataParallel as FSDP
from neural_arch.distributed.fsdp import StateDictType
from neural_arch.distributed.fsdp.state_dict import FSDPStateDicts
from neural_arch.nn.module import Module


def test_fsdp_holds_its_state_dicts_and_delegates(world_of_one):
    fsdp = FSDP(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))
    assert type(fsdp).__mro__[1:] == Module.__mro__  # composition: no mixin between FSDP and Module
    assert isinstance(fsdp._state_dicts, FSDPStateDicts)
    full = fsdp.state_dict()
    assert list(full) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with FSDP.state_dict_type(fsdp, StateDictType.SHARDED_STATE_DICT):
        assert fsdp._state_dicts.type is StateDictType.SHARDED_STATE_DICT
        shards = fsdp.state_dict()
        assert list(shards) == ["flat_param_0"]
        fsdp.load_state_dict({"flat_param_0": np.zeros_like(shards["flat_param_0"])})
    assert fsdp._state_dicts.type is StateDictType.FULL_STATE_DICT
    assert not fsdp.state_dict()["0.weight"].any()
    fsdp.load_state_dict(full)
    with fsdp.summon_full_params():
        np.testing.assert_array_equal(fsdp.module[1].bias.data, full["1.bias"])
