"""The whole Slurm scenario of ``tests/slurm`` in one process: start a Slurm cluster on this host
(:class:`~slurm_cluster.SlurmCluster`: two node names), run every job, stop the cluster (every daemon and
job process reaped, its folder removed, also on failure or SIGTERM), and write what happened to
``WORKDIR/results.json`` for the tests to judge.

It runs beside the rest of the suite as a background job (``tests/background.py``; Slurm passes the
submitter's nice value on to the jobs' tasks, so they too take only idle cycles). Every job is submitted
at once and the local reference runs start beside them, so the scenario costs about its slowest job:

* ``examples/slurm/train.sbatch`` in ``MODE=srun`` (``srun`` starts 2 ranks on one node) and in
  ``MODE=launcher`` on two node names (one launcher per node, ``--nnodes 2``), each training
  ``examples/restart_from_checkpoint.py``; the reference: the launcher's run of the same script here;
* seed 003's ``examples/slurm/launch_training.sh`` started by ``srun`` on two nodes; the reference: the
  same script run here without Slurm;
* ``srun`` starting 4 ranks of ``srun_probe.py`` on two nodes (gloo, rendezvous from ``SLURM_*`` alone);
* ``create_slurm_manager()``: a two-node ``TrainingJobSpec`` submitted and followed to its end; the probe
  as a one-node, two-task ``backend="mpi"`` spec (srun starts the MPI ranks through PMI-2; where mpi4py is
  installed); a one-node job cancelled while it runs.

Example::

    python tests/slurm/slurm_scenario.py /tmp/slurm-scenario     # then read /tmp/slurm-scenario/results.json
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from slurm_cluster import SlurmCluster, free_ports, resolvable_node_names  # noqa: E402

from neural_arch.distributed.scale import TrainingJobSpec  # noqa: E402
from neural_arch.distributed.scale.slurm import create_slurm_manager, parse_job_id  # noqa: E402

SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
LAUNCH_TRAINING = REPO / "examples" / "slurm" / "launch_training.sh"
RESTART_SCRIPT = REPO / "examples" / "restart_from_checkpoint.py"
PROBE = HERE / "srun_probe.py"
#: every job of the scenario ends within this many seconds (generous: the suite shares the cores)
DEADLINE_S = 240.0
#: seed 003's production run, tiny: one epoch of 7 steps on 2 ranks
TRAIN_ARGS = ["--epochs", "1", "--samples", "256", "--hidden", "16", "--no-progress"]


def restart_args(work: Path, name: str) -> list[str]:
    """``restart_from_checkpoint.py``'s arguments: 4 steps, final parameters to ``WORK/NAME.npz``."""
    return ["--ckpt-dir", str(work / f"ckpt-{name}"), "--no-crash", "--steps", "4", "--out", str(work / f"{name}.npz")]


class Scenario:
    """The jobs (Slurm's by name: id; local runs by name: Popen) and what was seen of them."""

    def __init__(self, cluster: SlurmCluster, work: Path) -> None:
        self.cluster, self.work = cluster, work
        self.deadline = time.monotonic() + DEADLINE_S
        self.ids: dict[str, str] = {}
        self.local: dict[str, subprocess.Popen] = {}
        self.manager = create_slurm_manager(log_dir=str(work / "manager"), master_port=free_ports(1)[0])
        self.results: dict = {"nodes": list(cluster.node_names), "jobs": {}, "local": {}, "manager": {}}

    def env(self, **extra) -> dict:
        return self.cluster.env(PYTHON=sys.executable, **extra)

    def sbatch(self, name: str, options: list[str], env: dict, script: list[str]) -> None:
        done = subprocess.run(["sbatch", "--parsable", f"--job-name={name}", f"--output={self.work}/{name}-%j.out",
                               *options, *script], env=env, cwd=self.work, capture_output=True, text=True,
                              timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch of {name} failed: {done.stderr}")
        self.ids[name] = parse_job_id(done.stdout)

    def run_local(self, name: str, argv: list[str], **extra) -> None:
        self.local[name] = subprocess.Popen(argv, cwd=self.work, env=self.env(**extra), stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT, text=True)

    def left_s(self) -> float:
        return max(1.0, self.deadline - time.monotonic())

    def submit_all(self) -> None:
        work = self.work
        (work / "sleeper.py").write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
        # rendezvous from Slurm's variables alone (the port from the job id: this is the first job)
        self.sbatch("probe", ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=1"], self.env(),
                    ["--wrap", f"srun {sys.executable} {PROBE}"])
        for mode, shape in (("srun", ["--nodes=1", "--ntasks-per-node=2"]),
                            ("launcher", ["--nodes=2", "--ntasks-per-node=1"])):
            self.sbatch(mode, [*shape, "--cpus-per-task=1"],
                        self.env(MODE=mode, NPROC_PER_NODE="1", MASTER_PORT=str(free_ports(1)[0]),
                                 SCRIPT=str(RESTART_SCRIPT), SCRIPT_ARGS=" ".join(restart_args(work, mode))),
                        [str(SBATCH)])
        self.sbatch("launch_training", ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"],
                    self.env(MASTER_PORT=str(free_ports(1)[0]), NEURAL_ARCH_AUTH_TOKEN=secrets.token_hex(16),
                             CHECKPOINT_DIR=str(work / "ckpt-launch_training")),
                    ["--wrap", f"srun {LAUNCH_TRAINING} 2 ddp 16 {' '.join(TRAIN_ARGS)}"])
        self.ids["manager"] = self.manager.submit(TrainingJobSpec(
            "na-train", str(RESTART_SCRIPT), restart_args(work, "manager"), nodes=2, processes_per_node=1,
            resources={"cpus_per_task": 1}))
        if importlib.util.find_spec("mpi4py") is not None:
            # MPI ranks started by srun through PMI-2 (the mpich wheel's MPI speaks it): the mpi backend.
            # One node with both ranks: the two "nodes" here are one host, and MPICH's UCX shared-memory
            # transport between ranks of two slurmd's steps on one host failed now and then ("mm ep failed
            # to connect to remote FIFO"), which a real cluster's nodes never meet
            self.ids["manager_mpi"] = self.manager.submit(TrainingJobSpec(
                "na-mpi", str(PROBE), nodes=1, processes_per_node=2, backend="mpi", resources={"cpus_per_task": 1}))
        self.ids["sleeper"] = self.manager.submit(TrainingJobSpec("na-sleeper", str(work / "sleeper.py"),
                                                                  resources={"cpus_per_task": 1}))
        # the references: the same scripts run here without Slurm
        self.run_local("restart", [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
                                   "--nproc_per_node", "2", str(RESTART_SCRIPT), *restart_args(work, "local")])
        self.run_local("launch_training", [str(LAUNCH_TRAINING), "2", "ddp", "16", *TRAIN_ARGS],
                       CHECKPOINT_DIR=str(work / "ckpt-local"))

    def cancel_the_sleeper(self) -> None:
        """Wait until the sleeper prints, see it RUNNING, cancel it, follow it to its end."""
        job_id, seen = self.ids["sleeper"], {}
        while "sleeping" not in self.manager.logs(job_id) and time.monotonic() < self.deadline:
            if self.manager.status(job_id).finished:
                break
            time.sleep(0.2)
        seen["while_running"] = self.manager.status(job_id).value
        seen["logs_before_cancel"] = self.manager.logs(job_id)
        self.manager.cancel(job_id)
        seen["final"] = self.manager.wait(job_id, timeout=self.left_s(), poll_interval=0.2).value
        self.results["manager"]["cancel"] = seen

    def follow_the_rest(self) -> None:
        for name in ("probe", "srun", "launcher", "launch_training"):
            state = self.manager.wait(self.ids[name], timeout=self.left_s(), poll_interval=0.2)
            out = self.work / f"{name}-{self.ids[name]}.out"
            self.results["jobs"][name] = {"id": self.ids[name], "state": state.value,
                                          "output": out.read_text() if out.exists() else ""}
        job_id = self.ids["manager"]
        final = self.manager.wait(job_id, timeout=self.left_s(), poll_interval=0.2)
        self.results["manager"]["train"] = {"id": job_id, "final": final.value,
                                            "status_after": self.manager.status(job_id).value,
                                            "logs": self.manager.logs(job_id)}
        if "manager_mpi" in self.ids:
            job_id = self.ids["manager_mpi"]
            final = self.manager.wait(job_id, timeout=self.left_s(), poll_interval=0.2)
            self.results["manager"]["mpi"] = {"id": job_id, "final": final.value, "logs": self.manager.logs(job_id)}
        for name, proc in self.local.items():
            out, _ = proc.communicate(timeout=self.left_s())
            self.results["local"][name] = {"returncode": proc.returncode, "output": out}

    def stop_local(self) -> None:
        for proc in self.local.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def main(work: Path) -> int:
    # a background job that times out is ended with SIGTERM: stop the cluster on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work.mkdir(parents=True, exist_ok=True)
    with SlurmCluster(str(work / "cluster"), resolvable_node_names(), cpus=8) as cluster:
        # every job runs at once: more CPUs per node than the host has (config_overrides) keeps them
        # from queueing behind each other
        env = cluster.env()     # SLURM_CONF for the manager's commands, no job variables pytest inherited
        os.environ.clear()
        os.environ.update(env)
        scenario = Scenario(cluster, work)
        try:
            scenario.submit_all()
            scenario.cancel_the_sleeper()
            scenario.follow_the_rest()
        finally:
            scenario.stop_local()
    (work / "results.json").write_text(json.dumps(scenario.results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).resolve()))
