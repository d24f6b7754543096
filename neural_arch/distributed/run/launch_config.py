"""Launcher configuration (:class:`~neural_arch.distributed.run.launch_config.LaunchConfig`) and
command-line parsing.

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

import argparse
import dataclasses
import os
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
    (prefix each line with ``[rank{r}]: ``), ``rdzv_id`` (torchrun's job id, given to the ranks as
    ``TORCHELASTIC_RUN_ID``), ``rdzv_last_call`` (elastic jobs: seconds node 0 keeps a round open
    for more nodes once ``MIN`` have joined), ``wait_log_interval`` (seconds between the lines a
    launcher prints while it waits for other nodes: what it waits for, and how long is left).

    ``nnodes`` is ``N`` or torchrun's ``"MIN:MAX"``; ``N`` means ``N:N``. After validation
    ``nnodes`` holds MAX and ``min_nnodes`` holds MIN. A multi-node job with a range or with
    ``max_restarts > 0`` is *elastic* (rounds of rendezvous through node 0, see ``run/agent.py``).

    >>> LaunchConfig(nproc_per_node=2).world_size
    2
    >>> cfg = LaunchConfig(nnodes="1:2", max_restarts=3)
    >>> cfg.min_nnodes, cfg.nnodes, cfg.elastic
    (1, 2, True)
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
    rdzv_id: str | None = None
    rdzv_last_call: float = 1.0
    min_nnodes: int | None = None
    wait_log_interval: float = 30.0

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        low, high = parse_nnodes(self.nnodes)
        if self.min_nnodes is not None and ":" not in str(self.nnodes):
            low = int(self.min_nnodes)  # replace() passes MIN back separately from MAX
        need(1 <= low <= high, f"nnodes={self.nnodes}: need 1 <= MIN <= MAX (got MIN={low}, MAX={high})")
        self.nnodes, self.min_nnodes = high, low
        need(float(self.rdzv_last_call) >= 0, "rdzv_last_call must be >= 0 seconds")
        self.rdzv_last_call = float(self.rdzv_last_call)
        need(int(self.nproc_per_node) >= 1,
             f"nproc_per_node={self.nproc_per_node}: start at least 1 process per node")
        need(int(self.nnodes) >= 1, f"nnodes={self.nnodes}: a job has at least 1 node")
        need(0 <= int(self.node_rank) < int(self.nnodes),
             f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes}); "
             f"number nodes 0..nnodes-1, node 0 hosts the rendezvous")
        need(0 <= int(self.master_port) < 65536, f"master_port={self.master_port} is not a TCP port")
        need(int(self.master_port) != 0 or self.standalone or int(self.nproc_per_node) * parse_nnodes(self.nnodes)[1] == 1,
             "master_port=0 lets the store pick a port the other ranks cannot know; give a port, or --standalone "
             "(one node: the launcher picks a free port and tells its workers)")
        need(int(self.max_restarts) >= 0, f"max_restarts={self.max_restarts} must be >= 0")
        need(float(self.monitor_interval) > 0, "monitor_interval must be > 0 seconds")
        need(float(self.start_timeout) > 0, "start_timeout must be > 0 seconds")
        need(float(self.term_timeout) >= 0, "term_timeout must be >= 0 seconds")
        need(float(self.wait_log_interval) > 0, "wait_log_interval must be > 0 seconds")
        self.wait_log_interval = float(self.wait_log_interval)
        need(not (self.standalone and int(self.nnodes) != 1),
             "--standalone is for a single node; drop it or use --nnodes 1")
        need(bool(str(self.backend).strip()), "backend must be a name such as 'gloo' or 'mpi'")
        self.nproc_per_node, self.nnodes = int(self.nproc_per_node), int(self.nnodes)
        self.node_rank, self.master_port = int(self.node_rank), int(self.master_port)
        self.max_restarts = int(self.max_restarts)
        self.monitor_interval, self.start_timeout = float(self.monitor_interval), float(self.start_timeout)
        self.term_timeout = float(self.term_timeout)

    @property
    def elastic(self) -> bool:
        """True for a multi-node job with a node range or restarts (node 0's agent then runs
        rendezvous rounds)."""
        return self.nnodes > 1 and (self.min_nnodes < self.nnodes or self.max_restarts > 0)

    @property
    def nnodes_spec(self) -> str:
        """``"MIN:MAX"`` as every node must state it."""
        return f"{self.min_nnodes}:{self.nnodes}"

    @property
    def world_size(self) -> int:
        """Total number of processes across all nodes (at the most nodes, MAX, for a range)."""
        return self.nproc_per_node * self.nnodes

    def replace(self, **changes) -> LaunchConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def parse_nnodes(value) -> tuple[int, int]:
    """``3`` -> ``(3, 3)``, ``"1:4"`` -> ``(1, 4)`` (torchrun's ``--nnodes MIN:MAX``).

    >>> parse_nnodes("2"), parse_nnodes("1:4")
    ((2, 2), (1, 4))
    """
    if isinstance(value, bool):
        raise TypeError(f"nnodes={value!r} is not a node count")
    if isinstance(value, int):
        return value, value
    text = str(value).strip()
    low, sep, high = text.partition(":")
    try:
        return (int(low), int(high)) if sep else (int(text), int(text))
    except ValueError:
        raise ValueError(f"nnodes={value!r}: write a count N or a range MIN:MAX such as 1:4") from None


def _nproc_arg(raw: str) -> int:
    """torchrun's ``--nproc_per_node``: a count, ``cpu`` (one per CPU core), ``gpu`` (one per visible
    GPU; an error when there is none) or ``auto`` (GPUs if any, else CPU cores)."""
    text = str(raw).strip().lower()
    if text in ("cpu", "gpu", "auto"):
        gpus = _gpu_count() if text != "cpu" else 0
        if text == "gpu" and gpus == 0:
            raise argparse.ArgumentTypeError("gpu: no GPU is visible here (CuPy sees none); give a count, or cpu")
        return gpus if gpus else (os.cpu_count() or 1)
    return int(text)


_nproc_arg.__name__ = "process count N, cpu, gpu or auto"  # argparse's error names it


def _gpu_count() -> int:
    """GPUs CuPy can see (0 without CuPy or a driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: no GPU to count
        return 0


def _nnodes_arg(raw: str) -> str:
    parse_nnodes(raw)  # reject garbage at parse time, with the message above
    return raw


_nnodes_arg.__name__ = "node count N or range MIN:MAX"  # argparse's error names it


# name -> (field, converter); None converter = boolean flag
_OPTIONS: dict[str, tuple[str, Callable | None]] = {}
for _field, _conv in [
    ("nproc_per_node", _nproc_arg), ("nnodes", _nnodes_arg), ("node_rank", int), ("master_addr", str),
    ("master_port", int), ("backend", str), ("max_restarts", int), ("monitor_interval", float),
    ("start_timeout", float), ("log_dir", str), ("standalone", None), ("term_timeout", float),
    ("agent_port", int), ("rdzv_backend", str), ("rdzv_endpoint", str), ("rdzv_id", str),
    ("rdzv_last_call", float), ("wait_log_interval", float),
]:
    _OPTIONS["--" + _field] = (_field, _conv)
    _OPTIONS["--" + _field.replace("_", "-")] = (_field, _conv)

USAGE = """\
usage: python -m neural_arch.distributed.launcher [options] script.py [options] [script args]
       python -m neural_arch.distributed.launcher [options] -m module [options] [module args]

options (each multi-word option also accepts dashes: --nproc-per-node):
  --nproc_per_node N     processes on this node (default 1)
  --nnodes N|MIN:MAX     number of nodes, each running one launcher (default 1); a range
                         (or --max_restarts > 0) makes the job elastic: node 0's launcher
                         forms rounds of MIN..MAX nodes and re-forms them after a failure
  --node_rank R          this node's index, 0..nnodes-1 (default 0)
  --master_addr HOST     address of node 0, which hosts the rendezvous store (default 127.0.0.1)
  --master_port PORT     port of the rendezvous store (default 29500)
  --backend NAME         NEURAL_ARCH_BACKEND for the children: gloo, mpi, nccl (default gloo)
  --standalone           single node, pick a free master port
  --max_restarts N       restart the whole group up to N times after a failure (default 0);
                         multi-node: every node restarts together, at the nodes still there
  --rdzv_last_call S     elastic: once MIN nodes joined, wait S s more for others (default 1)
  --monitor_interval S   longest pause between health checks, seconds (default 1.0); a rank
                         whose output closes is checked at once, signals within 0.1 s
  --start_timeout S      fail if some rank has not reached rendezvous (init_process_group, or
                         child_env.report_ready() in a script without one) within S s (default 600)
  --log_dir DIR          also write each rank's output to DIR/rank_{r}.log
  --term_timeout S       grace between SIGTERM and SIGKILL on teardown (default 5)
  --agent_port PORT      node-0 launcher port for the other nodes (default master_port+1)
  --wait_log_interval S  multi-node: while waiting for the other nodes, say what for every S s
                         (default 30); node 0 also logs each refused join as it happens
  --rdzv_backend NAME    torchrun's: c10d or static (both mean node 0's store at --rdzv_endpoint)
  --rdzv_endpoint H:P    torchrun's: the rendezvous address = --master_addr H --master_port P
  --rdzv_id ID           torchrun's job id; the ranks see it as TORCHELASTIC_RUN_ID
  -m MODULE              run a module (like python -m) instead of a script
  --                     end of launcher options; the rest goes to the script

Launcher options may also follow the script name directly (with a warning naming them); the
first argument that is not a launcher option starts the script's own arguments, and so does --.

multi-node jobs (--nnodes > 1) need the same NEURAL_ARCH_AUTH_TOKEN exported on every node:
  export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')
(the launchers check it with an HMAC challenge; it is never sent over the network)
"""


class _UsageError(SystemExit):
    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


_TORCHRUN_RDZV_PORT = 29400  # torchrun's default port of --rdzv_endpoint


class _Parser(argparse.ArgumentParser):
    """argparse with our usage errors: the message says what to write instead."""

    def error(self, message: str):
        raise _UsageError(_translate(message))


def _translate(message: str) -> str:
    if message.startswith("unrecognized arguments:"):
        first = message.split(":", 1)[1].split()[0]
        return f"unknown launcher option {first!r} before the script; run with --help to list the options"
    if "expected one argument" in message:
        name = message.split()[1].rstrip(":").split("/")[0]
        return f"{name} needs a value, e.g. {name}=2"
    if "ignored explicit argument" in message:
        name = message.split()[1].rstrip(":").split("/")[0]
        return f"{name} is a flag and takes no value"
    return message


def _typed(conv: Callable, name: str) -> Callable:
    def convert(raw: str):
        try:
            return conv(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {raw!r} is not a valid {conv.__name__}") from None
    convert.__name__ = conv.__name__
    return convert


def _build_parser(with_target: bool) -> _Parser:
    parser = _Parser(prog="python -m neural_arch.distributed.launcher", add_help=False, allow_abbrev=False)
    seen: set = set()
    for field, conv in _OPTIONS.values():
        if field in seen:
            continue
        seen.add(field)
        names = ["--" + field] + (["--" + field.replace("_", "-")] if "_" in field else [])
        if conv is None:
            parser.add_argument(*names, dest=field, action="store_true", default=argparse.SUPPRESS)
        else:
            parser.add_argument(*names, dest=field, type=_typed(conv, names[0]), default=argparse.SUPPRESS)
    if with_target:
        parser.add_argument("-h", "--help", action="store_true", dest="_help")
        # -m takes the module and everything after it, like python -m
        parser.add_argument("-m", "--module", dest="_module", nargs=argparse.REMAINDER)
        parser.add_argument("_rest", nargs=argparse.REMAINDER)
    return parser


def _is_option(token: str) -> bool:
    return token.partition("=")[0] in _OPTIONS


def _leading_options(tokens: list[str]) -> int:
    """How many of ``tokens`` form a leading run of launcher options (values included)."""
    i = 0
    while i < len(tokens):
        name, eq, _ = tokens[i].partition("=")
        if name not in _OPTIONS:
            break
        takes_value = _OPTIONS[name][1] is not None
        i += 1 if (eq or not takes_value) else 2
    return min(i, len(tokens))


def _apply_rdzv(values: dict) -> None:
    """torchrun's rendezvous options -> ours (node 0's TCP store at the endpoint)."""
    backend = values.pop("rdzv_backend", None)
    endpoint = values.pop("rdzv_endpoint", None)
    if backend is not None and backend not in ("c10d", "static"):
        raise _UsageError(f"--rdzv_backend={backend!r} is not supported; use --rdzv_backend=c10d (or static): "
                          "node 0 hosts the store at --rdzv_endpoint")
    if endpoint is None:
        return
    endpoint = endpoint.strip()
    host, sep, port = endpoint.rpartition(":")
    if not sep or (endpoint.startswith("[") and endpoint.endswith("]")):
        host, port = endpoint, str(_TORCHRUN_RDZV_PORT)     # no port (also a bare [IPv6]): torchrun's 29400
    if not host.strip("[]").strip() or not port.isdigit():
        raise _UsageError(f"--rdzv_endpoint={endpoint!r} must look like HOST:PORT, e.g. node0:29400")
    for field, value in (("master_addr", host.strip("[]")), ("master_port", int(port))):
        if field in values and values[field] != value:
            raise _UsageError(f"--rdzv_endpoint={endpoint} contradicts --{field}={values[field]}; give one of them")
        values[field] = value


def parse_command_line(argv: list[str], warn=None) -> tuple[LaunchConfig, str, list[str]]:
    """Split ``argv`` into (config, script-or-module, script args) following the module's rule.

    Raises ``SystemExit(2)`` with a message on bad usage, ``SystemExit(0)`` for ``-h``.

    Example::

        >>> cfg, target, args = parse_command_line(["--nproc_per_node=2", "train.py", "--epochs", "3"])
        >>> cfg.nproc_per_node, target, args
        (2, 'train.py', ['--epochs', '3'])
    """
    warn = warn or (lambda msg: print(f"neural_arch.launcher: {msg}", file=sys.stderr))
    try:
        head = _build_parser(with_target=True).parse_args(argv)
        values = {k: v for k, v in vars(head).items() if not k.startswith("_")}
        if head._help:
            print(USAGE)
            raise SystemExit(0)
        if head._module is not None:
            if not head._module:
                raise _UsageError("-m needs a module name, e.g. -m mypkg.train")
            values["module"] = True
            target, after = head._module[0], head._module[1:]
        else:
            rest = head._rest
            dashed = bool(rest) and rest[0] == "--"
            if dashed:  # "launcher [options] -- script args": no launcher option after this
                rest = rest[1:]
            if not rest:
                raise _UsageError("no script given: python -m neural_arch.distributed.launcher "
                                  "[options] script.py [args]")
            target, after = rest[0], rest[1:]
            if dashed:
                after = ["--", *after]
        # After the script: a leading run of launcher options is still ours (seed 001's form),
        # up to the first token we do not know, or an explicit "--".
        n = _leading_options(after)
        taken, rest = after[:n], after[n:]
        explicit_end = bool(rest) and rest[0] == "--"
        if explicit_end:
            rest = rest[1:]
        if taken:
            values.update(vars(_build_parser(with_target=False).parse_args(taken)))
        _apply_rdzv(values)
        try:
            config = LaunchConfig(**values)
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
    except _UsageError as exc:
        print(USAGE, file=sys.stderr)
        print(f"error: {exc.message}", file=sys.stderr)
        raise
    notes = []
    if taken and not explicit_end:
        names = " ".join(t.partition("=")[0] for t in taken if t.startswith("--"))
        notes.append(f"took {names} after the script {target!r} as launcher options (write -- before "
                     f"arguments meant for the script)")
    late = [t for t in rest if t.startswith("--") and _is_option(t)]
    if late and not explicit_end:
        notes.append(f"{late[0].partition('=')[0]} comes after the script argument {rest[0]!r} and is "
                     f"passed to the script; put launcher options before the script, or directly after it")
    if notes:
        warn("; ".join(notes))
    return config, target, rest
