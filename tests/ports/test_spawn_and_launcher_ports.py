"""The two ways torch scripts start ranks: ``mp.spawn(demo, args=(world,), nprocs=world)`` with the
tutorial's setup()/cleanup(), and a ``torchrun``-style script under our launcher."""

import os
import subprocess
import sys
import textwrap

import port_rank_fns as fns
import pytest

import neural_arch.distributed as dist
from neural_arch.distributed.run.child_env import free_port

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("world", [2, 3])
def test_spawn_tutorial_pattern(tmp_path, world):
    assert dist.spawn(fns.tutorial_demo, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True) is None
    total = world * (world + 1) / 2
    for rank in range(world):
        assert (tmp_path / f"rank{rank}.txt").read_text() == f"{rank} {world} {total} False"


def test_spawn_reraises_the_failing_rank_and_stops_the_others(tmp_path):
    with pytest.raises(dist.ProcessRaisedException) as info:
        dist.spawn(fns.tutorial_demo, args=(2, free_port(), str(tmp_path), 1), nprocs=2)
    assert info.value.error_index == 1
    assert "-- Process 1 terminated with the following error" in str(info.value)
    assert "KeyError: 'rank 1 fails on purpose'" in str(info.value)


def test_spawn_rejects_torch_misuse_with_what_to_write():
    with pytest.raises(TypeError, match=r"args=\(3,\)"):
        dist.spawn(fns.tutorial_demo, args=3, nprocs=2)
    with pytest.raises(ValueError, match="start_method"):
        dist.spawn(fns.tutorial_demo, nprocs=2, start_method="fork")


TORCHRUN_SCRIPT = textwrap.dedent('''
    import os
    import numpy as np
    import neural_arch.distributed as dist
    from neural_arch.core.tensor import Tensor

    dist.init_process_group(backend="gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    t = Tensor(np.array([1.0 + dist.get_rank()]))
    dist.all_reduce(t)
    print(f"ok rank={dist.get_rank()} local={local_rank} world={dist.get_world_size()} sum={t.data[0]}")
    dist.destroy_process_group()
''')


@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_script_under_our_launcher(tmp_path, world):
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone", "--nproc_per_node",
           str(world), str(script)]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=90, env=dict(os.environ),
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    total = world * (world + 1) / 2
    for rank in range(world):
        assert f"ok rank={rank} local={rank} world={world} sum={total}" in done.stdout


STDIN_SCRIPT = textwrap.dedent('''
    import os, sys
    data = sys.stdin.read()
    print(f"rank={os.environ['RANK']} stdin={data.strip()!r} run_id={os.environ.get('TORCHELASTIC_RUN_ID')}")
''')


def test_stdin_goes_to_rank0_and_rdzv_id_to_every_rank(tmp_path):
    script = tmp_path / "read.py"
    script.write_text(STDIN_SCRIPT)
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node", "2",
           "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "job7",
           "--start_timeout", "60", str(script)]
    env = dict(os.environ, NEURAL_ARCH_READY_DIR="")
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=60, input="hello\n", env=env)
    assert done.returncode == 0, done.stderr
    assert "rank=0 stdin='hello' run_id=job7" in done.stdout
    assert "rank=1 stdin='' run_id=job7" in done.stdout
