"""Issue 27/28, "never silently wrong" in the launcher and the node agent.

* the failure summary names the rank whose error came *first* (and prints it), not the first to exit;
* a launcher started by mpiexec as several tasks of one node is refused with what to do instead;
* multi-node: node 0 logs refused joins as they happen and the nodes still missing; a node that
  cannot reach node 0 (a wrong --master_port) says so while it waits; a second node 0 is named;
* the agent's accept loop survives EMFILE and caps unauthenticated connections;
* --log_dir: never through a symlink, logs 0600, a folder others may write into is refused.

Cheap on purpose: the agent tests run in-process on loopback; three tests start a launcher (no
neural_arch import in its ranks), one starts a small script that lowers its own descriptor limit.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from launcher_helpers import child_env, free_port, run_launcher

from neural_arch.distributed.launcher import main
from neural_arch.distributed.run import procs
from neural_arch.distributed.run.agent import NodeAgentServer, accept_forever, join_node0

pytestmark = pytest.mark.timeout(60)

TOKEN = "5f3ca9e1" * 5                 # 160 bits: strong enough for the handshake


# ----------------------------------------------------------------------------- the summary
FIRST_ERROR = """
import atexit, os, sys, time
rank = int(os.environ["RANK"])
record = os.path.join(os.environ["NEURAL_ARCH_READY_DIR"], "error_0.json")
if rank == 0:
    atexit.register(time.sleep, 20)      # a slow teardown: rank 0 is not the first to exit
    raise RuntimeError("the real cause: batch 7 has NaNs")
# rank 1 raises once rank 0's error is on record (the bootstrap writes error_0.json as rank 0 raises)
deadline = time.monotonic() + 20
while not os.path.exists(record) and time.monotonic() < deadline:
    time.sleep(0.02)
raise ConnectionError("lost the connection to rank 0")   # what a peer sees a moment later
"""


def test_summary_names_the_rank_whose_error_came_first(write_script, tmp_path):
    script = write_script("first.py", FIRST_ERROR)
    res = run_launcher(["--nproc_per_node=2", "--standalone", "--term_timeout=1", script], tmp_path, timeout=40)
    assert res.returncode == 1, res.stderr
    summary = res.stderr[res.stderr.index("job failed"):]
    assert summary.startswith("job failed: rank 0 raised the first error: RuntimeError: the real cause"), summary
    assert "rank 1" in summary and "first to exit" in summary and "ConnectionError" in summary, summary


KILLED_IN_SHM_SETUP = """
import os, signal
# what a rank SIGKILLed between creating its shared-memory ring and the attach barrier leaves
open(f"/dev/shm/na-{os.getpid()}-{os.environ['RANK']}feed-ring", "wb").close()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_launcher_removes_what_ranks_killed_in_shm_setup_left(write_script, tmp_path):
    """Every rank died: no survivor cleans /dev/shm, so the launcher does, after the teardown (only
    files whose creating process is gone)."""
    import glob

    script = write_script("killed.py", KILLED_IN_SHM_SETUP)
    before = set(glob.glob("/dev/shm/na-*feed-ring"))
    res = run_launcher(["--nproc_per_node=2", "--standalone", "--term_timeout=1", script], tmp_path, timeout=40)
    assert res.returncode != 0, res.stderr
    assert set(glob.glob("/dev/shm/na-*feed-ring")) - before == set()


@pytest.mark.mpi
def test_a_launcher_started_by_mpiexec_is_refused_with_what_to_do(write_script, tmp_path):
    from neural_arch.distributed.testing import run_mpiexec

    script = write_script("hi.py", "print('hi')\n")
    done = run_mpiexec(["-m", "neural_arch.distributed.launcher", "--nproc_per_node=1", str(script)], n=2,
                       timeout=50, cwd=tmp_path)
    assert done.returncode != 0, done.output          # today: two jobs started, one per MPI task
    assert "started by mpiexec/srun as one of 2 tasks" in done.stderr, done.output
    assert "one launcher per node" in done.stderr, done.output


# ----------------------------------------------------------------------------- multi-node waits
def test_node0_logs_refused_joins_and_the_nodes_still_missing():
    lines: list[str] = []
    server = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token=TOKEN, log=lines.append)
    try:
        with pytest.raises(RuntimeError, match="refused node 1"):
            join_node0("127.0.0.1", server.port, 1, 1, "0e1f" * 10, timeout=5)
        with pytest.raises(TimeoutError, match="never joined"):
            server.wait_layout(1.1, log_interval=0.4)
    finally:
        server.close()
    text = "\n".join(lines)
    assert "refused a join from 127.0.0.1" in text and "wrong or missing job key" in text, text
    assert sum("still waiting for nodes [1]" in line for line in lines) >= 2, text


def test_a_node_that_cannot_reach_node0_says_what_it_waits_for():
    lines: list[str] = []
    port = free_port()  # nobody listens: a wrong --master_port looks exactly like this
    with pytest.raises(TimeoutError, match="could not reach"):
        join_node0("127.0.0.1", port, 1, 1, TOKEN, timeout=1.1, log=lines.append, log_interval=0.4)
    text = "\n".join(lines)
    assert f"joining node 0's launcher at 127.0.0.1:{port}" in text, text
    assert "still cannot reach" in text and "refused" in text.lower() and "--master_port" in text, text


def test_launcher_of_a_node_with_a_wrong_master_port_is_not_silent(write_script, tmp_path):
    script = write_script("never.py", "print('never started')\n")
    port = free_port()
    res = run_launcher(["--nnodes=2", "--node_rank=1", f"--master_port={port}", "--start_timeout=1.2",
                        "--wait_log_interval=0.4", script], tmp_path, timeout=30,
                       env={"NEURAL_ARCH_AUTH_TOKEN": TOKEN})
    assert res.returncode == 1, res.stderr
    waiting = [line for line in res.stderr.splitlines() if "still cannot reach" in line]
    assert waiting and f"127.0.0.1:{port + 1}" in waiting[0], res.stderr   # before the 1.2 s timeout ran out


def test_a_second_node0_names_the_duplicate_node_rank():
    first = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token=TOKEN)
    try:
        with pytest.raises(RuntimeError, match=r"--node_rank 0"):
            NodeAgentServer(first.port, nnodes=2, nproc_per_node=1, token=TOKEN)
    finally:
        first.close()


# ----------------------------------------------------------------------------- the accept loop
EMFILE_FLOOD = """
import json, os, resource, socket, time
from neural_arch.distributed.run.agent import NodeAgentServer, join_node0
TOKEN = "7b2d" * 10
lines = []
try:
    server = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token=TOKEN, log=lines.append)
except TypeError:  # an agent without logging (before issue 28): the layout check below still applies
    server = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token=TOKEN)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 24, hard))
flood = []
try:
    while True:
        flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
except OSError:
    pass                      # out of descriptors: the agent's accept() fails with EMFILE too
time.sleep(0.5)
for s in flood:
    s.close()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
try:
    layout = list(join_node0("127.0.0.1", server.port, 1, 1, TOKEN, timeout=8).nproc)
except Exception as exc:
    layout = repr(exc)
print(json.dumps({"layout": layout, "lines": lines}))
"""


def test_the_accept_loop_survives_emfile():
    done = subprocess.run([sys.executable, "-c", EMFILE_FLOOD], env=child_env(), capture_output=True, text=True,
                          timeout=40, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["layout"] == [1, 1], out        # before: the loop stopped for good, the real node timed out
    assert any("accepting a connection failed" in line and "Too many open files" in line
               for line in out["lines"]), out   # the flood did hit EMFILE in the agent


def test_unauthenticated_connections_are_capped():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(32)
    sock.settimeout(0.2)
    stop, lock, release = threading.Event(), threading.Lock(), threading.Event()
    state = {"now": 0, "most": 0, "seen": 0}

    def handshake(conn, authenticated):
        with lock:
            state["now"] += 1
            state["seen"] += 1
            state["most"] = max(state["most"], state["now"])
        release.wait(10)       # an idle client: never authenticates
        with lock:
            state["now"] -= 1
        conn.close()

    loop = threading.Thread(target=accept_forever, args=(sock, stop, handshake, "test-hello"),
                            kwargs={"cap": 3}, daemon=True)
    loop.start()
    clients = [socket.create_connection(sock.getsockname()) for _ in range(8)]
    try:
        time.sleep(0.6)
        assert state["seen"] == 3 and state["most"] == 3, state   # the rest wait in the backlog
        release.set()
        deadline = time.monotonic() + 5
        while state["seen"] < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert state["seen"] == 8 and state["most"] <= 3, state    # served once slots freed
    finally:
        release.set()
        stop.set()
        loop.join(5)
        for c in clients:
            c.close()
        sock.close()


# ----------------------------------------------------------------------------- --log_dir
def test_log_files_are_private_and_never_followed_through_a_symlink(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    (tmp_path / "rank_0.log").symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        procs.open_log(str(tmp_path / "rank_0.log"))
    assert target.read_text() == "precious\n"
    old = tmp_path / "rank_1.log"
    old.write_text("an old run\n")
    old.chmod(0o644)
    with procs.open_log(str(old)) as f:
        f.write("new\n")
    assert oct(old.stat().st_mode & 0o777) == "0o600" and old.read_text() == "an old run\nnew\n"


def test_a_log_dir_others_can_write_is_refused(tmp_path, capsys):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="writable by other users"):
        procs.prepare_log_dir(str(shared))
    assert main(["--nproc_per_node=1", f"--log_dir={shared}", "train.py"]) == 2
    assert "chmod go-w" in capsys.readouterr().err
    fresh = tmp_path / "fresh" / "logs"
    procs.prepare_log_dir(str(fresh))
    assert oct(fresh.stat().st_mode & 0o777) == "0o700"
