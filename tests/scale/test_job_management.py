"""TrainingJobSpec.run_local through the real launcher, and the spec's checks."""

from __future__ import annotations

import pytest

from neural_arch.distributed.scale.job_management import JobState, TrainingJobSpec

SCRIPT = """
import sys
import numpy as np
import neural_arch.distributed as dist
dist.init_process_group()
a = np.ones(2)
dist.all_reduce(a)
assert a.tolist() == [2.0, 2.0], a
dist.destroy_process_group()
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.timeout(90)   # two launcher jobs of 2 ranks; the launcher reaps its ranks on the way out
def test_run_local_completes_and_fails(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    assert TrainingJobSpec("ok", str(script), ["0"], processes_per_node=2).run_local() is JobState.COMPLETED
    assert TrainingJobSpec("bad", str(script), ["3"], processes_per_node=2).run_local() is JobState.FAILED


def test_spec_checks():
    spec = TrainingJobSpec("j", "train.py", arguments=[1, "x"], nodes=2, processes_per_node=3, restarts=1)
    assert spec.world_size == 6 and spec.arguments == ["1", "x"]
    cfg = spec.launch_config()
    assert (cfg.nproc_per_node, cfg.nnodes, cfg.max_restarts, cfg.standalone) == (3, 2, 1, False)
    with pytest.raises(ValueError, match="run_local starts one node"):
        spec.run_local()
    with pytest.raises(ValueError, match="unknown resource"):
        TrainingJobSpec("j", "train.py", resources={"gpus": 1})
    with pytest.raises(ValueError, match="name"):
        TrainingJobSpec("a b", "train.py")
