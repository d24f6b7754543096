"""Two launchers on one host as two nodes: differing --nproc_per_node form one world; a node that
disagrees about the job fails every node at once, with the same reason."""
import time

import pytest
from launcher_helpers import free_port, reap, start_launcher
from test_launcher_procs import ENV_SCRIPT, envs_from

TOKEN = {"NEURAL_ARCH_AUTH_TOKEN": "c0ffee00" * 4}


def _two_nodes(tmp_path, script, node0_extra, node1_extra, env=None):
    port, agent = free_port(), free_port()
    common = ["--master_addr=127.0.0.1", f"--master_port={port}", f"--agent_port={agent}", "--start_timeout=30"]
    # Started together: a joiner that comes first retries until node 0 listens (the launcher's job, not the test's).
    node0 = start_launcher([*common, "--node_rank=0", *node0_extra, script], tmp_path, env={**TOKEN, **(env or {})})
    node1 = start_launcher([*common, "--node_rank=1", *node1_extra, script], tmp_path, env={**TOKEN, **(env or {})})
    return node0, node1


@pytest.mark.timeout(60)
def test_nodes_with_different_process_counts_form_one_world(tmp_path, write_script):
    script = write_script("train.py", ENV_SCRIPT)
    node0, node1 = _two_nodes(tmp_path, script, ["--nnodes=2", "--nproc_per_node=2"],
                              ["--nnodes=2", "--nproc_per_node=1"], env={"TRY_ALL_REDUCE": "1"})
    try:
        out0, err0 = node0.communicate(timeout=45)
        out1, err1 = node1.communicate(timeout=45)
        assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
        infos = envs_from(out0 + out1)
        assert [i["RANK"] for i in infos] == ["0", "1", "2"]
        assert {i["WORLD_SIZE"] for i in infos} == {"3"}
        assert [(i["NODE_RANK"], i["LOCAL_RANK"], i["LOCAL_WORLD_SIZE"]) for i in infos] == [
            ("0", "0", "2"), ("0", "1", "2"), ("1", "0", "1")]
        assert (out0 + out1).count(": SUM 6.0") == 3  # 1 + 2 + 3 across both "nodes"
    finally:
        reap(node0)
        reap(node1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("node1_flags, reason", [
    (["--nnodes=3", "--nproc_per_node=1"], "nnodes=3 but node 0 has nnodes=2"),
    (["--nnodes=2", "--nproc_per_node=1", "--master_port=1"], "master_port=1 but node 0 has master_port="),
])
def test_a_disagreeing_node_fails_every_node_at_once(tmp_path, write_script, node1_flags, reason):
    script = write_script("train.py", "print('must not run')\n")
    start = time.monotonic()
    node0, node1 = _two_nodes(tmp_path, script, ["--nnodes=2", "--nproc_per_node=1"], node1_flags)
    try:
        out0, err0 = node0.communicate(timeout=45)
        out1, err1 = node1.communicate(timeout=45)
        assert node0.returncode == 1 and node1.returncode == 1, err0 + err1
        assert reason in err0 and reason in err1
        assert "must not run" not in out0 + out1
        assert time.monotonic() - start < 20  # not node 0's 30 s start timeout
    finally:
        reap(node0)
        reap(node1)
