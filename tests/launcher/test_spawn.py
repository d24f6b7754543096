"""launch(fn, nprocs): results in rank order, remote tracebacks, timeouts, reaping."""

from __future__ import annotations

import os
import sys
import time

import pytest

from neural_arch.distributed.run.spawn import SpawnError, launch


def rank_and_env(scale):
    return int(os.environ["RANK"]) * scale, os.environ["WORLD_SIZE"], os.environ["NEURAL_ARCH_BACKEND"]


def fail_on_rank_one():
    if os.environ["RANK"] == "1":
        raise KeyError("rank one is unhappy")
    time.sleep(30)  # must be stopped by launch(), not waited for
    return "never"


def write_pid_and_hang(folder):
    with open(os.path.join(folder, f"pid_{os.environ['RANK']}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(60)


def sum_of_ranks():
    import numpy as np

    from neural_arch.core.tensor import Tensor
    from neural_arch.distributed import ReduceOp, all_reduce, get_rank, get_world_size

    t = Tensor(np.array([float(get_rank())]))
    out = all_reduce(t, ReduceOp.SUM)
    return get_world_size(), float(np.asarray(getattr(out, "data", out))[0])


@pytest.mark.timeout(30)
def test_results_in_rank_order_without_group():
    # without a process group the backend is only a label for fn (mpi has its own test below)
    assert launch(rank_and_env, 2, args=(10,), backend="nccl", init_process_group=False) == [
        (0, "2", "nccl"), (10, "2", "nccl")]


@pytest.mark.timeout(30)
def test_failing_rank_raises_with_its_traceback_and_others_are_stopped():
    start = time.monotonic()
    with pytest.raises(SpawnError) as info:
        launch(fail_on_rank_one, 2, init_process_group=False)
    assert time.monotonic() - start < 15
    assert info.value.rank == 1
    assert "KeyError: 'rank one is unhappy'" in str(info.value)
    assert "fail_on_rank_one" in info.value.remote_traceback


@pytest.mark.timeout(30)
def test_timeout_kills_every_rank(tmp_path):
    from launcher_helpers import pid_alive, wait_for

    with pytest.raises(TimeoutError, match=r"ranks still running: \[0, 1\]"):
        launch(write_pid_and_hang, 2, args=(str(tmp_path),), timeout=3, init_process_group=False)
    pids = [int((tmp_path / f"pid_{r}").read_text()) for r in range(2)]
    assert wait_for(lambda: not any(pid_alive(p) for p in pids), 5)


@pytest.mark.timeout(30)
def test_interactive_function_without_cloudpickle_is_rejected_up_front(monkeypatch):
    namespace = {"__name__": "__main__"}
    exec("def typed_in_a_notebook():\n    return 1\n", namespace)  # noqa: S102 - simulates a notebook cell
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # makes `import cloudpickle` fail
    monkeypatch.delattr(sys.modules["__main__"], "__file__", raising=False)
    with pytest.raises(ValueError, match="pip install cloudpickle"):
        launch(namespace["typed_in_a_notebook"], 2, init_process_group=False)


@pytest.mark.timeout(30)
def test_notebook_function_travels_by_value_with_cloudpickle():
    pytest.importorskip("cloudpickle")
    namespace = {"__name__": "__main__"}
    cell = "import os\ndef typed_in_a_notebook(x):\n    return x + int(os.environ['RANK'])\n"
    exec(cell, namespace)  # noqa: S102 - simulates a notebook cell
    assert launch(namespace["typed_in_a_notebook"], 2, args=(5,), init_process_group=False) == [5, 6]


@pytest.mark.timeout(60)
def test_process_group_is_initialised_for_fn():
    assert launch(sum_of_ranks, 3) == [(3, 3.0)] * 3


def say_hello():
    print(f"hello from {os.environ['RANK']}", flush=True)


@pytest.mark.timeout(30)
def test_rank_output_is_echoed_with_a_rank_prefix(capfd):
    assert launch(say_hello, 2, init_process_group=False) == [None, None]
    out = capfd.readouterr().out
    assert "[rank0]: hello from 0" in out and "[rank1]: hello from 1" in out


@pytest.mark.timeout(60)
@pytest.mark.mpi
def test_mpi_backend_runs_under_a_real_mpiexec():
    assert launch(rank_and_env, 2, args=(1,), backend="mpi", init_process_group=False) == [
        (0, "2", "mpi"), (1, "2", "mpi")]
