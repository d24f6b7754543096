"""Start, watch, tear down and restart the processes of a distributed job (one launcher per node).

Command line (options before the script, or directly after it — see
:mod:`~neural_arch.distributed.run.launch_config`)::

    python -m neural_arch.distributed.launcher --nproc_per_node=4 train.py --epochs 3
    python -m neural_arch.distributed.launcher train.py --nproc_per_node=4 --backend=gloo
    neural-arch-launch --standalone --nproc_per_node 2 --max_restarts 3 -m mypkg.train

Python::

    from neural_arch.distributed import LaunchConfig, DistributedLauncher, launch_distributed_training
    exit_code = DistributedLauncher(LaunchConfig(nproc_per_node=2)).launch("train.py", "--epochs", "3")
    exit_code = launch_distributed_training("train.py", "--epochs", "3", nproc_per_node=2)

(The seeds write ``launch_distributed_training("train.py", nproc_per_node=4, ..., "--model", "x")``,
which Python rejects: positional arguments cannot follow keywords. Put script arguments first.)

What each rank gets in its environment: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``NODE_RANK``, ``GROUP_RANK`` (= node rank), ``ROLE_NAME`` (``default``),
``ROLE_RANK``/``ROLE_WORLD_SIZE`` (= ``RANK``/``WORLD_SIZE``: one role), ``MASTER_ADDR``, ``MASTER_PORT``,
``NEURAL_ARCH_BACKEND``, ``NEURAL_ARCH_RESTART_COUNT`` (and ``TORCHELASTIC_RESTART_COUNT``),
``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID`` (with ``--rdzv_id``),
``NEURAL_ARCH_AUTH_TOKEN``, ``NEURAL_ARCH_PARENT_PID``, ``NEURAL_ARCH_READY_DIR`` (see
``--start_timeout``), ``NEURAL_ARCH_MAX_RESTARTS``, ``PYTHONUNBUFFERED=1`` (so output is not lost
when a rank is killed). ``init_process_group()`` reads them. MPI launcher variables (``PMI_*``,
``PMIX_*``, ``OMPI_COMM_WORLD_*``) of a launcher that was itself started by mpiexec/srun are *not*
passed on. ``--backend mpi`` with more than one rank is refused: MPI ranks must come from mpiexec.
Exit statuses: 0; the failing rank's code; 128+N for signal N; 124 for ``--start_timeout``; 1 when a
node cannot join node 0; 2 for bad usage.

Auth token (``NEURAL_ARCH_AUTH_TOKEN``): the ranks' store and transport accept only peers that know
it. Single node: the launcher generates a random one per job unless the variable is set.
**Multi-node: export the same value on every node before starting its launcher** - the launcher
refuses ``--nnodes > 1`` without it (exit status 2), rather than generating one that the other nodes
would then have to be told about::

    export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')

The launchers prove to each other that they know it with an HMAC challenge-response; the token is
never sent over the network. Node 0's launcher listens on ``--master_addr`` only.

Behaviour:

* Input: the launcher's stdin goes to global rank 0 (``python -m ... train.py < data.txt``);
  every other rank reads an empty stdin.
* Output: each line is prefixed ``[rank{r}]: `` (stdout to stdout, stderr to stderr), whole lines
  only. With ``--log_dir`` each rank's raw output is *appended* to ``log_dir/rank_{r}.log``; every
  attempt starts with a ``==== neural_arch launcher: attempt k ====`` header line. The folder is
  created 0700 and refused if another user owns it or may write into it; logs are 0600 and never
  opened through a symlink.
* Failure: the first rank to exit non-zero makes the launcher stop the others (SIGTERM to each rank's
  process group, SIGKILL after ``term_timeout`` s). While restarts remain the whole node group is
  started again with ``NEURAL_ARCH_RESTART_COUNT`` increased (a fresh port in ``--standalone`` mode);
  otherwise the launcher exits with that rank's code (128+N for signal N) after a summary. The
  summary names the rank whose error came *first* (each rank's uncaught error is recorded with its
  time) and prints that error: the first rank to *exit* is often a peer that only saw a lost
  connection (``PeerFailureError``) while another rank held the cause.
* Started by mpiexec/srun as several tasks of one node (``mpiexec -n 2 python -m ...launcher``): refused
  at once (exit status 2) with what to do instead, rather than the launchers fighting over the port.
* Signals: SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every rank, then the same teardown
  runs and the launcher exits with 128+N. A launcher killed with SIGKILL leaves no orphans: each rank
  leads its own process group and watches its parent (polling every 0.2 s); when the launcher is
  gone it ends the whole group - the rank and whatever it started - with SIGTERM, then SIGKILL 3 s
  later. Teardown by a living launcher also signals each rank's group, not just its pid.
* ``--start_timeout``: every local rank must reach rendezvous in time - ``init_process_group()``
  creates ``$NEURAL_ARCH_READY_DIR/rank_{r}`` when it succeeded (a fresh folder per attempt,
  removed afterwards) - and, for multi-node jobs, every node's launcher must first have joined
  node 0's (no rank starts before that). When the time runs out the launcher fails, naming the
  ranks (and whether they even started) or the nodes that are missing.
* Multi-node: the launchers agree on the job before any rank starts (``run/agent.py``): nodes may
  run different ``--nproc_per_node`` (as with torchrun; ranks are numbered node by node), and a
  node that disagrees about ``--nnodes``, ``--backend`` or ``--master_port``, or repeats a
  ``--node_rank``, fails *every* node at once with the reason. A rank that exits counts as done. **A script that never calls
  init_process_group** must call ``neural_arch.distributed.run.child_env.report_ready()`` instead, or
  get a ``--start_timeout`` longer than its run.

Elastic multi-node jobs (``--nnodes MIN:MAX``, or ``--max_restarts > 0`` with several nodes): node
0's launcher hosts the rendezvous agent for the whole job; rounds of MIN..MAX nodes form, and after
a failed rank or a lost node every node stops its ranks and the next round starts them again
with new ``RANK``/``WORLD_SIZE`` and the restart count + 1 (see ``run/agent.py`` and
docs/fault_tolerance.md). If node 0 dies the job ends.

Limitations (said plainly): no SSH start of remote nodes: run one launcher per node (by hand, or
with ``srun``; see ``examples/slurm/``). A node that joins while a round runs makes every node
restart its ranks in a new round that includes it (a membership change: no restart is used up).

Restart-from-checkpoint pattern for a training script (see ``examples/restart_from_checkpoint.py``)::

    from neural_arch.distributed import find_latest_checkpoint
    from neural_arch.distributed.elastic.checkpoint_restart import restart_count, save_npz_atomic
    ckpt = find_latest_checkpoint("ckpts")            # None on the very first start
    state = load(ckpt) if ckpt else fresh_state()
    for step in range(state.step, total_steps):
        train_one_step(state)
        if rank == 0:
            save_npz_atomic(f"ckpts/step_{step + 1:06d}.npz", ...)   # temp file + os.replace
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from neural_arch import config
from neural_arch.distributed import auth as handshake
from neural_arch.distributed.elastic.agent import ElasticAgentServer, ElasticMember
from neural_arch.distributed.launch_env import (
    detect_launch_env,
    launched_by_mpiexec,
    oversubscription_message,
)
from neural_arch.distributed.run.agent import NodeAgentServer, NodeLayout, _Every, join_node0
from neural_arch.distributed.run.child_env import free_port, package_root, port_taken, rank_env
from neural_arch.distributed.run.launch_config import LaunchConfig, parse_command_line
from neural_arch.distributed.run.procs import (
    Child,
    OutputPump,
    describe_exit,
    exit_status,
    prepare_log_dir,
    send_signal_all,
    signal_name,
    start_child,
    terminate_all,
)

__all__ = ["DistributedLauncher", "LaunchConfig", "launch_distributed_training", "main"]

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_SIGNAL_CHECK_S = 0.1  # longest delay before a received SIGINT/SIGTERM is acted on
EXIT_START_TIMEOUT = 124  # like coreutils' timeout: "did not start in time"


def _say(message: str) -> None:
    print(f"neural_arch.launcher: {message}", file=sys.stderr, flush=True)


find_free_port = free_port  # the launcher's historical name
_package_root = package_root


def _format_ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class DistributedLauncher:
    """Runs ``config.nproc_per_node`` ranks of a script on this node; see the module docstring.

    >>> launcher = DistributedLauncher(LaunchConfig(nproc_per_node=2, standalone=True))
    >>> launcher.launch("train.py", "--epochs", "1")   # doctest: +SKIP
    0
    """

    def __init__(self, config: LaunchConfig | None = None, **overrides) -> None:
        config = config or LaunchConfig()
        self.config = config.replace(**overrides) if overrides else config
        self._wake = threading.Event()
        self._signum: int | None = None
        self.restart_count = 0
        self.last_failure: dict | None = None
        self._node_rank = self.config.node_rank   # elastic jobs: this round's node rank
        self._errors: list[dict] = []              # the last attempt's error records, oldest first
        self._member: ElasticMember | None = None  # elastic jobs: our connection to node 0's agent

    # ------------------------------------------------------------------ signals
    def _on_signal(self, signum, frame) -> None:
        # Only set a flag: a Python signal handler runs in the main thread between bytecodes, and
        # touching the Event here could deadlock on its lock if the main thread holds it right
        # now (inside wait()/clear()). The monitor loop looks at the flag at least every 0.1 s.
        if self._signum is None:
            self._signum = signum

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}  # only the main thread may set handlers; the caller then owns signals
        previous = {}
        for sig in _FORWARDED_SIGNALS:
            try:
                previous[sig] = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                pass
        return previous

    # ------------------------------------------------------------------ environment
    def _child_env(self, local_rank: int, port: int, token: str, ready_dir: str) -> dict:
        cfg = self.config
        env = rank_env(rank=self._layout.rank_offset(self._node_rank) + local_rank, local_rank=local_rank,
                       world_size=self._layout.world_size, local_world_size=cfg.nproc_per_node,
                       node_rank=self._node_rank, master_addr=cfg.master_addr, master_port=port,
                       backend=cfg.backend, token=token, restart_count=self.restart_count,
                       parent_pid=os.getpid())
        env["NEURAL_ARCH_MAX_RESTARTS"] = str(cfg.max_restarts)
        # the rest of torchrun's documented list: one role ("default"), so its ranks are the job's
        env.update({"ROLE_NAME": "default", "ROLE_RANK": env["RANK"], "ROLE_WORLD_SIZE": env["WORLD_SIZE"],
                    "TORCHELASTIC_MAX_RESTARTS": str(cfg.max_restarts)})
        env["NEURAL_ARCH_READY_DIR"] = ready_dir
        if cfg.rdzv_id:
            env["TORCHELASTIC_RUN_ID"] = str(cfg.rdzv_id)  # torchrun's --rdzv_id, as torchrun exports it
        return env

    def _command(self, target: str, args: tuple) -> list[str]:
        bootstrap = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run", "bootstrap.py")
        head = [sys.executable, "-u", bootstrap]
        return head + (["-m", target] if self.config.module else [target]) + [str(a) for a in args]

    # ------------------------------------------------------------------ one attempt
    def _start_group(self, target: str, args: tuple, port: int, token: str, ready_dir: str,
                     pump: OutputPump) -> list[Child]:
        cfg = self.config
        children: list[Child] = []
        header = f"==== neural_arch launcher: attempt {self.restart_count} ({time.ctime()}) ====\n"
        try:
            for local_rank in range(cfg.nproc_per_node):
                rank = self._layout.rank_offset(self._node_rank) + local_rank
                log_path = os.path.join(cfg.log_dir, f"rank_{rank}.log") if cfg.log_dir else None
                children.append(start_child(
                    self._command(target, args), self._child_env(local_rank, port, token, ready_dir),
                    rank=rank, pump=pump, local_rank=local_rank, node_rank=self._node_rank,
                    log_path=log_path, header=header, stdin=None if rank == 0 else subprocess.DEVNULL))
        except BaseException:
            terminate_all(children, grace=cfg.term_timeout)
            raise
        return children

    def _missing_message(self, children: list[Child], ready_dir: str) -> str | None:
        """None when every rank reached rendezvous; otherwise the text naming who is missing.

        A rank is ready once ``ready_dir/rank_{r}`` exists (``init_process_group`` writes it,
        see :func:`~neural_arch.distributed.run.child_env.report_ready`) or it has exited; ``started_{r}`` (written by the
        bootstrap) tells "never started" from "hangs before its rendezvous".
        """
        cfg = self.config

        def has(name: str) -> bool:
            return os.path.exists(os.path.join(ready_dir, name))

        missing = [c.rank for c in children if c.proc.poll() is None and not has(f"rank_{c.rank}")]
        if not missing:
            return None
        never = [r for r in missing if not has(f"started_{r}")]
        noun = "rank" if len(missing) == 1 else "ranks"
        text = (f"{noun} {_format_ranks(missing)} on node {cfg.node_rank} did not reach "
                f"rendezvous (init_process_group)")
        if never:
            text += (f"; of these, {_format_ranks(never)} did not even start (the Python "
                     f"process never reached the launcher's bootstrap)")
        return text + (". A script that never calls init_process_group must call "
                       "neural_arch.distributed.run.child_env.report_ready(), or raise --start_timeout")

    def _run_attempt(self, target: str, args: tuple, port: int, token: str, pump: OutputPump) -> int:
        """Run one group to completion. Returns 0, or raises on failure/timeout/signal."""
        cfg = self.config
        ready_dir = tempfile.mkdtemp(prefix="neural_arch_ready_")
        children: list[Child] = []
        try:
            children = self._start_group(target, args, port, token, ready_dir, pump)
            deadline = time.monotonic() + cfg.start_timeout
            every = _Every(cfg.wait_log_interval)
            started = False
            while True:
                # A rank's pipes reach EOF a moment *before* the kernel reports it as exited; poll
                # fast in that window instead of sleeping a whole monitor_interval.
                closing = any(c.proc.poll() is None and c.threads and
                              not any(t.is_alive() for t in c.threads) for c in children)
                self._wake.wait(0.01 if closing else min(cfg.monitor_interval, _SIGNAL_CHECK_S))
                self._wake.clear()
                if self._signum is not None:
                    send_signal_all(children, self._signum)
                    raise _Interrupted(self._signum)
                if self._member is not None:
                    message = self._member.poll()
                    if message is not None:  # node 0's agent: stop (another node failed), exit, lost
                        raise _AgentSaid(message)
                failed = [c for c in children if c.proc.poll() not in (None, 0)]
                if failed:
                    # Several ranks may have died in one interval; report the lowest rank.
                    raise _ChildFailed(min(failed, key=lambda c: c.rank))
                if all(c.proc.poll() == 0 for c in children):
                    return 0
                if not started:
                    missing = self._missing_message(children, ready_dir)
                    started = missing is None
                    if not started and time.monotonic() > deadline:
                        raise _StartTimeout(missing)
                    if not started and every():
                        _say(f"still waiting: {missing.split('. A script')[0]} ({deadline - time.monotonic():.0f} s left of "
                             f"--start_timeout {cfg.start_timeout:g})")
        finally:
            grace = cfg.term_timeout
            terminate_all(children, grace=grace, already_signalled=self._signum is not None)
            if children:
                # ranks killed during shared-memory set-up leave /dev/shm files that no survivor
                # removes when every rank died: only files whose creating process is gone
                from neural_arch.distributed.comm.gloo.transport.shm import clean_stale_rings

                clean_stale_rings()
            self._errors = _read_error_records(ready_dir)
            shutil.rmtree(ready_dir, ignore_errors=True)

    # ------------------------------------------------------------------ public entry
    def launch(self, script: str, *script_args) -> int:
        """Run ``script`` (a path, or a module name when ``config.module``) on this node's ranks.

        Returns the exit status: 0, the failing rank's exit code, 128+N for a signal N, or 124 when
        ranks did not start within ``start_timeout``.
        """
        cfg = self.config
        _refuse_mpi_tasks(cfg)
        if cfg.backend.lower() == "mpi" and cfg.world_size > 1:
            raise ValueError(
                "--backend mpi: MPI ranks must be started by mpiexec, which this launcher is not; "
                "its processes would each be an MPI world of one. Run `mpiexec -n "
                f"{cfg.world_size} python {script} ...` instead, or use --backend gloo here")
        if cfg.log_dir:
            prepare_log_dir(cfg.log_dir)
        if not cfg.standalone and not cfg.elastic and cfg.node_rank == 0 \
                and port_taken(cfg.master_addr, cfg.master_port):
            # said here, before any rank starts: otherwise rank 0 fails deep inside init_process_group
            _say(f"the master port {cfg.master_port} on {cfg.master_addr} is taken: another process listens "
                 "there (a previous job still running, or someone else's). On one node pass --standalone "
                 "to pick a free port; otherwise choose a free --master_port (the same on every node)")
            return 1
        crowded = oversubscription_message(cfg.nproc_per_node)
        if crowded:
            _say(crowded)      # one launcher per host: said once, before any rank starts
        token = config.get("NEURAL_ARCH_AUTH_TOKEN") or None
        if token:
            handshake.job_key(token)   # a weak token is refused here, before any rank or node starts
        if cfg.nnodes > 1 and not token:
            raise ValueError(
                "a multi-node job needs the same NEURAL_ARCH_AUTH_TOKEN on every node (the launchers "
                "authenticate each other with it, and the ranks' store and transport use it). Run "
                "`export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')` "
                "once, and export that same value on every node before starting its launcher")
        previous = self._install_signal_handlers()
        self._signum, self.restart_count, self.last_failure = None, 0, None
        self._layout = NodeLayout((cfg.nproc_per_node,) * cfg.nnodes)  # multi-node: node 0 decides below
        agent = None
        # Output-pipe EOF usually means a rank exited: wake the monitor at once, not after an interval.
        pump = OutputPump(prefix=cfg.prefix_output, on_eof=self._wake.set)
        try:
            if cfg.elastic:
                return self._launch_elastic(script, script_args, token, pump)
            if cfg.nnodes > 1:
                try:
                    token, agent = self._join_nodes(token)
                except (TimeoutError, InterruptedError, RuntimeError) as exc:
                    if self._signum is not None:
                        return 128 + self._signum
                    _say(str(exc))
                    return 1
            token = token or secrets.token_hex(16)
            while True:
                port = find_free_port() if cfg.standalone else cfg.master_port
                try:
                    return self._run_attempt(script, script_args, port, token, pump)
                except _ChildFailed as failure:
                    self.last_failure = failure.describe(self.restart_count)
                    child = failure.child
                    where = f"; log: {child.log_path}" if child.log_path else ""
                    if self.restart_count < cfg.max_restarts:
                        _say(f"rank {child.rank} {describe_exit(child.proc.returncode)}{where}; "
                             f"restarting the group (restart {self.restart_count + 1} of "
                             f"{cfg.max_restarts})")
                        self.restart_count += 1
                        continue
                    _say(self._summary(child))
                    return exit_status(child.proc.returncode)
        except _StartTimeout as exc:
            _say(f"start timeout after {cfg.start_timeout:g} s: {exc.missing}")
            return EXIT_START_TIMEOUT
        except _Interrupted as exc:
            _say(f"received {signal_name(exc.signum)}; forwarded it to all ranks and stopped them")
            return 128 + exc.signum
        finally:
            if agent is not None:
                agent.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _join_nodes(self, token: str):
        """Multi-node set-up: node 0 listens for the other launchers, the others join it; every
        launcher leaves with the job's layout (processes per node) or fails with node 0's reason."""
        cfg = self.config
        agent_port = cfg.agent_port or cfg.master_port + 1
        stopping = lambda: self._signum is not None
        if cfg.node_rank == 0:
            # Listen on master_addr only: the other nodes reach us there, nobody needs more.
            agent = NodeAgentServer(agent_port, cfg.nnodes, cfg.nproc_per_node, token, host=cfg.master_addr,
                                    backend=cfg.backend, master_port=cfg.master_port,
                                    log=lambda m: _say(f"node 0: {m}"))
            try:
                self._layout = agent.wait_layout(cfg.start_timeout, stopping, log_interval=cfg.wait_log_interval)
            except TimeoutError as exc:
                agent.close()
                raise _StartTimeout(f"{exc}: start each missing node's launcher with --node_rank N "
                                    f"--master_addr {cfg.master_addr}") from None
            except BaseException:
                agent.close()
                raise
            return token, agent
        self._layout = join_node0(cfg.master_addr, agent_port, cfg.node_rank, cfg.nproc_per_node, token,
                                  cfg.start_timeout, stopping, nnodes=cfg.nnodes, backend=cfg.backend,
                                  master_port=cfg.master_port, log=_say, log_interval=cfg.wait_log_interval)
        return token, None

    # ------------------------------------------------------------------ elastic jobs
    def _launch_elastic(self, script: str, script_args: tuple, token: str, pump: OutputPump) -> int:
        """Every node (node 0 too) is a member of node 0's agent and runs the rounds it forms."""
        cfg = self.config
        agent_port = cfg.agent_port or cfg.master_port + 1
        stopping = lambda: self._signum is not None
        server = None
        try:
            if cfg.node_rank == 0:
                server = ElasticAgentServer(agent_port, cfg.min_nnodes, cfg.nnodes, token, host=cfg.master_addr,
                                            backend=cfg.backend, master_port=cfg.master_port,
                                            max_restarts=cfg.max_restarts, last_call=cfg.rdzv_last_call,
                                            start_timeout=cfg.start_timeout, log=lambda m: _say(f"agent: {m}"),
                                            log_interval=cfg.wait_log_interval)
            try:
                member = ElasticMember(cfg.master_addr, agent_port, cfg.node_rank, cfg.nproc_per_node, token,
                                       cfg.start_timeout, stopping, nnodes_spec=cfg.nnodes_spec,
                                       backend=cfg.backend, master_port=cfg.master_port, on_message=self._wake.set,
                                       log=_say, log_interval=cfg.wait_log_interval)
            except (TimeoutError, InterruptedError, RuntimeError) as exc:
                if self._signum is not None:
                    return 128 + self._signum
                _say(str(exc))
                return 1
            self._member = member
            try:
                return self._elastic_rounds(script, script_args, token, pump, member)
            finally:
                self._member = None
                member.close()
        finally:
            if server is not None:
                server.close()

    def _elastic_rounds(self, script: str, script_args: tuple, token: str, pump: OutputPump,
                        member: ElasticMember) -> int:
        cfg = self.config
        # The agent enforces --start_timeout itself; this bound only guards against a silent agent.
        silent_limit = cfg.start_timeout + 120.0
        message = None
        while True:
            if message is None:
                message = self._wait_agent(member, silent_limit)
            if message is None:
                _say(f"{member.where} sent nothing for {silent_limit:g} s; giving up")
                return 1
            current, message = message, None
            if "lost" in current:
                _say(current["lost"])
                return 1
            if "exit" in current:
                _say(f"job failed: {current.get('reason')}")
                return int(current["exit"]) or 1
            if "finished" in current:
                return 0
            if "stop" in current:  # we had already stopped (our own failure, or we were done)
                member.send({"stopped": current["stop"]})
                continue
            if "round" not in current:
                continue
            rnd = int(current["round"])
            self._layout, self._node_rank = NodeLayout(tuple(current["layout"])), int(current["node_rank"])
            self.restart_count = int(current["restart"])
            _say(f"round {rnd}: node rank {self._node_rank} of {len(self._layout.nproc)} nodes, world size "
                 f"{self._layout.world_size}, restart {self.restart_count}")
            try:
                self._run_attempt(script, script_args, int(current["master_port"]), token, pump)
                member.send({"done": rnd})
            except _ChildFailed as failure:
                child = failure.child
                self.last_failure = failure.describe(self.restart_count)
                member.send({"failed": rnd, "code": exit_status(child.proc.returncode),
                             "summary": self._summary(child, restarts=False)})
            except _StartTimeout as exc:
                member.send({"failed": rnd, "code": EXIT_START_TIMEOUT,
                             "summary": f"start timeout after {cfg.start_timeout:g} s: {exc.missing}"})
            except _AgentSaid as said:  # our ranks are stopped (the attempt's teardown ran)
                if "stop" in said.message:
                    member.send({"stopped": said.message["stop"]})
                else:
                    message = said.message

    def _wait_agent(self, member: ElasticMember, limit: float) -> dict | None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self._signum is not None:
                raise _Interrupted(self._signum)
            message = member.get(_SIGNAL_CHECK_S)
            if message is not None:
                return message
        return None

    def _summary(self, child: Child, restarts: bool = True) -> str:
        cfg = self.config
        first = self._errors[0] if self._errors else None
        own = next((e for e in self._errors if e["rank"] == child.rank), None)
        # Only against the failed rank's own record: a rank killed by a signal leaves none, and is
        # then itself the likeliest cause (its peers' errors follow from its death).
        if own is not None and first is not None and first["rank"] != child.rank:
            # The first rank to exit is often a peer that saw the cause as a lost connection: name the
            # rank whose error came first, with its message, and the first exit after it.
            lines = [f"job failed: rank {first['rank']} raised the first error: {first['type']}: {first['message']}",
                     (f"  (rank {child.rank}, pid {child.proc.pid}, was the first to exit: "
                      f"{describe_exit(child.proc.returncode)}{_error_of(self._errors, child.rank)})")]
            log_path = os.path.join(cfg.log_dir, f"rank_{first['rank']}.log") if cfg.log_dir else None
            if cfg.max_restarts and restarts:
                lines.append(f"  restarts used: {self.restart_count} of {cfg.max_restarts}")
            lines.append(f"  log: {log_path}" if log_path else
                         (f"  log: its output is above, prefixed with [rank{first['rank']}]:  (use --log_dir to "
                          "keep one file per rank)"))
            return "\n".join(lines)
        lines = [(f"job failed: rank {child.rank} (node {child.node_rank}, local rank {child.local_rank},"
                  f" pid {child.proc.pid}) {describe_exit(child.proc.returncode)}"
                  + (f": {own['type']}: {own['message']}" if own is not None and own["type"] != "SystemExit" else ""))]
        if cfg.max_restarts and restarts:
            lines.append(f"  restarts used: {self.restart_count} of {cfg.max_restarts}")
        lines.append(f"  log: {child.log_path}" if child.log_path else
                     "  log: its output is above, prefixed with "
                     f"[rank{child.rank}]:  (use --log_dir to keep one file per rank)")
        return "\n".join(lines)


def _read_error_records(folder: str) -> list[dict]:
    """The ``error_{rank}.json`` records the ranks' bootstrap wrote (see run/bootstrap.py), oldest first."""
    records = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith("error_") and n.endswith(".json")]
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            records.append({"rank": int(record["rank"]), "time": float(record["time"]),
                            "type": str(record["type"]), "message": str(record["message"])})
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by a rank killed meanwhile: the others still tell the story
    return sorted(records, key=lambda r: (r["time"], r["rank"]))


def _error_of(records: list[dict], rank: int) -> str:
    for record in records:
        if record["rank"] == rank:
            return f" with {record['type']}: {record['message'].splitlines()[0] if record['message'] else ''}"
    return ""


def _refuse_mpi_tasks(cfg: LaunchConfig) -> None:
    """A launcher started by mpiexec/srun as several tasks for one node would start the job several
    times over (port clashes, "another job key"): refuse it at once, saying what to do instead."""
    if not launched_by_mpiexec():
        return
    try:
        outer = detect_launch_env()
    except ValueError:
        outer = None
    tasks = int(outer["world_size"]) if outer else 0
    if tasks > 1 and tasks != cfg.nnodes:
        raise ValueError(
            f"this launcher was started by mpiexec/srun as one of {tasks} tasks, but the job has --nnodes "
            f"{cfg.nnodes}: each task would start the whole node's ranks again. Either let MPI start the "
            f"ranks (`mpiexec -n {cfg.world_size} python train.py`, backend mpi or gloo) or start one launcher "
            f"per node (`python -m neural_arch.distributed.launcher --nproc_per_node {cfg.nproc_per_node} "
            "train.py`; under srun use --ntasks-per-node=1 with --nnodes and --node_rank=$SLURM_NODEID)")


class _ChildFailed(Exception):
    def __init__(self, child: Child) -> None:
        super().__init__(child.rank)
        self.child = child

    def describe(self, restart: int) -> dict:
        code = self.child.proc.returncode
        return {"rank": self.child.rank, "returncode": code, "exit": describe_exit(code),
                "restart": restart, "log": self.child.log_path}


class _AgentSaid(Exception):
    """Node 0's agent sent a message while our ranks ran (stop, exit, or the connection is lost)."""

    def __init__(self, message: dict) -> None:
        super().__init__(message)
        self.message = message


class _StartTimeout(Exception):
    def __init__(self, missing: str | None) -> None:
        super().__init__(missing)
        self.missing = missing


def launch_distributed_training(script: str, *script_args, **config) -> int:
    """Launch ``script`` with ``script_args`` on this node; keyword arguments are LaunchConfig fields.

    >>> launch_distributed_training("train.py", "--epochs", "1", nproc_per_node=2)  # doctest: +SKIP
    0
    """
    unknown = set(config) - set(LaunchConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown launch option(s) {sorted(unknown)}; valid: "
                        f"{sorted(LaunchConfig.__dataclass_fields__)}")
    return DistributedLauncher(LaunchConfig(**config)).launch(script, *script_args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m neural_arch.distributed.launcher`` and ``neural-arch-launch``.

    Example::

        python -m neural_arch.distributed.launcher --nproc-per-node 4 train.py --epochs 3
    """
    config, target, script_args = parse_command_line(list(sys.argv[1:] if argv is None else argv))
    try:
        return DistributedLauncher(config).launch(target, *script_args)
    except (NotImplementedError, ValueError) as exc:
        _say(str(exc))
        return 2


if __name__ == "__main__":
    sys.exit(main())
