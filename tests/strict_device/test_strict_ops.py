"""Op equivalence through the strict fake device: every Tensor op's forward value and gradients
on the fake device equal the NumPy ones, results stay on the device, and neither the forward nor
the backward makes the host wait for the device (no transfer out, no synchronisation).

This is the CPU-run counterpart of the GPU equivalence tests: the fake refuses what CuPy refuses
(implicit NumPy conversion, host/device mixing) and counts what would stall a GPU.
"""

from __future__ import annotations

import fake_device as fd
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch.nn.functional as F
from neural_arch import backend
from neural_arch.core.tensor import Tensor

pytestmark = pytest.mark.usefixtures("fake")


def _data(seed, shape, positive=False, spread=False):
    rng = np.random.default_rng(seed)
    if spread:  # distinct values away from kinks (relu, abs, clip bounds, max ties)
        n = int(np.prod(shape)) if shape else 1
        return ((rng.permutation(n) - n / 2.0) * 0.3 + 0.05).reshape(shape)
    a = rng.standard_normal(shape)
    return np.abs(a) + 0.5 if positive else a


def _host(x):
    return backend.to_host(x) if backend.is_device_array(x) else np.asarray(x)


def check_equivalent(fn, arrays, consts=(), grad=None, allow_syncs=False, allow_from_host=False, seed=0):
    """Run ``fn(*tensors, *consts)`` on host and on the fake device; compare values and grads.

    ``arrays`` become float64 leaves (``grad``: indices that require grad, default all); ``consts``
    are raw arrays placed on each device beforehand (targets, indices, masks).
    """
    grad = range(len(arrays)) if grad is None else grad
    results = {}
    for dev in ("cpu", "fake"):
        leaves = [Tensor(np.array(a, dtype=np.float64), device=dev, requires_grad=i in grad)
                  for i, a in enumerate(arrays)]
        cs = [c if dev == "cpu" else backend.to_device(c, "fake") for c in consts]
        with fd.counting() as ev:
            out = fn(*leaves, *cs)
        if dev == "fake":
            assert type(out.data) is fd.FakeArray, f"forward result left the device: {type(out.data)}"
        up = np.random.default_rng(seed).standard_normal(out.shape)
        upstream = Tensor(up.astype(out.dtype), device=dev)
        with fd.counting() as ev_back:
            out.backward(upstream)
        grads = []
        for i in grad:
            g = leaves[i].grad
            assert g is not None, f"input {i} got no gradient on {dev}"
            if dev == "fake":
                assert type(g.data) is fd.FakeArray, f"gradient {i} left the device"
            grads.append(_host(g.data))
        results[dev] = (_host(out.data), grads, ev, ev_back)
    (out_h, grads_h, _, _), (out_d, grads_d, ev, ev_back) = results["cpu"], results["fake"]
    np.testing.assert_allclose(out_d, out_h, rtol=1e-12, atol=1e-12, err_msg="forward")
    for i, (gd, gh) in enumerate(zip(grads_d, grads_h)):
        np.testing.assert_allclose(gd, gh, rtol=1e-12, atol=1e-12, err_msg=f"grad {i}")
    if not allow_syncs:
        assert ev.host_waits == [], f"forward waited for the device: {ev}"
        assert ev_back.host_waits == [], f"backward waited for the device: {ev_back}"
    if not allow_from_host:
        assert ev.from_host == [] and ev_back.from_host == [], f"host-to-device copies: {ev} {ev_back}"


SET = settings(deadline=None, max_examples=8)
pair_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3)


# ----------------------------------------------------------------------------- arithmetic
@pytest.mark.parametrize("op", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
    lambda a, b: a ** b, lambda a, b: b - a * a,
], ids=["add", "sub", "mul", "div", "pow", "mixed"])
@SET
@given(shp=pair_shapes, seed=st.integers(0, 2**16))
def test_binary_broadcast(op, shp, seed):
    sa, sb = shp.input_shapes
    check_equivalent(op, [_data(seed, sa, positive=True), _data(seed + 1, sb, positive=True)], seed=seed)


@pytest.mark.parametrize("op", [
    lambda a: a + 2.0, lambda a: 3.0 - a, lambda a: 2.5 * a, lambda a: a / 4.0, lambda a: 2.0 / a,
    lambda a: a ** 2, lambda a: a ** 3.5, lambda a: 1.7 ** a, lambda a: -a, lambda a: abs(a),
], ids=["radd", "rsub", "rmul", "div_s", "rdiv", "sq", "pow_f", "rpow", "neg", "abs"])
def test_scalar_operands(op):
    check_equivalent(op, [_data(1, (3, 4), positive=True)])


def test_raw_device_array_operand():
    check_equivalent(lambda a, c: a * c + c, [_data(2, (2, 3))], consts=[_data(3, (2, 3))])


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((4,), (4, 3)), ((3, 4), (4,)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4,))])
def test_matmul(sa, sb):
    check_equivalent(lambda a, b: a @ b, [_data(4, sa), _data(5, sb)])


@pytest.mark.parametrize("lead", [(5,), (2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(lead, bias):
    arrays = [_data(6, lead + (4,)), _data(7, (3, 4))] + ([_data(8, (3,))] if bias else [])
    check_equivalent(lambda x, w, *b: F.linear(x, w, *b), arrays)


# ----------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("fn", [
    lambda x: x.sum(), lambda x: x.sum(axis=1), lambda x: x.sum(axis=(0, 2), keepdims=True),
    lambda x: x.mean(), lambda x: x.mean(axis=0), lambda x: x.max(), lambda x: x.min(), lambda x: x.var(),
], ids=["sum", "sum1", "sum02k", "mean", "mean0", "max", "min", "var"])
def test_reductions(fn):
    check_equivalent(fn, [_data(9, (2, 3, 4), spread=True)])


# ----------------------------------------------------------------------------- shape ops
@pytest.mark.parametrize("fn", [
    lambda x: x.reshape(6, 4), lambda x: x.reshape((4, -1)).T, lambda x: x.transpose(),
    lambda x: x.transpose(0, 2), lambda x: x.permute(2, 0, 1), lambda x: x.unsqueeze(1).squeeze(),
    lambda x: x.flatten(1), lambda x: x[:, :1].broadcast_to((2, 5, 4)), lambda x: x.astype(np.float32) * 2,
    lambda x: x.swapaxes(0, 1),
], ids=["reshape", "reshapeT", "transpose", "transpose02", "permute", "unsqueeze_squeeze", "flatten",
        "broadcast_to", "astype", "swapaxes"])
def test_shape_ops(fn):
    check_equivalent(fn, [_data(10, (2, 3, 4))])


@pytest.mark.parametrize("fn", [
    lambda x: x[1:, ::2], lambda x: x[0], lambda x: x[..., -1], lambda x: x[None, :, 1],
], ids=["slices", "int", "ellipsis", "newaxis"])
def test_basic_indexing(fn):
    check_equivalent(fn, [_data(11, (3, 4))])


def test_integer_array_indexing_on_device():
    idx = np.array([0, 2, 0, 1])  # repeated rows: the gradient accumulates (scatter-add)
    check_equivalent(lambda x, i: x[i], [_data(12, (3, 4))], consts=[idx])
    check_equivalent(lambda x, i, j: x[i, j], [_data(13, (3, 4))], consts=[idx, np.array([1, 1, 3, 0])])


def test_host_index_array_is_copied_to_the_device():
    # A host index for device data is moved over (a host-to-device copy), never a sync.
    check_equivalent(lambda x: x[np.array([2, 0, 2])], [_data(14, (3, 4))], allow_from_host=True)


def test_boolean_mask_indexing_is_a_documented_sync():
    mask = np.array([True, False, True])
    check_equivalent(lambda x, m: x[m], [_data(15, (3, 2))], consts=[mask], allow_syncs=True)
    with fd.counting() as ev:
        Tensor(np.ones((3, 2)), device="fake")[backend.to_device(mask, "fake")]
    assert len(ev.syncs) == 1  # CuPy must read the mask to know the result's size


def test_join_and_split():
    arrays = [_data(16, (2, 3)), _data(17, (2, 3)), _data(18, (2, 1))]
    check_equivalent(lambda a, b, c: F.cat([a, b, c], axis=1), arrays)
    check_equivalent(lambda a, b: F.stack([a, b], axis=1) * 2, arrays[:2])
    check_equivalent(lambda a: F.cat([p * (i + 1) for i, p in enumerate(a.split(2, axis=1))], axis=1),
                     [_data(19, (3, 5))])
    check_equivalent(lambda a: F.cat([p * (i + 1) for i, p in enumerate(a.chunk(3, axis=0))], axis=0),
                     [_data(20, (5, 2))])


# ----------------------------------------------------------------------------- nn ops
@pytest.mark.parametrize("name,fn,positive", [
    ("exp", F.exp, False), ("log", F.log, True), ("sqrt", F.sqrt, True), ("abs", F.abs, False),
    ("tanh", F.tanh, False), ("sigmoid", F.sigmoid, False), ("relu", F.relu, False),
    ("leaky_relu", lambda t: F.leaky_relu(t, 0.1), False), ("silu", F.silu, False),
    ("gelu", F.gelu, False), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), False),
    ("clip", lambda t: F.clip(t, -0.42, 0.71), False), ("clip_lo", lambda t: F.clip(t, min=-0.42), False),
    ("softmax", lambda t: F.softmax(t, axis=-1), False), ("log_softmax0", lambda t: F.log_softmax(t, axis=0), False),
])
def test_unary_nn_ops(name, fn, positive):
    check_equivalent(fn, [_data(21, (3, 4), positive=positive, spread=not positive)])


def test_where():
    cond = _data(22, (3, 4)) > 0
    check_equivalent(lambda a, b, c: F.where(c, a, b), [_data(23, (3, 4)), _data(24, (1, 4))], consts=[cond])
    check_equivalent(lambda a, c: F.where(c, a, 0.0), [_data(25, (3, 4))], consts=[cond])


def test_embedding_and_layer_norm():
    idx = np.array([[1, 3, 1], [0, 2, 3]])
    check_equivalent(lambda w, i: F.embedding(i, w), [_data(26, (4, 5))], consts=[idx])
    check_equivalent(lambda x, w, b: F.layer_norm(x, 4, w, b), [_data(27, (2, 3, 4)), _data(28, (4,)),
                                                                 _data(29, (4,))])
    check_equivalent(lambda x: F.layer_norm(x, (3, 4)), [_data(30, (2, 3, 4))])


def test_dropout_stays_on_the_device_without_syncs():
    x = Tensor(np.ones((50, 40)), device="fake", requires_grad=True)
    with fd.counting() as ev:
        y = F.dropout(x, 0.25)
        y.sum().backward()
    assert ev.host_waits == [] and ev.from_host == []
    grad = backend.to_host(x.grad.data)
    out = backend.to_host(y.data)
    np.testing.assert_array_equal(grad, out)  # the gradient is the (scaled) mask
    assert set(np.unique(out)) <= {0.0, 1.0 / 0.75} and 0.6 < (out > 0).mean() < 0.9
    check_equivalent(lambda t: F.dropout(t, 0.5, training=False) * 2, [_data(31, (3, 4))])


# ----------------------------------------------------------------------------- losses
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_class_targets(reduction, smoothing):
    target = np.array([0, 2, -100, 1, 2])
    check_equivalent(lambda x, t: F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing),
                     [_data(32, (5, 3))], consts=[target])


def test_cross_entropy_spatial_and_host_targets():
    check_equivalent(lambda x, t: F.cross_entropy(x, t), [_data(33, (2, 3, 4))],
                     consts=[np.array([[0, 2, 1, 1], [2, 2, 0, -100]])])
    # host targets for device logits: copied over once, never a sync
    check_equivalent(lambda x: F.cross_entropy(x, np.array([1, 0, 2])), [_data(34, (3, 3))],
                     allow_from_host=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_probability_targets(reduction):
    probs = np.random.default_rng(35).dirichlet(np.ones(4), size=3)
    check_equivalent(lambda x, t: F.cross_entropy(x, t, reduction=reduction, label_smoothing=0.2),
                     [_data(36, (3, 4)), probs])


def test_nll_and_mse():
    target = np.array([0, 3, 1, -100])
    check_equivalent(lambda x, t: F.nll_loss(F.log_softmax(x), t), [_data(37, (4, 4))], consts=[target])
    check_equivalent(lambda x, y: F.mse_loss(x, y), [_data(38, (3, 2)), _data(39, (3, 2))])
    check_equivalent(lambda x, y: F.mse_loss(x, y, reduction="none"), [_data(40, (3, 2)), _data(41, (1, 2))])
