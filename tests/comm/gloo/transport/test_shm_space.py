"""A nearly full /dev/shm is a clear error at set-up, never a SIGBUS.

tmpfs files are sparse: before the pages were reserved (``posix_fallocate``), a ring or segment
larger than the free space mapped fine and the first write into it killed the process with SIGBUS
-- every rank of the job, without a word. The filesystem here is real: a 1 MiB tmpfs mounted for the
test (root, as in CI), and the shared-memory files are created in it (``_Ring`` takes its path,
``ShmSegment.connect`` its ``directory``). The creation runs in a child process, so that the old
behaviour fails the test instead of killing pytest.
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

_CHILD = r"""
import json, os, sys, time
from neural_arch.distributed.comm.gloo.transport.shm import _Ring
from neural_arch.distributed.comm.gloo.transport.shm_segment import ShmSegment
from neural_arch.distributed.rendezvous.store import TCPStore

d, out = sys.argv[1], {}
def attempt(name, fn):
    try:
        fn()
        out[name] = ["ok", ""]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
attempt("big ring", lambda: _Ring(f"{d}/na-{os.getpid()}-aa-0to1", create=True, capacity=4 << 20))
store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=10)
attempt("big segment", lambda: ShmSegment.connect(store, 0, 1, time.monotonic() + 10, chunk=1 << 20, directory=d))
out["left"] = sorted(os.listdir(d))
ring = _Ring(f"{d}/na-{os.getpid()}-bb-0to1", create=True, capacity=64 << 10)   # one that fits works
ring.data[:4] = b"abcd"
out["small ring"] = bytes(ring.data[:4]).decode()
print(json.dumps(out))
"""


@pytest.fixture
def tiny_tmpfs(tmp_path):
    where = tmp_path / "tiny-shm"
    where.mkdir()
    done = subprocess.run(check=False, args=["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True,
                          text=True, timeout=20)
    if done.returncode:
        pytest.skip(f"mounting a 1 MiB tmpfs needs root (CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(check=False, args=["umount", "-l", str(where)], capture_output=True, timeout=20)


def test_full_shared_memory_is_a_clear_error_suggesting_tcp_not_sigbus(tiny_tmpfs):
    child = subprocess.run(check=False, args=[sys.executable, "-c", _CHILD, str(tiny_tmpfs)], capture_output=True, text=True,
                           timeout=50)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])   # -7: killed by SIGBUS
    out = json.loads(child.stdout.strip().splitlines()[-1])
    for what in ("big ring", "big segment"):
        kind, msg = out[what]
        assert kind == "RendezvousError", (what, out[what])
        assert "No space left" in msg and "NEURAL_ARCH_GLOO_TRANSPORT=tcp" in msg and "MiB free" in msg, msg
    assert out["left"] == [], out["left"]          # the failed files (and doorbells) were removed
    assert out["small ring"] == "abcd"
