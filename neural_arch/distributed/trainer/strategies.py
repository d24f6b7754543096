"""The trainer's parallel strategies as plain data: what wraps the model, what is sharded, how
micro-batches before a window's last one avoid synchronising.

===============  ============================  ==========  ==========  ==========  ===========================
name             the model becomes             optimizer   gradients   parameters  earlier micro-batches
===============  ============================  ==========  ==========  ==========  ===========================
``ddp``          ``DistributedDataParallel``   replicated  replicated  replicated  no all-reduce (``no_sync``)
``zero1``        DDP + ``ZeroRedundancyOpt.``  sharded     replicated  replicated  no all-reduce (``no_sync``)
``zero2``        the model (ZeRO-2 reduces)    sharded     sharded     replicated  reduce-scatter each one
``fsdp``         ``FullyShardedDataParallel``  sharded     sharded     sharded     reduce-scatter each one
``fully_shard``  (FSDP2: not in the project)   -           -           -           -
``tp`` / ``pp``  (need a per-model plan)       -           -           -           -
===============  ============================  ==========  ==========  ==========  ===========================

FSDP and ZeRO-2 have no ``no_sync()`` here: their gradients are reduced into the shards at every
backward and *accumulate there* (the same sums, more communication). A device-mesh spec such as
``{"dp": 2}`` is accepted when only its data-parallel dimension is larger than one (it is then
``ddp``); a tensor- or pipeline-parallel dimension needs a per-model plan the trainer cannot guess.

>>> resolve_strategy("ddp").wraps
'DistributedDataParallel'
>>> resolve_strategy({"dp": 1}).name
'ddp'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["STRATEGIES", "Strategy", "resolve_strategy"]


@dataclass(frozen=True)
class Strategy:
    """One row of the table above.

    Example::

        >>> s = resolve_strategy("zero1")
        >>> s.wraps, s.zero_stage, s.shards_parameters
        ('DistributedDataParallel', 1, False)
    """

    name: str
    wraps: str
    shards_optimizer: bool
    shards_gradients: bool
    shards_parameters: bool
    skips_sync_while_accumulating: bool
    zero_stage: int = 0              # 1 or 2: the optimizer becomes a ZeroRedundancyOptimizer of that stage
    available: bool = True
    instead: str = ""                # for an unavailable strategy: what to do


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy("ddp", "DistributedDataParallel", False, False, False, True),
    "zero1": Strategy("zero1", "DistributedDataParallel", True, False, False, True, zero_stage=1),
    "zero2": Strategy("zero2", "the model itself", True, True, False, False, zero_stage=2),
    "fsdp": Strategy("fsdp", "FullyShardedDataParallel", True, True, True, False),
    "fully_shard": Strategy("fully_shard", "fully_shard (FSDP2)", True, True, True, False, available=False,
                            instead="the project has no fully_shard (FSDP2) yet; use strategy='fsdp'"),
    "tp": Strategy("tp", "a tensor-parallel plan", False, False, True, False, available=False,
                   instead="tensor parallelism needs a per-model plan: parallelize the model with "
                           "neural_arch.distributed.tensor.parallel and train it with a manual loop"),
    "pp": Strategy("pp", "a pipeline schedule", False, False, True, False, available=False,
                   instead="pipeline parallelism needs a split and a schedule: use "
                           "neural_arch.distributed.pipelining (PipelineStage + a Schedule) directly"),
}

_MESH_DIMS = ("dp", "tp", "pp")


def _valid_names() -> str:
    return ", ".join(repr(n) for n in STRATEGIES) + ", or a device-mesh dict such as {'dp': 2}"


def resolve_strategy(spec, world_size: int | None = None) -> Strategy:
    """The :class:`Strategy` for ``spec`` (a name or a device-mesh dict); a clear error otherwise.

    ``world_size``, when given, must equal the product of a mesh spec's sizes.

    Example::

        >>> resolve_strategy("fsdp").shards_parameters
        True
        >>> resolve_strategy({"dp": 4}, world_size=4).name
        'ddp'
    """
    if isinstance(spec, dict):
        unknown = [k for k in spec if k not in _MESH_DIMS]
        if unknown:
            raise ValueError(f"DistributedTrainer: strategy={spec!r} names unknown mesh dimensions {unknown}; "
                             f"a device-mesh spec uses {list(_MESH_DIMS)}")
        sizes = {k: spec[k] for k in _MESH_DIMS if k in spec}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes.values()):
            raise ValueError(f"DistributedTrainer: strategy={spec!r}: every mesh size must be an int >= 1")
        total = math.prod(sizes.values())
        if world_size is not None and total != world_size:
            raise ValueError(f"DistributedTrainer: strategy={spec!r} describes {total} ranks but the world has "
                             f"{world_size}; make the sizes multiply to the world size")
        if any(sizes.get(k, 1) > 1 for k in ("tp", "pp")):
            dim = "tp" if sizes.get("tp", 1) > 1 else "pp"
            raise NotImplementedError(f"DistributedTrainer: strategy={spec!r}: {STRATEGIES[dim].instead}")
        return STRATEGIES["ddp"]
    if not isinstance(spec, str) or spec.lower() not in STRATEGIES:
        raise ValueError(f"DistributedTrainer: unknown strategy {spec!r}; valid strategies are {_valid_names()}")
    found = STRATEGIES[spec.lower()]
    if not found.available:
        raise NotImplementedError(f"DistributedTrainer: strategy={spec!r} is not available: {found.instead}")
    return found
