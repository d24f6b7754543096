"""``python -m neural_arch.distributed.launcher``: the public entry point of :mod:`.run.launcher`.

Kept at this path because users type it (seeds 001/002, torchrun habits); the code lives in
``run/``. Example::

    python -m neural_arch.distributed.launcher --nproc_per_node 2 train.py --epochs 3
"""

import sys

from neural_arch.distributed.run.launcher import (  # noqa: F401 - re-exported
    DistributedLauncher, LaunchConfig, launch_distributed_training, main,
)

if __name__ == "__main__":
    sys.exit(main())
