"""Seed 000's Slurm manager: ``submit``, ``status``, ``cancel``, ``logs`` (and ``wait``) through ``sbatch``,
``squeue``/``scontrol``/``sacct`` and ``scancel``.

Tested against a real one-node Slurm cluster (Debian's ``slurmctld`` + ``slurmd`` + ``munge``, started by
``tests/slurm``): a submitted job trains on two node names through one launcher per node and ends
``COMPLETED`` with its output in :meth:`SlurmManager.logs`; a running job is cancelled and ends
``CANCELLED``. The batch script starts one launcher per node with ``srun`` (``--ntasks-per-node=1``),
each launcher starts ``processes_per_node`` ranks; node 0's host is the rendezvous address, and one
auth token generated in the script is shared by every node through ``srun``'s environment. An ``mpi``
job is started by ``srun`` directly (one task per rank: MPI ranks come from the MPI launcher, not ours).
The job runs in the folder ``submit`` was called from, with the submitting environment (Slurm's
``--export=ALL``) and this interpreter (``sys.executable``).

Where a job's state comes from: ``squeue`` while it is queued or running; then ``scontrol show job``
(the controller keeps a finished job for ``MinJobAge`` seconds, 300 by default); then ``sacct``
(accounting, on sites that run ``slurmdbd``).

>>> from neural_arch.distributed.scale.job_management import TrainingJobSpec
>>> squeue_command("42")
['squeue', '--noheader', '--jobs', '42', '--format', '%T']
>>> state_from_slurm("COMPLETED"), parse_job_id("Submitted batch job 42")
(<JobState.COMPLETED: 'completed'>, '42')
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

from neural_arch.distributed.scale.job_management import JobState, TrainingJobSpec

# JobState is named here because status() returns it (the reference links it from this page)
__all__ = ["JobState", "SlurmManager", "batch_script", "create_slurm_manager", "parse_job_id", "sacct_command",
           "sbatch_command", "scancel_command", "scontrol_command", "squeue_command", "state_from_slurm"]

#: Slurm job states -> ours (``squeue --format %T`` / ``sacct --format State``); the rest are PENDING
_STATES = {
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "CONFIGURING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING, "STOPPED": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED, "TIMEOUT": JobState.FAILED, "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED, "BOOT_FAIL": JobState.FAILED, "DEADLINE": JobState.FAILED,
    "PREEMPTED": JobState.FAILED,
}
_SBATCH_RESOURCES = {"cpus_per_task": "--cpus-per-task", "gpus_per_node": "--gpus-per-node",
                     "memory": "--mem", "time": "--time", "partition": "--partition"}


def state_from_slurm(text: str) -> JobState:
    """A Slurm state word (``RUNNING``, ``CANCELLED by 123``, ``COMPLETED``...) as a :class:`JobState`.

    Example::

        >>> state_from_slurm("CANCELLED by 1000"), state_from_slurm("PENDING")
        (<JobState.CANCELLED: 'cancelled'>, <JobState.PENDING: 'pending'>)
    """
    word = text.strip().split()[0].rstrip("+").upper() if text.strip() else "PENDING"
    return _STATES.get(word, JobState.PENDING)


def parse_job_id(sbatch_output: str) -> str:
    """The job id in ``sbatch``'s answer (``Submitted batch job 42``, or ``42`` with ``--parsable``).

    Example::

        >>> parse_job_id("42;cluster")
        '42'
    """
    text = sbatch_output.strip()
    last = text.split()[-1] if text else ""
    job_id = last.split(";")[0]
    if not job_id.isdigit():
        raise RuntimeError(f"could not read a job id in sbatch's output: {sbatch_output!r}")
    return job_id


def batch_script(spec: TrainingJobSpec, log_dir: str, master_port: int | None = None,
                 python: str | None = None) -> str:
    """The ``sbatch`` script of ``spec`` (text); its output goes to ``log_dir/<name>-<jobid>.out``.

    ``master_port``: node 0's rendezvous port (the launchers' agent uses the next one); None derives it
    from the job id in the script (``15000 + SLURM_JOB_ID % 20000``, the rule
    :func:`~neural_arch.distributed.launch_env.detect_launch_env` follows), so two jobs sharing a node
    do not collide.

    Example::

        >>> from neural_arch.distributed.scale.job_management import TrainingJobSpec
        >>> text = batch_script(TrainingJobSpec("j", "train.py", nodes=2, processes_per_node=4), "/logs",
        ...                     python="python")
        >>> "#SBATCH --nodes=2" in text and "--node_rank \\"$SLURM_NODEID\\"" in text
        True
    """
    python = python or sys.executable
    mpi = spec.backend == "mpi"
    if mpi and spec.restarts:
        raise ValueError(f"job {spec.name!r}: restarts are the launcher's, and an mpi job is started by srun "
                         "directly; use restarts=0 with backend='mpi', or backend='gloo'")
    tasks = spec.processes_per_node if mpi else 1
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={spec.name}",
             f"#SBATCH --nodes={spec.nodes}",
             f"#SBATCH --ntasks-per-node={tasks}",
             f"#SBATCH --output={os.path.join(log_dir, spec.name)}-%j.out"]
    for key, value in spec.resources.items():
        lines.append(f"#SBATCH {_SBATCH_RESOURCES[key]}={value}")
    lines.append("set -euo pipefail")
    target = (["-m"] if spec.module else []) + [spec.script] + list(spec.arguments)
    if mpi:
        # srun starts MPI ranks through a process-management interface: the site's choice when it set one
        # (SLURM_MPI_TYPE, or MpiDefault when that is not "none"), else PMI-2, which MPICH and Open MPI speak
        lines.append("export SLURM_MPI_TYPE=${SLURM_MPI_TYPE:-pmi2}")
        lines.append("srun " + shlex.join([python] + target))
        return "\n".join(lines) + "\n"
    port = "$((15000 + SLURM_JOB_ID % 20000))" if master_port is None else str(int(master_port))
    lines += [
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export MASTER_PORT={port}",
        # one token for every node's launcher (they authenticate each other with it); srun passes it on
        "export NEURAL_ARCH_AUTH_TOKEN=${NEURAL_ARCH_AUTH_TOKEN:-$(" + shlex.quote(python)
        + " -c 'import secrets; print(secrets.token_hex(16))')}",
    ]
    launcher = shlex.join([python, "-m", "neural_arch.distributed.launcher", "--nnodes", str(spec.nodes),
                           "--nproc_per_node", str(spec.processes_per_node), "--backend", spec.backend,
                           "--max_restarts", str(spec.restarts)])
    if master_port is not None:
        launcher += " " + shlex.join(["--master_port", str(int(master_port))])
    else:
        launcher += ' --master_port "$MASTER_PORT"'
    rest = shlex.join(target)
    # $SLURM_NODEID, $MASTER_ADDR and $MASTER_PORT are expanded by each task's shell, on its own node
    per_node = launcher + ' --node_rank "$SLURM_NODEID" --master_addr "$MASTER_ADDR" ' + rest
    lines.append("srun bash -c " + shlex.quote(per_node))
    return "\n".join(lines) + "\n"


def sbatch_command(script_path: str) -> list[str]:
    """``sbatch --parsable SCRIPT``.

    Example::

        >>> sbatch_command("/tmp/j.sbatch")
        ['sbatch', '--parsable', '/tmp/j.sbatch']
    """
    return ["sbatch", "--parsable", str(script_path)]


def squeue_command(job_id: str) -> list[str]:
    """The state of a job still in the queue (an empty answer: it left the queue; ask :func:`sacct_command`).

    Example::

        >>> squeue_command("7")[-2:]
        ['--format', '%T']
    """
    return ["squeue", "--noheader", "--jobs", str(job_id), "--format", "%T"]


def sacct_command(job_id: str) -> list[str]:
    """The state of a job that left the queue (Slurm's accounting).

    Example::

        >>> sacct_command("7")
        ['sacct', '--noheader', '--allocations', '--jobs', '7', '--format', 'State']
    """
    return ["sacct", "--noheader", "--allocations", "--jobs", str(job_id), "--format", "State"]


def scontrol_command(job_id: str) -> list[str]:
    """The controller's record of a job, one line (it keeps a finished job for ``MinJobAge`` seconds).

    Example::

        >>> scontrol_command("7")
        ['scontrol', '--oneliner', 'show', 'job', '7']
    """
    return ["scontrol", "--oneliner", "show", "job", str(job_id)]


def _scontrol_state(text: str) -> str:
    """``JobState=COMPLETED`` in ``scontrol show job``'s answer -> ``"COMPLETED"`` ("" when absent)."""
    for word in text.split():
        if word.startswith("JobState="):
            return word[len("JobState="):]
    return ""


def scancel_command(job_id: str) -> list[str]:
    """``scancel JOBID``.

    Example::

        >>> scancel_command("7")
        ['scancel', '7']
    """
    return ["scancel", str(job_id)]


class SlurmManager:
    """Submits :class:`~neural_arch.distributed.scale.job_management.TrainingJobSpec` s to Slurm and
    follows them (tested against a one-node Slurm cluster: see the module docstring).

    ``log_dir``: where batch scripts and job output go (created on first submit; on a cluster, a
    folder every node sees). ``master_port``: node 0's rendezvous port; None (the default) derives it
    from the job id, so jobs sharing a node do not collide.

    Example::

        >>> manager = SlurmManager(log_dir="/tmp/slurm-jobs")
        >>> manager.log_path("j", "42")
        '/tmp/slurm-jobs/j-42.out'
        >>> import shutil
        >>> shutil.which("sbatch") is not None or "sbatch" in str(_err(manager.cancel, "42"))
        True
    """

    def __init__(self, log_dir: str = "slurm-jobs", master_port: int | None = None) -> None:
        self.log_dir = os.path.abspath(log_dir)
        self.master_port = None if master_port is None else int(master_port)
        self._names: dict[str, str] = {}

    def _run(self, command: list[str]) -> str:
        if shutil.which(command[0]) is None:
            raise FileNotFoundError(f"{command[0]} not found on PATH: create_slurm_manager() drives Slurm's "
                                    "sbatch/squeue/scontrol/sacct/scancel commands; run it on a Slurm login node, "
                                    "or run the job on this machine with TrainingJobSpec.run_local()")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command)} exited with {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def log_path(self, name: str, job_id: str) -> str:
        """Where job ``job_id`` named ``name`` writes its output.

        Example::

            >>> SlurmManager("/x").log_path("a", "1")
            '/x/a-1.out'
        """
        return os.path.join(self.log_dir, f"{name}-{job_id}.out")

    def submit(self, spec: TrainingJobSpec) -> str:
        """Write the batch script and ``sbatch`` it; returns the job id. The job runs in the current
        folder (a relative ``script`` is found from there) with the current environment.

        Example::

            job_id = create_slurm_manager().submit(TrainingJobSpec("demo", "train.py", nodes=2))
        """
        text = batch_script(spec, self.log_dir, self.master_port)
        if shutil.which("sbatch") is None:
            self._run(["sbatch"])           # the error that names the missing binary, before any file
        os.makedirs(self.log_dir, exist_ok=True)
        path = os.path.join(self.log_dir, f"{spec.name}.sbatch")
        with open(path, "w") as f:
            f.write(text)
        job_id = parse_job_id(self._run(sbatch_command(path)))
        self._names[job_id] = spec.name
        return job_id

    def status(self, job_id: str) -> JobState:
        """The job's :class:`JobState`: ``squeue`` while it is queued or running, then the controller's
        record (``scontrol show job``, kept ``MinJobAge`` seconds after the end), then ``sacct``.

        Example::

            create_slurm_manager().status(job_id)      # JobState.RUNNING
        """
        failures = []
        for command, read in ((squeue_command(job_id), lambda out: out.splitlines()[0] if out else ""),
                              (scontrol_command(job_id), _scontrol_state),
                              (sacct_command(job_id), lambda out: out.splitlines()[0] if out else "")):
            try:
                word = read(self._run(command).strip())
            except RuntimeError as exc:
                # a job the controller forgot ("Invalid job id specified"), accounting disabled on
                # this site ("Slurm accounting storage is disabled"): ask the next source
                failures.append(str(exc))
                continue
            if word:
                return state_from_slurm(word)
        raise RuntimeError(f"Slurm knows no job {job_id}: not queued, not in the controller's memory, and no "
                           "accounting record" + ("".join(f"\n  {f}" for f in failures) if failures else ""))

    def wait(self, job_id: str, timeout: float | None = None, poll_interval: float = 1.0) -> JobState:
        """Poll :meth:`status` until the job finishes; its final state. ``TimeoutError`` (naming the
        state it is in) after ``timeout`` seconds.

        Example::

            state = manager.wait(manager.submit(spec), timeout=3600)    # JobState.COMPLETED
        """
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            state = self.status(job_id)
            if state.finished:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Slurm job {job_id} still {state.value} after {timeout} s")
            time.sleep(poll_interval)

    def cancel(self, job_id: str) -> None:
        """``scancel`` the job (its state becomes ``CANCELLED``).

        Example::

            create_slurm_manager().cancel(job_id)
        """
        self._run(scancel_command(job_id))

    def logs(self, job_id: str, name: str | None = None) -> str:
        """The job's output so far (``name``: the spec's, when this manager did not submit it).

        Example::

            print(create_slurm_manager().logs(job_id))
        """
        name = name or self._names.get(str(job_id))
        if name is None:
            raise KeyError(f"job {job_id}: not submitted by this manager; pass its spec's name: logs(job_id, name)")
        path = self.log_path(name, str(job_id))
        if not os.path.exists(path):
            return ""    # not started yet: Slurm creates the file when the job starts
        with open(path) as f:
            return f.read()


def _err(fn, *args):
    """The exception ``fn(*args)`` raises, or None (the docstring examples use it)."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def create_slurm_manager(log_dir: str = "slurm-jobs", master_port: int | None = None) -> SlurmManager:
    """A :class:`SlurmManager` (``sbatch`` and the other commands are looked for when one runs).

    Example::

        >>> create_slurm_manager("/tmp/jobs").log_dir
        '/tmp/jobs'
    """
    return SlurmManager(log_dir, master_port)
