"""Checkpoint helpers (elastic.py) and the parent-death watch's polling fallback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from launcher_helpers import ROOT, kill_pids, pid_alive, wait_for

from neural_arch.distributed import find_latest_checkpoint
from neural_arch.distributed.elastic.checkpoint_restart import (
    atomic_write_bytes,
    restart_count,
    save_npz_atomic,
)


def test_find_latest_checkpoint_orders_by_step_number_not_by_name(tmp_path):
    assert find_latest_checkpoint(tmp_path / "missing") is None
    assert find_latest_checkpoint(tmp_path) is None
    for name in ["step_9.npz", "step_10.npz", "step_2.npz", "notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "step_99.npz.tmp-abc").write_bytes(b"half")  # an interrupted atomic write
    (tmp_path / "step_50.npz").mkdir()  # not a file
    assert os.path.basename(find_latest_checkpoint(tmp_path, "step_*.npz")) == "step_10.npz"


def test_unnumbered_checkpoints_fall_back_to_modification_time(tmp_path):
    old, new = tmp_path / "last.ckpt", tmp_path / "best.ckpt"
    old.write_bytes(b"1")
    new.write_bytes(b"2")
    os.utime(old, (1, 1))
    assert find_latest_checkpoint(tmp_path, "*.ckpt") == str(new)


def test_atomic_writes_leave_no_temp_files_and_round_trip(tmp_path):
    save_npz_atomic(str(tmp_path / "sub" / "step_1.npz"), w=np.arange(3.0), step=np.array(1))
    atomic_write_bytes(str(tmp_path / "sub" / "raw.bin"), b"abc")
    assert sorted(os.listdir(tmp_path / "sub")) == ["raw.bin", "step_1.npz"]
    with np.load(tmp_path / "sub" / "step_1.npz") as data:
        assert data["w"].tolist() == [0.0, 1.0, 2.0] and int(data["step"]) == 1


def test_restart_count_reads_both_names():
    assert restart_count({}) == 0
    assert restart_count({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    with pytest.raises(ValueError, match="not an integer"):
        restart_count({"NEURAL_ARCH_RESTART_COUNT": "x"})


GRANDCHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
import neural_arch.distributed.run.parent_watch as run_env
run_env._set_pdeathsig = lambda sig: False      # force the portable polling fallback
assert run_env.install_parent_death_watch(parent_pid=os.getppid(), poll_interval=0.05)
print(os.getpid(), flush=True)
time.sleep(60)
"""

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {code!r}], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


@pytest.mark.timeout(30)
def test_polling_fallback_stops_an_orphan(tmp_path):
    code = GRANDCHILD.format(root=ROOT)
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(code=code)], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    pid = None
    try:
        pid = int(parent.stdout.readline().strip())
        assert pid_alive(pid)
        parent.kill()
        parent.wait(5)
        start = time.monotonic()
        assert wait_for(lambda: not pid_alive(pid), 5), "grandchild outlived its parent"
        assert time.monotonic() - start < 5
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(5)
        if pid:
            kill_pids([pid])


def test_watch_is_a_no_op_for_a_process_that_is_not_the_launchers_child():
    from neural_arch.distributed.run.parent_watch import install_parent_death_watch

    # our own pid is alive but not our parent: e.g. a subprocess of a rank inherited the variable
    assert install_parent_death_watch(parent_pid=os.getpid()) is False


def test_remove_interrupted_writes_deletes_only_temp_files(tmp_path):
    from neural_arch.distributed.elastic.checkpoint_restart import remove_interrupted_writes

    (tmp_path / "step_000006.npz").write_bytes(b"good")
    (tmp_path / "step_000007.npz.tmp-x1y2").write_bytes(b"half")  # a writer killed mid-write
    assert remove_interrupted_writes(str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000006.npz"]
    assert remove_interrupted_writes(str(tmp_path / "missing")) == 0
