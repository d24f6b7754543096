"""The examples' ``--device cuda`` path, run end to end on CPU: two ranks under the launcher, each
with the strict fake GPU registered as ``"cuda"`` (no GPU here; the fake refuses silent host copies,
so any place that mixes host and device arrays fails as it would on a real GPU)."""
import os
import sys

import background
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


CASES = [
    ("train_digits_ddp.py", ["--epochs", "3", "--no-progress"], "held-out accuracy"),
    ("train_gpt_ddp.py", ["--steps", "4"], "final: validation loss"),
]


def _name(example: str) -> str:
    return f"strict fake cuda: {example}"


def _job(example: str, args) -> background.Job:
    """The launcher run as a background job (``tests/background.py``: self-contained, it runs beside the other
    tests); the wrapper and the checkpoint live in the job's own folder."""
    job = background.Job(_name(example), [], timeout=140)
    wrapper = job.workdir / "on_fake_cuda.py"
    wrapper.write_text(WRAPPER.format(here=HERE))
    job.argv = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node", "2",
                str(wrapper), os.path.join(ROOT, "examples", example), "--device", "cuda", *args]
    if example == "train_digits_ddp.py":
        job.argv += ["--checkpoint", str(job.workdir / "c.npz")]
    return job


def background_jobs(items):
    """The runs the collected tests ask for, queued at collection."""
    return [_job(item.callspec.params["example"], item.callspec.params["args"]) for item in items
            if hasattr(item, "callspec")]


@pytest.mark.parametrize("example, args, expect", CASES)
def test_example_runs_with_device_cuda_on_two_ranks(example, args, expect):
    done = background.result(_name(example), lambda: _job(example, args))
    assert not done.timed_out, f"{example} did not finish within {done.timeout:.0f} s: {done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    assert expect in done.stdout, done.stdout[-2000:]
    assert "2 rank(s)" in done.stdout
