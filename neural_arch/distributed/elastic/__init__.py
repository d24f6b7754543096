"""Elastic training, every piece in one package.

==========================  ===============================================================
module                      what
==========================  ===============================================================
``in_process``              Horovod's ``hvd.elastic`` model: :class:`State`, :func:`run`
                            (commit, fail, re-form the group, restore: no process restart)
``agent``                   the launcher's rounds for ``--nnodes MIN:MAX`` (who is in)
``checkpoint_restart``      ``--max_restarts`` helpers: the newest checkpoint, atomic writes
``sampler``                 :class:`ElasticDistributedSampler`: resumes mid-epoch on a new world
==========================  ===============================================================

Names load lazily (the launcher imports ``agent`` without the collectives)::

    from neural_arch.distributed import elastic
    state = elastic.State(model=model, optimizer=opt, epoch=0)

    @elastic.run
    def train(state): ...
"""

from __future__ import annotations

import importlib

_LAZY = {
    "State": "in_process", "run": "in_process", "RESETTABLE_ERRORS": "in_process",
    "ElasticDistributedSampler": "sampler",
    "restart_count": "checkpoint_restart",
    "save_npz_atomic": "checkpoint_restart",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'neural_arch.distributed.elastic' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
