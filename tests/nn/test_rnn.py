"""torch's recurrent layers (``neural_arch.nn.rnn``): ``RNN`` (tanh and relu), ``LSTM`` (with and without
projections), ``GRU`` and the three cells, against the float64 NumPy references of tests/nn/rnn_references.py
(written from torch's documented equations).

Values within 1e-10 in float64 (2e-5 in float32) over layers, directions, ``batch_first``, bias, unbatched
inputs, a given or a zero initial state; gradients of the input, the initial state and every parameter
against central finite differences of the reference (every array along random directions in the property
test, every element in the small pinned cases). Then torch's parameter names and shapes (written out by
hand), its initialisation, dropout between layers, and torch's errors for bad arguments and inputs.
"""

from __future__ import annotations

import doctest
import importlib
import math
import warnings

import numpy as np
import pytest
import rnn_references as R
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor
from neural_arch.core.rng import numpy_generator
from neural_arch.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase

MODES = ["RNN_TANH", "RNN_RELU", "LSTM", "GRU"]


def _layer(mode, input_size, hidden_size, dtype=np.float64, **kw):
    if mode.startswith("RNN"):
        return RNN(input_size, hidden_size, nonlinearity="tanh" if mode == "RNN_TANH" else "relu", dtype=dtype, **kw)
    return (LSTM if mode == "LSTM" else GRU)(input_size, hidden_size, dtype=dtype, **kw)


def _params(module):
    return {name: np.array(p.data, dtype=np.float64) for name, p in module.named_parameters()}


def _run(module, x, hx):
    """Our forward, its outputs flattened into a list: output, h_n (and c_n)."""
    out, state = module(x, hx)
    return [out] + (list(state) if isinstance(state, tuple) else [state])


def _ref_flat(mode, cfg, names, lstm_hx):
    """The reference as a function of (x, h0[, c0], *params) returning its outputs flattened the same way."""
    def f(x, *rest):
        n_state = 0 if not cfg["give_hx"] else (2 if lstm_hx else 1)
        state, weights = rest[:n_state], rest[n_state:]
        hx = None if not n_state else (tuple(state) if lstm_hx else state[0])
        out, s = R.ref_rnn(mode, x, hx, dict(zip(names, weights)), num_layers=cfg["layers"],
                           hidden_size=cfg["hidden"], bidirectional=cfg["bidir"], batch_first=cfg["batch_first"],
                           proj_size=cfg["proj"])
        return [out] + (list(s) if isinstance(s, tuple) else [s])
    return f


def _check_directional_grads(f_ref, arrays, got_grads, upstream, rng, eps=1e-6, tol=1e-6):
    """<grad_i, v> against the central difference of sum(f_ref * upstream) along a random v, per array."""
    def loss(arrs):
        return sum(float((o * u).sum()) for o, u in zip(f_ref(*arrs), upstream))
    for i, (a, g) in enumerate(zip(arrays, got_grads)):
        if a.size == 0:
            continue
        v = rng.standard_normal(a.shape)
        plus = [b + eps * v if j == i else b for j, b in enumerate(arrays)]
        minus = [b - eps * v if j == i else b for j, b in enumerate(arrays)]
        want = (loss(plus) - loss(minus)) / (2 * eps)
        got = float((np.zeros_like(a) if g is None else g * v).sum())
        assert abs(got - want) <= tol * (1 + abs(want)), f"array {i}: {got} != {want}"


layer_cases = st.fixed_dictionaries({
    "mode": st.sampled_from(MODES), "proj": st.sampled_from([0, 1]), "layers": st.integers(1, 2),
    "bidir": st.booleans(), "batch_first": st.booleans(), "bias": st.booleans(), "batched": st.booleans(),
    "give_hx": st.booleans(), "L": st.integers(1, 3), "N": st.integers(1, 2), "input": st.integers(1, 3),
    "hidden": st.integers(2, 3), "seed": st.integers(0, 2**16),
})


def _pin(**kw):
    case = {"mode": "LSTM", "proj": 0, "layers": 1, "bidir": False, "batch_first": False, "bias": True,
            "batched": True, "give_hx": True, "L": 2, "N": 2, "input": 2, "hidden": 2, "seed": 0}
    case.update(kw)
    return case


@settings(max_examples=20)
@given(layer_cases)
@example(_pin(mode="LSTM", proj=1, layers=2, bidir=True, batch_first=True)).via("projections feed the next layer")
@example(_pin(mode="GRU", layers=2, bidir=True, batched=False, give_hx=True)).via("unbatched with hx (D*L, H)")
@example(_pin(mode="RNN_RELU", bias=False, batched=False, batch_first=True, give_hx=False, L=3))\
    .via("batch_first is ignored for an unbatched input")
@example(_pin(mode="LSTM", proj=1, bidir=True, batched=False, batch_first=True, L=3))\
    .via("unbatched with batch_first and (h_0, c_0) given")
@example(_pin(mode="LSTM", bidir=True, give_hx=False, L=3)).via("h_n of the reverse direction is its state at t=0")
def test_layers_match_the_reference_values_and_gradients(case):
    mode, rng = case["mode"], np.random.default_rng(case["seed"])
    proj = case["proj"] if mode == "LSTM" else 0
    cfg = dict(case, proj=proj)
    kw = {"num_layers": case["layers"], "bias": case["bias"], "batch_first": case["batch_first"],
          "bidirectional": case["bidir"]}
    if mode == "LSTM":
        kw["proj_size"] = proj
    module = _layer(mode, case["input"], case["hidden"], **kw)
    D, L, N = 2 if case["bidir"] else 1, case["L"], case["N"]
    h_out = proj or case["hidden"]
    if case["batched"]:
        x_shape = (N, L, case["input"]) if case["batch_first"] else (L, N, case["input"])
        lead = (case["layers"] * D, N)
    else:
        x_shape, lead = (L, case["input"]), (case["layers"] * D,)
    x = rng.standard_normal(x_shape)
    states = []
    if case["give_hx"]:
        states = [rng.standard_normal(lead + (h_out,))]
        if mode == "LSTM":
            states.append(rng.standard_normal(lead + (case["hidden"],)))
    xt = Tensor(x.copy(), requires_grad=True)
    st_t = [Tensor(s.copy(), requires_grad=True) for s in states]
    hx = None if not states else (tuple(st_t) if mode == "LSTM" else st_t[0])
    ours = _run(module, xt, hx)

    params = _params(module)
    names = list(params)
    f_ref = _ref_flat(mode, cfg, names, mode == "LSTM")
    want = f_ref(x, *states, *params.values())
    assert [o.shape for o in ours] == [w.shape for w in want]
    for o, w in zip(ours, want):
        assert o.dtype == np.float64
        np.testing.assert_allclose(o.data, w, rtol=1e-10, atol=1e-10)

    upstream = [rng.standard_normal(w.shape) for w in want]
    sum((o * Tensor(u)).sum() for o, u in zip(ours, upstream)).backward()
    grads = [xt.grad] + [s.grad for s in st_t] + [dict(module.named_parameters())[n].grad for n in names]
    grads = [None if g is None else np.asarray(g.data) for g in grads]
    _check_directional_grads(f_ref, [x, *states, *params.values()], grads, upstream, rng)


@pytest.mark.parametrize("mode", MODES + ["LSTM_PROJ"])
def test_every_gradient_element_of_a_small_two_layer_bidirectional_stack(mode):
    """Every element of every gradient (not only random projections) on one small case per mode."""
    proj = 1 if mode == "LSTM_PROJ" else 0
    mode = "LSTM" if proj else mode
    cfg = {"layers": 2, "hidden": 2, "bidir": True, "batch_first": False, "proj": proj, "give_hx": True}
    kw = {"proj_size": proj} if mode == "LSTM" else {}
    module = _layer(mode, 2, 2, num_layers=2, bidirectional=True, **kw)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 1, 2))
    states = [rng.standard_normal((4, 1, proj or 2))] + ([rng.standard_normal((4, 1, 2))] if mode == "LSTM" else [])
    xt, st_t = Tensor(x.copy(), requires_grad=True), [Tensor(s.copy(), requires_grad=True) for s in states]
    ours = _run(module, xt, tuple(st_t) if mode == "LSTM" else st_t[0])
    params = _params(module)
    f_ref = _ref_flat(mode, cfg, list(params), mode == "LSTM")
    upstream = [rng.standard_normal(o.shape) for o in ours]
    sum((o * Tensor(u)).sum() for o, u in zip(ours, upstream)).backward()
    flat_up = np.concatenate([u.ravel() for u in upstream])
    arrays = [x, *states, *params.values()]
    want = R.central_differences(lambda *a: np.concatenate([o.ravel() for o in f_ref(*a)]), arrays, flat_up)
    got = [xt.grad, *[s.grad for s in st_t], *[p.grad for p in module.parameters()]]
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.data, w, rtol=1e-6, atol=1e-7, err_msg=f"array {i}")


@pytest.mark.parametrize("mode,steps", [("LSTM", 5), ("GRU", 11), ("RNN_TANH", 8)])
def test_longer_sequences_match_the_reference_values_and_gradients(mode, steps):
    """Past 4 steps the layers take the time steps by halving (cheap backward): every step still in place."""
    cfg = {"layers": 1, "hidden": 2, "bidir": True, "batch_first": True, "proj": 0, "give_hx": False}
    module = _layer(mode, 2, 2, bidirectional=True, batch_first=True)
    rng = np.random.default_rng(steps)
    x = rng.standard_normal((2, steps, 2))
    xt = Tensor(x.copy(), requires_grad=True)
    ours = _run(module, xt, None)
    params = _params(module)
    f_ref = _ref_flat(mode, cfg, list(params), mode == "LSTM")
    for o, w in zip(ours, f_ref(x, *params.values())):
        np.testing.assert_allclose(o.data, w, rtol=1e-10, atol=1e-10)
    upstream = [rng.standard_normal(o.shape) for o in ours]
    sum((o * Tensor(u)).sum() for o, u in zip(ours, upstream)).backward()
    (want,) = R.central_differences(lambda a: np.concatenate([o.ravel() for o in f_ref(a, *params.values())]), [x],
                                    np.concatenate([u.ravel() for u in upstream]))
    np.testing.assert_allclose(xt.grad.data, want, rtol=1e-6, atol=1e-7)
    _check_directional_grads(lambda *a: f_ref(x, *a), list(params.values()),
                             [np.asarray(p.grad.data) for p in module.parameters()], upstream, rng)


@pytest.mark.parametrize("mode", MODES + ["LSTM_PROJ"])
def test_float32_layers_match_the_float64_reference(mode):
    proj = 2 if mode == "LSTM_PROJ" else 0
    mode = "LSTM" if proj else mode
    kw = {"proj_size": proj} if proj else {}
    module = _layer(mode, 3, 4, dtype=np.float32, num_layers=2, bidirectional=True, **kw)
    x = np.random.default_rng(1).standard_normal((4, 3, 3)).astype(np.float32)
    ours = _run(module, x, None)
    out, s = R.ref_rnn(mode, x.astype(np.float64), None, _params(module), num_layers=2, hidden_size=4,
                       bidirectional=True, proj_size=proj)
    for o, w in zip(ours, [out] + (list(s) if isinstance(s, tuple) else [s])):
        assert o.dtype == np.float32
        np.testing.assert_allclose(o.data, w, rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------- cells
cell_cases = st.fixed_dictionaries({
    "mode": st.sampled_from(MODES), "bias": st.booleans(), "batched": st.booleans(), "give_hx": st.booleans(),
    "N": st.integers(0, 3), "input": st.integers(1, 3), "hidden": st.integers(1, 3), "seed": st.integers(0, 2**16),
})


@settings(max_examples=20)
@given(cell_cases)
@example({"mode": "LSTM", "bias": True, "batched": False, "give_hx": True, "N": 1, "input": 2, "hidden": 2,
          "seed": 0}).via("an unbatched (h, c) state")
@example({"mode": "GRU", "bias": False, "batched": True, "give_hx": False, "N": 0, "input": 2, "hidden": 2,
          "seed": 0}).via("an empty batch")
def test_cells_match_the_reference_values_and_gradients(case):
    mode, rng, H = case["mode"], np.random.default_rng(case["seed"]), case["hidden"]
    if mode.startswith("RNN"):
        cell = RNNCell(case["input"], H, case["bias"], "tanh" if mode == "RNN_TANH" else "relu", dtype=np.float64)
    else:
        cell = (LSTMCell if mode == "LSTM" else GRUCell)(case["input"], H, case["bias"], dtype=np.float64)
    lead = (case["N"],) if case["batched"] else ()
    x = rng.standard_normal(lead + (case["input"],))
    states = [rng.standard_normal(lead + (H,)) for _ in range(2 if mode == "LSTM" else 1)] if case["give_hx"] else []
    xt, st_t = Tensor(x.copy(), requires_grad=True), [Tensor(s.copy(), requires_grad=True) for s in states]
    hx = None if not states else (tuple(st_t) if mode == "LSTM" else st_t[0])
    got = cell(xt, hx)
    got = list(got) if isinstance(got, tuple) else [got]
    params = _params(cell)

    def f_ref(xa, *rest):
        state, w = rest[:len(states)], dict(zip(params, rest[len(states):]))
        xs = xa.reshape(-1, xa.shape[-1])
        hs = [s.reshape(-1, H) for s in state] or [np.zeros((xs.shape[0], H))] * 2
        outs = [R.ref_cell(mode, xs[b], hs[0][b], hs[-1][b], w["weight_ih"], w["weight_hh"], w.get("bias_ih"),
                           w.get("bias_hh")) for b in range(xs.shape[0])]
        h_new = np.array([o[0] for o in outs]).reshape(lead + (H,))
        if mode != "LSTM":
            return [h_new]
        return [h_new, np.array([o[1] for o in outs]).reshape(lead + (H,))]

    want = f_ref(x, *states, *params.values())
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.data, w, rtol=1e-10, atol=1e-10)
    upstream = [rng.standard_normal(w.shape) for w in want]
    sum((g * Tensor(u)).sum() for g, u in zip(got, upstream)).backward()
    grads = [xt.grad, *[s.grad for s in st_t], *[dict(cell.named_parameters())[n].grad for n in params]]
    _check_directional_grads(f_ref, [x, *states, *params.values()],
                             [None if g is None else np.asarray(g.data) for g in grads], upstream, rng)


@pytest.mark.parametrize("mode", MODES)
def test_a_cell_stepped_by_hand_equals_the_one_layer_module(mode):
    """The cell with the layer's weights, looped over time, gives the layer's output (same equations)."""
    layer = _layer(mode, 3, 4)
    nonlinearity = {"RNN_TANH": "tanh", "RNN_RELU": "relu"}
    cell = (RNNCell(3, 4, nonlinearity=nonlinearity[mode], dtype=np.float64) if mode in nonlinearity
            else (LSTMCell if mode == "LSTM" else GRUCell)(3, 4, dtype=np.float64))
    cell.load_state_dict({k[:-3]: v for k, v in layer.state_dict().items()})
    x = na.randn(5, 2, 3, dtype=na.float64)
    out, state = layer(x)
    h = None
    for t in range(5):
        h = cell(x[t], h)
        np.testing.assert_allclose((h[0] if mode == "LSTM" else h).data, out[t].data, rtol=1e-12, atol=1e-12)
    if mode == "LSTM":
        np.testing.assert_allclose(h[1].data, state[1][0].data, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- torch's parameters
# torch's state_dict keys and shapes, written out by hand from its documentation
TORCH_KEYS = {
    "lstm_2x_bidir_proj": (lambda: LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2), [
        ("weight_ih_l0", (16, 3)), ("weight_hh_l0", (16, 2)), ("bias_ih_l0", (16,)), ("bias_hh_l0", (16,)),
        ("weight_hr_l0", (2, 4)),
        ("weight_ih_l0_reverse", (16, 3)), ("weight_hh_l0_reverse", (16, 2)), ("bias_ih_l0_reverse", (16,)),
        ("bias_hh_l0_reverse", (16,)), ("weight_hr_l0_reverse", (2, 4)),
        ("weight_ih_l1", (16, 4)), ("weight_hh_l1", (16, 2)), ("bias_ih_l1", (16,)), ("bias_hh_l1", (16,)),
        ("weight_hr_l1", (2, 4)),
        ("weight_ih_l1_reverse", (16, 4)), ("weight_hh_l1_reverse", (16, 2)), ("bias_ih_l1_reverse", (16,)),
        ("bias_hh_l1_reverse", (16,)), ("weight_hr_l1_reverse", (2, 4))]),
    "lstm_no_bias_proj": (lambda: LSTM(3, 4, bias=False, proj_size=1), [
        ("weight_ih_l0", (16, 3)), ("weight_hh_l0", (16, 1)), ("weight_hr_l0", (1, 4))]),
    "gru_2x_no_bias": (lambda: GRU(5, 3, num_layers=2, bias=False), [
        ("weight_ih_l0", (9, 5)), ("weight_hh_l0", (9, 3)), ("weight_ih_l1", (9, 3)), ("weight_hh_l1", (9, 3))]),
    "rnn_bidir_relu": (lambda: RNN(2, 3, nonlinearity="relu", bidirectional=True), [
        ("weight_ih_l0", (3, 2)), ("weight_hh_l0", (3, 3)), ("bias_ih_l0", (3,)), ("bias_hh_l0", (3,)),
        ("weight_ih_l0_reverse", (3, 2)), ("weight_hh_l0_reverse", (3, 3)), ("bias_ih_l0_reverse", (3,)),
        ("bias_hh_l0_reverse", (3,))]),
    "gru_2x_bidir": (lambda: GRU(2, 3, num_layers=2, bidirectional=True), [
        ("weight_ih_l0", (9, 2)), ("weight_hh_l0", (9, 3)), ("bias_ih_l0", (9,)), ("bias_hh_l0", (9,)),
        ("weight_ih_l0_reverse", (9, 2)), ("weight_hh_l0_reverse", (9, 3)), ("bias_ih_l0_reverse", (9,)),
        ("bias_hh_l0_reverse", (9,)),
        ("weight_ih_l1", (9, 6)), ("weight_hh_l1", (9, 3)), ("bias_ih_l1", (9,)), ("bias_hh_l1", (9,)),
        ("weight_ih_l1_reverse", (9, 6)), ("weight_hh_l1_reverse", (9, 3)), ("bias_ih_l1_reverse", (9,)),
        ("bias_hh_l1_reverse", (9,))]),
    "lstm_cell": (lambda: LSTMCell(3, 2), [("weight_ih", (8, 3)), ("weight_hh", (8, 2)), ("bias_ih", (8,)),
                                            ("bias_hh", (8,))]),
    "gru_cell_no_bias": (lambda: GRUCell(3, 2, bias=False), [("weight_ih", (6, 3)), ("weight_hh", (6, 2))]),
    "rnn_cell": (lambda: RNNCell(3, 2), [("weight_ih", (2, 3)), ("weight_hh", (2, 2)), ("bias_ih", (2,)),
                                          ("bias_hh", (2,))]),
}


@pytest.mark.parametrize("which", sorted(TORCH_KEYS))
def test_state_dict_keys_and_shapes_are_torchs_and_torch_weights_load(which):
    build, expected = TORCH_KEYS[which]
    module = build()
    assert [(k, tuple(v.shape)) for k, v in module.state_dict().items()] == expected
    assert [name for name, _ in module.named_parameters()] == [k for k, _ in expected]
    # a torch checkpoint: the same names, arrays of those shapes
    rng = np.random.default_rng(0)
    torch_sd = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in expected}
    result = module.load_state_dict(torch_sd)
    assert not result.missing_keys and not result.unexpected_keys
    for k, v in module.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v.data if isinstance(v, Tensor) else v), torch_sd[k])


def test_all_weights_groups_follow_torch_layer_and_direction_order():
    lstm = LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2)
    names = [[n for n, p in lstm.named_parameters() if any(p is q for q in group)] for group in lstm.all_weights]
    assert names == [[f"{s}_l{k}{d}" for s in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")]
                     for k in range(2) for d in ("", "_reverse")]


@pytest.mark.parametrize("build", [lambda: LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2),
                                   lambda: RNN(2, 9), lambda: GRUCell(3, 16), lambda: RNNCell(2, 5, bias=False)])
def test_initialisation_is_torchs_uniform_drawn_in_registration_order_from_the_seeded_generator(build):
    na.manual_seed(123)
    module = build()
    na.manual_seed(123)
    gen = numpy_generator(None)
    k = 1 / math.sqrt(module.hidden_size)
    for name, p in module.named_parameters():
        assert p.dtype == np.float32 and p.requires_grad
        want = gen.uniform(-k, k, size=p.shape).astype(np.float32)
        np.testing.assert_array_equal(p.data, want, err_msg=name)


def test_repr_is_torchs():
    assert repr(LSTM(10, 20, 2)) == "LSTM(10, 20, num_layers=2)"
    assert repr(LSTM(3, 4, proj_size=2, bias=False, batch_first=True, dropout=0.5, num_layers=2,
                     bidirectional=True)) == ("LSTM(3, 4, proj_size=2, num_layers=2, bias=False, batch_first=True, "
                                              "dropout=0.5, bidirectional=True)")
    assert repr(RNN(3, 4, nonlinearity="relu")) == "RNN(3, 4)"          # torch does not show it either
    assert repr(GRU(3, 4)) == "GRU(3, 4)"
    assert repr(RNNCell(3, 4, nonlinearity="relu")) == "RNNCell(3, 4, nonlinearity=relu)"
    assert repr(LSTMCell(3, 4, bias=False)) == "LSTMCell(3, 4, bias=False)"
    assert repr(GRUCell(3, 4)) == "GRUCell(3, 4)"


# ----------------------------------------------------------------------------- dropout, train / eval
@pytest.mark.parametrize("mode", MODES)
def test_dropout_between_layers_only_in_training(mode):
    x = na.randn(4, 2, 3, dtype=na.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # two layers: no "dropout expects num_layers > 1" warning
        module = _layer(mode, 3, 4, num_layers=2, dropout=0.5)
    want = R.ref_rnn(mode, x.data, None, _params(module), num_layers=2, hidden_size=4)
    module.eval()
    for got, w in zip(_run(module, x, None), [want[0]] + (list(want[1]) if mode == "LSTM" else [want[1]])):
        np.testing.assert_allclose(got.data, w, rtol=1e-10, atol=1e-10)      # eval: as without dropout
    module.train()
    module.dropout = 1.0         # every unit of layer 0's output dropped: layer 1 reads zeros
    masks = [np.zeros((4, 2, 4))]
    want = R.ref_rnn(mode, x.data, None, _params(module), num_layers=2, hidden_size=4, dropout_masks=masks)
    got = _run(module, x, None)
    np.testing.assert_allclose(got[0].data, want[0], rtol=1e-10, atol=1e-10)
    if mode != "RNN_RELU":   # (relu of layer 1's biases alone may be all zero)
        assert np.abs(got[0].data).max() > 0   # no dropout after the last layer
    module.dropout = 0.0         # training with dropout=0 is the plain forward
    np.testing.assert_allclose(_run(module, x, None)[0].data,
                               R.ref_rnn(mode, x.data, None, _params(module), num_layers=2, hidden_size=4)[0],
                               rtol=1e-10, atol=1e-10)


def test_dropout_in_training_draws_from_the_seeded_generator_and_scales_the_kept_units():
    module = GRU(3, 5, num_layers=2, dropout=0.5, dtype=np.float64)
    x = na.randn(4, 2, 3, dtype=na.float64)
    na.manual_seed(5)
    a = module(x)[0].data
    na.manual_seed(5)
    b = module(x)[0].data
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, module.eval()(x)[0].data)


def test_dropout_with_one_layer_warns_like_torch():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        LSTM(3, 4, dropout=0.2)


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("mode", MODES)
def test_batch_first_is_the_transpose_of_time_first(mode):
    a = _layer(mode, 3, 4, num_layers=2, bidirectional=True)
    b = _layer(mode, 3, 4, num_layers=2, bidirectional=True, batch_first=True)
    b.load_state_dict(a.state_dict())
    x = na.randn(5, 2, 3, dtype=na.float64)
    ra, rb = _run(a, x, None), _run(b, x.transpose(0, 1), None)
    np.testing.assert_allclose(rb[0].data, ra[0].data.transpose(1, 0, 2), rtol=1e-13, atol=1e-13)
    for u, v in zip(ra[1:], rb[1:]):     # batch_first does not apply to the states
        np.testing.assert_allclose(u.data, v.data, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", MODES)
def test_zero_initial_state_equals_omitted_and_an_empty_batch_has_torchs_shapes(mode):
    module = _layer(mode, 3, 4, num_layers=2, bidirectional=True)
    x = na.randn(3, 2, 3, dtype=na.float64)
    zeros = na.zeros(4, 2, 4, dtype=na.float64)
    given_ = _run(module, x, (zeros, zeros) if mode == "LSTM" else zeros)
    for u, v in zip(_run(module, x, None), given_):
        np.testing.assert_array_equal(u.data, v.data)
    empty = _run(module, na.randn(3, 0, 3, dtype=na.float64), None)
    assert [tuple(t.shape) for t in empty] == [(3, 0, 8)] + [(4, 0, 4)] * (len(empty) - 1)


def test_output_and_state_dtype_and_device_follow_the_input():
    out, (h, c) = LSTM(3, 4)(na.randn(2, 1, 3))
    assert out.dtype == h.dtype == c.dtype == np.float32
    assert out.device == h.device == "cpu"


# ----------------------------------------------------------------------------- torch's errors
@pytest.mark.parametrize("build,args,error,match", [
    (lambda: RNN(3, 4), (na.ones(2, 1, 1, 3),), ValueError, "RNN: Expected input to be 2D or 3D, got 4D tensor"),
    (lambda: LSTM(3, 4), (na.ones(3),), ValueError, "LSTM: Expected input to be 2D or 3D, got 1D instead"),
    (lambda: GRU(3, 4), (na.ones(2, 1, 5),), RuntimeError, "input.size.-1. must be equal to input_size. Expected 3"),
    (lambda: GRU(3, 4), (na.ones(2, 1, 3, dtype=na.float64),), ValueError, "input must have the type float32"),
    (lambda: RNN(3, 4), (na.ones(2, 2, 3), na.zeros(1, 3, 4)), RuntimeError,
     r"Expected hidden size \(1, 2, 4\), got \[1, 3, 4\]"),
    (lambda: RNN(3, 4), (na.ones(2, 2, 3), na.zeros(2, 4)), RuntimeError, "For batched 3-D input, hx should also"),
    (lambda: GRU(3, 4), (na.ones(2, 3), na.zeros(1, 1, 4)), RuntimeError, "For unbatched 2-D input, hx should"),
    (lambda: LSTM(3, 4), (na.ones(2, 3), (na.zeros(1, 4), na.zeros(1, 1, 4))), RuntimeError,
     r"hx and cx should also be 2-D but got \(2-D, 3-D\)"),
    (lambda: LSTM(3, 4, proj_size=2), (na.ones(2, 1, 3), (na.zeros(1, 1, 4), na.zeros(1, 1, 4))), RuntimeError,
     r"Expected hidden\[0\] size \(1, 1, 2\), got \[1, 1, 4\]"),
    (lambda: LSTM(3, 4, proj_size=2), (na.ones(2, 1, 3), (na.zeros(1, 1, 2), na.zeros(1, 1, 2))), RuntimeError,
     r"Expected hidden\[1\] size \(1, 1, 4\), got \[1, 1, 2\]"),
    (lambda: LSTM(3, 4), (na.ones(2, 1, 3), na.zeros(1, 1, 4)), TypeError, r"hx must be a tuple \(h_0, c_0\)"),
    (lambda: GRU(3, 4), (na.ones(0, 2, 3),), RuntimeError, "Expected sequence length to be larger than 0"),
    (lambda: GRU(3, 4), (na.ones(2, 2, 3), na.zeros(1, 2, 4, dtype=na.float64)), RuntimeError,
     "hx must have the type float32"),
    (lambda: GRU(3, 4), ([[1.0, 2.0, 3.0]],), TypeError, "packed sequences"),
    (lambda: RNNCell(3, 4), (na.ones(1, 1, 3),), ValueError, "RNNCell: Expected input to be 1D or 2D, got 3D"),
    (lambda: GRUCell(3, 4), (na.ones(2, 5),), RuntimeError, "input has inconsistent input_size: got 5 expected 3"),
    (lambda: GRUCell(3, 4), (na.ones(2, 3), na.zeros(3, 4)), RuntimeError,
     "Input batch size 2 doesn't match hidden batch size 3"),
    (lambda: LSTMCell(3, 4), (na.ones(2, 3), (na.zeros(2, 4), na.zeros(2, 5))), RuntimeError,
     "hidden1 has inconsistent hidden_size: got 5, expected 4"),
    (lambda: LSTMCell(3, 4), (na.ones(2, 3), (na.zeros(2, 4), na.zeros(1, 2, 4))), ValueError,
     r"Expected hx\[1\] to be 1D or 2D, got 3D"),
    (lambda: RNNCell(3, 4), (na.ones(3), na.zeros(1, 4)), RuntimeError, "a 1-D input needs 1-D hidden"),
    (lambda: RNNCell(3, 4), (na.ones(1, 3, dtype=na.float64),), RuntimeError, "input must have the type float32"),
    (lambda: RNNCell(3, 4, nonlinearity="gelu"), (na.ones(1, 3),), RuntimeError, "Unknown nonlinearity: gelu"),
])
def test_bad_inputs_raise_torchs_errors(build, args, error, match):
    with pytest.raises(error, match=match):
        build()(*args)


@pytest.mark.parametrize("build,error,match", [
    (lambda: RNN(3, 4, nonlinearity="gelu"), ValueError, "Unknown nonlinearity 'gelu'. Select from 'tanh' or 'relu'"),
    (lambda: RNN(3, 4, proj_size=2), ValueError, "proj_size argument is only supported for LSTM"),
    (lambda: GRU(3, 4, proj_size=2), ValueError, "proj_size argument is only supported for LSTM"),
    (lambda: GRU(3, 4, projsize=2), TypeError, "unexpected keyword argument 'projsize'"),
    (lambda: LSTM(3, 4, proj_size=4), ValueError, "proj_size has to be smaller than hidden_size"),
    (lambda: LSTM(3, 4, proj_size=-1), ValueError, "proj_size should be a positive integer or zero"),
    (lambda: LSTM(3, 4.0), TypeError, "hidden_size should be of type int, got: float"),
    (lambda: LSTM(3, 0), ValueError, "hidden_size must be greater than zero"),
    (lambda: GRU(3, 4, num_layers=0), ValueError, "num_layers must be greater than zero"),
    (lambda: GRU(3, 4, num_layers=2, dropout=1.5), ValueError, "dropout should be a number in range"),
    (lambda: GRU(3, 4, num_layers=2, dropout=True), ValueError, "dropout should be a number in range"),
    (lambda: RNNBase("SRU", 3, 4), ValueError, "Unrecognized RNN mode: SRU"),
    (lambda: RNNCellBase(3, -1, True, 1), RuntimeError, "must be non-negative"),
])
def test_bad_constructor_arguments_raise_torchs_errors(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_nonlinearity_is_the_fourth_positional_argument_of_rnn_as_in_torch():
    rnn = RNN(3, 4, 1, "relu", False)
    assert rnn.nonlinearity == "relu" and rnn.mode == "RNN_RELU" and not rnn.bias
    assert [n for n, _ in rnn.named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]


def test_flatten_parameters_and_the_check_methods_exist_for_ported_scripts():
    lstm = LSTM(3, 4, num_layers=2, proj_size=2)
    lstm.flatten_parameters()
    x = na.ones(5, 6, 3)
    assert lstm.get_expected_hidden_size(x) == (2, 6, 2) and lstm.get_expected_cell_size(x) == (2, 6, 4)
    lstm.check_forward_args(x, (na.zeros(2, 6, 2), na.zeros(2, 6, 4)))


@pytest.mark.parametrize("name", ["neural_arch.nn.rnn", "rnn_references"])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0 and result.attempted > 0, f"{result.failed} docstring example(s) failed in {name}"
