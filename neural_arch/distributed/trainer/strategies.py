"""The trainer's parallel strategies as plain data: what wraps the model, what is sharded, how
micro-batches before a window's last one avoid synchronising.

===============  ============================  ==========  ==========  ==========  ===========================
name             the model becomes             optimizer   gradients   parameters  earlier micro-batches
===============  ============================  ==========  ==========  ==========  ===========================
``ddp``          ``DistributedDataParallel``   replicated  replicated  replicated  no all-reduce (``no_sync``)
``zero1``        DDP + ``ZeroRedundancyOpt.``  sharded     replicated  replicated  no all-reduce (``no_sync``)
``zero2``        the model (ZeRO-2 reduces)    sharded     sharded     replicated  reduce-scatter each one
``fsdp``         ``FullyShardedDataParallel``  sharded     sharded     sharded     reduce-scatter each one
``fully_shard``  ``fully_shard`` per block,    sharded     sharded     sharded     no reduce-scatter
                 then on the root                                                  (``set_requires_gradient_sync``)
``tp``           the model, ``parallelize_*``  sharded     sharded     sharded     nothing to skip (no dp)
``{"dp","tp"}``  DDP over dp of the tp model   sharded/tp  sharded/tp  sharded/tp  no all-reduce (``no_sync``)
``pp``           (not in the trainer)          -           -           -           -
===============  ============================  ==========  ==========  ==========  ===========================

FSDP and ZeRO-2 have no ``no_sync()`` here: their gradients are reduced into the shards at every
backward and *accumulate there* (the same sums, more communication). ``fully_shard`` accumulates
the unsharded gradients locally and reduce-scatters their sum once per window (torch's FSDP2).

``tp`` shards every parameter the plan names over all ranks (``nn.GPT``: ``parallelize_gpt`` with
the logits gathered, so the user's criterion works; any other model: the trainer's ``tp_plan=``
argument, a ``{pattern: ParallelStyle}`` dict). A device-mesh spec ``{"dp": a, "tp": b}`` (``a*b``
ranks, ``tp`` innermost) is ``tp`` over each row of ``b`` ranks and DDP over the ``a`` rows; ``{"dp":
a}`` alone is ``ddp``. ``pp`` (a strategy or a mesh dimension) is refused: a pipeline schedule runs a
whole batch of micro-batches per call, where the trainer's ``train_step`` is one micro-batch, so
pipeline training goes through ``neural_arch.distributed.pipelining`` directly (see ``instead``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
    mesh: tuple = ()                 # ``tp`` from a mesh spec: ((dim, size), ...) outermost first


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy("ddp", "DistributedDataParallel", False, False, False, True),
    "zero1": Strategy("zero1", "DistributedDataParallel", True, False, False, True, zero_stage=1),
    "zero2": Strategy("zero2", "the model itself", True, True, False, False, zero_stage=2),
    "fsdp": Strategy("fsdp", "FullyShardedDataParallel", True, True, True, False),
    "fully_shard": Strategy("fully_shard", "the model, fully_shard per child block then the root", True, True,
                            True, True),
    "tp": Strategy("tp", "the model, parallelize_gpt or parallelize_module(tp_plan)", True, True, True, True),
    "pp": Strategy("pp", "a pipeline schedule", False, False, True, False, available=False,
                   instead="a pipeline schedule runs all micro-batches of a step in one call, where train_step "
                           "runs one micro-batch: split the model with neural_arch.distributed.pipelining."
                           "pipeline() and step a Schedule1F1B (n_microbatches = the accumulation steps) in "
                           "your loop; examples/train_gpt_5d.py --pp shows it"),
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
        >>> resolve_strategy({"dp": 2, "tp": 2}, world_size=4).mesh
        (('dp', 2), ('tp', 2))
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
        if sizes.get("pp", 1) > 1:
            raise NotImplementedError(f"DistributedTrainer: strategy={spec!r}: {STRATEGIES['pp'].instead}")
        if sizes.get("tp", 1) > 1:
            return replace(STRATEGIES["tp"], skips_sync_while_accumulating=sizes.get("dp", 1) > 1,
                           mesh=(("dp", sizes.get("dp", 1)), ("tp", sizes["tp"])))
        return STRATEGIES["ddp"]
    if not isinstance(spec, str) or spec.lower() not in STRATEGIES:
        raise ValueError(f"DistributedTrainer: unknown strategy {spec!r}; valid strategies are {_valid_names()}")
    found = STRATEGIES[spec.lower()]
    if not found.available:
        raise NotImplementedError(f"DistributedTrainer: strategy={spec!r} is not available: {found.instead}")
    if found.name == "tp":   # every rank in one tensor-parallel group
        return replace(found, skips_sync_while_accumulating=False, mesh=(("dp", 1), ("tp", world_size)))
    return found
