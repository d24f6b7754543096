"""A one-node Slurm cluster on this host, for the tests: ``munged``, ``slurmctld`` and ``slurmd`` started
by hand (root, no systemd) from a configuration in a temporary folder, and stopped with every process and
file they made.

What it is not: a site's configuration. No cgroups (``proctrack/linuxproc``, ``task/none``), no accounting
daemon (``sacct`` answers "accounting storage is disabled"; ``squeue`` still knows a finished job for
``MinJobAge`` seconds), one partition of one node (or two node names on this host, where Slurm's build
allows several ``slurmd``). The daemons find the configuration through ``SLURM_CONF``, and so must every
client command the tests run: :meth:`SlurmCluster.env` is the environment to run them in.

Example::

    with SlurmCluster(base_dir) as cluster:
        subprocess.run(["sbatch", "--wrap", "hostname"], env=cluster.env(), check=True)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing_binaries() -> list[str]:
    """The daemons and client commands this cluster needs that are not installed."""
    paths = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [name for name in (*DAEMONS, "sbatch", "srun", "squeue", "scancel", "scontrol")
            if shutil.which(name, path=paths) is None]


def _which(name: str) -> str:
    paths = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = shutil.which(name, path=paths)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed")
    return found


def _become_subreaper() -> None:
    """Adopt the orphans of our descendants (Linux's PR_SET_CHILD_SUBREAPER): ``slurmstepd`` daemonizes,
    and would otherwise leave our process tree, where whoever ends us (a test runner ending a job that
    timed out) finds and ends everything."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)    # PR_SET_CHILD_SUBREAPER


def _reap_adopted(pids: set[int]) -> None:
    """Collect the exit status of the adopted job processes that ended (no zombie of ours is left);
    only those: another child's status belongs to whoever started it."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.pid in pids or child.name() == "slurmstepd":
                os.waitpid(child.pid, os.WNOHANG)


def resolvable_node_names() -> tuple[str, ...]:
    """Two names for this host that both resolve (this host's name and ``localhost``), so a job's first
    node -- its rendezvous address -- is reachable whichever it is; one name where the host is itself
    called ``localhost`` or its name does not resolve."""
    host = socket.gethostname()
    try:
        socket.gethostbyname(host)
    except OSError:
        return ("localhost",)
    return (host,) if host == "localhost" else (host, "localhost")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports, each free a moment ago together with the port after it (the launcher's node
    agent listens on MASTER_PORT + 1), chosen *below* the kernel's ephemeral range.

    A Slurm job binds its port seconds after the scenario picks it; a port from ``bind(0)`` lies in the
    ephemeral range, where any other process's ``bind(0)`` or outgoing connection may take it meanwhile
    (a 5-d launcher run beside the scenario once did). Nothing gets a port below that range unless it
    asks for it by number.
    """
    low = _ephemeral_low()
    rng = random.Random()
    found: list[int] = []
    while len(found) < n:
        port = rng.randrange(max(1024, low - 12000), low - 2)
        if port in found or port + 1 in found or port - 1 in found:
            continue
        if all(_bindable(p) for p in (port, port + 1)):
            found.append(port)
    return found


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class SlurmCluster:
    """Slurm on this host: one controller and a ``slurmd`` per name in ``node_names`` (default: this
    host's name), each node ``cpus`` CPUs whatever the hardware has (``config_overrides``), in
    ``base_dir`` (removed by :meth:`stop`). Several ``slurmd`` on one host need a Slurm built with
    ``--enable-multiple-slurmd``; Debian's 22.05 build runs them.

    Example::

        cluster = SlurmCluster(tempfile.mkdtemp()).start()
        try:
            print(subprocess.run(["sinfo"], env=cluster.env(), capture_output=True, text=True).stdout)
        finally:
            cluster.stop()
    """

    def __init__(self, base_dir: str, node_names: tuple[str, ...] | None = None, cpus: int = 2,
                 start_timeout: float = 60.0) -> None:
        self.base_dir = os.path.abspath(base_dir)
        self.host = socket.gethostname()
        self.node_names = tuple(node_names or (self.host,))
        self.cpus = int(cpus)
        self.start_timeout = float(start_timeout)
        self.conf = os.path.join(self.base_dir, "slurm.conf")
        self.munge_socket = os.path.join(self.base_dir, "munge.sock")
        self._procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ configuration
    def env(self, **extra) -> dict:
        """The environment for Slurm's client commands (``sbatch``, ``srun``, ``squeue``...)."""
        env = dict(os.environ, SLURM_CONF=self.conf, **extra)
        for name in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if name != "SLURM_CONF" and name not in extra:
                del env[name]       # tests run inside a job elsewhere must not pass its allocation on
        return env

    def _write_config(self) -> None:
        ctld_port, *node_ports = free_ports(1 + len(self.node_names))
        d = self.base_dir
        lines = [
            "ClusterName=neural-arch-test",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log", f"SlurmdLogFile={d}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "MpiDefault=none", "SwitchType=switch/none",
            "SlurmdParameters=config_overrides",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2", "MinJobAge=600", "KillWait=2", "InactiveLimit=0",
            # batch jobs are scheduled within a second of their submission (the default waits up to 3 s)
            "SchedulerType=sched/builtin", "SchedulerParameters=batch_sched_delay=1",
            "SlurmctldTimeout=30", "SlurmdTimeout=30",
            f"PlugStackConfig={d}/plugstack.conf",
        ]
        for name, port in zip(self.node_names, node_ports):
            # several names on one host: each slurmd (-N name) on its own port
            lines.append(f"NodeName={name} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE State=UP")
        os.makedirs(os.path.join(d, "state"), exist_ok=True)
        for name in self.node_names:
            os.makedirs(os.path.join(d, f"spool-{name}"), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        open(os.path.join(d, "plugstack.conf"), "w").close()     # no SPANK plugins (not the host's)

    # ------------------------------------------------------------------ life cycle
    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(os.path.join(self.base_dir, f"{key}.stderr"), "wb")
        with log:
            # a session of its own: the daemons' signals (and the terminal's Ctrl-C) stay apart from pytest's
            self._procs[key] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env(), start_new_session=True, cwd=self.base_dir)

    def start(self) -> SlurmCluster:
        """Write the configuration, start the daemons in the foreground (as our children), wait until
        every node is idle. On any failure everything started is stopped and the error says what the
        daemons logged."""
        os.makedirs(self.base_dir, exist_ok=True)
        _become_subreaper()
        try:
            self._write_config()
            key = os.path.join(self.base_dir, "munge.key")
            with open(key, "wb") as f:
                f.write(os.urandom(128))
            os.chmod(key, 0o400)
            self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                                   f"--key-file={key}", f"--pid-file={self.base_dir}/munged.pid",
                                   f"--log-file={self.base_dir}/munged.log",
                                   f"--seed-file={self.base_dir}/munged.seed", "--num-threads=2"])
            self._wait_for(lambda: os.path.exists(self.munge_socket), "munged's socket")
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", self.conf])
            for name in self.node_names:
                self._spawn(f"slurmd-{name}", [_which("slurmd"), "-D", "-N", name, "-f", self.conf])
            self._wait_for(self._nodes_idle, "every node idle in sinfo")
        except BaseException:
            self.stop(remove=False)
            raise
        return self

    def _nodes_idle(self) -> bool:
        done = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], env=self.env(),
                              capture_output=True, text=True, check=False)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and all(states.get(n, "").startswith("idle") for n in self.node_names)

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not ready():
            for key, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{key} exited with {proc.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {self.start_timeout:.0f} s:\n" + self.logs())
            time.sleep(0.1)

    def logs(self) -> str:
        """The tail of every daemon's log (for error messages)."""
        out = []
        for name in sorted(os.listdir(self.base_dir)) if os.path.isdir(self.base_dir) else []:
            if name.endswith((".log", ".stderr")):
                with open(os.path.join(self.base_dir, name), errors="replace") as f:
                    tail = f.read()[-2000:]
                out.append(f"--- {name}\n{tail}")
        return "\n".join(out)

    def _job_processes(self) -> list[psutil.Process]:
        """The ``slurmstepd`` processes of this cluster and everything under them. They leave slurmd's
        tree (slurmstepd daemonizes; we adopt them where Linux allows) and clear their environment:
        found by the working folder they inherit from their slurmd, ``base_dir``."""
        found = []
        for proc in psutil.process_iter(["name"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["name"] == "slurmstepd" and proc.cwd() == self.base_dir:
                    found.append(proc)
                    found += proc.children(recursive=True)
        return found

    def stop(self, remove: bool = True) -> None:
        """Cancel every job, kill what is left of the jobs' processes, stop the daemons (TERM, then KILL),
        and remove ``base_dir``. Quick (a test cluster has nothing to save): a background job that timed
        out gets a second between SIGTERM and SIGKILL."""
        with contextlib.suppress(Exception):
            if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
                subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=self.env(),
                               capture_output=True, timeout=2, check=False)
        steps = self._job_processes()
        for proc in steps:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(steps, timeout=5)
        for key in [k for k in self._procs if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            proc = self._procs.get(key)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        _reap_adopted({proc.pid for proc in steps})
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":   # python tests/slurm/slurm_cluster.py: start one, print sinfo, stop it
    import tempfile

    with SlurmCluster(tempfile.mkdtemp(prefix="slurm-"), resolvable_node_names()) as c:
        print(subprocess.run(["sinfo"], env=c.env(), capture_output=True, text=True).stdout)
        print(subprocess.run(["srun", "-n", "2", "hostname"], env=c.env(), capture_output=True, text=True))
