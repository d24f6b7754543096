"""Environment parsing for torchrun-style, mpiexec (Open MPI / MPICH / PMIx) and SLURM starts."""

import os

import pytest

from neural_arch.distributed.launch_env import (
    detect_launch_env,
    expand_hostlist,
    launched_by_mpiexec,
    parse_tasks_per_node,
)


# ----------------------------------------------------------------------------- hostlists
@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-04,07],gpu5", ["node01", "node02", "node03", "node04", "node07", "gpu5"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("a,b,c", ["a", "b", "c"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[3],cpu[1-2].cluster", ["gpu3", "cpu1.cluster", "cpu2.cluster"]),
    ("", []),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("bad", ["node[01-", "node]1[", "node[a-b]", "node[5-2]"])
def test_expand_hostlist_rejects_garbage_with_the_text(bad):
    with pytest.raises(ValueError, match="SLURM host list"):
        expand_hostlist(bad)


@pytest.mark.parametrize("text, counts", [
    ("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2),3", [4, 4, 3]), ("", []),
])
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


def test_parse_tasks_per_node_rejects_garbage():
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node("2(y3)")


# ----------------------------------------------------------------------------- sources
def test_nothing_detected():
    assert detect_launch_env({}) is None
    assert detect_launch_env({"PATH": "/bin"}) is None
    assert not launched_by_mpiexec({})


def test_torchrun_style_full():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"}
    assert detect_launch_env(env) == {
        "rank": 5, "world_size": 8, "local_rank": 1, "local_world_size": 4, "node_rank": 1,
        "master_addr": "10.1.2.3", "master_port": 1234, "source": "torchrun-style"}


def test_torchrun_style_minimal_defaults():
    info = detect_launch_env({"RANK": "1", "WORLD_SIZE": "3"})
    assert info["local_rank"] == 1 and info["local_world_size"] == 3 and info["node_rank"] == 0
    assert info["master_addr"] == "127.0.0.1" and info["master_port"] == 29500


def test_group_rank_is_node_rank_and_local_rank_derived():
    info = detect_launch_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                              "GROUP_RANK": "1"})
    assert info["local_rank"] == 1 and info["node_rank"] == 1


def test_explicit_beats_mpiexec_and_slurm():
    env = {"RANK": "0", "WORLD_SIZE": "1", "PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "2",
           "SLURM_NTASKS": "4"}
    assert detect_launch_env(env)["source"] == "torchrun-style"


def test_half_explicit_is_an_error_naming_the_missing_variable():
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        detect_launch_env({"RANK": "0"})
    with pytest.raises(ValueError, match="RANK"):
        detect_launch_env({"WORLD_SIZE": "2"})


@pytest.mark.parametrize("env, message", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "outside world size"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "must be >= 1"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
])
def test_inconsistent_values_raise(env, message):
    with pytest.raises(ValueError, match=message):
        detect_launch_env(env)


def test_mpich_hydra():
    env = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert launched_by_mpiexec(env)
    assert detect_launch_env(env) == {
        "rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2, "node_rank": 0,
        "master_addr": "127.0.0.1", "master_port": 29500, "source": "mpiexec"}


def test_open_mpi_multi_host_has_no_master_unless_given():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    info = detect_launch_env(env)
    assert (info["rank"], info["local_rank"], info["node_rank"]) == (5, 1, 1)
    assert info["master_addr"] is None
    assert detect_launch_env({**env, "MASTER_ADDR": "h0"})["master_addr"] == "h0"


def test_pmix_rank_with_open_mpi_size():
    env = {"PMIX_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}
    info = detect_launch_env(env)
    assert info["rank"] == 2 and info["world_size"] == 3 and info["source"] == "mpiexec"


def test_pmix_rank_without_size_says_what_to_set():
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        detect_launch_env({"PMIX_RANK": "0"})


def test_mpiexec_beats_slurm():
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert detect_launch_env(env)["source"] == "mpiexec"


def test_slurm_srun_step():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "1234"}
    assert detect_launch_env(env) == {
        "rank": 5, "world_size": 8, "local_rank": 1, "local_world_size": 2, "node_rank": 2,
        "master_addr": "gpu07", "master_port": 15000 + 1234, "source": "slurm"}


def test_slurm_uneven_tasks_and_old_nodelist_name():
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURM_NODELIST": "a,b,c"}
    info = detect_launch_env(env)
    assert info["local_world_size"] == 1 and info["master_addr"] == "a"


def test_slurm_ntasks_per_node_and_master_overrides():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_JOB_NODELIST": "n[1-2]", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "4000"}
    info = detect_launch_env(env)
    assert (info["local_world_size"], info["master_addr"], info["master_port"]) == (2, "10.0.0.9", 4000)


@pytest.mark.mpi
def test_real_mpiexec_environment_is_detected(tmp_path):
    import json

    from neural_arch.distributed.testing import run_mpiexec

    # One file per rank: mpiexec forwards the ranks' pipes in chunks, so a shared stdout can split
    # a line (with PYTHONUNBUFFERED=1 the two ranks' JSON lines used to interleave).
    code = ("import json; from neural_arch.distributed.launch_env import detect_launch_env as d; info = d()\n"
            "open(f\"info_{info['rank']}.json\", 'w').write(json.dumps(info))")
    done = run_mpiexec(["-c", code], 2, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.output
    infos = sorted((json.loads(p.read_text()) for p in tmp_path.glob("info_*.json")), key=lambda i: i["rank"])
    assert [(i["rank"], i["world_size"], i["local_rank"], i["source"]) for i in infos] == [
        (0, 2, 0, "mpiexec"), (1, 2, 1, "mpiexec")]


# ----------------------------------------------------------------------------- derive_job_token
from neural_arch.distributed.launch_env import derive_job_token


@pytest.mark.parametrize("env", [
    {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0"},
    {"SLURM_JOBID": "1234"},
    {"PMI_KVSNAME": "kvs_5512_0"},
    {"PMIX_NAMESPACE": "prterun-host-1234@1"},
    {"OMPI_MCA_orte_ess_jobid": "3735879681"},
    {"OMPI_MCA_ess_base_jobid": "3735879681"},
])
def test_job_token_is_derived_from_each_launcher_family(env):
    token = derive_job_token(env)
    assert token is not None and len(token) == 32 and int(token, 16) >= 0
    assert derive_job_token(dict(env)) == token  # every rank of the job computes the same one
    assert all(v not in token for v in env.values() if len(v) > 4)  # hashed, not the id itself


def test_job_token_separates_jobs_and_steps():
    a = derive_job_token({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"})
    assert a != derive_job_token({"SLURM_JOB_ID": "2", "SLURM_STEP_ID": "0"})
    assert a != derive_job_token({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "1"})
    assert derive_job_token({"PMI_KVSNAME": "kvs_1"}) != derive_job_token({"PMIX_NAMESPACE": "kvs_1"})


def test_no_job_id_gives_none():
    assert derive_job_token({}) is None
    assert derive_job_token({"SLURM_JOB_ID": "  ", "RANK": "0"}) is None


# ----------------------------------------------------------------------------- rank_env (one child env)
from neural_arch.distributed.run.child_env import package_root, rank_env


def test_rank_env_sets_identity_and_drops_outer_job_variables():
    outer = {"PMI_RANK": "3", "OMPI_COMM_WORLD_RANK": "3", "NEURAL_ARCH_READY_DIR": "/outer",
             "NEURAL_ARCH_PARENT_PID": "1", "RANK": "9", "PYTHONPATH": "/x", "KEEP": "me"}
    env = rank_env(outer, rank=2, world_size=4, local_world_size=2, node_rank=1, master_port=1234,
                   token="tok", backend="gloo", restart_count=3, parent_pid=77)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["NODE_RANK"]) == ("2", "0", "4", "1")
    assert env["NEURAL_ARCH_RESTART_COUNT"] == env["TORCHELASTIC_RESTART_COUNT"] == "3"
    assert env["NEURAL_ARCH_PARENT_PID"] == "77" and env["KEEP"] == "me"
    assert not any(k in env for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "NEURAL_ARCH_READY_DIR"))
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [package_root(), "/x"]


def test_rank_env_without_rank_leaves_identity_to_mpiexec():
    env = rank_env({"RANK": "1", "LOCAL_RANK": "1"}, rank=None, world_size=2, master_port=1, token="t")
    assert "RANK" not in env and "LOCAL_RANK" not in env and env["WORLD_SIZE"] == "2"
