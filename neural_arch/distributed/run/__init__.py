"""Process management: the launcher's configuration (:mod:`.launch_config`; the launcher itself is
:mod:`neural_arch.distributed.launcher`), the per-node agent (:mod:`.agent`), child processes
(:mod:`.procs`, :mod:`.bootstrap`, :mod:`.parent_watch`), the job environment (:mod:`.child_env`,
:mod:`.device`), ``launch``/``spawn`` for functions (:mod:`.spawn`, :mod:`.pool`, :mod:`.rank_worker`);
restarts are :mod:`neural_arch.distributed.elastic`.

Example::

    from neural_arch.distributed.run.spawn import spawn
    spawn(train, args=(config,), nprocs=2)       # train(rank, config) on 2 new processes
"""
