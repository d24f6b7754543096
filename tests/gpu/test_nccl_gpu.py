"""NCCL backend and the CUDA path, on a real GPU. Every test here is marked ``gpu`` and skips,
with the reason, where CuPy, libnccl or a GPU is missing (that is every development machine).

On a GPU machine::

    pip install -e '.[test,gpu]' 'nvidia-nccl-cu12>=2.18'
    python -m pytest tests/gpu -v -rs

With one GPU the 2-rank tests first try two ranks on that GPU: NCCL normally refuses
("Duplicate GPU detected"), and the tests then skip saying so; the single-rank tests still run
every NCCL call of the backend for real.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from gpu_harness import duplicate_gpu_refusal, spawn

from neural_arch.distributed.comm import ReduceOp

pytestmark = pytest.mark.gpu


def _two_rank_device(count: int):
    return None if count >= 2 else "cuda:0"


def _check_or_skip(results, device):
    if device is not None:
        refusal = duplicate_gpu_refusal(results)
        if refusal:
            pytest.skip(f"one GPU: NCCL refused two ranks on cuda:0 ({refusal}); needs 2 GPUs")
    bad = [r for r in results if not r.get("ok")]
    assert not bad, "\n".join(r.get("traceback") or r.get("error", "") for r in bad)


# -- one rank: every NCCL call of the backend, for real, in this process ---------------------------
@pytest.fixture
def solo(nccl_ready):
    from neural_arch.distributed.comm.nccl.backend import NCCLBackend
    from neural_arch.distributed.rendezvous.store import TCPStore
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=30)
    backend = NCCLBackend.create(store, 0, 1, timeout=30)
    yield backend
    backend.shutdown()
    store.close()


def _info(backend, name, array=None):
    info = backend._new_info(name, array)
    info.deadline = time.monotonic() + 30
    return info


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "int8", "uint8"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG])
def test_single_rank_allreduce_and_reduce_call_nccl(solo, dtype, op):
    import cupy as cp
    if op is ReduceOp.AVG and np.dtype(dtype).kind != "f":
        pytest.skip("AVG is for floating dtypes")
    host = (np.arange(12) % 5 + 1).astype(dtype).reshape(3, 4)
    a = cp.asarray(host)
    solo._allreduce(a, op, _info(solo, "all_reduce", a))
    np.testing.assert_array_equal(cp.asnumpy(a), host)
    solo._reduce(a, 0, op, _info(solo, "reduce", a))
    np.testing.assert_array_equal(cp.asnumpy(a), host)


def test_single_rank_other_primitives(solo):
    import cupy as cp
    x = cp.arange(8, dtype=cp.float32)
    solo._broadcast(x, 0, _info(solo, "broadcast", x))
    out = cp.zeros((1, 8), cp.float32)
    solo._allgather(out, x, _info(solo, "all_gather", x))
    assert cp.asnumpy(out[0]).tolist() == list(range(8))
    rs = cp.zeros(8, cp.float32)
    solo._reduce_scatter(rs, x, ReduceOp.SUM, _info(solo, "reduce_scatter", x))
    assert cp.asnumpy(rs).tolist() == list(range(8))
    a2a = cp.zeros(8, cp.float32)
    solo._alltoall(a2a, x, _info(solo, "all_to_all", x))
    assert cp.asnumpy(a2a).tolist() == list(range(8))
    flags = cp.asarray(np.array([True, False]))
    solo._allreduce(flags, ReduceOp.MAX, _info(solo, "all_reduce", flags))
    assert cp.asnumpy(flags).tolist() == [True, False]
    solo._barrier(_info(solo, "barrier"))


def test_single_rank_stream_ordering(solo):
    """The input is written by a slow kernel on a side stream; the gather must see the write."""
    import cupy as cp
    side = cp.cuda.Stream(non_blocking=True)
    src = cp.zeros(1 << 22, cp.float32)
    out = cp.zeros((1, 1 << 22), cp.float32)
    with side:
        m = cp.ones((8192, 8192), cp.float32)
        for _ in range(6):
            m = m @ m / 8192             # ~1 TFLOP each: tens of ms before the write lands
        src += m[0, 0] + 1               # 2.0 once the chain has run
        info = _info(solo, "all_gather", src)   # records the "ready" event on `side`
    solo._allgather(out, src, info)
    assert float(out[0, -1].get()) == 2.0


def test_single_rank_new_group_and_public_api(solo):
    import cupy as cp
    sub = solo.new_group([0])
    assert sub is not None and sub.size == 1
    a = cp.ones(4, cp.float32)
    assert solo.allreduce(a, "avg").result() is a
    assert solo.broadcast_object({"k": 1}) == {"k": 1}
    sub.shutdown()


def test_wrong_device_array_is_rejected(solo, nccl_ready):
    import cupy as cp
    if nccl_ready < 2:
        pytest.skip("needs 2 GPUs to put an array on the other one")
    other = 1 - solo._device_id if solo._device_id in (0, 1) else 0
    with cp.cuda.Device(other):
        a = cp.ones(3)
    with pytest.raises(ValueError, match="lives on cuda"):
        solo.allreduce(a)


# -- several ranks: separate processes ------------------------------------------------------------
def test_collectives_two_ranks_vs_numpy(nccl_ready):
    device = _two_rank_device(nccl_ready)
    results = spawn("collectives", 2, device=device)
    _check_or_skip(results, device)
    for r in results:
        assert r["fails"] == [], r["fails"]
    print("NCCL", results[0]["info"])


def test_collectives_more_ranks_vs_numpy(nccl_ready):
    if nccl_ready < 3:
        pytest.skip(f"needs 3+ GPUs (odd world sizes), this machine has {nccl_ready}")
    results = spawn("collectives", min(nccl_ready, 5))
    _check_or_skip(results, None)
    for r in results:
        assert r["fails"] == [], r["fails"]


def test_op_timeout_aborts_instead_of_hanging(nccl_ready):
    device = _two_rank_device(nccl_ready)
    results = spawn("timeout", 2, device=device, timeout=120)
    _check_or_skip(results, device)
    r0 = results[0]
    assert r0["error"] is not None, "rank 0 completed an allreduce rank 1 never joined"
    assert "all_reduce #1" in r0["error"] and "aborted" in r0["error"]
    assert r0["elapsed"] < 3.0 + 10.0


def test_init_timeout_is_an_error_not_a_hang(nccl_ready):
    results = spawn("init_timeout", 2, ranks=[0], timeout=120)
    r0 = results[0]
    assert r0.get("ok"), r0
    assert r0["error"] is not None and "did not join" in r0["error"]
    assert r0["elapsed"] < 3.0 + 10.0


def test_ddp_mlp_matches_single_process(nccl_ready):
    device = _two_rank_device(nccl_ready)
    results = spawn("ddp", 2, device=device)
    _check_or_skip(results, device)
    for r in results:
        assert r["max_diff"] < 1e-4, r
    assert results[0]["param_sums"][0] == results[0]["param_sums"][1]


# -- Tensor ops: "cuda" gives what "cpu" gives -----------------------------------------------------
def _ops():
    import neural_arch.nn.functional as F
    return {
        "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "div": lambda a, b: a / (b * b + 1), "matmul": lambda a, b: a @ b.T,
        "sum": lambda a, b: (a * b).sum(axis=1), "mean": lambda a, b: (a + b).mean(),
        "exp": lambda a, b: F.exp(a), "log": lambda a, b: F.log(a * a + 1),
        "relu": lambda a, b: F.relu(a - b), "tanh": lambda a, b: F.tanh(a), "sigmoid": lambda a, b: F.sigmoid(b),
        "softmax": lambda a, b: F.softmax(a, axis=-1), "log_softmax": lambda a, b: F.log_softmax(b, axis=-1),
        "reshape_T": lambda a, b: a.reshape(4, 3).T * 2, "getitem": lambda a, b: a[1:, ::2] + b[:2, 1:3],
        "max": lambda a, b: a.amax(axis=0), "gelu": lambda a, b: F.gelu(a),
        "mse": lambda a, b: F.mse_loss(a, b),
    }


@pytest.mark.parametrize("name", sorted([
    "add", "sub", "mul", "div", "matmul", "sum", "mean", "exp", "log", "relu", "tanh", "sigmoid", "softmax",
    "log_softmax", "reshape_T", "getitem", "max", "gelu", "mse"]))
def test_tensor_op_cuda_matches_cpu(cupy_gpu, name):
    from neural_arch.core.tensor import Tensor
    fn = _ops()[name]
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    results = {}
    for device in ("cpu", "cuda"):
        a = Tensor(xa).to(device).detach().requires_grad_()
        b = Tensor(xb).to(device).detach().requires_grad_()
        out = fn(a, b)
        assert out.device.startswith(device)
        out.sum().backward()
        results[device] = (out.numpy(), a.grad.numpy() if a.grad is not None else None,
                           b.grad.numpy() if b.grad is not None else None)
    for got, want in zip(results["cuda"], results["cpu"]):
        if want is None:
            assert got is None
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cross_entropy_and_linear_cuda_matches_cpu(cupy_gpu):
    from neural_arch import nn
    from neural_arch.core import rng as na_rng
    from neural_arch.core.tensor import Tensor
    x = np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32)
    y = np.arange(16) % 3
    grads = {}
    for device in ("cpu", "cuda"):
        na_rng.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
        loss = nn.CrossEntropyLoss()(model(Tensor(x).to(device)), Tensor(y).to(device))
        loss.backward()
        grads[device] = [loss.item()] + [p.grad.numpy() for p in model.parameters()]
    np.testing.assert_allclose(grads["cuda"][0], grads["cpu"][0], rtol=1e-5)
    for got, want in zip(grads["cuda"][1:], grads["cpu"][1:]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
