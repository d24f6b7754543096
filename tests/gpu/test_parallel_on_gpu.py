"""The strict-device parallelism cases on a real GPU: ZeRO-1/2, FSDP (with clipping), tensor-parallel
GPT and the 1F1B pipeline, two gloo ranks sharing the one GPU with CuPy arrays, each step equal to the
same step on NumPy (float64, <= 1e-10) and every parameter still a ``cupy.ndarray`` afterwards.

On CPU the same functions (``tests/strict_device/strict_parallel_fns.py``) run on the strict fake device,
which also counts host transfers; here CuPy itself is the judge: the fake cannot know every place where
real CuPy refuses a host array (``x[...] = numpy_array`` raises on CuPy 14), this run does.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "strict_device"))

import strict_parallel_fns as fns  # needs the path above

from neural_arch.distributed.testing import RankPool

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]

TOL = 1e-10

CASES = {
    "zero1": (fns.zero_run, 1),
    "zero2": (fns.zero_run, 2),
    "fsdp": (fns.fsdp_run,),
    "fsdp-clip": (fns.fsdp_run, True),
    "tp-gpt": (fns.tp_gpt_run,),
    "pp-1f1b": (fns.pp_1f1b_run,),
}


@pytest.fixture(scope="module")
def gpu_pool():
    from gpu_harness import gpu_skip_reason

    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    os.environ["STRICT_FNS_REAL_DEVICE"] = "cuda"  # read by the ranks, which inherit the environment
    pool = RankPool(2, backend="gloo", timeout=120.0)
    try:
        pool.start()
        yield pool
    finally:
        pool.close()
        os.environ.pop("STRICT_FNS_REAL_DEVICE", None)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_step_on_gpu_equals_numpy(gpu_pool, case):
    fn, *args = CASES[case]
    for rank, r in enumerate(gpu_pool.run(fn, *args)):
        assert r["diff"] <= TOL, f"{case}, rank {rank}: the GPU step differs from NumPy by {r['diff']:g}"
        assert r["on_device"], f"{case}, rank {rank}: parameters left the GPU"
        assert not r.get("host_params"), f"{case}, rank {rank}: parameters not on the GPU: {r['host_params']}"
