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
``pp``           this rank's pipeline stage    per stage   per stage   per stage   buffered: the schedule runs
                                                                                   them at the window's last one
``{"dp","pp"}``  pp stages, dp replicas each   per stage   per stage   per stage   buffered (dp average once)
===============  ============================  ==========  ==========  ==========  ===========================

FSDP and ZeRO-2 have no ``no_sync()`` here: their gradients are reduced into the shards at every
backward and *accumulate there* (the same sums, more communication). ``fully_shard`` accumulates
the unsharded gradients locally and reduce-scatters their sum once per window (torch's FSDP2).

``tp`` shards every parameter the plan names over all ranks (``nn.GPT``: ``parallelize_gpt`` with
the logits gathered, so the user's criterion works; any other model: the trainer's ``tp_plan=``
argument, a ``{pattern: ParallelStyle}`` dict). A device-mesh spec ``{"dp": a, "tp": b}`` (``a*b``
ranks, ``tp`` innermost) is ``tp`` over each row of ``b`` ranks and DDP over the ``a`` rows; ``{"dp":
a}`` alone is ``ddp``.

``pp`` cuts the model into one stage per rank (``nn.GPT``: by blocks, equal counts, as
``examples/train_gpt_5d.py --pp``; ``nn.Sequential``: between children, balanced parameter counts;
``pp_split_points=`` overrides) with :mod:`neural_arch.distributed.pipelining`, DeepSpeed's
``PipelineEngine`` way: the ``K`` micro-batches of an accumulation window are the schedule's
micro-batches. ``train_step`` buffers each one and, on the window's last, runs the schedule
(``pp_schedule=``: ``"1f1b"`` by default, ``"gpipe"``, ``"interleaved"`` -- two stages per rank,
``K`` a multiple of the ranks --, ``"zbh1"``) over all of them, then clips (the norm over every
stage) and steps. ``{"dp": a, "pp": b}`` (``a*b`` ranks, ``pp`` outermost as in torchtitan) is ``b``
stages, each replicated over ``a`` ranks that average its gradients once per window (DeepSpeed's
pipeline + data parallel); the ``pp`` ranks of one row take the same batches. ``pp`` with ``tp`` is
refused.
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
    mesh: tuple = ()                 # ``tp``/``pp``: ((dim, size), ...) outermost first


STRATEGIES: dict[str, Strategy] = {
    "ddp": Strategy("ddp", "DistributedDataParallel", False, False, False, True),
    "zero1": Strategy("zero1", "DistributedDataParallel", True, False, False, True, zero_stage=1),
    "zero2": Strategy("zero2", "the model itself", True, True, False, False, zero_stage=2),
    "fsdp": Strategy("fsdp", "FullyShardedDataParallel", True, True, True, False),
    "fully_shard": Strategy("fully_shard", "the model, fully_shard per child block then the root", True, True,
                            True, True),
    "tp": Strategy("tp", "the model, parallelize_gpt or parallelize_module(tp_plan)", True, True, True, True),
    "pp": Strategy("pp", "this rank's pipeline stage(s) of the model", True, True, True, False),
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
        >>> resolve_strategy({"dp": 2, "pp": 2}, world_size=4).mesh
        (('pp', 2), ('dp', 2))
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
            if sizes.get("tp", 1) > 1:
                raise NotImplementedError(f"DistributedTrainer: strategy={spec!r}: pipeline and tensor parallelism "
                                          "together are not in the trainer yet; use {'dp': a, 'pp': b} or "
                                          "{'dp': a, 'tp': b} (examples/train_gpt_5d.py combines all of them)")
            return replace(STRATEGIES["pp"], mesh=(("pp", sizes["pp"]), ("dp", sizes.get("dp", 1))))
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
    if found.name == "pp":   # every rank one stage of one pipeline
        return replace(found, mesh=(("pp", world_size), ("dp", 1)))
    return found
