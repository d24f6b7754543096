"""A whole training step through the strict fake device: forward, cross_entropy, backward,
clip_grad_norm_ and an SGD or Adam step make **zero** device-to-host transfers, zero
synchronisations and zero host-to-device copies (inputs already on the device), and train exactly
like NumPy. Out-of-range targets still raise a clear error, when the loss is read."""

from __future__ import annotations

import os

import fake_device as fd
import numpy as np
import pytest

import neural_arch.nn.functional as F
from neural_arch import backend, nn, optim
from neural_arch.core.tensor import Tensor

pytestmark = pytest.mark.usefixtures("fake")


def _mlp(device):
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Linear(6, 16, dtype=np.float64), nn.ReLU(), nn.Linear(16, 16, dtype=np.float64),
                          nn.GELU(), nn.Linear(16, 4, dtype=np.float64))
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, size=p.shape)
    return model.to(device)


def _batch(step, n=12):
    rng = np.random.default_rng(10 + step)
    x = rng.normal(size=(n, 6))
    y = rng.integers(0, 4, size=n)
    y[0] = -100  # one ignored target: ignore_index must keep working on the device
    return x, y


def _make_opt(name, params):
    if name == "sgd":
        return optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return optim.Adam(params, lr=0.01)


def _step(model, opt, x, y, use_module_loss):
    opt.zero_grad()
    logits = model(x)
    loss = nn.CrossEntropyLoss()(logits, y) if use_module_loss else F.cross_entropy(logits, y)
    loss.backward()
    norm = optim.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    return loss, norm


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
@pytest.mark.parametrize("use_module_loss", [False, True], ids=["F.cross_entropy", "nn.CrossEntropyLoss"])
def test_training_step_makes_no_host_transfer_or_sync(opt_name, use_module_loss):
    host, dev = _mlp("cpu"), _mlp("fake")
    opt_h, opt_d = _make_opt(opt_name, host.parameters()), _make_opt(opt_name, dev.parameters())
    losses = []
    for step in range(3):
        x, y = _batch(step)
        xd, yd = Tensor(x, device="fake"), backend.to_device(y, "fake")  # the data loader's job
        loss_h, norm_h = _step(host, opt_h, Tensor(x), y, use_module_loss)
        with fd.counting() as ev:
            loss_d, norm_d = _step(dev, opt_d, xd, yd, use_module_loss)
        assert ev.to_host == [], f"device-to-host copies in a training step: {ev.to_host}"
        assert ev.syncs == [], f"host synchronisations in a training step: {ev.syncs}"
        assert ev.from_host == [], f"host-to-device copies in a training step: {ev.from_host}"
        losses.append((loss_h.item(), loss_d.item(), norm_h, norm_d.item()))  # reading: the user asks
    for lh, ld, nh, nd in losses:
        assert ld == pytest.approx(lh, rel=1e-12) and nd == pytest.approx(nh, rel=1e-12)
    for ph, pd in zip(host.parameters(), dev.parameters()):
        assert type(pd.data) is fd.FakeArray
        np.testing.assert_allclose(backend.to_host(pd.data), ph.data, rtol=1e-10, atol=1e-12)


def test_training_step_under_forbid_raises_at_the_first_sync():
    # The same step with every host wait turned into an error: the tool to find a new sync.
    dev = _mlp("fake")
    opt = optim.Adam(dev.parameters(), lr=0.01)
    x, y = _batch(0)
    xd, yd = Tensor(x, device="fake"), backend.to_device(y, "fake")
    with fd.forbid():
        loss, _ = _step(dev, opt, xd, yd, False)
        with pytest.raises(fd.HostSyncError, match="item"):
            loss.item()


def test_out_of_range_target_raises_when_the_loss_is_read():
    logits = Tensor(np.random.default_rng(0).normal(size=(4, 3)), device="fake", requires_grad=True)
    target = backend.to_device(np.array([0, 3, 1, -100]), "fake")  # 3 is not a class of 3
    with fd.counting() as ev:
        loss = F.cross_entropy(logits, target)
        loss.backward()
    assert ev.host_waits == []  # validation stayed on the device
    for read in (loss.item, lambda: float(loss), loss.numpy, lambda: repr(loss), loss.detach().item):
        with pytest.raises(IndexError, match=r"target 3 is out of range for 3 classes.*ignore_index=-100"):
            read()
    # Until read, the value is NaN (visibly wrong) and the bad row gets no gradient.
    assert np.isnan(backend.to_host(loss.data))
    g = backend.to_host(logits.grad.data)
    assert np.all(np.isfinite(g)) and np.all(g[1] == 0) and np.all(g[3] == 0)
    none = F.cross_entropy(logits, target, reduction="none")
    vals = backend.to_host(none.data)
    assert np.isnan(vals[1]) and np.isfinite(vals[[0, 2, 3]]).all()


def test_valid_targets_read_normally_and_host_checks_stay_eager():
    logits = Tensor(np.zeros((2, 3)), device="fake")
    loss = F.cross_entropy(logits, backend.to_device(np.array([0, 2]), "fake"))
    with fd.counting() as ev:
        assert loss.item() == pytest.approx(np.log(3))
    assert len(ev.syncs) + len(ev.to_host) == 2  # the value and its flag, read together
    with pytest.raises(IndexError, match="out of range"):  # NumPy: checked at once (free on the host)
        F.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 5]))


def test_eager_checks_env_makes_device_checks_immediate(monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_EAGER_CHECKS", "1")
    logits = Tensor(np.zeros((2, 3)), device="fake")
    with pytest.raises(IndexError, match="target -2 is out of range"):
        F.cross_entropy(logits, backend.to_device(np.array([0, -2]), "fake"))
    monkeypatch.delenv("NEURAL_ARCH_EAGER_CHECKS")
    assert os.environ.get("NEURAL_ARCH_EAGER_CHECKS") is None


def test_all_targets_ignored_gives_nan_like_torch():
    for dev in ("cpu", "fake"):
        loss = F.cross_entropy(Tensor(np.zeros((2, 3)), device=dev), backend.to_device(np.array([-100, -100]), dev))
        assert np.isnan(loss.item())


def test_gpt_training_step_has_no_host_waits():
    from neural_arch.core.tensor import manual_seed

    manual_seed(0)
    model = nn.GPT(vocab_size=8, block_size=6, n_layer=1, n_head=2, n_embd=8, dropout=0.1).to("fake")
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    idx = backend.to_device(np.random.default_rng(0).integers(0, 8, size=(2, 6)), "fake")
    for step in range(2):
        with fd.counting() as ev:
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(model(idx), idx)
            loss.backward()
            optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        assert ev.host_waits == [], ev
        if step:  # the causal mask is built on the host once, then cached on the device
            assert ev.from_host == [], ev
    assert np.isfinite(loss.item())
