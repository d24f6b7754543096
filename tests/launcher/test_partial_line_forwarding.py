"""The launcher forwards a progress bar's carriage-return updates as they are printed (issue 33: under
torchrun-like tools tqdm animates; a line forwarded only at "\\n" arrives in one burst at the end), and
warns once when a host gets more ranks than it has CPUs.

The rank prints "a\\r", "b\\r", "c\\n", each flushed, and waits (polling a file) until the test has seen
that piece on the launcher's stdout: a launcher that held the pieces back until the newline fails here."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from neural_arch.distributed.testing import script_env

pytestmark = pytest.mark.timeout(90)

RANK_SCRIPT = r"""
import os, pathlib, sys, time
if os.environ["RANK"] != "0":
    sys.exit(0)
folder = pathlib.Path(sys.argv[1])
for i, piece in enumerate(["a\r", "b\r", "c\n"]):
    sys.stdout.write(piece)
    sys.stdout.flush()
    deadline = time.monotonic() + 20
    while not (folder / f"seen_{i}").exists():       # the test saw the piece: go on
        if time.monotonic() > deadline:
            sys.exit(f"the launcher never forwarded {piece!r}")
        time.sleep(0.01)
"""

# The launcher as neural-arch-launch, on a host that says it has one CPU (the warning's case) with 2 ranks
ONE_CPU_LAUNCHER = ("import os, sys; os.cpu_count = lambda: 1; "
                    "from neural_arch.distributed.launcher import main; sys.exit(main(sys.argv[1:]))")


def _collect(pipe, sink: list) -> None:
    sink.extend(iter(lambda: os.read(pipe.fileno(), 4096), b""))   # each chunk as it arrives


def test_carriage_return_pieces_arrive_as_printed_and_crowding_warns(tmp_path):
    script = tmp_path / "bar.py"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.Popen([sys.executable, "-c", ONE_CPU_LAUNCHER, "--standalone", "--nproc_per_node=2",
                             str(script), str(tmp_path)], env=script_env(), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [threading.Thread(target=_collect, args=(p, sink), daemon=True)
               for p, sink in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    try:
        expected = ""
        for i, piece in enumerate(["a\r", "b\r", "c\n"]):
            expected += f"[rank0]: {piece}"
            deadline = time.monotonic() + 30
            while expected not in b"".join(out).decode():
                assert proc.poll() is None and time.monotonic() < deadline, \
                    f"{piece!r} not forwarded while the rank waits: {b''.join(out)!r} {b''.join(err)[-2000:]!r}"
                time.sleep(0.01)
            (tmp_path / f"seen_{i}").touch()
        assert proc.wait(timeout=60) == 0, b"".join(err)[-3000:]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
        for t in readers:
            t.join(timeout=10)
    stderr = b"".join(err).decode()
    assert stderr.count("2 ranks on 1 cores: every rank busy-polls") == 1, stderr
    assert b"".join(out).decode() == "[rank0]: a\r[rank0]: b\r[rank0]: c\n"
