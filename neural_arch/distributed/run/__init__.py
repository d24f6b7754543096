"""Process management for the launcher (:mod:`neural_arch.distributed.launcher`) and ``launch``/``spawn``.

Modules: :mod:`~neural_arch.distributed.run.launch_config` (the launcher's options),
:mod:`~neural_arch.distributed.run.agent` (the per-node agent), :mod:`~neural_arch.distributed.run.procs`,
:mod:`~neural_arch.distributed.run.bootstrap` and :mod:`~neural_arch.distributed.run.parent_watch`
(child processes), :mod:`~neural_arch.distributed.run.child_env` and
:mod:`~neural_arch.distributed.run.device` (the job environment), :mod:`~neural_arch.distributed.run.spawn`,
:mod:`~neural_arch.distributed.run.pool` and :mod:`~neural_arch.distributed.run.rank_worker` (functions
on new processes); restarts are :mod:`neural_arch.distributed.elastic`.

Example::

    from neural_arch.distributed.run.spawn import spawn
    spawn(train, args=(config,), nprocs=2)       # train(rank, config) on 2 new processes
"""
