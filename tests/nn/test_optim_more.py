"""RMSprop, Adagrad, LAMB, LARS and Adafactor against independent float64 re-statements of
torch.optim's documented algorithms (LAMB/LARS: the papers), the multi-tensor (foreach) path
against the per-tensor path, and state_dict resume."""

import math

import numpy as np
import pytest
from optim_references import rmsprop_ref

from neural_arch import nn, optim
from neural_arch.core.tensor import Tensor

STEPS = 4
SHAPES = [(3, 4), (5,), (2, 3, 2), ()]


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    p0 = [rng.normal(size=s) for s in SHAPES]
    grads = [[rng.normal(size=s) for s in SHAPES] for _ in range(STEPS)]
    return p0, grads


def _run(factory, p0, grads, steps=None):
    ps = [nn.Parameter(np.array(x, dtype=np.float64)) for x in p0]
    opt = factory(ps)
    for gs in grads[:steps]:
        for p, g in zip(ps, gs):
            p.grad = Tensor(np.array(g))
        opt.step()
    return ps, opt


# ------------------------------------------------------------------ references (one tensor, float64)


def adagrad_ref(p, grads, lr, lr_decay=0.0, wd=0.0, init=0.0, eps=1e-10, maximize=False):
    p = p.copy(); s = np.full_like(p, init)
    for t, g in enumerate(grads, start=1):
        g = -g if maximize else g
        g = g + wd * p
        clr = lr / (1 + (t - 1) * lr_decay)
        s = s + g * g
        p = p - clr * g / (np.sqrt(s) + eps)
    return p


def lamb_ref(p, grads, lr, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, bias_correction=True):
    p = p.copy(); m = np.zeros_like(p); v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        c1, c2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1, 1)
        u = (m / c1) / (np.sqrt(v / c2) + eps) + wd * p
        wn, un = np.linalg.norm(p), np.linalg.norm(u)
        trust = wn / un if wn > 0 and un > 0 else 1.0
        p = p - lr * trust * u
    return p


def lars_ref(p, grads, lr, momentum=0.0, dampening=0.0, wd=0.0, nesterov=False, tc=1e-3, eps=1e-8):
    p = p.copy(); buf = None
    for g in grads:
        wn, gn = np.linalg.norm(p), np.linalg.norm(g)
        local = tc * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 and tc else 1.0
        d = local * (g + wd * p)
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + (1 - dampening) * d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def adafactor_ref(p, grads, lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, wd=0.0, maximize=False):
    """torch.optim.Adafactor (torch 2.5 docs, 'Note' on eps1 placement)."""
    p = p.copy()
    e1 = np.finfo(p.dtype).eps if eps[0] is None else eps[0]
    R = C = V = None
    for t, g in enumerate(grads, start=1):
        g = -g if maximize else g
        w = t ** beta2_decay  # 1 - beta2_t
        rms_p = math.sqrt(np.mean(p * p)) if p.size else 0.0
        alpha = max(eps[1], rms_p) * min(lr, 1 / math.sqrt(t))
        p = p * (1 - lr * wd)
        if p.ndim > 1:
            r, c = (g * g).mean(-1, keepdims=True), (g * g).mean(-2, keepdims=True)
            R = r if R is None else (1 - w) * R + w * r
            C = c if C is None else (1 - w) * C + w * c
            vhat = R * C / np.maximum(R.mean(-2, keepdims=True), e1)
        else:
            V = g * g if V is None else (1 - w) * V + w * g * g
            vhat = V
        U = g / np.maximum(np.sqrt(vhat), e1)
        rms_u = math.sqrt(np.mean(U * U))
        p = p - alpha / max(1.0, rms_u / d) * U
    return p


CASES = [
    (lambda ps, **k: optim.RMSprop(ps, **k), rmsprop_ref, {"lr": 0.01}),
    (lambda ps, **k: optim.RMSprop(ps, **k), rmsprop_ref,
     {"lr": 0.01, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "momentum": 0.8, "centered": True, "maximize": True}),
    (lambda ps, **k: optim.RMSprop(ps, **k), rmsprop_ref, {"lr": 0.02, "momentum": 0.5}),
    (lambda ps, **k: optim.Adagrad(ps, **k), adagrad_ref, {"lr": 0.1}),
    (lambda ps, **k: optim.Adagrad(ps, **k), adagrad_ref,
     {"lr": 0.1, "lr_decay": 0.3, "weight_decay": 0.2, "initial_accumulator_value": 0.5, "eps": 1e-6, "maximize": True}),
    (lambda ps, **k: optim.LAMB(ps, **k), lamb_ref, {"lr": 0.05, "weight_decay": 0.01}),
    (lambda ps, **k: optim.LAMB(ps, **k), lamb_ref, {"lr": 0.05, "betas": (0.8, 0.99), "bias_correction": False}),
    (lambda ps, **k: optim.LARS(ps, **k), lars_ref, {"lr": 0.5, "trust_coefficient": 0.01}),
    (lambda ps, **k: optim.LARS(ps, **k), lars_ref,
     {"lr": 0.5, "momentum": 0.9, "weight_decay": 1e-2, "nesterov": True, "trust_coefficient": 0.02}),
    (lambda ps, **k: optim.LARS(ps, **k), lars_ref, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "trust_coefficient": 0.0}),
]
_REF_KW = {"weight_decay": "wd", "initial_accumulator_value": "init", "trust_coefficient": "tc",
           "betas": None}


def _ref_kwargs(kw):
    out = {}
    for k, v in kw.items():
        if k == "betas":
            out["b1"], out["b2"] = v
        else:
            out[_REF_KW.get(k, k)] = v
    return out


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("factory, ref, kw", CASES)
def test_update_matches_reference(factory, ref, kw, foreach):
    p0, grads = _setup()
    ps, _ = _run(lambda ps: factory(ps, foreach=foreach, **kw), p0, grads)
    for i, p in enumerate(ps):
        want = ref(p0[i], [g[i] for g in grads], **_ref_kwargs(kw))
        np.testing.assert_allclose(p.data, want, rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")


@pytest.mark.parametrize("kw", [{}, {"lr": 0.05, "weight_decay": 0.1, "maximize": True, "d": 1.5, "eps": (1e-20, 1e-2)},
                                {"lr": 0.3, "beta2_decay": -0.5}])
def test_adafactor_matches_torch_algorithm(kw):
    p0, grads = _setup(1)
    ps, opt = _run(lambda ps: optim.Adafactor(ps, **kw), p0, grads)
    ref_kw = {("wd" if k == "weight_decay" else k): v for k, v in kw.items()}
    for i, p in enumerate(ps):
        np.testing.assert_allclose(p.data, adafactor_ref(p0[i], [g[i] for g in grads], **ref_kw),
                                   rtol=1e-12, atol=1e-14, err_msg=f"param {i} {SHAPES[i]}")
    # Factored state: O(rows + cols) for the matrix, a full-size variance for the vector.
    assert opt.state[ps[0]]["row_var"].shape == (3, 1) and opt.state[ps[0]]["col_var"].shape == (1, 4)
    assert opt.state[ps[2]]["row_var"].shape == (2, 3, 1) and opt.state[ps[2]]["col_var"].shape == (2, 1, 2)
    assert opt.state[ps[1]]["variance"].shape == (5,)


def test_adafactor_first_step_by_hand():
    # Step 1: w = 1, so V = g*g exactly, U = sign(g), RMS(U) = 1; alpha = max(1e-3, RMS(p)) * lr.
    p = nn.Parameter(np.array([3.0, -4.0]))  # RMS = sqrt(12.5)
    p.grad = Tensor(np.array([0.5, -2.0]))
    optim.Adafactor([p], lr=0.1).step()
    np.testing.assert_allclose(p.data, [3.0 - 0.1 * math.sqrt(12.5), -4.0 + 0.1 * math.sqrt(12.5)], rtol=1e-12)


def test_lamb_and_lars_first_step_by_hand():
    # LAMB step 1 with bias correction: r = g/|g| elementwise (eps tiny); trust = |p| / |r|.
    p = nn.Parameter(np.array([3.0, 4.0]))
    p.grad = Tensor(np.array([1.0, -1.0]))
    optim.LAMB([p], lr=0.1, eps=0.0).step()
    np.testing.assert_allclose(p.data, [3.0 - 0.1 * 5 / math.sqrt(2), 4.0 + 0.1 * 5 / math.sqrt(2)], rtol=1e-12)
    # LARS: local = tc * |p| / |g| = 0.5 * 5 / 10; p -= lr * local * g.
    q = nn.Parameter(np.array([3.0, 4.0]))
    q.grad = Tensor(np.array([6.0, 8.0]))
    optim.LARS([q], lr=1.0, trust_coefficient=0.5, eps=0.0).step()
    np.testing.assert_allclose(q.data, [3.0 - 0.25 * 6, 4.0 - 0.25 * 8], rtol=1e-12)


ALL = [
    lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.9, centered=True),
    lambda ps: optim.Adagrad(ps, lr=0.1, lr_decay=0.1),
    lambda ps: optim.LAMB(ps, lr=0.01, weight_decay=0.01),
    lambda ps: optim.LARS(ps, lr=0.1, momentum=0.9),
    lambda ps: optim.Adafactor(ps, weight_decay=0.01),
]


@pytest.mark.parametrize("factory", ALL)
def test_state_dict_resume_is_exact(factory):
    p0, grads = _setup(2)
    full, _ = _run(factory, p0, grads)
    half, opt = _run(factory, p0, grads, steps=2)
    sd = opt.state_dict()
    ps = [nn.Parameter(p.data.copy()) for p in half]
    opt2 = factory(ps)
    opt2.load_state_dict(sd)
    for gs in grads[2:]:
        for p, g in zip(ps, gs):
            p.grad = Tensor(np.array(g))
        opt2.step()
    for a, b in zip(ps, full):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-13, atol=1e-15)
    # The saved state is a copy: stepping on does not change it.
    assert all(isinstance(v, (int, float, np.ndarray)) for st in sd["state"].values() for v in st.values())


def test_foreach_state_is_per_parameter_and_survives_missing_grads():
    p0, grads = _setup(3)
    ps, opt = _run(lambda ps: optim.RMSprop(ps, lr=0.01, momentum=0.5), p0, grads, steps=1)
    assert [opt.state[p]["square_avg"].shape for p in ps] == [tuple(s) for s in SHAPES]
    # Parameter 1 misses a step: the group's step counts now differ, and the update still matches
    # the per-parameter references (per-tensor fallback).
    for i, p in enumerate(ps):
        p.grad = None if i == 1 else Tensor(np.array(grads[1][i]))
    opt.step()
    for i, p in enumerate(ps):
        p.grad = Tensor(np.array(grads[2][i]))
    opt.step()
    for i, p in enumerate(ps):
        seq = [grads[0][i], grads[2][i]] if i == 1 else [grads[0][i], grads[1][i], grads[2][i]]
        np.testing.assert_allclose(p.data, rmsprop_ref(p0[i], seq, 0.01, momentum=0.5), rtol=1e-12, atol=1e-14)


def test_foreach_writes_parameters_in_place():
    ps = [nn.Parameter(np.ones((2, 2))), nn.Parameter(np.ones(3))]
    arrays = [p.data for p in ps]
    for p in ps:
        p.grad = Tensor(np.ones_like(p.data))
    optim.Adagrad(ps, lr=0.1).step()
    assert all(p.data is a for p, a in zip(ps, arrays))
    np.testing.assert_allclose(arrays[1], 0.9)


@pytest.mark.parametrize("bad, match", [
    (lambda ps: optim.RMSprop(ps, lr=-1), "RMSprop: invalid lr"),
    (lambda ps: optim.Adagrad(ps, lr_decay=-1), "Adagrad: invalid lr_decay"),
    (lambda ps: optim.LAMB(ps, betas=(1.0, 0.9)), "LAMB: betas"),
    (lambda ps: optim.LARS(ps, lr=0.1, nesterov=True), "LARS: nesterov"),
    (lambda ps: optim.Adafactor(ps, d=0.5), "Adafactor: the clipping threshold"),
    (lambda ps: optim.Adafactor(ps, beta2_decay=0.5), "beta2_decay"),
])
def test_bad_hyper_parameters_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        bad([nn.Parameter(np.ones(2))])


def test_adafactor_rejects_state_of_another_shape():
    w = nn.Parameter(np.ones((3, 4)))
    w.grad = Tensor(np.ones((3, 4)))
    opt = optim.Adafactor([w])
    opt.step()
    sd = opt.state_dict()
    other = optim.Adafactor([nn.Parameter(np.ones((4, 3)))])
    with pytest.raises(ValueError, match="row_var"):
        other.load_state_dict(sd)


@pytest.mark.parametrize("foreach", [None, True])
def test_default_foreach_splits_small_and_large_tensors(foreach):
    # foreach=None: the 20000-element tensor is updated on its own, the small ones flat; both
    # follow the reference, and only the small ones' state lives in the shared flat vectors.
    rng = np.random.default_rng(4)
    shapes = [(200, 100), (3, 4), (5,)]
    p0 = [rng.normal(size=s) for s in shapes]
    grads = [[rng.normal(size=s) for s in shapes] for _ in range(3)]
    ps, opt = _run(lambda ps: optim.LAMB(ps, lr=0.05, weight_decay=0.01, foreach=foreach), p0, grads)
    for i, p in enumerate(ps):
        np.testing.assert_allclose(p.data, lamb_ref(p0[i], [g[i] for g in grads], 0.05, wd=0.01),
                                   rtol=1e-12, atol=1e-14)
    big_is_view = opt.state[ps[0]]["exp_avg"].base is not None
    assert big_is_view == (foreach is True)
    assert opt.state[ps[1]]["exp_avg"].base is not None


def test_zero_norms_give_trust_one_without_dividing_by_zero():
    w = nn.Parameter(np.zeros(3))  # ||p|| = 0: LAMB and LARS fall back to ratio 1
    w.grad = Tensor(np.ones(3))
    optim.LARS([w], lr=0.5, trust_coefficient=0.1, eps=0.0).step()
    np.testing.assert_allclose(w.data, -0.5)
    z = nn.Parameter(np.ones(2))
    z.grad = Tensor(np.zeros(2))  # ||g|| = 0 and eps = 0
    optim.LARS([z], lr=0.5, eps=0.0).step()
    np.testing.assert_allclose(z.data, 1.0)
    for fe in (False, True):
        ps = [nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(3))]
        for p in ps:
            p.grad = Tensor(np.ones_like(p.data))
        optim.LAMB(ps, lr=0.1, eps=0.0, foreach=fe).step()
        assert all(np.allclose(p.data, -0.1) for p in ps)


@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples():
    import doctest
    import importlib

    for name in ("rmsprop", "adagrad", "lamb", "lars", "adafactor", "_multi_tensor", "lr_scheduler"):
        module = importlib.import_module(f"neural_arch.optim.{name}")
        assert doctest.testmod(module, verbose=False).failed == 0, name
