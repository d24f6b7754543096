"""Launcher configuration (:class:`LaunchConfig`) and command-line parsing.

Command-line rule (chosen so that the seed documents' commands work as written)::

    python -m neural_arch.distributed.launcher [launcher options] script.py [launcher options] [script args]
    python -m neural_arch.distributed.launcher [launcher options] -m package.module [launcher options] [args]

* Before the script name every option must be a launcher option (an unknown one is an error).
* Right after the script name, a *leading run* of known launcher options is still taken by the
  launcher (``launcher train.py --nproc_per_node=4 --backend=gloo`` works, as in the seeds). The first
  argument that is not a launcher option ends launcher parsing: it and everything after it go to the
  script unchanged. A launcher option name met later is passed to the script, with a warning.
* ``--`` ends launcher parsing explicitly; it is dropped and everything after it goes to the script
  (``launcher train.py --nproc_per_node 2 -- --backend mpi`` gives the script ``--backend mpi``).
* Every multi-word option has both spellings (``--nproc_per_node`` / ``--nproc-per-node``) and both
  forms (``--opt=value`` / ``--opt value``).

Example::

    >>> cfg, target, args = parse_command_line(["train.py", "--nproc_per_node=2", "--epochs", "3"])
    >>> cfg.nproc_per_node, target, args
    (2, 'train.py', ['--epochs', '3'])
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["USAGE", "LaunchConfig", "parse_command_line"]


@dataclass
class LaunchConfig:
    """Everything the launcher needs to start one node's share of a job.

    Fields beyond the seed contract (all optional): ``module`` (run ``-m module`` instead of a
    script), ``term_timeout`` (seconds between SIGTERM and SIGKILL on teardown), ``agent_port`` (the
    node-0 launcher's port for other nodes' launchers; default ``master_port + 1``), ``prefix_output``
    (prefix each line with ``[rank{r}]: ``).

    >>> LaunchConfig(nproc_per_node=2).world_size
    2
    """

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "gloo"
    max_restarts: int = 0
    monitor_interval: float = 1.0
    start_timeout: float = 600
    log_dir: str | None = None
    standalone: bool = False
    module: bool = False
    term_timeout: float = 5.0
    agent_port: int | None = None
    prefix_output: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(int(self.nproc_per_node) >= 1,
             f"nproc_per_node={self.nproc_per_node}: start at least 1 process per node")
        need(int(self.nnodes) >= 1, f"nnodes={self.nnodes}: a job has at least 1 node")
        need(0 <= int(self.node_rank) < int(self.nnodes),
             f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes}); "
             f"number nodes 0..nnodes-1, node 0 hosts the rendezvous")
        need(0 <= int(self.master_port) < 65536, f"master_port={self.master_port} is not a TCP port")
        need(int(self.max_restarts) >= 0, f"max_restarts={self.max_restarts} must be >= 0")
        need(float(self.monitor_interval) > 0, "monitor_interval must be > 0 seconds")
        need(float(self.start_timeout) > 0, "start_timeout must be > 0 seconds")
        need(float(self.term_timeout) >= 0, "term_timeout must be >= 0 seconds")
        need(not (self.standalone and int(self.nnodes) != 1),
             "--standalone is for a single node; drop it or use --nnodes 1")
        need(bool(str(self.backend).strip()), "backend must be a name such as 'gloo' or 'mpi'")
        self.nproc_per_node, self.nnodes = int(self.nproc_per_node), int(self.nnodes)
        self.node_rank, self.master_port = int(self.node_rank), int(self.master_port)
        self.max_restarts = int(self.max_restarts)
        self.monitor_interval, self.start_timeout = float(self.monitor_interval), float(self.start_timeout)
        self.term_timeout = float(self.term_timeout)

    @property
    def world_size(self) -> int:
        """Total number of processes across all nodes."""
        return self.nproc_per_node * self.nnodes

    def replace(self, **changes) -> LaunchConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


# name -> (field, converter); None converter = boolean flag
_OPTIONS: dict[str, tuple[str, Callable | None]] = {}
for _field, _conv in [
    ("nproc_per_node", int), ("nnodes", int), ("node_rank", int), ("master_addr", str),
    ("master_port", int), ("backend", str), ("max_restarts", int), ("monitor_interval", float),
    ("start_timeout", float), ("log_dir", str), ("standalone", None), ("term_timeout", float),
    ("agent_port", int),
]:
    _OPTIONS["--" + _field] = (_field, _conv)
    _OPTIONS["--" + _field.replace("_", "-")] = (_field, _conv)

USAGE = """\
usage: python -m neural_arch.distributed.launcher [options] script.py [options] [script args]
       python -m neural_arch.distributed.launcher [options] -m module [options] [module args]

options (each multi-word option also accepts dashes: --nproc-per-node):
  --nproc_per_node N     processes on this node (default 1)
  --nnodes N             number of nodes, each running one launcher (default 1)
  --node_rank R          this node's index, 0..nnodes-1 (default 0)
  --master_addr HOST     address of node 0, which hosts the rendezvous store (default 127.0.0.1)
  --master_port PORT     port of the rendezvous store (default 29500)
  --backend NAME         NEURAL_ARCH_BACKEND for the children: gloo, mpi, nccl (default gloo)
  --standalone           single node, pick a free master port
  --max_restarts N       restart the whole group up to N times after a failure (default 0)
  --monitor_interval S   longest pause between health checks, seconds (default 1.0); a rank
                         whose output closes is checked at once, signals within 0.1 s
  --start_timeout S      fail if some rank has not reached rendezvous (init_process_group, or
                         run_env.report_ready() in a script without one) within S s (default 600)
  --log_dir DIR          also write each rank's output to DIR/rank_{r}.log
  --term_timeout S       grace between SIGTERM and SIGKILL on teardown (default 5)
  --agent_port PORT      node-0 launcher port for the other nodes (default master_port+1)
  -m MODULE              run a module (like python -m) instead of a script
  --                     end of launcher options; the rest goes to the script

Launcher options may also follow the script name directly; the first argument that is not a
launcher option starts the script's own arguments.

multi-node jobs (--nnodes > 1) need the same NEURAL_ARCH_AUTH_TOKEN exported on every node:
  export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')
(the launchers check it with an HMAC challenge; it is never sent over the network)
"""


class _UsageError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


def _take_option(argv: list[str], i: int, values: dict) -> int:
    """Consume the launcher option at ``argv[i]``; return the index after it."""
    token = argv[i]
    name, eq, inline = token.partition("=")
    field, conv = _OPTIONS[name]
    if conv is None:
        if eq:
            raise _UsageError(f"{name} is a flag and takes no value (got {token!r})")
        values[field] = True
        return i + 1
    if eq:
        raw, nxt = inline, i + 1
    else:
        if i + 1 >= len(argv):
            raise _UsageError(f"{name} needs a value, e.g. {name}=2")
        raw, nxt = argv[i + 1], i + 2
    try:
        values[field] = conv(raw)
    except ValueError:
        raise _UsageError(f"{name}: {raw!r} is not a valid {conv.__name__}") from None
    return nxt


def _is_option(token: str) -> bool:
    return token.partition("=")[0] in _OPTIONS


def parse_command_line(argv: list[str], warn=None) -> tuple[LaunchConfig, str, list[str]]:
    """Split ``argv`` into (config, script-or-module, script args) following the module's rule.

    Raises ``SystemExit(2)`` with a message on bad usage, ``SystemExit(0)`` for ``-h``.
    """
    warn = warn or (lambda msg: print(f"neural_arch.launcher: {msg}", file=sys.stderr))
    values: dict = {}
    target: str | None = None
    rest: list[str] = []
    explicit_end = False
    i = 0
    try:
        while i < len(argv):
            token = argv[i]
            if token == "--":
                i += 1
                if target is None:
                    if i >= len(argv):
                        raise _UsageError("'--' must be followed by the script to run")
                    target, i = argv[i], i + 1
                rest, explicit_end = argv[i:], True
                break
            if target is None:
                if token in ("-h", "--help"):
                    print(USAGE)
                    raise SystemExit(0)
                if token in ("-m", "--module"):
                    if i + 1 >= len(argv):
                        raise _UsageError("-m needs a module name, e.g. -m mypkg.train")
                    values["module"], target, i = True, argv[i + 1], i + 2
                    continue
                if token.startswith("-"):
                    if not _is_option(token):
                        raise _UsageError(f"unknown launcher option {token!r} before the script; "
                                          f"run with --help to list the options")
                    i = _take_option(argv, i, values)
                    continue
                target, i = token, i + 1
                continue
            if _is_option(token):
                i = _take_option(argv, i, values)
                continue
            rest = argv[i:]
            break
        if target is None:
            raise _UsageError("no script given: python -m neural_arch.distributed.launcher "
                              "[options] script.py [args]")
        try:
            config = LaunchConfig(**values)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    except _UsageError as exc:
        print(USAGE, file=sys.stderr)
        print(f"error: {exc.message}", file=sys.stderr)
        raise
    late = [t for t in rest if t.startswith("--") and _is_option(t)]
    if late and not explicit_end:
        warn(f"{late[0].partition('=')[0]} comes after the script argument {rest[0]!r} and is "
             f"passed to the script; put launcher options before the script, or directly after it")
    return config, target, rest
