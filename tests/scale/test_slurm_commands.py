"""The Slurm manager's command lines and batch script (pure), where a job's state is read from, and its
error without ``sbatch``. Against a real Slurm cluster: ``tests/slurm``."""

from __future__ import annotations

import shlex

import pytest

from neural_arch.distributed.scale.job_management import JobState, TrainingJobSpec
from neural_arch.distributed.scale.slurm import (
    SlurmManager,
    batch_script,
    parse_job_id,
    sacct_command,
    sbatch_command,
    scancel_command,
    scontrol_command,
    squeue_command,
    state_from_slurm,
)


def test_command_lines():
    assert sbatch_command("/j/a.sbatch") == ["sbatch", "--parsable", "/j/a.sbatch"]
    assert squeue_command(12) == ["squeue", "--noheader", "--jobs", "12", "--format", "%T"]
    assert sacct_command("12") == ["sacct", "--noheader", "--allocations", "--jobs", "12", "--format", "State"]
    assert scancel_command("12") == ["scancel", "12"]
    assert parse_job_id("Submitted batch job 981\n") == parse_job_id("981;cluster\n") == "981"
    with pytest.raises(RuntimeError, match="could not read a job id"):
        parse_job_id("sbatch: error: invalid partition")


@pytest.mark.parametrize("word, state", [("PENDING", JobState.PENDING), ("RUNNING", JobState.RUNNING),
                                         ("COMPLETED", JobState.COMPLETED), ("CANCELLED by 0", JobState.CANCELLED),
                                         ("FAILED", JobState.FAILED), ("TIMEOUT", JobState.FAILED),
                                         ("NODE_FAIL", JobState.FAILED), ("", JobState.PENDING)])
def test_slurm_states(word, state):
    assert state_from_slurm(word) is state


def test_gloo_batch_script_starts_one_launcher_per_node():
    spec = TrainingJobSpec("lm", "train.py", ["--lr", "0.1 x"], nodes=2, processes_per_node=4, restarts=2,
                           resources={"gpus_per_node": 4, "time": "01:00:00"})
    text = batch_script(spec, "/logs", master_port=29600, python="python3")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for line in ("#SBATCH --job-name=lm", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --output=/logs/lm-%j.out", "#SBATCH --gpus-per-node=4", "#SBATCH --time=01:00:00"):
        assert line in lines
    srun = shlex.split(lines[-1])
    assert srun[:3] == ["srun", "bash", "-c"]
    per_node = shlex.split(srun[3])         # what each node's shell runs ($SLURM_NODEID expanded there)
    assert per_node[:3] == ["python3", "-m", "neural_arch.distributed.launcher"]
    for opt, value in (("--nnodes", "2"), ("--nproc_per_node", "4"), ("--backend", "gloo"),
                       ("--max_restarts", "2"), ("--master_port", "29600"), ("--node_rank", "$SLURM_NODEID"),
                       ("--master_addr", "$MASTER_ADDR")):
        assert per_node[per_node.index(opt) + 1] == value
    assert per_node[-3:] == ["train.py", "--lr", "0.1 x"]
    assert any(line.startswith("export NEURAL_ARCH_AUTH_TOKEN=") for line in lines)
    assert any(line.startswith("export MASTER_ADDR=") for line in lines)


def test_mpi_batch_script_lets_srun_start_the_ranks():
    spec = TrainingJobSpec("m", "pkg.train", nodes=2, processes_per_node=3, backend="mpi", module=True)
    lines = batch_script(spec, "/logs", python="python3").splitlines()
    assert "#SBATCH --ntasks-per-node=3" in lines
    assert lines[-1] == "srun python3 -m pkg.train"
    assert "export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmi2}" in lines     # srun speaks PMI-2 unless told otherwise
    with pytest.raises(ValueError, match="restarts"):
        batch_script(TrainingJobSpec("m", "t.py", backend="mpi", restarts=1), "/logs")


def test_missing_sbatch_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))       # no Slurm binaries on it
    manager = SlurmManager(log_dir=str(tmp_path / "jobs"))
    with pytest.raises(FileNotFoundError, match="sbatch not found on PATH.*run_local"):
        manager.submit(TrainingJobSpec("j", "train.py"))
    assert not (tmp_path / "jobs").exists()         # nothing written before the check
    with pytest.raises(FileNotFoundError, match="squeue not found"):
        manager.status("1")
    with pytest.raises(FileNotFoundError, match="scancel not found"):
        manager.cancel("1")


def test_logs_reads_the_jobs_output_file(tmp_path):
    manager = SlurmManager(log_dir=str(tmp_path))
    assert manager.logs("5", name="j") == ""        # not started yet
    (tmp_path / "j-5.out").write_text("[rank0]: step 1\n")
    assert manager.logs("5", name="j") == "[rank0]: step 1\n"
    with pytest.raises(KeyError, match="pass its spec's name"):
        manager.logs("6")


def test_scontrol_reads_a_finished_jobs_state():
    assert scontrol_command(12) == ["scontrol", "--oneliner", "show", "job", "12"]


def test_status_asks_squeue_then_the_controller_then_accounting(monkeypatch, tmp_path):
    """squeue knows queued and running jobs; a finished one is in scontrol's record for MinJobAge, then
    only in sacct; a source that fails (forgotten job, accounting disabled) hands over to the next."""
    manager = SlurmManager(log_dir=str(tmp_path))
    answers: dict = {}
    asked = []

    def run(command):
        asked.append(command[0])
        answer = answers[command[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(manager, "_run", run)
    answers.update(squeue="RUNNING\n", scontrol="", sacct="")
    assert manager.status("3") is JobState.RUNNING and asked == ["squeue"]
    asked.clear()
    answers.update(squeue="", scontrol="JobId=3 JobName=j UserId=root(0) JobState=CANCELLED Reason=None\n")
    assert manager.status("3") is JobState.CANCELLED and asked == ["squeue", "scontrol"]
    asked.clear()
    answers.update(squeue=RuntimeError("Invalid job id specified"), scontrol=RuntimeError("Invalid job id specified"),
                   sacct="COMPLETED\n")
    assert manager.status("3") is JobState.COMPLETED and asked == ["squeue", "scontrol", "sacct"]
    answers.update(sacct=RuntimeError("Slurm accounting storage is disabled"))
    with pytest.raises(RuntimeError, match="knows no job 3(.|\n)*accounting storage is disabled"):
        manager.status("3")
    answers.update(squeue="PENDING\n")
    with pytest.raises(TimeoutError, match="still pending"):
        manager.wait("3", timeout=0.05, poll_interval=0.01)


def test_the_master_port_comes_from_the_job_id_unless_given():
    lines = batch_script(TrainingJobSpec("lm", "train.py", nodes=2), "/logs", python="python3").splitlines()
    assert "export MASTER_PORT=$((15000 + SLURM_JOB_ID % 20000))" in lines
    per_node = shlex.split(shlex.split(lines[-1])[3])
    assert per_node[per_node.index("--master_port") + 1] == "$MASTER_PORT"
