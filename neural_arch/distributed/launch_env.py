"""Where am I running? Parse the environment a launcher left for this process.

A training script can be started by our own launcher (``python -m neural_arch.distributed.launcher``),
by ``torchrun``-style tools that set ``RANK``/``WORLD_SIZE``, by ``mpiexec`` (Open MPI, MPICH/Hydra,
PMIx) or by SLURM's ``srun``. :func:`detect_launch_env` turns each of these into one dictionary so
that ``init_process_group()`` does not have to know who started it.

Priority (the first that matches wins):

1. ``torchrun-style``: ``RANK`` and ``WORLD_SIZE`` are both set (our launcher sets them).
2. ``mpiexec``: Open MPI ``OMPI_COMM_WORLD_*``, MPICH/Hydra ``PMI_RANK``/``PMI_SIZE`` +
   ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``, PMIx ``PMIX_RANK`` (size taken from the other families;
   under ``srun --mpi=pmix``, which sets none of them, the layout is srun's).
   An explicit launcher beats mpiexec because ``srun --mpi=pmi2`` and friends set PMI variables too.
3. ``slurm``: ``SLURM_PROCID`` + ``SLURM_NTASKS`` (inside an ``srun`` step).

Defaults that are *chosen*, not read (documented so nobody is surprised):

* ``master_addr``: ``MASTER_ADDR`` when set. Otherwise: mpiexec on one host -> ``"127.0.0.1"``, mpiexec
  across hosts -> ``None`` (the MPI backend does not need it); SLURM -> first host of the node list.
* ``master_port``: ``MASTER_PORT`` when set, else 29500; under SLURM ``15000 + SLURM_JOB_ID % 20000`` so
  two jobs sharing a node do not collide.
* ``node_rank`` under mpiexec: ``rank // local_world_size`` (exact when every host runs the same number
  of ranks, which is what ``mpiexec -ppn`` does).

Example::

    >>> detect_launch_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
    ...                    "MPI_LOCALNRANKS": "2"})["rank"]
    1
    >>> expand_hostlist("node[01-03,07],gpu5")
    ['node01', 'node02', 'node03', 'node07', 'gpu5']

It also gives a job's public id (:func:`derive_job_token`: keeps two jobs apart, never
authenticates), torch's :func:`is_torchelastic_launched` and :func:`get_node_local_rank`,
:func:`export_launch_env` (``init_process_group`` writes ``RANK``/``LOCAL_RANK``/... from mpiexec's
or srun's variables, so torch's ``int(os.environ["LOCAL_RANK"])`` works under them too) and
:func:`oversubscription_message` (more ranks than CPUs on one host). Standard library only: the group layer
(``groups.py``, ``info.py``) reads it, and nothing here imports the rest of the package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

__all__ = [
    "MPI_ENV_PREFIXES", "derive_job_token", "detect_launch_env", "expand_hostlist",
    "export_launch_env", "get_local_rank", "get_node_local_rank", "is_torchelastic_launched", "launched_by_mpiexec",
    "oversubscription_message", "parse_tasks_per_node", "unexport_launch_env",
]

DEFAULT_MASTER_PORT = 29500

_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


# A launcher started by mpiexec/srun must not pass its own MPI identity on: the ranks would take it
# for theirs (detect_launch_env; MPI_Init through PMI_FD).
MPI_ENV_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


# --------------------------------------------------------------------------- small helpers
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _int(environ: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    """First of ``names`` present in ``environ``, as int; ``default`` when none is set.

    Only plain decimal text counts: Python's ``int()`` would also read ``"1_0"`` as 10 or other
    scripts' digits, and a garbled variable must never become a plausible rank.
    """
    for name in names:
        value = environ.get(name)
        if value is not None and value.strip() != "":
            if not _INTEGER.fullmatch(value.strip()):
                raise ValueError(
                    f"environment variable {name}={value!r} is not an integer; "
                    f"unset it or fix the job script that sets it"
                )
            return int(value.strip())
    return default


def _required(environ: Mapping[str, str], name: str) -> int:
    """``name`` as int; a set-but-empty variable is an error naming it (never a None rank)."""
    value = _int(environ, name)
    if value is None:
        raise ValueError(f"environment variable {name} is set but empty; give it a number "
                         f"(or unset both RANK and WORLD_SIZE to run as a single process)")
    return value


def _port(environ: Mapping[str, str], default: int) -> int:
    """``MASTER_PORT`` (a TCP port; 0, "any free port", only passes :func:`_check` in a world of one),
    else ``default``."""
    port = _int(environ, "MASTER_PORT", default=default)
    if not 0 <= port < 65536:
        raise ValueError(f"environment variable MASTER_PORT={environ.get('MASTER_PORT')!r} is not a TCP port "
                         "(1..65535); fix the job script that sets it")
    return port


def _addr(environ: Mapping[str, str]) -> str | None:
    """``MASTER_ADDR`` without surrounding blanks; None when unset or blank."""
    return (environ.get("MASTER_ADDR") or "").strip() or None


# The variables each source reads, named in its errors (the user fixes *these*).
_NAMES = {
    "torchrun-style": {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                       "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK/GROUP_RANK"},
    "mpiexec": {"rank": "OMPI_COMM_WORLD_RANK/PMI_RANK/PMIX_RANK",
                "world_size": "OMPI_COMM_WORLD_SIZE/PMI_SIZE/PMIX_SIZE",
                "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK/MPI_LOCALRANKID/PMIX_LOCAL_RANK",
                "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE/MPI_LOCALNRANKS/PMIX_LOCAL_SIZE",
                "node_rank": "the rank and local world size"},
    "slurm": {"rank": "SLURM_PROCID", "world_size": "SLURM_NTASKS", "local_rank": "SLURM_LOCALID",
              "local_world_size": "SLURM_NTASKS_PER_NODE/SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE",
              "node_rank": "SLURM_NODEID"},
}


def _check(info: dict) -> dict:
    """Reject impossible combinations with a message naming the variables to fix."""
    names = _NAMES[info["source"]]
    rank, size = info["rank"], info["world_size"]
    local_rank, local_size = info["local_rank"], info["local_world_size"]
    if size < 1:
        raise ValueError(f"world size {size} from {info['source']} variables must be >= 1 "
                         f"(check {names['world_size']})")
    if not 0 <= rank < size:
        raise ValueError(
            f"rank {rank} is outside world size {size} ({info['source']} variables); "
            f"check {names['rank']}/{names['world_size']} or the job script"
        )
    # SLURM_NTASKS_PER_NODE is the job's request, which a smaller srun step inside the job inherits:
    # more than the step's world is stale there, not a contradiction (and only sizes the warnings)
    most = size if info["source"] != "slurm" else local_size
    if not 1 <= local_size <= most:
        raise ValueError(
            f"local world size {local_size} must be in [1, {most}] ({info['source']} variables, world size {size}); "
            f"check {names['local_world_size']}"
        )
    if not 0 <= local_rank < local_size:
        raise ValueError(
            f"local rank {local_rank} is outside local world size "
            f"{local_size} ({info['source']} variables); check {names['local_rank']}"
        )
    if info["master_port"] == 0 and size > 1:
        # port 0 = "any free port": rank 0 would listen on one the other ranks cannot know
        raise ValueError(f"environment variable MASTER_PORT=0 cannot gather a world of {size} ranks "
                         "(the other ranks cannot know which port rank 0 picked); give a fixed free port")
    if info["node_rank"] < 0:
        raise ValueError(f"node rank {info['node_rank']} must be >= 0 ({info['source']} variables); "
                         f"check {names['node_rank']}")
    return info

# --------------------------------------------------------------------------- SLURM hostlists
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``[...]``: ``"a[1,2],b"`` -> ``["a[1,2]", "b"]``."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in SLURM host list {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in SLURM host list {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_brackets(body: str, text: str) -> list[str]:
    """``"01-03,07"`` -> ``["01", "02", "03", "07"]``, keeping zero padding as SLURM does."""
    out = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"cannot parse range {item!r} in SLURM host list {text!r}")
        lo, hi = match.group(1), match.group(2)
        if hi is None:
            out.append(lo)
            continue
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in SLURM host list {text!r}")
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand SLURM's compressed host list syntax into host names, in order.

    Handles ranges with zero padding, several ranges per bracket and several bracket groups per
    name (a cartesian product, as ``scontrol show hostnames`` does).

    >>> expand_hostlist("node[01-02,07],gpu5")
    ['node01', 'node02', 'node07', 'gpu5']
    >>> expand_hostlist("rack[1-2]-n[1-2]")
    ['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']
    """
    hosts: list[str] = []
    for part in _split_top_level(text or ""):
        names = [""]
        pos = 0
        for match in re.finditer(r"\[([^\]]*)\]", part):
            prefix = part[pos:match.start()]
            choices = _expand_brackets(match.group(1), text)
            names = [n + prefix + c for n in names for c in choices]
            pos = match.end()
        names = [n + part[pos:] for n in names]
        hosts.extend(names)
    return hosts


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` -> ``[2, 2, 2, 1]``).

    >>> parse_tasks_per_node("4(x2),3")
    [4, 4, 3]
    """
    counts: list[int] = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        match = re.match(r"^(\d+)(?:\(x(\d+)\))?$", item)
        if not match:
            raise ValueError(f"cannot parse SLURM_TASKS_PER_NODE item {item!r} in {text!r}")
        repeat = int(match.group(2) or 1)
        if repeat < 1:
            raise ValueError(f"SLURM_TASKS_PER_NODE item {item!r} in {text!r} repeats zero times")
        counts.extend([int(match.group(1))] * repeat)
    return counts

# --------------------------------------------------------------------------- the three sources
def _from_explicit(env: Mapping[str, str]) -> dict:
    rank = _required(env, "RANK")
    size = _required(env, "WORLD_SIZE")
    local_size = _int(env, "LOCAL_WORLD_SIZE", default=None)
    local_rank = _int(env, "LOCAL_RANK", default=None)
    if local_size is None:
        # Without LOCAL_WORLD_SIZE we cannot know the node layout: assume one node.
        local_size = size
    if local_rank is None:
        local_rank = rank % max(local_size, 1)
    node_rank = _int(env, "NODE_RANK", "GROUP_RANK", default=None)
    if node_rank is None:
        node_rank = rank // local_size if local_size else 0
    return {
        "rank": rank, "world_size": size, "local_rank": local_rank,
        "local_world_size": local_size, "node_rank": node_rank,
        "master_addr": _addr(env) or "127.0.0.1",
        "master_port": _port(env, DEFAULT_MASTER_PORT),
        "source": "torchrun-style",
    }


def _from_mpiexec(env: Mapping[str, str]) -> dict:
    rank = _int(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    # Not OMPI_UNIVERSE_SIZE: that is the number of slots Open MPI may use, which can exceed the
    # ranks started (a world size too large: every rank would wait for ranks that never come).
    size = _int(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")
    if size is None and _srun_task(env, rank):
        # srun --mpi=pmix sets PMIX_RANK but no size variable: the task is srun's, read its layout
        info = _from_slurm(env)
        info["source"] = "mpiexec"
        return info
    if size is None:
        raise ValueError(
            "launched by an MPI launcher (PMIX_RANK is set) but no world size variable was found "
            "(OMPI_COMM_WORLD_SIZE / PMI_SIZE); set WORLD_SIZE and RANK explicitly"
        )
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK")
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMIX_LOCAL_SIZE")
    if local_rank is None or local_size is None:
        local_rank, local_size = rank, size
    single_host = local_size == size
    addr = _addr(env) or ("127.0.0.1" if single_host else None)
    return {
        "rank": rank, "world_size": size, "local_rank": local_rank,
        "local_world_size": local_size, "node_rank": rank // max(local_size, 1),
        "master_addr": addr,
        "master_port": _port(env, DEFAULT_MASTER_PORT),
        "source": "mpiexec",
    }


def _srun_task(env: Mapping[str, str], rank: int | None) -> bool:
    """Whether this MPI process is the srun task whose SLURM variables describe it (same rank)."""
    return (rank is not None and _int(env, "SLURM_PROCID") == rank
            and _int(env, "SLURM_NTASKS", "SLURM_NPROCS") is not None)


def _slurm_local_size(env: Mapping[str, str], node_rank: int) -> int:
    """Tasks on this node: the step's own list first (``SLURM_NTASKS_PER_NODE`` is the job's request,
    which an ``srun -n`` inside the job may not follow), then the request, then the job's list."""
    step = parse_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE", ""))
    request = _int(env, "SLURM_NTASKS_PER_NODE", default=None)
    counts = step or ([request] if request is not None else parse_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", "")))
    if not counts:
        return 1
    if len(set(counts)) == 1:
        return counts[0]  # every node alike: the index does not matter (a step may use part of the job)
    if not 0 <= node_rank < len(counts):
        raise ValueError(f"SLURM_NODEID={node_rank} has no entry in the tasks-per-node list {counts} "
                         "(SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE); set LOCAL_WORLD_SIZE, RANK and "
                         "WORLD_SIZE explicitly")
    return counts[node_rank]


def _from_slurm(env: Mapping[str, str]) -> dict:
    rank = _int(env, "SLURM_PROCID")
    size = _int(env, "SLURM_NTASKS", "SLURM_NPROCS")
    node_rank = _int(env, "SLURM_NODEID", default=0)
    local_rank = _int(env, "SLURM_LOCALID", default=0)
    local_size = _slurm_local_size(env, node_rank)
    nodelist = (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                or env.get("SLURM_NODELIST") or "")
    hosts = expand_hostlist(nodelist)
    addr = _addr(env) or (hosts[0] if hosts else "127.0.0.1")
    job_id = _int(env, "SLURM_JOB_ID", "SLURM_JOBID", default=0)
    return {
        "rank": rank, "world_size": size, "local_rank": local_rank,
        "local_world_size": local_size, "node_rank": node_rank,
        "master_addr": addr,
        "master_port": _port(env, 15000 + job_id % 20000),
        "source": "slurm",
    }


def launched_by_mpiexec(environ: Mapping[str, str] | None = None) -> bool:
    """True when an MPI launcher (Open MPI, MPICH/Hydra, PMIx) started this process.

    >>> launched_by_mpiexec({"PMI_RANK": "0", "PMI_SIZE": "1"})
    True
    >>> launched_by_mpiexec({})
    False
    """
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip() != "" for name in _MPI_RANK_VARS)


def detect_launch_env(environ: Mapping[str, str] | None = None) -> dict | None:
    """Return ``{rank, world_size, local_rank, local_world_size, node_rank, master_addr,
    master_port, source}`` for this process, or ``None`` when no launcher is detected.

    ``source`` is ``"torchrun-style"``, ``"mpiexec"`` or ``"slurm"``. Raises ``ValueError`` (saying
    which variable to fix) when the variables are present but inconsistent: a rank outside the world,
    a local rank outside the node, a negative node rank, a port that is not one, text that is not a
    decimal integer, an empty ``RANK``/``WORLD_SIZE``.

    >>> detect_launch_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"})["master_addr"]
    '10.0.0.1'
    >>> detect_launch_env({}) is None
    True
    """
    env = os.environ if environ is None else environ
    exported = _EXPORTED.get(id(env))
    if exported:
        # What export_launch_env copied from mpiexec's/srun's variables is not a torchrun-style launch:
        # read the launcher's own variables, as before the export.
        env = {k: v for k, v in env.items() if k not in exported or v != exported[k]}
    has_rank, has_size = "RANK" in env, "WORLD_SIZE" in env
    if has_rank and has_size:
        return _check(_from_explicit(env))
    if launched_by_mpiexec(env):
        return _check(_from_mpiexec(env))
    if env.get("SLURM_PROCID") is not None and (env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")):
        return _check(_from_slurm(env))
    if has_rank != has_size:
        missing = "WORLD_SIZE" if has_rank else "RANK"
        raise ValueError(
            f"{'RANK' if has_rank else 'WORLD_SIZE'} is set but {missing} is not; "
            f"set both (or neither, to run as a single process)"
        )
    return None

def is_torchelastic_launched(environ: Mapping[str, str] | None = None) -> bool:
    """torch's helper: True when this process was started by an elastic launcher.

    Here that is torchrun (``TORCHELASTIC_RUN_ID``) or our launcher / ``launch()`` (both set
    ``TORCHELASTIC_RESTART_COUNT`` next to ``RANK``); mpiexec and srun are not elastic launchers.

    >>> is_torchelastic_launched({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0"})
    True
    >>> is_torchelastic_launched({"PMI_RANK": "0"})
    False
    """
    env = os.environ if environ is None else environ
    if (env.get("TORCHELASTIC_RUN_ID") or "").strip():
        return True
    return "TORCHELASTIC_RESTART_COUNT" in env and "RANK" in env


# --------------------------------------------------------------------------- torch's variables, everywhere
# What export_launch_env wrote, per environment mapping (id -> {name: value}), so detect_launch_env
# still sees mpiexec/srun in this process. Not an environment variable: a child process started meanwhile
# inherits torch's variables as a torchrun-style launch, as under the launcher.
_EXPORTED: dict[int, dict[str, str]] = {}

_TORCH_VARS = (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
               ("LOCAL_WORLD_SIZE", "local_world_size"))


def export_launch_env(info: Mapping | None, environ: dict | None = None) -> list[str]:
    """Write torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` into ``environ``
    (default ``os.environ``) from an mpiexec or srun launch; returns the names it set.

    A variable already set is left alone; launches that already are torchrun-style set nothing.
    ``init_process_group`` calls it, so the torch idiom ``int(os.environ["LOCAL_RANK"])`` works under
    ``mpiexec`` and ``srun`` too; ``destroy_process_group`` calls :func:`unexport_launch_env`.

    >>> env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}
    >>> names = export_launch_env(detect_launch_env(env), env); names
    ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE']
    >>> env["LOCAL_RANK"], env["WORLD_SIZE"], detect_launch_env(env)["source"]
    ('1', '4', 'slurm')
    >>> unexport_launch_env(names, env)
    """
    env = os.environ if environ is None else environ
    if info is None or info.get("source") not in ("mpiexec", "slurm"):
        return []
    done = [name for name, key in _TORCH_VARS if name not in env]
    for name, key in _TORCH_VARS:
        if name in done:
            env[name] = str(int(info[key]))
            _EXPORTED.setdefault(id(env), {})[name] = env[name]
    return done


def unexport_launch_env(names, environ: dict | None = None) -> None:
    """Undo :func:`export_launch_env`: remove ``names`` it set (a variable changed since is kept).

    >>> env = {"PMI_RANK": "0", "PMI_SIZE": "1"}
    >>> names = export_launch_env(detect_launch_env(env), env)
    >>> unexport_launch_env(names, env); env
    {'PMI_RANK': '0', 'PMI_SIZE': '1'}
    """
    env = os.environ if environ is None else environ
    exported = _EXPORTED.pop(id(env), {})
    for name in names or ():
        if name in exported and env.get(name) == exported[name]:
            env.pop(name, None)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """torch's ``dist.get_node_local_rank``: this process's rank on its host.

    ``LOCAL_RANK`` when set, else what mpiexec (``MPI_LOCALRANKID``, ``OMPI_COMM_WORLD_LOCAL_RANK``)
    or srun (``SLURM_LOCALID``) says, else ``fallback_rank``; with none of these a ``RuntimeError``
    (torch's behaviour). Use it to pick a device: ``cupy.cuda.Device(get_node_local_rank(0))``.

    >>> get_node_local_rank(fallback_rank=0) >= 0
    True
    """
    value = _int(os.environ, "LOCAL_RANK")
    if value is not None:
        if value < 0:
            raise ValueError(f"environment variable LOCAL_RANK={value} must be >= 0")
        return value
    launch = detect_launch_env()
    if launch is not None:
        return int(launch["local_rank"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("get_node_local_rank: LOCAL_RANK is not set and no launcher (torchrun, the neural_arch "
                       "launcher, mpiexec, srun) was detected; pass fallback_rank=0 for a single process")


def get_local_rank() -> int:
    """This process's rank on its host (0 for a plain ``python`` run): :func:`get_node_local_rank`
    with ``fallback_rank=0``, under every launcher (ours, torchrun, mpiexec, srun).

    >>> get_local_rank() >= 0
    True
    """
    return get_node_local_rank(fallback_rank=0)


def oversubscription_message(local_ranks: int, cpus: int | None = None) -> str | None:
    """The warning for ``local_ranks`` ranks on a host with ``cpus`` logical CPUs, or None when they fit.

    >>> oversubscription_message(2, cpus=4) is None
    True
    >>> oversubscription_message(3, cpus=2).split(":")[0]
    '3 ranks on 2 cores'
    """
    cpus = os.cpu_count() if cpus is None else cpus
    if not cpus or local_ranks <= cpus:
        return None
    return (f"{local_ranks} ranks on {cpus} cores: every rank busy-polls while it waits for its peers, so the "
            f"ranks take the cores from each other; expect a large slowdown (start at most {cpus} ranks per host)")


# --------------------------------------------------------------------------- job token
_JOB_ID_SOURCES = (
    ("slurm", ("SLURM_JOB_ID", "SLURM_JOBID"), ("SLURM_STEP_ID", "SLURM_STEPID")),
    ("pmi", ("PMI_KVSNAME",), ()),              # MPICH/Hydra: one KVS per mpiexec
    ("pmix", ("PMIX_NAMESPACE",), ()),          # PMIx (Open MPI 5, srun --mpi=pmix)
    ("ompi", ("OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid"), ()),
)


def derive_job_token(environ: Mapping[str, str] | None = None) -> str | None:
    """A public id shared by all processes of one ``mpiexec``/``srun`` job, or None.

    Derived (sha256) from the per-job id those launchers put in every rank's environment:
    ``SLURM_JOB_ID`` + ``SLURM_STEP_ID``, ``PMI_KVSNAME``, ``PMIX_NAMESPACE``, or Open MPI's
    ``OMPI_MCA_orte_ess_jobid`` / ``OMPI_MCA_ess_base_jobid`` (first found wins).

    It only keeps *concurrent jobs apart*: the rendezvous store mixes it into the per-user secret of
    a one-host job, so a rank of another job of the same user on the same port is refused. It is
    **not a secret** and never authenticates anything: any local user can read these ids (``ps e``,
    ``squeue``; SLURM's are sequential) and compute it. One-host jobs are authenticated by the
    per-user secret; multi-host jobs need ``NEURAL_ARCH_AUTH_TOKEN`` exported on every rank
    (docs/security.md).

    >>> derive_job_token({}) is None
    True
    >>> a = derive_job_token({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0"})
    >>> a == derive_job_token({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "1"}), len(a)
    (False, 32)
    """
    import hashlib

    env = os.environ if environ is None else environ
    for family, id_names, extra_names in _JOB_ID_SOURCES:
        job = next((env[n].strip() for n in id_names if env.get(n, "").strip()), None)
        if job is None:
            continue
        extra = next((env[n].strip() for n in extra_names if env.get(n, "").strip()), "")
        text = f"neural_arch-job-token|{family}|{job}|{extra}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]
    return None
