"""Child process for the crash tests: saves checkpoint after checkpoint until it is SIGKILLed.

Checkpoint ``step`` holds arrays whose values are derived from ``step``, so the test can check
that whatever is listed as latest is complete and holds exactly that step's data.
"""

import sys

import numpy as np

from neural_arch.distributed.checkpoint import CheckpointManager


def state_for(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.normal(size=(256, 512)), "b": np.full(1000, float(step)), "step": step}


if __name__ == "__main__":
    directory, mode = sys.argv[1], sys.argv[2]
    mgr = CheckpointManager(directory, keep_last=2)
    for step in range(1, 10_000):
        if mode == "async":
            mgr.save(state_for(step), step=step, asynchronous=True)
        else:
            mgr.save(state_for(step), step=step)
        print(step, flush=True)
