"""Two real launchers of an elastic job: a rank that always fails uses up --max_restarts across
both nodes together, and then every launcher exits with the same failure summary."""

from __future__ import annotations

import pytest
from launcher_helpers import free_port, reap, start_launcher

TOKEN = {"NEURAL_ARCH_AUTH_TOKEN": "5ca1ab1e" * 4}
SCRIPT = """
import os, sys
import neural_arch.distributed as dist
dist.init_process_group()
print("attempt", os.environ["TORCHELASTIC_RESTART_COUNT"], "rank", dist.get_rank(), "of", dist.get_world_size(), flush=True)
if dist.get_rank() == 2:
    sys.exit(5)
dist.barrier()   # the others wait for rank 2: they are stopped by their launchers
"""


@pytest.mark.timeout(90)
def test_restarts_are_used_up_by_the_whole_job_then_every_node_fails(tmp_path, write_script):
    script = write_script("fail.py", SCRIPT)
    port, agent = free_port(), free_port()
    common = ["--nnodes=2:2", "--nproc_per_node=2", "--max_restarts=1", "--master_addr=127.0.0.1",
              f"--master_port={port}", f"--agent_port={agent}", "--start_timeout=30", "--term_timeout=2"]
    node1 = start_launcher([*common, "--node_rank=1", script], tmp_path, env=TOKEN)
    node0 = start_launcher([*common, "--node_rank=0", script], tmp_path, env=TOKEN)
    try:
        out0, err0 = node0.communicate(timeout=70)
        out1, err1 = node1.communicate(timeout=20)
    finally:
        reap(node0)
        reap(node1)
    assert node0.returncode == node1.returncode == 5, err0 + err1
    for err in (err0, err1):
        assert "rank 2 (node 1, local rank 0" in err and "exit code 5" in err
        assert "restarts used: 1 of 1" in err
    out = out0 + out1
    assert out.count("attempt 0 rank") == 4 and out.count("attempt 1 rank") == 4
    assert "of 4" in out and "of 2" not in out
