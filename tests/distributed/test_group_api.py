"""In-process API tests: the world of one, backend selection, lifecycle and bad input.

Everything here runs in the pytest process itself (no rank processes): a world of one is
what ``init_process_group()`` gives when nothing in the environment names a job.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import neural_arch.distributed as dist
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import (
    CollectiveTimeoutError,
    DistributedError,
    GroupMember,
    NotInitializedError,
    ReduceOp,
    Work,
)
from neural_arch.distributed.groups import select_backend
from neural_arch.distributed.process_group import GroupMembershipError

# clean_job_env (conftest.py): no job variables, no process group left behind
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("clean_job_env")]


# ---------------------------------------------------------------------------------- seed 001 snippets
def test_seed001_basic_functionality():
    dist.init_process_group(backend="gloo", world_size=1, rank=0)
    assert (dist.get_world_size(), dist.get_rank()) == (1, 0)
    tensor = Tensor(np.array([1.0, 2.0, 3.0]))
    result = dist.all_reduce(tensor)
    assert result is tensor
    np.testing.assert_array_equal(result.data, [1.0, 2.0, 3.0])
    reduced = dist.all_reduce(tensor, ReduceOp.SUM)
    np.testing.assert_array_equal(reduced.data, [1.0, 2.0, 3.0])
    gathered = dist.all_gather(tensor)
    assert len(gathered) == 1 and isinstance(gathered[0], Tensor)
    np.testing.assert_array_equal(gathered[0].data, tensor.data)
    np.testing.assert_array_equal(dist.broadcast(tensor, src=0).data, [1.0, 2.0, 3.0])
    data = np.random.randn(dist.get_world_size() * 2, 3).astype(np.float32)
    scattered = dist.reduce_scatter(Tensor(data), ReduceOp.AVERAGE)
    assert scattered.shape == (2, 3)
    np.testing.assert_allclose(scattered.data, data)


def test_seed001_status_checking():
    info = dist.get_distributed_info()
    assert info["available"] is True and info["initialized"] is False
    assert (info["world_size"], info["rank"], info["backend"]) == (1, 0, None)
    dist.init_process_group(backend="gloo", world_size=1, rank=0)
    assert dist.is_initialized()
    info = dist.get_distributed_info()
    for key in ("available", "world_size", "rank", "backend", "local_rank", "transport", "devices", "debug"):
        assert key in info
    assert info["initialized"] and info["backend"] == "gloo" and info["world_size"] == 1


def test_world_of_one_without_environment():
    group = dist.init_process_group()
    assert dist.get_backend() == "local" and group is dist.get_default_group() is GroupMember.WORLD
    t = Tensor(np.arange(4.0))
    for fn in (lambda: dist.all_reduce(t, "max"), lambda: dist.broadcast(t), lambda: dist.reduce(t, 0),
               lambda: dist.scatter(t, [Tensor(np.arange(4.0))]), lambda: dist.all_to_all(t)):
        np.testing.assert_array_equal(fn().data, np.arange(4.0))
    assert [g.data.tolist() for g in dist.gather(t)] == [[0.0, 1.0, 2.0, 3.0]]
    dist.barrier()
    objs = [None]
    assert dist.all_gather_object(objs, {"a": 1}) == [{"a": 1}]
    assert dist.broadcast_object_list([1, "x"]) == [1, "x"]
    assert dist.broadcast_object_list([2], src=0, group=None, device="cpu") == [2]   # torch's device keyword
    assert dist.gather_object(5) == [5]
    assert dist.scatter_object_list([None], ["only"]) == ["only"]


def test_async_op_returns_work_with_the_tensor():
    dist.init_process_group()
    t = Tensor(np.ones(3))
    work = dist.all_reduce(t, async_op=True)
    assert isinstance(work, Work) and work.result() is t
    parts = dist.all_gather(t, async_op=True).result()
    assert len(parts) == 1


def test_non_contiguous_tensor_is_made_contiguous():
    dist.init_process_group()
    t = Tensor(np.arange(6.0).reshape(2, 3).T)
    assert not t.data.flags.c_contiguous
    assert dist.all_reduce(t) is t
    assert t.data.flags.c_contiguous
    np.testing.assert_array_equal(t.data, np.arange(6.0).reshape(2, 3).T)


# ---------------------------------------------------------------------------------- lifecycle
def test_collectives_before_init_name_init_process_group():
    t = Tensor(np.ones(2))
    calls = [lambda: dist.all_reduce(t), lambda: dist.broadcast(t), lambda: dist.all_gather(t),
             lambda: dist.reduce_scatter(t), lambda: dist.barrier(), lambda: dist.send(t, 1),
             lambda: dist.all_gather_object([None], 1), lambda: dist.get_rank(), lambda: dist.new_group([0])]
    for call in calls:
        with pytest.raises(NotInitializedError, match="init_process_group"):
            call()


def test_init_twice_is_a_clear_error_and_destroy_allows_reinit():
    dist.init_process_group()
    with pytest.raises(DistributedError, match="destroy_process_group"):
        dist.init_process_group()
    sub = dist.new_group([0])
    dist.destroy_process_group()
    assert not dist.is_initialized() and GroupMember.WORLD is None
    dist.destroy_process_group()  # harmless when not initialised
    dist.init_process_group(backend="gloo", world_size=1, rank=0, timeout=12.5)
    assert dist.get_distributed_info()["timeout"] == 12.5
    with pytest.raises(DistributedError, match="new_group"):
        dist.all_reduce(Tensor(np.ones(1)), group=sub)  # a group from the previous init


def test_debug_mode_logs_at_init(monkeypatch, caplog):
    monkeypatch.setenv("NEURAL_ARCH_DISTRIBUTED_DEBUG", "DETAIL")
    with caplog.at_level(logging.INFO, logger="neural_arch.distributed"):
        dist.init_process_group()
    assert any("DETAIL" in rec.getMessage() for rec in caplog.records)
    assert dist.get_distributed_info()["debug"] is True


def test_timeout_accepts_timedelta_and_rejects_nonsense():
    from datetime import timedelta

    dist.init_process_group(timeout=timedelta(seconds=7))
    assert dist.get_default_group().timeout == 7.0
    dist.destroy_process_group()
    with pytest.raises(TypeError, match="timedelta"):
        dist.init_process_group(timeout="soon")
    with pytest.raises(ValueError, match="init_method"):
        dist.init_process_group(backend="gloo", init_method="carrier-pigeon://x", world_size=2, rank=0)


# ---------------------------------------------------------------------------------- backend selection
@pytest.mark.parametrize("environ, mpi, expected", [
    ({}, True, "local"),
    ({"NEURAL_ARCH_BACKEND": "MPI"}, False, "mpi"),
    ({"NEURAL_ARCH_BACKEND": "gloo", "PMI_RANK": "0", "PMI_SIZE": "2"}, True, "gloo"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, True, "mpi"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, True, "mpi"),
    ({"PMIX_RANK": "0", "PMIX_SIZE": "2"}, True, "mpi"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, False, "gloo"),        # mpiexec without mpi4py: gloo over TCP
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, True, "gloo"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, True, "gloo"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, True, "local"),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_NODELIST": "n[1-2]"}, True, "gloo"),
], ids=lambda x: str(x) if not isinstance(x, dict) else ",".join(x) or "empty")
def test_select_backend_from_environment(environ, mpi, expected):
    assert select_backend(environ, mpi_importable=mpi) == expected


def test_select_backend_explicit_init_method_means_gloo():
    assert select_backend({}, mpi_importable=True, init_method="tcp://10.0.0.1:1234") == "gloo"
    assert select_backend({}, mpi_importable=True, init_method="file:///tmp/x") == "gloo"


# ---------------------------------------------------------------------------------- bad input
def test_bad_input_raises_at_the_call():
    dist.init_process_group()
    t = Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="out of range"):
        dist.broadcast(t, src=1)
    with pytest.raises(ValueError, match="out of range"):
        dist.reduce(t, dst=-1)
    with pytest.raises(ValueError, match="divisible"):
        dist.reduce_scatter(Tensor(np.float32(1.0)))
    with pytest.raises(ValueError, match="C-contiguous"):
        dist.all_reduce(np.ones((3, 2)).T)  # raw arrays are the caller's buffer: not copied
    with pytest.raises(TypeError, match="dtype"):
        dist.all_reduce(np.ones(2, dtype=np.complex128))
    with pytest.raises(TypeError, match="array"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="AVG needs a floating"):
        dist.all_reduce(np.ones(2, np.int64), ReduceOp.AVG)
    with pytest.raises(ValueError, match="reduction operator"):
        dist.all_reduce(t, "median")
    with pytest.raises(ValueError, match="shape"):
        dist.all_gather([Tensor(np.zeros((3, 2), np.float32))], t)  # wrong output shape
    with pytest.raises(TypeError, match="dtype"):
        dist.all_gather([Tensor(np.zeros((2, 3), np.float64))], t)  # wrong output dtype
    with pytest.raises(ValueError, match="exactly 1"):
        dist.all_gather([t, t], t)
    with pytest.raises(ValueError, match="scatter_list"):
        dist.scatter(t)
    with pytest.raises(ValueError, match="length 1"):
        dist.all_gather_object([], 1)
    with pytest.raises(ValueError, match="tag"):
        dist.isend(t, 0, tag=-3)
    with pytest.raises(ValueError, match="itself"):
        dist.send(t, 0)


def test_non_member_and_destroyed_groups():
    dist.init_process_group()
    t = Tensor(np.ones(2))
    # torch: a collective on a rank outside the group does nothing, returns None, and warns
    with pytest.warns(UserWarning, match="not a member"):
        assert dist.all_reduce(t, group=GroupMember.NON_GROUP_MEMBER) is None
    assert t.data.tolist() == [1.0, 1.0]
    assert dist.get_rank(GroupMember.NON_GROUP_MEMBER) == -1
    assert dist.get_world_size(GroupMember.NON_GROUP_MEMBER) == -1
    sub = dist.new_group([0])
    assert sub.ranks == [0] and dist.get_world_size(sub) == 1
    dist.destroy_process_group(sub)
    with pytest.raises(DistributedError, match="destroyed"):
        dist.all_reduce(t, group=sub)
    with pytest.raises(TypeError, match="ProcessGroup"):
        dist.all_reduce(t, group="world")
    with pytest.raises(ValueError, match="out of range"):
        dist.new_group([0, 1])
    assert dist.all_reduce(t) is t  # the world is still fine


def test_error_classes_are_distinct():
    assert issubclass(CollectiveTimeoutError, TimeoutError) and issubclass(GroupMembershipError, ValueError)


# ---------------------------------------------------------------------------------- torch names
def test_torch_names_are_exported_and_work_in_a_world_of_one():
    for name in ("all_to_all_single", "reduce_scatter_tensor", "get_global_rank", "get_group_rank",
                 "get_process_group_ranks", "all_gather_into_tensor", "P2POp", "batch_isend_irecv",
                 "send_object_list", "recv_object_list", "group", "reduce_op", "monitored_barrier",
                 "is_torchelastic_launched", "spawn", "ProcessRaisedException", "SyncBatchNorm"):
        assert name in dist.__all__ and getattr(dist, name) is not None, name
    assert dist.reduce_op is ReduceOp
    assert dist.group.WORLD is None
    dist.init_process_group()
    assert dist.group.WORLD is dist.get_default_group()
    assert dist.get_process_group_ranks(None) == [0] and dist.get_global_rank(None, 0) == 0
    out = Tensor(np.zeros(3))
    assert dist.all_gather_into_tensor(out, Tensor(np.arange(3.0))) is out and out.data.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="must be"):
        dist.all_gather_into_tensor(Tensor(np.zeros(4)), Tensor(np.arange(3.0)))
    a2a = Tensor(np.zeros((2, 2)))
    dist.all_to_all_single(a2a, Tensor(np.ones((2, 2))), output_split_sizes=[2], input_split_sizes=[2])
    assert a2a.data.tolist() == [[1, 1], [1, 1]]
    with pytest.raises(ValueError, match="input_split_sizes"):
        dist.all_to_all_single(a2a, Tensor(np.ones((2, 2))), output_split_sizes=[2], input_split_sizes=[3])
    with pytest.raises(ValueError, match="isend or irecv"):
        dist.P2POp(dist.send, Tensor(np.ones(1)), 0)
    with pytest.raises(ValueError, match="src=None"):
        dist.recv_object_list([None])
    dist.monitored_barrier(timeout=1)
    assert not dist.is_torchelastic_launched({})
