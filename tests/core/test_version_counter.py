"""torch's version counters: an in-place change to a constant that an earlier recorded op saved
for its backward is torch's RuntimeError at backward, never a silently wrong gradient.

Every in-place method (``add_`` ... ``copy_``, ``x[i] = v``, ``scatter_add_``) bumps the counter of
the tensor's memory, shared with its views; each op that reads a constant input in backward
remembers its version, and the engine checks it before running that op's backward. In-place
changes after backward, before the forward, or to a tensor no op saved stay allowed.

Example of what is caught::

    x = Tensor(np.ones((2, 3))); w = Tensor(np.ones((3, 3)), requires_grad=True)
    y = (x @ w).sum(); x.add_(1.0)
    y.backward()        # RuntimeError: ... modified by an inplace operation ... MatMulBackward ...
"""

import gc

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
import neural_arch.nn.functional as F
from neural_arch import Tensor
from neural_arch.core import autograd as ag

MODIFIED = "modified by an inplace operation"


def _rng(seed=0):
    return np.random.default_rng(seed)


def _w(shape=(3, 3), seed=1):
    return Tensor(_rng(seed).standard_normal(shape), requires_grad=True)


def _const(shape=(3, 3), seed=2):
    return Tensor(_rng(seed).random(shape) + 1.0)  # in [1, 2): safe as a divisor, a base, a log


# ------------------------------------------------------------------------------ the brief's example
def test_inplace_change_of_a_saved_constant_raises_at_backward_naming_op_shape_and_versions():
    x = Tensor(_rng().standard_normal((2, 3)))
    w = _w()
    y = (x @ w).sum()
    assert x._version == 0
    x.add_(1.0)
    assert x._version == 1
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    msg = str(info.value)
    assert "MatMulBackward" in msg and "[2, 3]" in msg
    assert "is at version 1; expected version 0 instead" in msg
    assert w.grad is None  # nothing was accumulated from the stale array


# ------------------------------------------------------------------------------ every in-place writer
MUTATORS = {
    "add_": lambda c: c.add_(1.0),
    "sub_": lambda c: c.sub_(1.0, alpha=2),
    "mul_": lambda c: c.mul_(2.0),
    "div_": lambda c: c.div_(2.0),
    "clamp_": lambda c: c.clamp_(min=1.5),
    "clip_": lambda c: c.clip_(max=1.5),
    "zero_": lambda c: c.zero_(),
    "fill_": lambda c: c.fill_(3.0),
    "copy_": lambda c: c.copy_(np.full(c.shape, 4.0)),
    "setitem": lambda c: c.__setitem__((0, 0), 9.0),
    "iadd": lambda c: c.__iadd__(1.0),
    "imul": lambda c: c.__imul__(2.0),
    "scatter_add_": lambda c: c.scatter_add_(0, np.zeros((1, 3), np.int64), Tensor(np.ones((1, 3)))),
    "view add_": lambda c: c[1:].add_(1.0),            # through a basic-index view of the saved base
    "reshape add_": lambda c: c.reshape(-1).mul_(3.0),
    "detach add_": lambda c: c.detach().add_(1.0),
    "transpose setitem": lambda c: c.T.__setitem__(0, 0.0),
}


@pytest.mark.parametrize("name", sorted(MUTATORS))
def test_every_inplace_writer_bumps_the_version_and_is_caught(name):
    c, w = _const(), _w()
    y = (w @ c).sum()
    before = c._version
    MUTATORS[name](c)
    assert c._version == before + 1
    with pytest.raises(RuntimeError, match="MatMulBackward"):
        y.backward()


def test_inplace_on_a_view_after_the_base_was_saved_and_on_the_base_after_a_view_was_saved():
    base, w = _const((4, 3)), _w()
    view = base[1:3]
    y = (view @ w).sum()          # the view is saved
    base.mul_(2.0)                # the base changes
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()
    base = _const((4, 3))
    y = (base @ w).sum()          # the base is saved
    base.reshape(2, 6)[0].fill_(0.0)
    with pytest.raises(RuntimeError, match=MODIFIED):
        y.backward()


# ------------------------------------------------------------------------------ every op that saves one
def _index_const():
    return Tensor(np.array([0, 2, 1]), dtype="int64")


def _mask_const():
    m = _rng(4).random((3, 3)) > 0.5
    np.fill_diagonal(m, True)  # every query row attends somewhere
    return Tensor(m)


def _probs_const():
    p = _rng(5).random((3, 3)) + 0.1
    return Tensor(p / p.sum(axis=1, keepdims=True))


# name -> (build(c, w) -> output, the node name in the error, make the constant (default _const))
OPS = {
    "mul": (lambda c, w: w * c, "Mul", None),
    "mul reflected": (lambda c, w: c * w, "Mul", None),
    "div": (lambda c, w: w / c, "Div", None),
    "pow base": (lambda c, w: c ** w, "Pow", None),
    "pow exponent": (lambda c, w: (w * w + 1.0) ** c, "Pow", None),
    "remainder": (lambda c, w: na.remainder(c, w * w + 3.0), "Remainder", None),
    "maximum": (lambda c, w: w.maximum(c), "Maximum", None),
    "minimum": (lambda c, w: w.minimum(c), "Minimum", None),
    "matmul": (lambda c, w: c @ w, "MatMul", None),
    "linear input": (lambda c, w: F.linear(c, w), "Linear", None),
    "linear weight": (lambda c, w: F.linear(w, c), "Linear", None),
    "conv2d": (lambda c, w: F.conv2d(c.reshape(1, 1, 3, 3), w.reshape(1, 1, 3, 3), padding=1), "Conv2d", None),
    "clamp tensor bound": (lambda c, w: F.clamp(c, min=w), "Clip", None),
    "where cond": (lambda c, w: F.where(c, w, 0.0), "Where", _mask_const),
    "masked_fill mask": (lambda c, w: w.masked_fill(c, 0.0), "MaskedFill", _mask_const),
    "getitem index tensor": (lambda c, w: w[c], "Index", _index_const),
    "gather index": (lambda c, w: na.gather(w, 0, c.reshape(3, 1)), "Gather", _index_const),
    "index_select index": (lambda c, w: w.index_select(0, c), "IndexSelect", _index_const),
    "scatter_add index": (lambda c, w: na.scatter_add(Tensor(np.zeros((3, 1))), 0, c.reshape(3, 1), w[:, :1]),
                          "ScatterAdd", _index_const),
    "embedding indices": (lambda c, w: F.embedding(c, w), "Embedding", _index_const),
    "layer_norm weight": (lambda c, w: F.layer_norm(w, (3,), weight=c[0]), "LayerNorm", None),
    "rms_norm weight": (lambda c, w: F.rms_norm(w, (3,), weight=c[0]), "RmsNorm", None),
    "group_norm weight": (lambda c, w: F.group_norm(w, 1, weight=c[0]), "GroupNorm", None),
    "attention key": (lambda c, w: F.scaled_dot_product_attention(w[None], c[None], w[None]),
                      "ScaledDotProductAttention", None),
    "attention bool mask": (lambda c, w: F.scaled_dot_product_attention(w[None], w[None], w[None], attn_mask=c),
                            "ScaledDotProductAttention", _mask_const),
    "cross_entropy prob target": (lambda c, w: F.cross_entropy(w, c), "CrossEntropy", _probs_const),
    "bce target": (lambda c, w: F.binary_cross_entropy(w.sigmoid(), c), "BinaryCrossEntropy", _probs_const),
    "bce logits target": (lambda c, w: F.binary_cross_entropy_with_logits(w, c), "BinaryCrossEntropyWithLogits",
                          _probs_const),
    "bce logits input": (lambda c, w: F.binary_cross_entropy_with_logits(c, w.sigmoid()),
                         "BinaryCrossEntropyWithLogits", None),
    "kl_div target": (lambda c, w: F.kl_div(w, c, reduction="batchmean"), "KLDivLoss", _probs_const),
}


def _mutate(c):
    # an index stays in range, a mask keeps its diagonal, a float constant changes value
    if c.dtype == np.bool_:
        c[0, 1] = not bool(c.data[0, 1])
    elif c.dtype.kind in "iu":
        c[0] = 1
    else:
        c.mul_(0.5)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_reading_a_constant_in_backward_refuses_a_changed_one(name):
    build, node, make = OPS[name]
    c, w = (make or _const)(), _w()
    y = build(c, w).sum()
    _mutate(c)
    with pytest.raises(RuntimeError, match=MODIFIED) as info:
        y.backward()
    assert f"{node}Backward" in str(info.value)


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_gives_the_fresh_gradient_when_the_change_comes_before_the_forward(name):
    build, _, make = OPS[name]
    c, w = (make or _const)(), _w()
    _mutate(c)
    build(c, w).sum().backward()
    wf = _w()
    build(Tensor(c.data.copy()), wf).sum().backward()
    np.testing.assert_allclose(w.grad.data, wf.grad.data, rtol=0, atol=0)


def test_a_constant_the_backward_does_not_read_may_change():
    # torch's div saves the divisor, not the dividend (its gradient is -out / divisor)
    c, w = _const(), _w()
    y = (c / (w * w + 1.0)).sum()
    c.add_(1.0)
    y.backward()
    w2 = _w()
    y = (w2 / c).sum()
    c.add_(1.0)
    with pytest.raises(RuntimeError, match="DivBackward"):
        y.backward()


# ------------------------------------------------------------------------------ what stays allowed
def test_changes_after_backward_under_no_grad_before_forward_or_to_unsaved_tensors_are_allowed():
    c, w = _const(), _w()
    (w @ c).sum().backward()
    c.add_(1.0)                                   # after backward: the graph is gone
    with na.no_grad():
        c.mul_(2.0)                               # before the forward
    y = (w @ c).sum()
    y.backward()
    np.testing.assert_allclose(w.grad.data, np.ones((3, 3)) @ c.data.T + np.ones((3, 3)) @ (c.data / 2 - 1).T,
                               rtol=1e-12)
    d = _const()
    y = (w + d).sum() + (w - d).sum()             # add/sub do not read their operands in backward
    d.add_(1.0)
    y.backward()
    unrelated = _const()
    y = (w * _const()).sum()
    unrelated.add_(1.0)                           # a constant no op saved
    y.backward()


def test_retain_graph_backward_twice_then_a_change_raises_on_the_next_backward():
    c, w = _const(), _w()
    y = (w * c).sum()
    y.backward(retain_graph=True)
    y.backward(retain_graph=True)
    np.testing.assert_allclose(w.grad.data, 2 * c.data, rtol=0, atol=0)
    c.mul_(2.0)
    with pytest.raises(RuntimeError, match="MulBackward"):
        y.backward()


def test_a_node_drops_its_saved_versions_after_backward():
    c, w = _const(), _w()
    y = (w * c).sum()
    node = y.grad_fn.parents[0].grad_fn
    assert node.saved is not None and node.saved[0][1] == 0
    y.backward()
    assert node.saved is None


def test_optimizer_steps_and_in_place_data_augmentation_between_steps_train_as_before():
    rng = _rng(3)
    x = Tensor(rng.standard_normal((4, 3)))
    layer = na.nn.Linear(3, 2)
    opt = na.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(3):
        loss = (layer(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        x.mul_(0.5)       # in place, after backward: the next forward sees the new values
    assert x._version == 3


def test_version_counter_is_shared_with_views_and_not_with_copies():
    t = na.zeros(2, 3)
    v, d, r = t[0], t.detach(), t.reshape(6)
    c = t.clone()
    t.add_(1.0)
    assert (t._version, v._version, d._version, r._version, c._version) == (1, 1, 1, 1, 0)
    c.add_(1.0)
    assert t._version == 1 and c._version == 1
    _ = t + 1                # out-of-place ops leave it alone
    assert t._version == 1
    acc = na.zeros(2, 3)
    acc.add_(_w((2, 3)))     # a constant updated from a tensor that requires grad: one write, as torch counts it
    assert acc._version == 1 and acc.requires_grad


def test_dead_arrays_leave_no_entry_behind():
    gc.collect()
    before = len(ag._versions)
    for _ in range(20):
        na.zeros(4).add_(1.0)
    gc.collect()
    assert len(ag._versions) == before


# ------------------------------------------------------------------------------ exploring property
# Each step of the chain: h <- op(h, constant) with one of two constants (or a view of one). An
# in-place change to one constant at a random position: backward raises exactly when an op that
# reads that constant in backward ran before the change; otherwise the gradient equals the one of
# the same chain on fresh copies (each op seeing the values it saw), and finite differences.
STEP_OPS = {  # name -> (forward on Tensors, forward on NumPy, reads the constant in backward)
    "mul": (lambda h, c: h * c, lambda h, c: h * c, True),
    "div": (lambda h, c: h / c, lambda h, c: h / c, True),
    "matmul": (lambda h, c: h @ c, lambda h, c: h @ c, True),
    "rmatmul": (lambda h, c: c @ h, lambda h, c: c @ h, True),
    "matmul_T": (lambda h, c: h @ c.T, lambda h, c: h @ c.T, True),
    "add": (lambda h, c: h + c, lambda h, c: h + c, False),
    "sub": (lambda h, c: c - h, lambda h, c: c - h, False),
    "tanh_mul": (lambda h, c: (h * c).tanh(), lambda h, c: np.tanh(h * c), True),
}
CHANGES = {  # name -> (in place on a Tensor, the same on a NumPy copy)
    "add_": (lambda c: c.add_(0.5), lambda a: a + 0.5),
    "mul_": (lambda c: c.mul_(1.5), lambda a: a * 1.5),
    "row setitem": (lambda c: c.__setitem__(1, 1.25), lambda a: np.concatenate([a[:1], np.full((1, 3), 1.25),
                                                                                  a[2:]])),
    "view mul_": (lambda c: c[:, 1:].mul_(2.0), lambda a: np.concatenate([a[:, :1], a[:, 1:] * 2], axis=1)),
    "copy_": (lambda c: c.copy_(np.full((3, 3), 1.75)), lambda a: np.full((3, 3), 1.75)),
}


def _chain_numpy(w, steps, consts, changed, at, change):
    vals = [c.copy() for c in consts]
    h = w
    for i, (op, j) in enumerate(steps):
        if i == at and changed is not None:
            vals[changed] = change(vals[changed])
        h = STEP_OPS[op][1](h, vals[j])
    return h


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16),
       steps=st.lists(st.tuples(st.sampled_from(sorted(STEP_OPS)), st.integers(0, 1)), min_size=1, max_size=5),
       changed=st.one_of(st.none(), st.integers(0, 1)), at_frac=st.floats(0.0, 1.0),
       change=st.sampled_from(sorted(CHANGES)))
@example(seed=0, steps=[("matmul", 0)], changed=0, at_frac=1.0, change="add_")      # the brief's case
@example(seed=0, steps=[("add", 0), ("mul", 1)], changed=0, at_frac=1.0, change="mul_")  # unread: allowed
@example(seed=1, steps=[("mul", 0), ("mul", 0)], changed=0, at_frac=0.5, change="view mul_")  # between two uses
@example(seed=2, steps=[("matmul_T", 1)], changed=1, at_frac=0.0, change="copy_")   # before the forward
def test_random_chains_with_an_inplace_change_raise_or_match_fresh_copies(seed, steps, changed, at_frac, change):
    rng = _rng(seed)
    w0 = rng.standard_normal((3, 3))
    c0 = [rng.random((3, 3)) + 1.0 for _ in range(2)]
    upstream = rng.standard_normal((3, 3))
    at = round(at_frac * len(steps))          # the change happens before step `at` (len: after the forward)
    w = Tensor(w0.copy(), requires_grad=True)
    consts = [Tensor(c.copy()) for c in c0]
    h = w
    for i, (op, j) in enumerate(steps):
        if i == at and changed is not None:
            CHANGES[change][0](consts[changed])
        h = STEP_OPS[op][0](h, consts[j])
    if at == len(steps) and changed is not None:
        CHANGES[change][0](consts[changed])
    loss = (h * Tensor(upstream)).sum()
    must_raise = changed is not None and any(
        j == changed and STEP_OPS[op][2] for op, j in steps[:at])
    if must_raise:
        with pytest.raises(RuntimeError, match=MODIFIED):
            loss.backward()
        return
    loss.backward()
    # the same chain on fresh copies, every op seeing the values it saw
    fresh = [Tensor(c.copy()) for c in c0]
    wf = Tensor(w0.copy(), requires_grad=True)
    hf = wf
    for i, (op, j) in enumerate(steps):
        if i == at and changed is not None:
            fresh[changed] = Tensor(CHANGES[change][1](fresh[changed].data))
        hf = STEP_OPS[op][0](hf, fresh[j])
    (hf * Tensor(upstream)).sum().backward()
    np.testing.assert_allclose(w.grad.data, wf.grad.data, rtol=0, atol=1e-12)
    # and central finite differences of a plain NumPy forward
    eps, fd = 1e-6, np.zeros((3, 3))
    for idx in np.ndindex(3, 3):
        wp, wm = w0.copy(), w0.copy()
        wp[idx] += eps
        wm[idx] -= eps
        fd[idx] = ((_chain_numpy(wp, steps, c0, changed, at, CHANGES[change][1]) * upstream).sum()
                   - (_chain_numpy(wm, steps, c0, changed, at, CHANGES[change][1]) * upstream).sum()) / (2 * eps)
    np.testing.assert_allclose(w.grad.data, fd, rtol=1e-5, atol=1e-5)


def test_arrays_made_separately_over_one_buffer_count_apart_and_their_views_together():
    import mmap

    buf = mmap.mmap(-1, 64)
    a = Tensor(np.ndarray((2,), np.float64, buffer=buf))
    b = Tensor(np.ndarray((2,), np.float64, buffer=buf, offset=16))   # a batch's inputs and targets
    w = Tensor(np.ones(2), requires_grad=True)
    y = (w * a).sum()
    b.fill_(1.0)                  # another array over the same shared buffer: no false alarm
    y.backward()
    y = (w * a).sum()
    a[1:].fill_(2.0)              # a view of the saved array: caught
    with pytest.raises(RuntimeError, match="MulBackward"):
        y.backward()
    del a, b, y
    gc.collect()
    buf.close()
