"""The examples' ``--device cuda`` path, run end to end on CPU: two ranks under the launcher, each
with the strict fake GPU registered as ``"cuda"`` (no GPU here; the fake refuses silent host copies,
so any place that mixes host and device arrays fails as it would on a real GPU)."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

WRAPPER = """
import runpy, sys
sys.path.insert(0, {here!r})
import fake_device
fake_device.install("cuda")
example = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(example, run_name="__main__")
"""


@pytest.mark.parametrize("example, args, expect", [
    ("train_digits_ddp.py", ["--epochs", "3", "--no-progress"], "held-out accuracy"),
    ("train_gpt_ddp.py", ["--steps", "4"], "final: validation loss"),
])
def test_example_runs_with_device_cuda_on_two_ranks(tmp_path, example, args, expect):
    wrapper = tmp_path / "on_fake_cuda.py"
    wrapper.write_text(WRAPPER.format(here=HERE))
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
           str(wrapper), os.path.join(ROOT, "examples", example), "--device", "cuda", *args]
    if example == "train_digits_ddp.py":
        cmd += ["--checkpoint", str(tmp_path / "c.npz")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=140, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout, done.stdout[-2000:]
    assert "2 rank(s)" in done.stdout
