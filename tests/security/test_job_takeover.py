"""Taking over a job (docs/security.md, "What another local user can do"): each attack runs in its
own process against a real store on loopback, with a hard timeout.

The attacker stands in for *another local user*: a separate process that never reads this user's
per-user job secret (it runs under the same uid here; the secret-folder test really switches uid).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import pytest
from security_procs import finish, kill, start

import neural_arch.distributed as dist
from neural_arch.distributed import auth as handshake
from neural_arch.distributed.errors import AuthenticationError, DistributedError
from neural_arch.distributed.launch_env import derive_job_token
from neural_arch.distributed.rendezvous.store import TCPStore
from neural_arch.distributed.run.child_env import free_port

pytestmark = pytest.mark.timeout(60)

# Another user's process takes MASTER_PORT before rank 0 and serves an *open* store (it asks for no
# key, so it needs no secret): today's code of this package is all it uses.
_OPEN_STORE = """
    import socket, threading
    from neural_arch.distributed import auth as handshake
    from neural_arch.distributed.rendezvous import tcp_store as ts
    state = ts._State()
    state.data["weights"] = b"the attacker's numbers"
    listener = socket.create_server(("127.0.0.1", 0))
    ready(listener.getsockname()[1])

    def serve(conn):
        try:
            handshake.serve(conn, None, b"store", time.monotonic() + 5)
            report("a rank joined the attacker's store")
            while True:
                op, args = ts._read_frame(conn)
                ts._write_frame(conn, *state.handle(op, args))
        except Exception:
            pass

    listener.settimeout(30)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def test_a_tokenless_rank_refuses_an_open_store_that_took_master_port(monkeypatch):
    """torch's ``env://`` without a token: the attacker holds MASTER_PORT and runs an open store.
    Rank 0 fails naming the port; rank 1 must not join the attacker's job (it used to: its
    all_reduce then returned the attacker's data and broadcast_object_list ran the attacker's code)."""
    for var in ("NEURAL_ARCH_AUTH_TOKEN", "NEURAL_ARCH_ALLOW_UNAUTHENTICATED", "SLURM_JOB_ID", "PMI_KVSNAME"):
        monkeypatch.delenv(var, raising=False)
    proc, port = start(_OPEN_STORE)
    try:
        with pytest.raises(DistributedError, match=f"cannot listen on 127.0.0.1:{port}"):
            TCPStore("127.0.0.1", port, is_master=True, timeout=2)                 # rank 0
        t0 = time.monotonic()
        with pytest.raises(AuthenticationError, match="WITHOUT authentication.*MASTER_PORT"):
            TCPStore("127.0.0.1", port, world_size=2, timeout=3)                   # rank 1's store
        with pytest.raises(AuthenticationError, match="not this job's rank 0"):
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=1,
                                    rendezvous_timeout=2)
        assert time.monotonic() - t0 < 5
    finally:
        kill(proc)
    assert not finish(proc, 1)[1], "a rank joined the attacker's store"


_SRUN_RANK0 = """
    import neural_arch.distributed as dist
    ready()
    dist.init_process_group("gloo", init_method="env://", world_size=2, rank=0, rendezvous_timeout=30)
"""


def _wait_listening(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"rank 0 never listened on {port}")


def test_the_public_srun_job_id_lets_no_one_in_but_keeps_jobs_apart():
    """An srun job without a token: its job id is public (squeue), so the token derived from it must
    not authenticate. The attacker computes it and tries the store; ranks of the same job (same
    user, same host) still join, and a rank of another job of the same user is refused."""
    port = free_port()
    job = {"SLURM_JOB_ID": "771", "SLURM_STEP_ID": "0"}
    proc, _ = start(_SRUN_RANK0, env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **job})
    try:
        _wait_listening(port)
        public = derive_job_token(job)                      # what anyone can compute from squeue
        with pytest.raises(AuthenticationError, match="wrong or missing job key"):
            TCPStore("127.0.0.1", port, timeout=3, auth_token=public)
        same_job = TCPStore("127.0.0.1", port, timeout=5, job_id=public)   # a rank of this job
        assert same_job.check("neural_arch/pg1//host/0")
        same_job.close()
        with pytest.raises(AuthenticationError, match="wrong or missing job key"):
            TCPStore("127.0.0.1", port, timeout=3, job_id=derive_job_token({"SLURM_JOB_ID": "772"}))
    finally:
        kill(proc)


# The victim: a token-less job of user `uid`, started as root only to import, then switched to `uid`.
_VICTIM_AS_UID = """
    import encodings.idna  # noqa: F401 - loaded now: after setuid the interpreter's files are root's
    from neural_arch.distributed.rendezvous.tcp_store import TCPStore
    ready()
    uid = int(os.environ["VICTIM_UID"])
    os.setgid(uid)
    os.setuid(uid)
    out = {}
    try:
        master = TCPStore("127.0.0.1", 0, is_master=True, timeout=5)
        worker = TCPStore("127.0.0.1", master.port, timeout=5)
        worker.set("k", "v")
        out["with XDG_RUNTIME_DIR"] = master.get("k").decode()
        worker.close()
        master.close()
    except Exception as exc:
        out["with XDG_RUNTIME_DIR"] = f"{type(exc).__name__}: {exc}"
    del os.environ["XDG_RUNTIME_DIR"]
    try:
        TCPStore("127.0.0.1", 0, is_master=True, timeout=5).close()
        out["without"] = "started"
    except Exception as exc:
        out["without"] = f"{type(exc).__name__}: {exc}"
    report(out)
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as two users")
@pytest.mark.parametrize("planted", ["folder", "file"])
def test_another_user_cannot_block_tokenless_jobs_through_tmp(planted):
    """Root (the other user) pre-creates ``/tmp/neural_arch-<uid>`` for user ``uid``: with a runtime
    directory the victim's jobs must not care; without one the victim gets a sentence saying what
    to do (it used to get "not a private directory" even with XDG_RUNTIME_DIR set, or a bare
    FileExistsError)."""
    uid = 54321 if planted == "folder" else 54322
    fallback = f"/tmp/neural_arch-{uid}"
    runtime = tempfile.mkdtemp(prefix=f"xdg-{uid}-", dir="/tmp")
    os.chown(runtime, uid, uid)
    try:
        if planted == "folder":
            os.mkdir(fallback, 0o755)
        else:
            with open(fallback, "w") as f:
                f.write("in the way")
        proc, _ = start(_VICTIM_AS_UID, env={"VICTIM_UID": str(uid), "XDG_RUNTIME_DIR": runtime})
        rc, results, err = finish(proc, 20)
        assert rc == 0, err
        out = results[0]
        assert out["with XDG_RUNTIME_DIR"] == "v"
        assert out["without"].startswith("AuthenticationError") and f"{fallback} is not a private folder" in \
            out["without"] and "XDG_RUNTIME_DIR" in out["without"], out["without"]
        assert os.path.isdir(os.path.join(runtime, f"neural_arch-{uid}"))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
        if os.path.isdir(fallback):
            shutil.rmtree(fallback, ignore_errors=True)
        elif os.path.exists(fallback):
            os.unlink(fallback)


def test_the_secret_folder_follows_the_runtime_directory(monkeypatch, tmp_path):
    """XDG_RUNTIME_DIR alone decides (when it exists): one folder, no /tmp twin."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert handshake.secret_dir() == os.path.join(str(tmp_path), f"neural_arch-{os.getuid()}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    assert handshake.secret_dir().startswith(("/tmp/", f"/run/user/{os.getuid()}/"))
