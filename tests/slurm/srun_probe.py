"""Started by ``srun`` as every rank of a job (no launcher): ``init_process_group()`` finds its rank,
the world and the rendezvous in Slurm's variables; each rank prints what it was given as one JSON line
(the torch variables it exported, and an all_reduce of the ranks as proof that the group formed).

Example::

    srun --nodes=2 --ntasks-per-node=2 python tests/slurm/srun_probe.py
"""

from __future__ import annotations

import json
import os

import numpy as np

import neural_arch.distributed as dist

dist.init_process_group()
total = np.array([float(dist.get_rank())])
dist.all_reduce(total)
print(json.dumps({
    "rank": dist.get_rank(), "world": dist.get_world_size(), "backend": dist.get_backend(),
    "sum_of_ranks": float(total[0]), "node": os.environ.get("SLURMD_NODENAME"),
    **{name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                               "MASTER_ADDR", "MASTER_PORT")},
}), flush=True)
dist.destroy_process_group()
