"""Process management: the launcher (:mod:`.launcher`, :mod:`.config`), the per-node agent,
child processes (:mod:`.procs`, :mod:`.bootstrap`), the job environment (:mod:`.env`),
``launch``/``spawn`` for functions (:mod:`.spawn`, :mod:`.rank_worker`) and restarts (:mod:`.elastic`)."""
