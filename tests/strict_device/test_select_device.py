"""select_device: what ``--device`` in the examples turns into, per rank (no GPU needed)."""
import pytest

from neural_arch.distributed.run.device import select_device

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_cpu_keeps_the_environment_backend():
    assert select_device("cpu", TORCHRUN) == ("cpu", None)


def test_cuda_without_a_gpu_says_what_to_do(monkeypatch):
    import neural_arch.cuda as cuda

    monkeypatch.setattr(cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="--device cpu"):
        select_device("cuda", TORCHRUN)


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        select_device("tpu", {})


def test_strict_cuda_mode_uses_the_local_rank_and_stages_through_gloo(strict_cuda):
    # the registered stand-in counts as one GPU shared by both local ranks: no NCCL (one GPU, two ranks)
    assert select_device("cuda", TORCHRUN) == ("cuda:0", None)


@pytest.mark.parametrize("count, expected", [(2, ("cuda:1", "nccl")), (1, ("cuda:0", None))])
def test_nccl_only_when_every_local_rank_has_its_own_gpu(monkeypatch, count, expected):
    import neural_arch.cuda as cuda

    monkeypatch.setattr(cuda, "device_count", lambda: count)
    monkeypatch.setattr(cuda, "set_device", lambda index: None)
    assert select_device("cuda", TORCHRUN) == expected
    mpi = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    assert select_device("cuda", mpi)[1] is None  # under mpiexec the backend stays mpi
