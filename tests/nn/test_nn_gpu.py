"""nn/optim on a CUDA device through CuPy (skipped cleanly without CuPy or a GPU)."""

import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch.core.tensor import manual_seed

pytestmark = pytest.mark.gpu


def _cupy():
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # no driver / no device
        pytest.skip(f"CUDA unavailable: {exc}")
    return cp


def test_gpt_trains_on_gpu_and_matches_cpu():
    cp = _cupy()
    manual_seed(0)
    cpu_model = nn.GPT(vocab_size=8, block_size=6, n_layer=1, n_head=2, n_embd=8)
    manual_seed(0)
    gpu_model = nn.GPT(vocab_size=8, block_size=6, n_layer=1, n_head=2, n_embd=8).to("cuda")
    weight = gpu_model.head.weight
    assert weight.device.startswith("cuda") and isinstance(weight.data, cp.ndarray)
    idx = np.random.default_rng(0).integers(0, 8, size=(2, 6))
    out_cpu = cpu_model(idx).data
    out_gpu = gpu_model(cp.asarray(idx)).data
    np.testing.assert_allclose(cp.asnumpy(out_gpu), out_cpu, atol=1e-4)
    opt = optim.AdamW(gpu_model.parameters(), lr=1e-2)
    loss = nn.CrossEntropyLoss()(gpu_model(cp.asarray(idx)), cp.asarray(idx))
    loss.backward()
    optim.clip_grad_norm_(gpu_model.parameters(), 1.0)
    opt.step()
    assert gpu_model.head.weight is weight and isinstance(weight.data, cp.ndarray)
    state = gpu_model.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    cpu_model.load_state_dict(state)
    np.testing.assert_array_equal(cpu_model.head.weight.data, cp.asnumpy(weight.data))
    opt_state = opt.state_dict()
    assert all(isinstance(v, np.ndarray) for st in opt_state["state"].values()
               for v in st.values() if hasattr(v, "shape"))
    opt.load_state_dict(opt_state)
