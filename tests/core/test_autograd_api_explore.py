"""Exploring properties of the autograd API around the ops, against analytic float64 NumPy
references: ``Tensor.backward(gradient=, retain_graph=, inputs=)``, ``.grad`` accumulation over
several backward calls, ``register_hook`` on leaves and non-leaves (the returned tensor replaces
the gradient; removal through the handle), ``retain_grad()``, ``requires_grad`` / ``is_leaf`` /
``grad_fn`` through ops with some inputs constant, ``detach`` / ``requires_grad_``, and torch's
errors for misuse (second backward without ``retain_graph``, a non-scalar output without a
gradient, a hook that changes the dtype...). Shapes with size-1 and empty dims, broadcasting,
float32 and float64.

Example of what one property checks::

    >>> import numpy as np
    >>> from neural_arch import Tensor
    >>> x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    >>> y = x * 3
    >>> _ = y.register_hook(lambda g: g * 10)     # the hook's result replaces y's gradient
    >>> y.retain_grad()
    >>> y.backward(gradient=np.array([1.0, 1.0]), retain_graph=True)
    >>> y.backward(gradient=np.array([1.0, 1.0]))  # .grad accumulates over the two calls
    >>> x.grad.tolist(), y.grad.tolist()
    ([60.0, 60.0], [20.0, 20.0])
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import Tensor

TOL = {np.float64: 1e-10, np.float32: 3e-5}


def _close(got, want, dtype, what=""):
    got = None if got is None else np.asarray(got.data if isinstance(got, Tensor) else got, dtype=np.float64)
    assert (got is None) == (want is None), f"{what}: got {got}, want {want}"
    if want is None:
        return
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=what)


def _unbroadcast(g, shape):
    """Sum ``g`` down to ``shape`` (the gradient of a broadcast input), NumPy only."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


@st.composite
def broadcast_case(draw):
    """(x shape, w shape broadcastable to it): size-1 and empty dims, w of fewer dims."""
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 3), min_size=ndim, max_size=ndim)))
    wdim = draw(st.integers(0, ndim))
    wshape = tuple(n if draw(st.booleans()) else 1 for n in shape[ndim - wdim:])
    return shape, wshape


GRADIENT_KINDS = ["same_tensor", "other_float_tensor", "ndarray_float32", "ndarray_int"]


@settings(max_examples=30)
@given(
    case=broadcast_case(),
    dtype=st.sampled_from([np.float64, np.float32]),
    w_requires_grad=st.booleans(),
    calls=st.integers(1, 3),
    leaf_hook=st.sampled_from([None, 2.0, -0.5]),
    mid_hook=st.sampled_from([None, 3.0]),
    retain_first=st.booleans(),
    inputs=st.sampled_from([None, "x", "w", "y", "x_y", "x_w"]),
    gradient_kind=st.sampled_from(GRADIENT_KINDS),
    seed=st.integers(0, 2**16),
)
# a float32 gradient into a float64 graph: the gradient took the output's dtype only at the leaves,
# so `0.1 * x`'s backward ran in float32 (relative error ~1e-8; torch casts the gradient first)
@example(case=((3,), (3,)), dtype=np.float64, w_requires_grad=True, calls=1, leaf_hook=None,
         mid_hook=None, retain_first=False, inputs=None, gradient_kind="other_float_tensor", seed=1)
# size-1 and 0-d shapes, every option on, a non-leaf in inputs
@example(case=((1, 3), ()), dtype=np.float32, w_requires_grad=True, calls=3, leaf_hook=-0.5,
         mid_hook=3.0, retain_first=True, inputs="x_y", gradient_kind="ndarray_int", seed=2)
@example(case=((), ()), dtype=np.float64, w_requires_grad=False, calls=2, leaf_hook=2.0,
         mid_hook=3.0, retain_first=False, inputs="y", gradient_kind="same_tensor", seed=3)
def test_backward_options_hooks_and_accumulation_match_analytic(
        case, dtype, w_requires_grad, calls, leaf_hook, mid_hook, retain_first, inputs, gradient_kind, seed):
    """y = tanh(x * w) + exp(x) * c + 0.1 * x, backward(gradient=G) ``calls`` times: every .grad
    (leaves, a retained non-leaf, backward(inputs=...)) equals the analytic value, with the hooks'
    replacements applied once per backward, whatever order retain_grad and register_hook came in."""
    shape, wshape = case
    if inputs in ("w", "x_w") and not w_requires_grad:
        inputs = "x"
    rng = np.random.default_rng(seed)
    xa = rng.standard_normal(shape).astype(dtype)
    wa = rng.standard_normal(wshape).astype(dtype)
    ca = rng.standard_normal(shape).astype(dtype)
    ga = rng.standard_normal(shape)
    if gradient_kind == "ndarray_int":
        ga = np.round(ga * 3)

    x = Tensor(xa, requires_grad=True)
    w = Tensor(wa, requires_grad=w_requires_grad)
    c = Tensor(ca)
    y = (x * w).tanh() + x.exp() * c + 0.1 * x
    assert y.requires_grad and not y.is_leaf and y.grad_fn is not None
    assert c.is_leaf and c.grad_fn is None and not c.requires_grad
    if retain_first:
        y.retain_grad()
    if mid_hook is not None:
        y.register_hook(lambda g: g * mid_hook)
    if not retain_first:
        y.retain_grad()
    if leaf_hook is not None:
        x.register_hook(lambda g: g * leaf_hook)
    # a hook registered then removed must never run
    x.register_hook(lambda g: g * 1000.0).remove()

    if gradient_kind == "same_tensor":
        gradient = Tensor(ga.astype(dtype))
    elif gradient_kind == "other_float_tensor":
        gradient = Tensor(ga.astype(np.float32 if dtype == np.float64 else np.float64))
    elif gradient_kind == "ndarray_float32":
        gradient = ga.astype(np.float32)
    else:
        gradient = ga.astype(np.int64)
    g_used = np.asarray(gradient.data if isinstance(gradient, Tensor) else gradient).astype(dtype)

    chosen = {"x": [x], "w": [w], "y": [y], "x_y": [x, y], "x_w": [x, w], None: None}[inputs]
    for i in range(calls):
        y.backward(gradient=gradient, retain_graph=i < calls - 1, inputs=chosen)

    x64, w64, c64, g64 = (a.astype(np.float64) for a in (xa, wa, ca, g_used))
    t = np.tanh(x64 * w64)
    gy = g64 * (mid_hook if mid_hook is not None else 1.0)
    dx = gy * ((1 - t * t) * w64 + np.exp(x64) * c64 + 0.1) * (leaf_hook if leaf_hook is not None else 1.0)
    dw = _unbroadcast(gy * (1 - t * t) * x64, wshape)
    names = None if inputs is None else set(inputs.split("_"))
    gets = lambda name: names is None or name in names
    _close(x.grad, calls * dx if gets("x") else None, dtype, "x.grad")
    _close(w.grad, calls * dw if w_requires_grad and gets("w") else None, dtype, "w.grad")
    _close(y.grad, calls * gy, dtype, "y.grad (retained)")
    assert c.grad is None
    for tensor in (x, w, y):
        assert tensor.grad is None or tensor.grad.dtype == dtype


OPS = {
    "add": (lambda a, b: a + b, lambda a, b, g: (g, g)),
    "sub": (lambda a, b: a - b, lambda a, b, g: (g, -g)),
    "mul": (lambda a, b: a * b, lambda a, b, g: (g * b, g * a)),
    "div": (lambda a, b: a / b, lambda a, b, g: (g / b, -g * a / (b * b))),
    "matmul": (lambda a, b: a @ b, lambda a, b, g: (g @ b.T, a.T @ g)),
}


@settings(max_examples=25)
@given(
    op=st.sampled_from(sorted(OPS)),
    mask=st.sampled_from([(True, False), (False, True), (True, True), (False, False)]),
    grad_mode=st.booleans(),
    n=st.integers(1, 3),
    dtype=st.sampled_from([np.float64, np.float32]),
    seed=st.integers(0, 2**16),
)
@example(op="matmul", mask=(False, True), grad_mode=True, n=1, dtype=np.float64, seed=0)
def test_requires_grad_leafness_and_gradients_with_some_inputs_constant(op, mask, grad_mode, n, dtype, seed):
    """An op's output requires grad iff grad mode is on and some input does; it is a leaf
    (``grad_fn`` None) iff it does not; only the inputs that require grad get a gradient, equal to
    the analytic one (then reduced by ``.sum()`` / ``.mean()``)."""
    rng = np.random.default_rng(seed)
    aa = rng.standard_normal((n, n)).astype(dtype)
    ba = (rng.uniform(0.5, 2.0, (n, n)) * rng.choice([-1, 1], (n, n))).astype(dtype)
    a, b = Tensor(aa, requires_grad=mask[0]), Tensor(ba, requires_grad=mask[1])
    forward, backward = OPS[op]
    with na.set_grad_enabled(grad_mode):
        out = forward(a, b)
        loss = out.mean() if seed % 2 else out.sum()
    wants = grad_mode and any(mask)
    for t in (out, loss):
        assert t.requires_grad == wants
        assert t.is_leaf == (not wants) and (t.grad_fn is None) == (not wants)
    if not wants:
        with pytest.raises(RuntimeError, match="does not require grad"):
            loss.backward()
        return
    loss.backward()
    g = np.full((n, n), 1.0 / (n * n) if seed % 2 else 1.0)
    da, db = backward(aa.astype(np.float64), ba.astype(np.float64), g)
    _close(a.grad, da if mask[0] else None, dtype, "a.grad")
    _close(b.grad, db if mask[1] else None, dtype, "b.grad")


def test_detach_shares_memory_and_cuts_the_graph():
    x = Tensor(np.arange(3.0), requires_grad=True)
    y = x * 2
    d = y.detach()
    assert np.shares_memory(d.data, y.data)
    assert not d.requires_grad and d.is_leaf and d.grad_fn is None
    d.requires_grad_()                         # a new leaf of its own
    ((d * x).sum()).backward()
    np.testing.assert_array_equal(d.grad.data, np.arange(3.0))
    np.testing.assert_array_equal(x.grad.data, 2 * np.arange(3.0))   # nothing flowed through d into y
    with pytest.raises(RuntimeError, match="only allowed on leaf"):
        (x * 2).requires_grad_(False)
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3)).requires_grad_()


def test_backward_twice_needs_retain_graph_and_accumulates_with_it():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    loss = (x.exp() * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(x.grad.data, 2 * np.exp([1.0, 2.0]) * np.array([2.0, 3.0]), rtol=1e-12)
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()


@pytest.mark.parametrize("misuse, error, match", [
    (lambda x, y: y.backward(), RuntimeError, "single-element"),
    (lambda x, y: y.backward(gradient=np.ones(3)), RuntimeError, "shape"),
    (lambda x, y: y.backward(gradient=np.ones(2), grad=np.ones(2)), TypeError, "once"),
    (lambda x, y: y.backward(np.ones(2), create_graph=True), NotImplementedError, "create_graph"),
    (lambda x, y: y.backward(np.ones(2), inputs=[]), RuntimeError, "cannot be empty"),
    (lambda x, y: y.backward(np.ones(2), inputs=[Tensor(np.ones(2))]), RuntimeError, "does not require grad"),
    (lambda x, y: y.backward(np.ones(2), inputs=[np.ones(2)]), TypeError, "not a Tensor"),
    (lambda x, y: Tensor(np.ones(2)).retain_grad(), RuntimeError, "requires_grad=False"),
    (lambda x, y: Tensor(np.ones(2)).register_hook(print), RuntimeError, "does not require grad"),
    (lambda x, y: Tensor(np.ones(2)).backward(np.ones(2)), RuntimeError, "does not require grad"),
    (lambda x, y: x.register_hook(3), TypeError, "callable"),
])
def test_misuse_is_a_clear_error_at_the_call(misuse, error, match):
    x = Tensor(np.ones(2), requires_grad=True)
    with pytest.raises(error, match=match):
        misuse(x, x * 2)


@pytest.mark.parametrize("on_leaf", [True, False])
@pytest.mark.parametrize("bad_return, error, match", [
    (lambda g: Tensor(g.data.astype(np.float32)), RuntimeError, "dtype"),   # torch refuses a dtype change
    (lambda g: Tensor(np.ones(5)), RuntimeError, "shape"),
    (lambda g: 5.0, TypeError, "Tensor or None"),
])
def test_a_hook_may_not_change_the_gradients_dtype_or_shape(on_leaf, bad_return, error, match):
    x = Tensor(np.ones(2), requires_grad=True)
    y = x * 2
    (x if on_leaf else y).register_hook(bad_return)
    with pytest.raises(error, match=match):
        (y * y).sum().backward()


def test_a_leaf_hook_sees_the_leafs_dtype_even_when_the_graph_ran_in_another():
    """A float32 leaf used in a float64 computation: the hook gets a float32 gradient (torch)."""
    x = Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    seen = []
    x.register_hook(lambda g: seen.append(g.dtype) or g * 2)
    (x * Tensor(np.full(2, 1.5))).sum().backward()
    assert seen == [np.float32] and x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad.data, [3.0, 3.0])


# ------------------------------------------------------------------ in-place writes under no_grad
# Each step: h <- op(h, w), w a leaf that requires grad (a parameter), h starting as another leaf.
# Under no_grad, w or the running h is changed in place at a random point. torch's rule: backward
# raises exactly when an op that reads the changed tensor in its backward ran before the change;
# otherwise the write is invisible to autograd (its derivative is the identity) and the gradients
# equal those of the same chain where the new values enter as ``t + (new - old)``.
STEPS = {  # name -> (forward, backward reads: its h operand, its w operand, its own result)
    "mul": (lambda h, w: h * w, True, True, False),
    "matmul": (lambda h, w: h @ w, True, True, False),
    "div": (lambda h, w: h / (w * w + 1.0), False, True, True),  # w*w reads w; div reads b and its result
    "add": (lambda h, w: h + w, False, False, False),
    "sub": (lambda h, w: w - h, False, False, False),
    "tanh": (lambda h, w: h.tanh() + w, False, False, False),   # tanh reads its own (inner) result
}
WRITES = {
    "add_": lambda t: t.add_(0.5),
    "mul_": lambda t: t.mul_(1.5),
    "setitem": lambda t: t.__setitem__(0, 1.25),
    "view mul_": lambda t: t[:, 1:].mul_(2.0),
    "copy_": lambda t: t.copy_(np.full((2, 2), 0.75)),
}


def _written_copy(t: Tensor, write: str) -> np.ndarray:
    """What ``write`` makes of ``t``'s values, computed on a copy."""
    c = Tensor(t.data.copy())
    with na.no_grad():
        WRITES[write](c)
    return c.data


@settings(max_examples=30)
@given(
    steps=st.lists(st.sampled_from(sorted(STEPS)), min_size=1, max_size=4),
    write=st.one_of(st.none(), st.sampled_from(sorted(WRITES))),
    at_frac=st.floats(0.0, 1.0),
    target=st.sampled_from(["w", "h"]),
    seed=st.integers(0, 2**16),
)
# an early optimizer-style update of a parameter: torch raises; the gradient silently used the new
# values here (the engine checked only constants' versions)
@example(steps=["mul"], write="add_", at_frac=1.0, target="w", seed=0)
# an activation changed after the matmul that consumed it (torch raises)
@example(steps=["add", "matmul"], write="mul_", at_frac=1.0, target="h", seed=1)
# a division's result changed after the op: its backward reads that result (silently wrong before)
@example(steps=["div", "add"], write="add_", at_frac=1.0, target="h", seed=4)
# ops that do not read the changed tensor keep working (add/sub: torch does not save them)
@example(steps=["add", "sub"], write="view mul_", at_frac=1.0, target="w", seed=2)
@example(steps=["tanh", "add"], write="setitem", at_frac=0.5, target="h", seed=3)
def test_inplace_writes_under_no_grad_raise_or_match_the_identity_write_chain(
        steps, write, at_frac, target, seed):
    """``target`` "w": the parameter, written before step ``at``; "h": the operand of the step
    before ``at`` (the first leaf when ``at`` is 0), written once that step consumed it."""
    at = round(at_frac * len(steps))
    rng = np.random.default_rng(seed)
    w0, h0, upstream = (rng.standard_normal((2, 2)) for _ in range(3))

    w, h_leaf = Tensor(w0.copy(), requires_grad=True), Tensor(h0.copy(), requires_grad=True)
    wf, hf_leaf = Tensor(w0.copy(), requires_grad=True), Tensor(h0.copy(), requires_grad=True)
    h, hf, wf_now, operand = h_leaf, hf_leaf, wf, h_leaf
    for i in range(len(steps) + 1):
        if i == at and write is not None:
            if target == "w":
                wf_now = wf + Tensor(_written_copy(w, write) - w.data)
                with na.no_grad():
                    WRITES[write](w)
            else:
                if at == 0:  # the leaf, before any op used it: the chain sees the new values
                    hf = hf + Tensor(_written_copy(h, write) - h.data)
                with na.no_grad():
                    WRITES[write](operand)
        if i < len(steps):
            operand = h
            h = STEPS[steps[i]][0](h, w)
            hf = STEPS[steps[i]][0](hf, wf_now)
    loss = (h * Tensor(upstream)).sum()
    if write is None:
        must_raise = False
    elif target == "w":
        must_raise = any(STEPS[op][2] for op in steps[:at])
    else:  # the operand of step at-1, which step at-2 made
        must_raise = at >= 1 and (STEPS[steps[at - 1]][1] or (at >= 2 and STEPS[steps[at - 2]][3]))
    if must_raise:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
        return
    loss.backward()
    (hf * Tensor(upstream)).sum().backward()
    _close(w.grad, wf.grad.data, np.float64, "w.grad")
    _close(h_leaf.grad, hf_leaf.grad.data, np.float64, "h.grad")


# What each op's backward reads, written in place under no_grad after the op ran: "raise" where
# torch raises (or where this implementation's backward reads the changed array, so computing
# would be silently wrong: the division and pow results, a layer norm's result), "same" where the
# gradient does not depend on the change and equals the one without it. Results that exp, tanh,
# sigmoid, softmax and division read were silently used changed before.
ONE_OPS = {
    "exp": lambda x: x.exp(), "tanh": lambda x: x.tanh(), "sigmoid": lambda x: x.sigmoid(),
    "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(-1),
    "sqrt": lambda x: x.sqrt(), "log": lambda x: x.log(), "square": lambda x: x * x,
    "pow": lambda x: x ** 2, "div": lambda x: 2.0 / x, "amax": lambda x: x.amax(1),
    "layer_norm": lambda x: F.layer_norm(x, (3,)),
    "relu": lambda x: x.relu(), "reshape": lambda x: x.reshape(3, 2), "transpose": lambda x: x.T,
    "add": lambda x: x + 1.0, "neg": lambda x: -x, "var": lambda x: x.var(), "max_dim": lambda x: x.max(1)[0],
}
ONE_CASES = [
    ("exp", "result", "raise"), ("tanh", "result", "raise"), ("sigmoid", "result", "raise"),
    ("softmax", "result", "raise"), ("log_softmax", "result", "raise"), ("sqrt", "result", "raise"),
    ("div", "result", "raise"), ("pow", "result", "raise"), ("amax", "result", "raise"),
    ("layer_norm", "result", "raise"),
    ("log", "input", "raise"), ("square", "input", "raise"), ("pow", "input", "raise"),
    ("amax", "input", "raise"),
    ("exp", "input", "same"), ("tanh", "input", "same"), ("softmax", "input", "same"),
    ("relu", "result", "same"), ("relu", "input", "raise"), ("reshape", "result", "same"),
    ("transpose", "input", "same"), ("add", "input", "same"), ("add", "result", "same"),
    ("neg", "result", "same"), ("var", "input", "same"), ("max_dim", "input", "same"),
]


@pytest.mark.parametrize("op, written, expect", ONE_CASES)
def test_an_ops_input_or_result_written_under_no_grad_raises_or_leaves_the_gradient(op, written, expect):
    x0 = np.random.default_rng(0).uniform(0.5, 2.0, (2, 3))
    x = Tensor(x0.copy(), requires_grad=True)
    y = ONE_OPS[op](x)
    with na.no_grad():
        (x if written == "input" else y).mul_(1.5)
    if expect == "raise":
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            (y * 1.0).sum().backward()
        return
    (y * 1.0).sum().backward()
    xf = Tensor(x0.copy(), requires_grad=True)
    (ONE_OPS[op](xf) * 1.0).sum().backward()
    _close(x.grad, xf.grad.data, np.float64, op)
