"""Explorer: how a job finds itself (launch_env) against references written from the launchers' docs.

* SLURM's compressed host lists: hypothesis draws the *expanded* names first (prefixes, zero-padded
  ranges, several brackets per name, several names), writes them in SLURM's syntax and checks that
  ``expand_hostlist`` gives the names back, in order (the last bracket varies fastest, as
  ``scontrol show hostnames`` prints them).
* ``SLURM_TASKS_PER_NODE`` (``2(x3),1``), and the identity each source gives (srun, Open MPI,
  MPICH/Hydra, torchrun's variables) for a drawn layout of nodes and tasks: rank, local rank,
  world size, local world size, node rank, master address and port equal the layout's.
* Inconsistent values (a rank outside the world, a negative local rank, a port out of range, text
  that is not a decimal integer, an empty variable) are a ``ValueError`` naming the variable to fix,
  never an identity a job would start with.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.launch_env import (
    detect_launch_env,
    expand_hostlist,
    get_node_local_rank,
    parse_tasks_per_node,
)

# --------------------------------------------------------------------------- references (from SLURM's docs)
_LITERAL = st.text("abgnopx-.", min_size=1, max_size=4)


@st.composite
def _bracket(draw):
    """One ``[...]`` group: its text and the numbers it stands for, each written ``width`` wide."""
    parts, names = [], []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(st.integers(0, 120))
        count = draw(st.integers(1, 4))
        width = draw(st.integers(len(str(lo)), 4))
        hi = lo + count - 1
        if count == 1 and draw(st.booleans()):
            parts.append(f"{lo:0{width}d}")
        else:
            parts.append(f"{lo:0{width}d}-{hi:0{width}d}")
        names += [f"{n:0{width}d}" for n in range(lo, hi + 1)]
    return "[" + ",".join(parts) + "]", names


@st.composite
def _host_item(draw):
    """A name with 0..2 bracket groups: SLURM expands it as the cartesian product, last group fastest."""
    text = draw(_LITERAL)
    choices = [[text]]
    for _ in range(draw(st.integers(0, 2))):
        bracket, numbers = draw(_bracket())
        suffix = draw(st.one_of(st.just(""), _LITERAL))
        text += bracket + suffix
        choices += [numbers, [suffix]]
    return text, ["".join(parts) for parts in itertools.product(*choices)]


@settings(max_examples=60)
@given(st.lists(_host_item(), min_size=1, max_size=3))
@example([("node[01-03,07]", ["node01", "node02", "node03", "node07"])])
@example([("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"])])
@example([("n[009-011]", ["n009", "n010", "n011"]), ("gpu-1.cluster", ["gpu-1.cluster"])])
@example([("n[8-11]", ["n8", "n9", "n10", "n11"])])
def test_expand_hostlist_matches_slurm_rule(items):
    text = ",".join(t for t, _ in items)
    assert expand_hostlist(text) == [name for _, names in items for name in names], text


def _compress_counts(counts: list[int]) -> str:
    """SLURM's run-length form of tasks per node: ``[2, 2, 2, 1]`` -> ``"2(x3),1"``."""
    out = []
    for value, run in itertools.groupby(counts):
        k = len(list(run))
        out.append(f"{value}(x{k})" if k > 1 else str(value))
    return ",".join(out)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_parse_tasks_per_node_inverts_slurm_run_length(counts):
    assert parse_tasks_per_node(_compress_counts(counts)) == counts


@pytest.mark.parametrize("text", ["2(x0)", "2(x)", "x2", "(x2)", "-1"])
def test_parse_tasks_per_node_rejects_malformed_items(text):
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node(text)


# --------------------------------------------------------------------------- identities from a layout
@st.composite
def _layout(draw, uniform=False):
    """Tasks per node, a global rank, and where that rank sits (node, local rank)."""
    nnodes = draw(st.integers(1, 4))
    if uniform:
        counts = [draw(st.integers(1, 4))] * nnodes
    else:
        counts = draw(st.lists(st.integers(1, 4), min_size=nnodes, max_size=nnodes))
    rank = draw(st.integers(0, sum(counts) - 1))
    node, first = 0, 0
    while rank >= first + counts[node]:
        first += counts[node]
        node += 1
    return counts, rank, node, rank - first


@settings(max_examples=40)
@given(_layout(), st.integers(0, 10**7), st.sampled_from(["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]))
def test_srun_task_identity(layout, job_id, counts_var):
    counts, rank, node, local = layout
    hosts = [f"gpu{i + 7:03d}" for i in range(len(counts))]
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(sum(counts)), "SLURM_NODEID": str(node),
           "SLURM_LOCALID": str(local), counts_var: _compress_counts(counts),
           "SLURM_JOB_NODELIST": f"gpu[{7:03d}-{6 + len(counts):03d}]", "SLURM_JOB_ID": str(job_id)}
    assert detect_launch_env(env) == {
        "rank": rank, "world_size": sum(counts), "local_rank": local, "local_world_size": counts[node],
        "node_rank": node, "master_addr": hosts[0], "master_port": 15000 + job_id % 20000, "source": "slurm"}


@settings(max_examples=30)
@given(_layout(uniform=True), st.sampled_from(["openmpi", "hydra"]))
def test_mpiexec_identity(layout, family):
    counts, rank, node, local = layout
    size, per_node = sum(counts), counts[0]
    if family == "openmpi":
        env = {"OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": size,
               "OMPI_COMM_WORLD_LOCAL_RANK": local, "OMPI_COMM_WORLD_LOCAL_SIZE": per_node}
    else:
        env = {"PMI_RANK": rank, "PMI_SIZE": size, "MPI_LOCALRANKID": local, "MPI_LOCALNRANKS": per_node}
    info = detect_launch_env({k: str(v) for k, v in env.items()})
    assert (info["rank"], info["world_size"], info["local_rank"], info["local_world_size"],
            info["node_rank"]) == (rank, size, local, per_node, node)
    # one host: the store is local; several: the MPI backend needs no address (MASTER_ADDR wins)
    assert info["master_addr"] == ("127.0.0.1" if len(counts) == 1 else None)


@settings(max_examples=30)
@given(_layout(), st.integers(1, 65535), st.sampled_from(["NODE_RANK", "GROUP_RANK"]))
def test_torchrun_identity(layout, port, node_var):
    counts, rank, node, local = layout
    env = {"RANK": rank, "WORLD_SIZE": sum(counts), "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": counts[node],
           node_var: node, "MASTER_ADDR": "node0.cluster", "MASTER_PORT": port}
    assert detect_launch_env({k: str(v) for k, v in env.items()}) == {
        "rank": rank, "world_size": sum(counts), "local_rank": local, "local_world_size": counts[node],
        "node_rank": node, "master_addr": "node0.cluster", "master_port": port, "source": "torchrun-style"}


def test_srun_pmix_task_takes_its_layout_from_srun():
    # srun --mpi=pmix sets PMIX_RANK and no MPI size variable: the layout is srun's (was: an error)
    env = {"PMIX_RANK": "5", "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NODEID": "1",
           "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_STEP_NODELIST": "n[1-2]"}
    info = detect_launch_env(env)
    assert (info["rank"], info["world_size"], info["local_rank"], info["local_world_size"], info["node_rank"],
            info["master_addr"], info["source"]) == (5, 8, 1, 4, 1, "n1", "mpiexec")


def test_srun_step_layout_beats_the_jobs_request():
    # sbatch --ntasks-per-node=4, then `srun -n 2` inside: the step runs 2 tasks on one node
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4",
           "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "4(x2)"}
    assert detect_launch_env(env)["local_world_size"] == 2


# --------------------------------------------------------------------------- inconsistent values are errors
_SOURCES = {
    "torchrun": {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
                 "MASTER_PORT": "29500"},
    "slurm": {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
              "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "n[1-2]"},
    "hydra": {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
}


@pytest.mark.parametrize("source", sorted(_SOURCES))
def test_consistent_base_environments_are_accepted(source):
    assert detect_launch_env(_SOURCES[source])["rank"] == 1


@pytest.mark.parametrize("source, name, value", [
    # a rank outside the world
    ("torchrun", "RANK", "4"), ("slurm", "SLURM_PROCID", "4"), ("hydra", "PMI_RANK", "7"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "4"),
    # negative or too large local ranks, local sizes that cannot be
    ("torchrun", "LOCAL_RANK", "-1"), ("torchrun", "LOCAL_RANK", "2"), ("slurm", "SLURM_LOCALID", "-1"),
    ("hydra", "MPI_LOCALRANKID", "2"), ("openmpi", "OMPI_COMM_WORLD_LOCAL_RANK", "-1"),
    ("torchrun", "LOCAL_WORLD_SIZE", "0"), ("torchrun", "LOCAL_WORLD_SIZE", "8"),
    ("hydra", "MPI_LOCALNRANKS", "8"), ("slurm", "SLURM_TASKS_PER_NODE", "0(x2)"),
    # negative node ranks (SLURM's used to index the tasks-per-node list from its end)
    ("torchrun", "GROUP_RANK", "-1"), ("slurm", "SLURM_NODEID", "-1"),
    # ports
    ("torchrun", "MASTER_PORT", "70000"), ("torchrun", "MASTER_PORT", "-5"), ("torchrun", "MASTER_PORT", "0"),
    ("slurm", "MASTER_PORT", "65536"), ("hydra", "MASTER_PORT", "99999"),
    # not decimal integers: "1_0" is 10 to int(), "１" (full width) is 1
    ("torchrun", "RANK", "1_0"), ("torchrun", "WORLD_SIZE", "4.0"), ("torchrun", "RANK", "\uff11"),
    ("slurm", "SLURM_NTASKS", "four"), ("hydra", "PMI_SIZE", "0x4"), ("openmpi", "OMPI_COMM_WORLD_SIZE", "4 4"),
    # set but empty
    ("torchrun", "RANK", ""), ("torchrun", "WORLD_SIZE", " "),
])
def test_inconsistent_value_is_an_error_naming_the_variable(source, name, value):
    env = {**_SOURCES[source], name: value}
    with pytest.raises(ValueError) as info:
        detect_launch_env(env)
    assert name in str(info.value), str(info.value)


def test_heterogeneous_node_id_outside_the_list_is_an_error():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_NODEID": "5", "SLURM_TASKS_PER_NODE": "2,1"}
    with pytest.raises(ValueError, match="SLURM_NODEID=5"):
        detect_launch_env(env)


def test_open_mpi_universe_size_is_not_the_world_size():
    # OMPI_UNIVERSE_SIZE counts slots, not ranks started: taking it made every rank wait for ghosts
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        detect_launch_env({"PMIX_RANK": "0", "OMPI_UNIVERSE_SIZE": "8"})


def test_master_port_zero_is_only_for_a_world_of_one():
    assert detect_launch_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "0"})["master_port"] == 0
    with pytest.raises(ValueError, match="MASTER_PORT=0"):
        detect_launch_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "0"})


def test_blank_master_addr_means_unset():
    assert detect_launch_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "  "})["master_addr"] == "127.0.0.1"


def test_get_node_local_rank_names_a_bad_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        get_node_local_rank(0)
    monkeypatch.setenv("LOCAL_RANK", "-2")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        get_node_local_rank(0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert get_node_local_rank() == 3
