"""Module API: registration order, buffers, state_dict, train/eval, zero_grad, apply, repr, to()."""

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor, manual_seed


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.act = nn.ReLU()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
        self.register_buffer("running", Tensor(np.zeros(4, dtype=np.float32)))
        self.register_buffer("scratch", Tensor(np.ones(2, dtype=np.float32)), persistent=False)
        self.scale = nn.Parameter(np.ones(1, dtype=np.float32))

    def forward(self, x):
        return self.block(self.act(self.fc1(x))) * self.scale


def test_registration_order_and_names():
    net = Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "block.0.weight", "block.0.bias"]
    assert [n for n, _ in net.named_buffers()] == ["running", "scratch"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "block"]
    assert [n for n, _ in net.named_modules()] == ["", "fc1", "act", "block", "block.0", "block.1"]
    assert net.get_submodule("block.0") is net.block[0]
    assert len(list(net.parameters(recurse=False))) == 1
    assert net.num_parameters() == 1 + 3 * 4 + 4 + 16 + 4


def test_reassignment_moves_between_registries():
    net = Net()
    net.fc1 = None
    assert "fc1.weight" not in dict(net.named_parameters())
    with pytest.raises(TypeError, match="parameter"):
        net.scale = np.ones(1)
    net.scale = None
    assert "scale" not in dict(net.named_parameters())


def test_tied_parameters_listed_once():
    a = nn.Linear(2, 2)
    seq = nn.Sequential(a, a)
    assert len(list(seq.parameters())) == 2


def test_state_dict_roundtrip_and_copies():
    manual_seed(0)
    net = Net()
    sd = net.state_dict()
    assert list(sd) == ["scale", "running", "fc1.weight", "fc1.bias", "block.0.weight", "block.0.bias"]
    assert all(isinstance(v, np.ndarray) for v in sd.values())
    sd["fc1.weight"][...] = 7  # a copy: the model must not change
    assert not np.any(net.fc1.weight.data == 7)
    manual_seed(1)
    other = Net()
    keys = other.load_state_dict(net.state_dict())
    assert keys.missing_keys == [] and keys.unexpected_keys == []
    for (n1, a), (n2, b) in zip(net.state_dict().items(), other.state_dict().items()):
        assert n1 == n2 and np.array_equal(a, b)


def test_load_state_dict_strict_errors_and_shapes():
    net = Net()
    sd = net.state_dict()
    del sd["fc1.bias"]
    sd["extra"] = np.zeros(1)
    with pytest.raises(RuntimeError, match="fc1.bias"):
        net.load_state_dict(sd)
    missing, unexpected = net.load_state_dict(sd, strict=False)
    assert missing == ["fc1.bias"] and unexpected == ["extra"]
    bad = net.state_dict()
    bad["fc1.weight"] = np.zeros((5, 5))
    with pytest.raises(RuntimeError, match="fc1.weight"):
        net.load_state_dict(bad)


def test_load_keeps_parameter_identity_and_dtype():
    net = Net()
    w = net.fc1.weight
    sd = {k: v.astype(np.float64) for k, v in net.state_dict().items()}
    net.load_state_dict(sd)
    assert net.fc1.weight is w and w.dtype == np.float32


def test_train_eval_propagates_and_dropout_identity():
    net = Net()
    assert net.training and net.block[1].training
    net.eval()
    assert not net.training and not net.block[1].training
    x = np.ones((2, 3), dtype=np.float32)
    np.testing.assert_array_equal(net(x).data, net(x).data)  # no dropout in eval
    net.train()
    assert net.block[1].training


def test_zero_grad_and_apply():
    net = Net()
    out = net(np.ones((2, 3), dtype=np.float32)).sum()
    out.backward()
    assert net.fc1.weight.grad is not None
    net.zero_grad(set_to_none=False)
    assert np.all(net.fc1.weight.grad.data == 0)
    net.zero_grad()
    assert net.fc1.weight.grad is None
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Linear") == 2


def test_repr_like_torch():
    text = repr(nn.Sequential(nn.Linear(2, 3, bias=False), nn.GELU()))
    assert text == (
        "Sequential(\n  (0): Linear(in_features=2, out_features=3, bias=False)\n  (1): GELU()\n)"
    )


def test_to_dtype_in_place():
    net = Net()
    w = net.fc1.weight
    net.to(dtype=np.float64)
    assert net.fc1.weight is w and w.dtype == np.float64
    assert net.running.dtype == np.float64
    net.to("cpu")
    assert w.device == "cpu"


def test_setattr_before_init_is_a_clear_error():
    class Bad(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(1, 1)

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_containers():
    ml = nn.ModuleList([nn.Linear(1, 1)])
    ml.append(nn.ReLU())
    ml.insert(0, nn.Tanh())
    assert [type(m).__name__ for m in ml] == ["Tanh", "Linear", "ReLU"]
    assert [n for n, _ in ml.named_children()] == ["0", "1", "2"]
    del ml[0]
    assert [n for n, _ in ml.named_parameters()] == ["0.weight", "0.bias"]
    md = nn.ModuleDict({"a": nn.Linear(1, 2)})
    md["b"] = nn.Linear(2, 1)
    assert list(md.keys()) == ["a", "b"] and "a" in md
    assert [n for n, _ in md.named_parameters()][-1] == "b.bias"
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    assert len(seq[:2]) == 2 and isinstance(seq[-1], nn.Linear)
    with pytest.raises(TypeError):
        nn.Sequential(np.zeros(2))


def test_init_functions_statistics_and_determinism():
    manual_seed(3)
    a = nn.Linear(100, 50)
    manual_seed(3)
    b = nn.Linear(100, 50)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    assert np.abs(a.weight.data).max() <= 1 / np.sqrt(100) + 1e-7
    w = nn.Parameter(np.empty((400, 300), dtype=np.float32))
    nn.init.xavier_normal_(w)
    assert abs(w.data.std() - np.sqrt(2 / 700)) < 0.003
    nn.init.kaiming_normal_(w, nonlinearity="relu")
    assert abs(w.data.std() - np.sqrt(2 / 300)) < 0.004
    nn.init.xavier_uniform_(w)
    assert np.abs(w.data).max() <= np.sqrt(6 / 700) + 1e-7
    nn.init.zeros_(w)
    assert not w.data.any()
    nn.init.ones_(w)
    assert np.all(w.data == 1)
    with pytest.raises(ValueError, match="2 dimensions"):
        nn.init.kaiming_uniform_(nn.Parameter(np.zeros(3)))


def test_forward_hooks():
    lin = nn.Linear(2, 2)
    calls = []
    pre = lin.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    post = lin.register_forward_hook(lambda m, args, out: out * 0)
    out = lin(np.ones((1, 2), dtype=np.float32))
    assert calls == ["pre"] and not out.data.any()
    pre.remove()
    post.remove()
    assert lin(np.ones((1, 2), dtype=np.float32)).data.any() and calls == ["pre"]


def test_pickle_and_deepcopy_roundtrip():
    import copy
    import pickle

    manual_seed(0)
    net = Net()
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert [n for n, _ in clone.named_parameters()] == [n for n, _ in net.named_parameters()]
        assert clone.fc1.weight is not net.fc1.weight
        for a, b in zip(clone.state_dict().values(), net.state_dict().values()):
            np.testing.assert_array_equal(a, b)


def test_named_sequential_keeps_names_on_slice_and_delete():
    from collections import OrderedDict

    seq = nn.Sequential(OrderedDict(fc=nn.Linear(2, 3), act=nn.ReLU(), out=nn.Linear(3, 1)))
    assert [n for n, _ in seq[1:].named_children()] == ["act", "out"]
    assert isinstance(seq["fc"], nn.Linear)
    del seq[1]
    assert [n for n, _ in seq.named_children()] == ["fc", "out"]
    assert seq(np.ones((4, 2), dtype=np.float32)).shape == (4, 1)
