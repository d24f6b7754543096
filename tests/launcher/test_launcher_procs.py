"""The launcher with real processes: env, prefixing, teardown, restarts, signals, orphans, timeouts.

Every test has a hard pytest timeout, runs the launcher in its own session, and kills anything left
in ``finally`` (see conftest.reap / kill_pids).
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from launcher_helpers import (
    free_port,
    kill_pids,
    pid_alive,
    reap,
    run_launcher,
    start_launcher,
    wait_for,
)

ENV_SCRIPT = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
        "MASTER_ADDR", "MASTER_PORT", "NEURAL_ARCH_BACKEND", "NEURAL_ARCH_RESTART_COUNT",
        "TORCHELASTIC_RESTART_COUNT", "NEURAL_ARCH_AUTH_TOKEN", "NEURAL_ARCH_PARENT_PID"]
info = {k: os.environ.get(k) for k in keys}
info["argv"] = sys.argv[1:]
info["name"] = __name__
info["mpi_vars"] = sorted(k for k in os.environ if k.startswith(("PMI_", "OMPI_COMM_WORLD_")))
print("ENV " + json.dumps(info))
if os.environ.get("TRY_ALL_REDUCE") == "1":  # a real collective across both "nodes"
    import numpy as np
    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ReduceOp, all_reduce, destroy_process_group, init_process_group
    init_process_group()
    out = all_reduce(Tensor(np.array([float(os.environ["RANK"]) + 1])), ReduceOp.SUM)
    print("SUM", float(np.asarray(getattr(out, "data", out))[0]), flush=True)
    destroy_process_group()
print("no newline at the end", end="")
"""

SLEEP_OR_FAIL = """
import os, sys, time
rank = int(os.environ["RANK"])
open(os.path.join(sys.argv[1], f"pid_{rank}"), "w").write(str(os.getpid()))
if rank == 1:  # fails once every rank wrote its pid file (the test reads them all after the teardown)
    def written(r):
        try:
            return open(os.path.join(sys.argv[1], f"pid_{r}")).read() != ""
        except FileNotFoundError:
            return False
    deadline = time.monotonic() + 20
    while not all(written(r) for r in range(int(os.environ["WORLD_SIZE"]))) and time.monotonic() < deadline:
        time.sleep(0.01)
    print("rank 1 failing now", flush=True)
    sys.exit(3)
time.sleep(60)
"""


def _written(path) -> bool:
    """The file exists *and* has its content (a rank creates it, then writes: two steps)."""
    try:
        return path.read_text().strip() != ""
    except FileNotFoundError:
        return False


def envs_from(stdout: str) -> list[dict]:
    found = []
    for line in stdout.splitlines():
        prefix, _, rest = line.partition(": ")
        if rest.startswith("ENV "):
            info = json.loads(rest[4:])
            assert prefix == f"[rank{info['RANK']}]"
            found.append(info)
    return sorted(found, key=lambda i: int(i["RANK"]))


@pytest.mark.timeout(30)
def test_seed_style_command_env_prefix_and_logs(tmp_path, write_script):
    script = write_script("train.py", ENV_SCRIPT)
    logs = tmp_path / "logs"
    port = free_port()
    res = run_launcher([script, "--nproc_per_node=2", "--nnodes=1", "--master_addr=127.0.0.1",
                        f"--master_port={port}", "--backend=gloo", f"--log_dir={logs}",
                        "--model", "transformer"], tmp_path,
                       env={"PMI_RANK": "0", "PMI_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"})
    assert res.returncode == 0, res.stderr
    infos = envs_from(res.stdout)
    assert [i["RANK"] for i in infos] == ["0", "1"]
    for rank, info in enumerate(infos):
        assert info["LOCAL_RANK"] == str(rank) and info["WORLD_SIZE"] == "2"
        assert info["LOCAL_WORLD_SIZE"] == "2" and info["NODE_RANK"] == info["GROUP_RANK"] == "0"
        assert info["MASTER_PORT"] == str(port) and info["NEURAL_ARCH_BACKEND"] == "gloo"
        assert info["NEURAL_ARCH_RESTART_COUNT"] == info["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert info["argv"] == ["--model", "transformer"] and info["name"] == "__main__"
        assert info["NEURAL_ARCH_PARENT_PID"].isdigit()
        assert info["mpi_vars"] == []  # the launcher's own MPI identity is not passed on
    assert infos[0]["NEURAL_ARCH_AUTH_TOKEN"] == infos[1]["NEURAL_ARCH_AUTH_TOKEN"]
    assert len(infos[0]["NEURAL_ARCH_AUTH_TOKEN"]) >= 32
    # the partial last line is not lost, and it is a line of its own
    assert res.stdout.count("[rank0]: no newline at the end\n") == 1
    assert res.stdout.count("[rank1]: no newline at the end\n") == 1
    for rank in (0, 1):
        text = (logs / f"rank_{rank}.log").read_text()
        assert "attempt 0" in text and f'"RANK": "{rank}"' in text and "[rank" not in text


@pytest.mark.timeout(30)
def test_module_mode_runs_as_main_with_argv(tmp_path, write_script):
    write_script("mymod.py", ENV_SCRIPT)
    res = run_launcher(["--standalone", "-m", "mymod", "--epochs", "2"], tmp_path)
    assert res.returncode == 0, res.stderr
    (info,) = envs_from(res.stdout)
    assert info["name"] == "__main__" and info["argv"] == ["--epochs", "2"]


@pytest.mark.timeout(30)
def test_failure_propagates_exit_code_and_tears_down_sleepers(tmp_path, write_script):
    script = write_script("fail.py", SLEEP_OR_FAIL)
    pids = []
    try:
        start = time.monotonic()
        res = run_launcher(["--standalone", "--nproc_per_node=3", "--term_timeout=2", script, tmp_path],
                           tmp_path)
        elapsed = time.monotonic() - start
        pids = [int((tmp_path / f"pid_{r}").read_text()) for r in range(3)]
        assert res.returncode == 3
        assert elapsed < 10, f"teardown took {elapsed:.1f} s"
        assert "[rank1]: rank 1 failing now" in res.stdout
        assert "rank 1 (node 0, local rank 1" in res.stderr and "exit code 3" in res.stderr
        assert not any(pid_alive(p) for p in pids)
    finally:
        kill_pids(pids)


@pytest.mark.timeout(30)
def test_signal_death_is_reported_as_128_plus_n(tmp_path, write_script):
    script = write_script("die.py", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    res = run_launcher(["--standalone", script], tmp_path)
    assert res.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in res.stderr


@pytest.mark.timeout(45)
def test_restarts_increase_restart_count_until_success(tmp_path, write_script):
    script = write_script("flaky.py", """
import os, sys
count = int(os.environ["NEURAL_ARCH_RESTART_COUNT"])
print("attempt", count, flush=True)
# only rank 0 fails, so each attempt's line from rank 0 is printed before the teardown
sys.exit(0 if count >= 2 or os.environ["RANK"] != "0" else 5)
""")
    res = run_launcher(["--standalone", "--nproc_per_node=2", "--max_restarts=3",
                        f"--log_dir={tmp_path / 'logs'}", script], tmp_path)
    assert res.returncode == 0, res.stderr
    for attempt in range(3):
        assert f"[rank0]: attempt {attempt}" in res.stdout
    assert "restart 2 of 3" in res.stderr
    assert (tmp_path / "logs" / "rank_1.log").read_text().count("==== neural_arch launcher: attempt") == 3


@pytest.mark.timeout(45)
def test_max_restarts_exhausted(tmp_path, write_script):
    script = write_script("bad.py", "import sys\nprint('trying', flush=True)\nsys.exit(7)\n")
    res = run_launcher(["--standalone", "--max_restarts=1", script], tmp_path)
    assert res.returncode == 7
    assert res.stdout.count("[rank0]: trying") == 2
    assert "restarts used: 1 of 1" in res.stderr


SIGNAL_AWARE = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
out = sys.argv[1]
def on_term(signum, frame):
    open(os.path.join(out, f"term_{rank}"), "w").write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, f"pid_{rank}"), "w").write(str(os.getpid()))
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_sigterm_to_launcher_reaches_every_rank(tmp_path, write_script):
    script = write_script("sig.py", SIGNAL_AWARE)
    proc = start_launcher(["--standalone", "--nproc_per_node=2", script, tmp_path], tmp_path)
    pids = []
    try:
        assert wait_for(lambda: all(_written(tmp_path / f"pid_{r}") for r in range(2)), 20)
        pids = [int((tmp_path / f"pid_{r}").read_text()) for r in range(2)]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "received SIGTERM" in err
        for r in range(2):
            assert (tmp_path / f"term_{r}").read_text() == str(int(signal.SIGTERM))
    finally:
        reap(proc)
        kill_pids(pids)


@pytest.mark.timeout(30)
def test_sigint_to_launcher_reaches_every_rank_as_keyboard_interrupt(tmp_path, write_script):
    # Ctrl-C in a terminal: each rank gets SIGINT (Python's KeyboardInterrupt), not a SIGTERM.
    script = write_script("sigint.py", """
import os, sys, time
rank = int(os.environ["RANK"])
out = sys.argv[1]
open(os.path.join(out, f"pid_{rank}"), "w").write(str(os.getpid()))
try:
    time.sleep(60)
except KeyboardInterrupt:
    open(os.path.join(out, f"int_{rank}"), "w").write("KeyboardInterrupt")
""")
    proc = start_launcher(["--standalone", "--nproc_per_node=2", script, tmp_path], tmp_path)
    pids = []
    try:
        assert wait_for(lambda: all(_written(tmp_path / f"pid_{r}") for r in range(2)), 20)
        pids = [int((tmp_path / f"pid_{r}").read_text()) for r in range(2)]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 128 + signal.SIGINT, err
        assert "received SIGINT" in err
        for r in range(2):
            assert (tmp_path / f"int_{r}").read_text() == "KeyboardInterrupt"
        assert not any(pid_alive(p) for p in pids)
    finally:
        reap(proc)
        kill_pids(pids)


# Each rank starts a grandchild first (a `sleep`, like a shell command or a loader worker would be).
WITH_GRANDCHILD = """
import os, subprocess, sys
rank = int(os.environ["RANK"])
child = subprocess.Popen(["sleep", "123"])
open(os.path.join(sys.argv[1], f"gpid_{rank}"), "w").write(str(child.pid))
""" + SLEEP_OR_FAIL


@pytest.mark.timeout(30)
def test_sigkill_of_launcher_leaves_no_orphans(tmp_path, write_script):
    script = write_script("sleeper.py", WITH_GRANDCHILD.replace("if rank == 1:", "if False:"))
    proc = start_launcher(["--standalone", "--nproc_per_node=2", script, tmp_path], tmp_path)
    pids = []
    try:
        assert wait_for(lambda: all(_written(tmp_path / f"pid_{r}") for r in range(2)), 20)
        pids = [int((tmp_path / f"{kind}_{r}").read_text()) for r in range(2) for kind in ("pid", "gpid")]
        assert all(pid_alive(p) for p in pids)
        proc.kill()  # SIGKILL: the launcher gets no chance to clean up
        proc.wait(timeout=5)
        assert wait_for(lambda: not any(pid_alive(p) for p in pids), 5), \
            f"orphans survived: {[p for p in pids if pid_alive(p)]} of ranks+grandchildren {pids}"
    finally:
        reap(proc)
        kill_pids(pids)


@pytest.mark.timeout(30)
def test_teardown_after_a_failure_also_stops_grandchildren(tmp_path, write_script):
    # rank 1 exits 3 leaving its `sleep` behind; rank 0 is torn down with its own `sleep`.
    script = write_script("fail.py", WITH_GRANDCHILD)
    pids = []
    try:
        res = run_launcher(["--standalone", "--nproc_per_node=2", "--term_timeout=2", script, tmp_path],
                           tmp_path)
        assert res.returncode == 3, res.stderr
        # rank 1 wrote both files before failing; rank 0 may have been stopped before writing its own
        assert _written(tmp_path / "pid_1") and _written(tmp_path / "gpid_1")
        pids = [int(p.read_text()) for p in tmp_path.glob("*pid_*") if _written(p)]
        assert wait_for(lambda: not any(pid_alive(p) for p in pids), 2), \
            f"left behind: {[p for p in pids if pid_alive(p)]}"
    finally:
        kill_pids(pids)


TOKEN = {"NEURAL_ARCH_AUTH_TOKEN": "0123456789abcdef" * 2}


@pytest.mark.timeout(30)
def test_multi_node_without_a_token_is_refused_with_instructions(tmp_path, write_script):
    script = write_script("wait.py", "print('must not run')\n")
    res = run_launcher(["--nnodes=2", "--node_rank=0", f"--master_port={free_port()}", script], tmp_path)
    assert res.returncode == 2
    assert "export NEURAL_ARCH_AUTH_TOKEN=" in res.stderr and "every node" in res.stderr
    assert "must not run" not in res.stdout


@pytest.mark.timeout(30)
def test_start_timeout_names_missing_node_and_ranks(tmp_path, write_script):
    script = write_script("wait.py", "import time\ntime.sleep(30)\n")
    port = free_port()
    start = time.monotonic()
    res = run_launcher(["--nnodes=2", "--node_rank=0", "--nproc_per_node=2", f"--master_port={port}",
                        f"--agent_port={free_port()}", "--start_timeout=1", "--monitor_interval=0.2",
                        "--term_timeout=1", script], tmp_path, env=TOKEN)
    assert res.returncode == 124
    assert "node 1 never joined" in res.stderr and "--node_rank N" in res.stderr
    assert time.monotonic() - start < 15


@pytest.mark.timeout(30)
def test_joining_node_without_node0_times_out_with_advice(tmp_path, write_script):
    script = write_script("wait.py", "print('must not run')\n")
    res = run_launcher(["--nnodes=2", "--node_rank=1", f"--master_port={free_port()}",
                        f"--agent_port={free_port()}", "--start_timeout=1", script], tmp_path, env=TOKEN)
    assert res.returncode == 1
    assert "could not reach node 0's launcher" in res.stderr and "must not run" not in res.stdout


@pytest.mark.timeout(60)
def test_two_launchers_on_one_host_form_one_world(tmp_path, write_script):
    script = write_script("train.py", ENV_SCRIPT)
    port, agent = free_port(), free_port()
    common = ["--nnodes=2", "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}",
              f"--agent_port={agent}", "--start_timeout=30"]
    extra = {"TRY_ALL_REDUCE": "1"}  # and a real all_reduce across the two "nodes"
    token = {"NEURAL_ARCH_AUTH_TOKEN": "feedface" * 4, **extra}
    node0 = start_launcher([*common, "--node_rank=0", script], tmp_path, env=token)
    node1 = start_launcher([*common, "--node_rank=1", script], tmp_path, env=token)
    try:
        out0, err0 = node0.communicate(timeout=45)
        out1, err1 = node1.communicate(timeout=45)
        assert node0.returncode == 0 and node1.returncode == 0, err0 + err1
        infos = envs_from(out0 + out1)
        assert [i["RANK"] for i in infos] == ["0", "1", "2", "3"]
        assert {i["WORLD_SIZE"] for i in infos} == {"4"}
        assert [i["NODE_RANK"] for i in infos] == ["0", "0", "1", "1"]
        assert [i["LOCAL_RANK"] for i in infos] == ["0", "1", "0", "1"]
        assert {i["NEURAL_ARCH_AUTH_TOKEN"] for i in infos} == {"feedface" * 4}
        summed = sorted(line.split(": ")[0] for line in (out0 + out1).splitlines()
                        if line.endswith(": SUM 10.0"))
        assert summed == ["[rank0]", "[rank1]", "[rank2]", "[rank3]"]
    finally:
        reap(node0)
        reap(node1)


@pytest.mark.timeout(30)
def test_python_api_launch_distributed_training(tmp_path, write_script, capfd, monkeypatch):
    from neural_arch.distributed.launcher import launch_distributed_training

    monkeypatch.delenv("NEURAL_ARCH_AUTH_TOKEN", raising=False)
    script = write_script("train.py", ENV_SCRIPT)
    code = launch_distributed_training(str(script), "--model", "transformer", nproc_per_node=2,
                                       nnodes=1, backend="nccl", standalone=True)
    assert code == 0
    infos = envs_from(capfd.readouterr().out)
    assert len(infos) == 2 and infos[1]["NEURAL_ARCH_BACKEND"] == "nccl"
    assert infos[0]["argv"] == ["--model", "transformer"]


@pytest.mark.timeout(30)
def test_distributed_launcher_seed_api_reports_failure(tmp_path, write_script, capfd):
    from neural_arch.distributed import DistributedLauncher, LaunchConfig

    script = write_script("fail.py", "import sys\nsys.exit(4)\n")
    config = LaunchConfig(nproc_per_node=2, nnodes=1, max_restarts=0, monitor_interval=1.0,
                          start_timeout=600, standalone=True)
    launcher = DistributedLauncher(config)
    assert launcher.launch(str(script), "--epochs", "100") == 4
    assert launcher.last_failure["returncode"] == 4
    assert "job failed" in capfd.readouterr().err



@pytest.mark.timeout(30)
def test_start_timeout_names_a_local_rank_stuck_before_starting(tmp_path, write_script):
    # sitecustomize runs at interpreter start-up, before the bootstrap: rank 1 hangs there.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('RANK') == '1':\n    time.sleep(30)\n")
    script = write_script("ok.py", "import time\ntime.sleep(30)\n")
    res = run_launcher(["--standalone", "--nproc_per_node=2", "--start_timeout=1.5",
                        "--monitor_interval=0.2", "--term_timeout=1", script], tmp_path,
                       env={"PYTHONPATH": str(site)})
    assert res.returncode == 124, res.stderr
    # rank 0 runs but never reaches rendezvous; rank 1 never even reached the bootstrap
    assert "ranks 0, 1 on node 0 did not reach rendezvous" in res.stderr
    assert "of these, 1 did not even start" in res.stderr


HANG_BEFORE_RENDEZVOUS = """
import os, time
if os.environ["RANK"] == os.environ.get("HANGING_RANK"):
    time.sleep(600)          # stuck before its rendezvous (loading data, a deadlock, ...)
if os.environ.get("NO_GROUP") == "1":
    from neural_arch.distributed.run.child_env import report_ready
    report_ready()           # a script without a process group says "past rendezvous" itself
else:
    from neural_arch.distributed import init_process_group
    init_process_group()     # writes $NEURAL_ARCH_READY_DIR/rank_N after a successful rendezvous
print("ready", flush=True)
time.sleep(float(os.environ.get("AFTER", "600")))
"""


@pytest.mark.timeout(30)
def test_start_timeout_watches_rendezvous_not_process_start(tmp_path, write_script):
    # Rank 1 hangs before init_process_group; ranks 0 and 2 wait for it inside the rendezvous.
    script = write_script("hang.py", HANG_BEFORE_RENDEZVOUS)
    start = time.monotonic()
    res = run_launcher(["--standalone", "--nproc_per_node=3", "--start_timeout=3", "--term_timeout=1",
                        script], tmp_path, timeout=25, env={"HANGING_RANK": "1"})
    elapsed = time.monotonic() - start
    assert res.returncode == 124, res.stderr
    assert "start timeout after 3 s: ranks 0, 1, 2 on node 0 did not reach rendezvous" in res.stderr
    assert "did not even start" not in res.stderr  # they started; they hang before/in rendezvous
    assert ": ready" not in res.stdout
    assert elapsed < 15, f"took {elapsed:.1f} s"


@pytest.mark.timeout(30)
def test_start_timeout_names_only_the_rank_that_did_not_report_ready(tmp_path, write_script):
    script = write_script("hang.py", HANG_BEFORE_RENDEZVOUS)
    res = run_launcher(["--standalone", "--nproc_per_node=2", "--start_timeout=2", "--term_timeout=1",
                        script], tmp_path, timeout=25, env={"HANGING_RANK": "1", "NO_GROUP": "1"})
    assert res.returncode == 124, res.stderr
    assert "start timeout after 2 s: rank 1 on node 0 did not reach rendezvous" in res.stderr
    assert "report_ready()" in res.stderr  # says what a script without a process group must do


@pytest.mark.timeout(30)
def test_ranks_past_rendezvous_may_run_longer_than_start_timeout(tmp_path, write_script):
    script = write_script("ok.py", HANG_BEFORE_RENDEZVOUS)
    # 4 s to reach rendezvous (a loaded CI box needs that for two Python starts), then 5 s of "work":
    # a rank ends >= 5 s after the launcher started, well after the first health check past the
    # 4 s deadline (every 0.2 s), where a launcher that timed out ready ranks would kill them.
    # Both ways of saying "past rendezvous" (a process group; report_ready() without one) run at
    # once, in two launchers: the test waits out the 5 s once.
    jobs = {}
    try:
        for no_group in ("0", "1"):
            folder = tmp_path / f"no_group_{no_group}"
            folder.mkdir()
            jobs[no_group] = start_launcher(["--standalone", "--nproc_per_node=2", "--start_timeout=4",
                                             "--monitor_interval=0.2", script], folder,
                                            {"AFTER": "5", "NO_GROUP": no_group})
        for no_group, proc in jobs.items():
            out, err = proc.communicate(timeout=25)
            assert proc.returncode == 0, f"NO_GROUP={no_group}: {err}"
            assert out.count(": ready") == 2, f"NO_GROUP={no_group}: {out}"
    finally:
        for proc in jobs.values():
            reap(proc)
