"""Explorer: the launcher's command line and the environment each worker gets, against torchrun's.

* Hypothesis draws torchrun-style options (``--nproc_per_node``, ``--nnodes N`` or ``MIN:MAX``,
  ``--node_rank``, ``--master_addr/--master_port`` or ``--rdzv_endpoint HOST[:PORT]`` with IPv6 in
  brackets, ``--max_restarts``, ``--standalone``), in both spellings and both forms, before or right
  after the script, and checks the parsed config and the script's own arguments.
* Values torchrun refuses are a usage error (exit status 2) naming the option.
* The environment of every worker of a drawn multi-node layout holds torchrun's documented
  variables with the values the layout gives, and ``detect_launch_env`` reads the same identity back.
* One tiny real launch: a failing worker makes the launcher exit with its code, naming it.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from launcher_helpers import run_launcher

from neural_arch.distributed.launch_env import detect_launch_env
from neural_arch.distributed.launcher import DistributedLauncher
from neural_arch.distributed.run.agent import NodeLayout
from neural_arch.distributed.run.launch_config import LaunchConfig, parse_command_line

pytestmark = pytest.mark.timeout(120)


def _quiet(message):
    pass


# --------------------------------------------------------------------------- parsing
@st.composite
def _options(draw):
    """Drawn torchrun options: (argv pieces, what the config must hold)."""
    low = draw(st.integers(1, 3))
    high = draw(st.integers(low, 4))
    ranged = low != high or draw(st.booleans())
    nnodes = f"{low}:{high}" if ranged else str(high)
    want = {"nproc_per_node": draw(st.integers(1, 8)), "nnodes": high, "min_nnodes": low if ranged else high,
            "node_rank": draw(st.integers(0, high - 1)), "max_restarts": draw(st.integers(0, 3))}
    standalone = high == 1 and low == 1 and draw(st.booleans())
    endpoint = draw(st.sampled_from(["none", "master", "rdzv", "rdzv-default-port", "rdzv-v6"]))
    port = draw(st.integers(1, 65535))
    host = draw(st.sampled_from(["127.0.0.1", "node-0.cluster", "10.1.2.3"]))
    pairs = [("nproc_per_node", want["nproc_per_node"]), ("nnodes", nnodes), ("node_rank", want["node_rank"]),
             ("max_restarts", want["max_restarts"])]
    if endpoint == "master":
        pairs += [("master_addr", host), ("master_port", port)]
        want.update(master_addr=host, master_port=port)
    elif endpoint == "rdzv":
        pairs += [("rdzv_endpoint", f"{host}:{port}")]
        want.update(master_addr=host, master_port=port)
    elif endpoint == "rdzv-default-port":
        pairs += [("rdzv_endpoint", host)]
        want.update(master_addr=host, master_port=29400)  # torchrun's default rendezvous port
    elif endpoint == "rdzv-v6":
        pairs += [("rdzv_endpoint", f"[::1]:{port}")]
        want.update(master_addr="::1", master_port=port)
    else:
        want.update(master_addr="127.0.0.1", master_port=29500)
    pairs = draw(st.permutations(pairs))
    argv = []
    for name, value in pairs:
        spelled = "--" + (name.replace("_", "-") if draw(st.booleans()) else name)
        argv += [f"{spelled}={value}"] if draw(st.booleans()) else [spelled, str(value)]
    if standalone:
        argv.append("--standalone")
    want["standalone"] = standalone
    return argv, want


_SCRIPT_ARGS = st.lists(st.sampled_from(["--lr", "0.1", "--epochs=3", "-v", "data.txt", "--nproc", "x y"]),
                        max_size=4).filter(lambda a: not a or a[0] != "--")


@settings(max_examples=40)
@given(_options(), st.booleans(), _SCRIPT_ARGS)
@example((["--rdzv_endpoint=[::1]:29500"], {"nproc_per_node": 1, "nnodes": 1, "min_nnodes": 1, "node_rank": 0,
                                            "max_restarts": 0, "master_addr": "::1", "master_port": 29500,
                                            "standalone": False}), False, ["--lr", "1"])
def test_parsed_options_match_torchrun(drawn, after_script, script_args):
    argv, want = drawn
    # options before the script, or the seeds' form: directly after it (then "--" ends them)
    line = [*argv, "train.py", *script_args] if after_script is False else \
        ["train.py", *argv, "--", *script_args]
    config, target, rest = parse_command_line(line, warn=_quiet)
    assert target == "train.py" and rest == script_args, (line, rest)
    got = {k: getattr(config, k) for k in want}
    assert got == want, line
    assert config.elastic == (want["nnodes"] > 1 and (want["min_nnodes"] < want["nnodes"] or want["max_restarts"] > 0))


def test_module_form_passes_the_modules_arguments_on():
    said = []
    config, target, rest = parse_command_line(["--nproc-per-node", "2", "-m", "pkg.train", "--lr", "1",
                                               "--nproc_per_node", "9"], warn=said.append)
    assert (config.nproc_per_node, config.module, target) == (2, True, "pkg.train")
    assert rest == ["--lr", "1", "--nproc_per_node", "9"]      # after the module's own: the module's
    assert "--nproc_per_node comes after the script argument '--lr'" in said[0]


@pytest.mark.parametrize("argv, named", [
    (["--nproc_per_node=0"], "nproc_per_node"),
    (["--nproc_per_node=1.5"], "--nproc_per_node"),
    (["--nnodes=2:1"], "nnodes=2:1"),
    (["--nnodes=0"], "nnodes=0"),
    (["--nnodes=:2"], "--nnodes"),
    (["--nnodes=2", "--node_rank=2"], "node_rank=2"),
    (["--node_rank=-1"], "node_rank=-1"),
    (["--master_port=65536"], "master_port=65536"),
    (["--rdzv_endpoint=node0:99999"], "master_port=99999"),
    (["--rdzv_endpoint=node0:"], "--rdzv_endpoint"),
    (["--rdzv_endpoint=node0:29500", "--master_port=1234"], "contradicts --master_port"),
    (["--rdzv_backend=etcd"], "--rdzv_backend"),
    (["--max_restarts=-1"], "max_restarts=-1"),
    (["--standalone", "--nnodes=2"], "--standalone"),
    (["--no_such_option=1"], "--no_such_option"),
])
def test_bad_options_are_usage_errors_naming_the_option(argv, named, capsys):
    with pytest.raises(SystemExit) as info:
        parse_command_line([*argv, "train.py"], warn=_quiet)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


# --------------------------------------------------------------------------- each worker's environment
# torchrun's documented worker variables (torch.distributed.elastic's "environment variables" list)
_TORCHRUN_VARS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                  "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_MAX_RESTARTS")


@settings(max_examples=30)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.data(), st.integers(0, 3), st.integers(1, 65535))
def test_each_worker_gets_torchruns_variables(nproc, data, restarts, port):
    node = data.draw(st.integers(0, len(nproc) - 1))
    launcher = DistributedLauncher(LaunchConfig(nproc_per_node=nproc[node], nnodes=len(nproc), node_rank=node,
                                                master_addr="node-0", master_port=port, max_restarts=3))
    launcher._layout, launcher._node_rank, launcher.restart_count = NodeLayout(tuple(nproc)), node, restarts
    first = sum(nproc[:node])
    for local in range(nproc[node]):
        env = launcher._child_env(local, port, "t" * 32, "/nonexistent")
        missing = [v for v in _TORCHRUN_VARS if v not in env]
        assert not missing, missing
        want = {"LOCAL_RANK": local, "RANK": first + local, "GROUP_RANK": node, "ROLE_RANK": first + local,
                "LOCAL_WORLD_SIZE": nproc[node], "WORLD_SIZE": sum(nproc), "ROLE_WORLD_SIZE": sum(nproc),
                "MASTER_ADDR": "node-0", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": restarts,
                "TORCHELASTIC_MAX_RESTARTS": 3}
        assert {k: env[k] for k in want} == {k: str(v) for k, v in want.items()}
        info = detect_launch_env(env)   # what init_process_group will read back
        assert (info["rank"], info["world_size"], info["local_rank"], info["local_world_size"], info["node_rank"],
                info["master_addr"], info["master_port"]) == (first + local, sum(nproc), local, nproc[node], node,
                                                              "node-0", port)


# --------------------------------------------------------------------------- one real launch
_WORKER = """
import json, os, sys, time
names = {names}
print("ENV " + json.dumps({{n: os.environ.get(n) for n in names}}), flush=True)
if os.environ["RANK"] == "1":
    # wait until rank 0 has printed, so the teardown this exit starts cannot cut it short
    flag = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0_done")
    end = time.monotonic() + 20
    while not os.path.exists(flag) and time.monotonic() < end:
        time.sleep(0.01)
    sys.exit(3)
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0_done"), "w").close()
"""


def test_a_failing_worker_sets_the_exit_status_and_is_named(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_WORKER.format(names=repr(_TORCHRUN_VARS)))
    done = run_launcher(["--standalone", "--nproc_per_node=2", "--max_restarts=0", script], tmp_path, timeout=60)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "job failed: rank 1" in done.stderr, done.stderr
    envs = {}
    for line in done.stdout.splitlines():
        if "ENV " in line:
            env = json.loads(line.split("ENV ", 1)[1])
            envs[int(env["RANK"])] = env
    assert sorted(envs) == [0, 1], done.stdout
    for rank, env in envs.items():
        assert env["LOCAL_RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == "0" and env["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "0" and env["MASTER_ADDR"] == "127.0.0.1"
        assert 0 < int(env["MASTER_PORT"]) < 65536
