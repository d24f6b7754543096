"""Activation checkpointing explored: for random small models, argument layouts and autocast
settings, the checkpointed forward + backward gives bitwise the outputs and gradients of the plain
one, and gradients equal to it up to the order of summation (the recomputation must rebuild
the graph the first run built).

Found by this file (pinned as ``@example``\\ s):

* a region of ``autocast`` open around the forward was closed when backward recomputed it, so the
  recomputation ran in float32 and the gradients differed from the plain run's (torch reopens it);
* a Tensor passed as a keyword argument (or inside a list) was not cut from the outer graph: the
  nested backward freed the outer graph's buffers and the outer backward crashed
  (``'NoneType' object is not callable``); torch's non-reentrant checkpoint takes such tensors;
* ``checkpoint_wrapper(module, preserve_rng_state=False)`` dropped every option but ``use_reentrant``.
"""

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from neural_arch import nn
from neural_arch.amp import autocast
from neural_arch.core import dtypes
from neural_arch.core.tensor import Tensor, manual_seed
from neural_arch.utils.checkpoint import checkpoint, checkpoint_sequential, checkpoint_wrapper

AUTOCAST = {"off": None, "float16": np.float16, "bfloat16": dtypes.bfloat16}


class Block(nn.Module):
    """Two inputs, one through a keyword and one inside a list; two outputs."""

    def __init__(self, width: int, p: float, dtype):
        super().__init__()
        self.a = nn.Linear(width, width, dtype=dtype)
        self.b = nn.Linear(width, width, dtype=dtype)
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.drop = nn.Dropout(p)

    def forward(self, x, side=None, extra=()):
        h = self.drop(self.a(x).tanh())
        if side is not None:
            h = h + side
        for e in extra:
            h = h * e
        y = self.b(self.norm(h))
        return y, h.relu()


def _build(seed: int, width: int, p: float, dtype):
    manual_seed(seed)
    block = Block(width, p, dtype)
    rng = np.random.default_rng(seed)
    for q in block.parameters():
        q.data[...] = rng.normal(0, 0.5, size=q.shape).astype(dtype)
    return block


def _run(block, x, side_w, mode: str, cast, layout: str, seed: int):
    """Outputs and gradients of one forward + backward; ``mode`` "plain" or how it is checkpointed."""
    manual_seed(seed)
    xt = Tensor(x, requires_grad=True)
    wt = Tensor(side_w, requires_grad=True)
    side = wt * 2.0                       # a non-leaf: its graph continues outside the checkpoint
    args, kwargs = (xt,), {}
    if layout == "keyword":
        kwargs = {"side": side}
    elif layout == "list":
        kwargs = {"extra": [side.sigmoid()]}
    ctx = autocast("cpu", dtype=cast) if cast is not None else _Null()
    with ctx:
        if mode == "plain":
            y, h = block(*args, **kwargs)
        elif mode == "checkpoint":
            y, h = checkpoint(block, *args, use_reentrant=False, **kwargs)
        else:   # "wrapper": the module's own forward checkpointed
            y, h = checkpoint_wrapper(block)(*args, **kwargs)
    loss = (y.astype(np.float64) ** 2).sum() + side.sum()
    if cast is None:
        # both outputs: the checkpoint recomputes once per output and adds their contributions to
        # each gradient separately, a float64 round-off apart. Under autocast one output only: two
        # paths summed in another order would differ at bfloat16's precision, hiding the bug
        loss = loss + (h * 0.5).sum()
    loss.backward()
    grads = [q.grad.data.copy() for q in block.parameters()] + [xt.grad.data.copy(), wt.grad.data.copy()]
    for q in block.parameters():
        q.grad = None
    if mode == "wrapper":
        block._checkpoint_wrapper.unwrap()
    return [y.data.copy(), h.data.copy()], grads


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@given(seed=st.integers(0, 2**16), width=st.sampled_from([3, 8]), rows=st.integers(1, 5),
       p=st.sampled_from([0.0, 0.4]), cast=st.sampled_from(sorted(AUTOCAST)),
       layout=st.sampled_from(["positional", "keyword", "list"]), mode=st.sampled_from(["checkpoint", "wrapper"]))
@example(seed=0, width=8, rows=4, p=0.0, cast="float16", layout="positional", mode="checkpoint")
@example(seed=0, width=8, rows=4, p=0.4, cast="bfloat16", layout="positional", mode="wrapper")
@example(seed=1, width=3, rows=2, p=0.0, cast="off", layout="keyword", mode="checkpoint")
@example(seed=1, width=3, rows=2, p=0.4, cast="off", layout="list", mode="checkpoint")
def test_checkpoint_equals_plain_run(seed, width, rows, p, cast, layout, mode):
    dtype = np.float64 if AUTOCAST[cast] is None else np.float32
    rng = np.random.default_rng(seed + 1)
    x = rng.normal(size=(rows, width)).astype(dtype)
    side_w = rng.normal(size=(rows, width)).astype(dtype)
    plain_out, plain_grads = _run(_build(seed, width, p, dtype), x, side_w, "plain", AUTOCAST[cast], layout, seed)
    ck_out, ck_grads = _run(_build(seed, width, p, dtype), x, side_w, mode, AUTOCAST[cast], layout, seed)
    for a, b in zip(plain_out, ck_out):      # the first run is the plain forward: bitwise
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for i, (a, b) in enumerate(zip(plain_grads, ck_grads)):
        _close(a, b, f"gradient {i}")


def _close(a, b, what: str) -> None:
    """Equal up to the order of summation: the checkpoint's nested backward adds each output's
    contribution to a parameter's gradient separately. A float16 forward recomputed in float32
    (the autocast bug) differs by about 1e-3 of the gradient's scale, far above this."""
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    tol = (1e-12 if a.dtype == np.float64 else 1e-5) * max(1.0, float(np.abs(a).max()))
    assert np.abs(a - b).max() <= tol, f"{what} differs by {np.abs(a - b).max():.3g} (tolerance {tol:.3g})"


def test_backward_inside_a_region_recomputes_a_forward_run_outside_one():
    """The forward ran without autocast; backward is called inside a region: the recomputation
    must not cast (it replays the forward's state, not backward's)."""
    x = np.random.default_rng(3).normal(size=(4, 8)).astype(np.float32)   # float64 is never cast
    grads = {}
    for mode in ("plain", "checkpoint"):
        block = _build(3, 8, 0.0, np.float32)
        xt = Tensor(x, requires_grad=True)
        y, _h = block(xt) if mode == "plain" else checkpoint(block, xt, use_reentrant=False)
        with autocast("cpu", dtype=np.float16):
            (y * y).sum().backward()
        grads[mode] = [q.grad.data.copy() for q in block.parameters()] + [xt.grad.data.copy()]
    for i, (a, b) in enumerate(zip(grads["plain"], grads["checkpoint"])):
        assert a.dtype == np.float32
        _close(a, b, f"gradient {i}")


def test_wrapper_passes_its_options_to_checkpoint():
    """``preserve_rng_state=False`` reaches checkpoint: dropout's recomputation draws a new mask,
    so the gradients differ from the plain run's (with the default they are equal)."""
    x = np.random.default_rng(4).normal(size=(6, 8))

    def grads(wrap_kwargs):
        block = _build(4, 8, 0.5, np.float64)
        if wrap_kwargs is not None:
            checkpoint_wrapper(block, **wrap_kwargs)
        manual_seed(9)
        y, _h = block(Tensor(x))
        (y * y).sum().backward()
        return [q.grad.data for q in block.parameters()]

    plain = grads(None)
    for i, (a, b) in enumerate(zip(plain, grads({}))):
        _close(a, b, f"gradient {i}")
    assert max(np.abs(a - b).max() for a, b in zip(plain, grads({"preserve_rng_state": False}))) > 1e-3


def test_checkpoint_sequential_under_autocast_equals_plain():
    manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    out = {}
    for mode in ("plain", "sequential"):
        for q in model.parameters():
            q.grad = None
        with autocast("cpu", dtype=np.float16):
            y = model(Tensor(x)) if mode == "plain" else checkpoint_sequential(model, 2, Tensor(x))
        (y.astype(np.float32) ** 2).sum().backward()
        out[mode] = [q.grad.data.copy() for q in model.parameters()]
    for i, (a, b) in enumerate(zip(out["plain"], out["sequential"])):
        _close(a, b, f"gradient {i}")


def test_a_constant_argument_changed_in_place_before_backward_is_torchs_error():
    """The recomputation reads every argument's array: one changed in place between the forward and
    backward would be recomputed with the new values (a silent wrong gradient); torch's version
    counter error instead."""
    import pytest

    w = Tensor(np.random.default_rng(0).normal(size=(3, 3)), requires_grad=True)
    x = Tensor(np.random.default_rng(1).normal(size=(2, 3)))
    y = checkpoint(lambda a: (a @ w).tanh(), x, use_reentrant=False).sum()
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*CheckpointBackward"):
        y.backward()


def test_the_recomputation_runs_hooks_registered_with_kwargs_as_the_forward_does():
    """``register_forward_(pre_)hook(..., with_kwargs=True)`` hooks get ``(module, args, kwargs[, out])``:
    the recomputation inside backward called every hook as ``hook(module, args)`` (a TypeError there).
    And the recomputation applied what hooks return a second time (the first forward applied it around
    the checkpointed function): a forward hook that doubles the output doubled the recomputed one, and
    the gradients came out doubled. Now the hooks run there for their side effects only."""
    from neural_arch import nn
    from neural_arch.utils.checkpoint import checkpoint_wrapper

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2, dtype=np.float64)

        def forward(self, x, scale=1.0):
            return self.lin(x) * scale

    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3))
    grads, calls = [], []
    for wrapped in (False, True):
        m = Scaled()
        m.lin.weight.data[...] = rng.normal(size=(2, 3)) if not grads else grads[0][1]
        m.lin.bias.data[...] = 0.5
        m.register_forward_pre_hook(lambda mod, a, k: (a, {"scale": 3.0}), with_kwargs=True)
        m.register_forward_pre_hook(lambda mod, a: (a[0] * 2.0,))        # applied twice: x * 4
        m.register_forward_hook(lambda mod, a, k, out: calls.append(k["scale"]) or out * 2.0, with_kwargs=True)
        if wrapped:
            checkpoint_wrapper(m)
        xt = Tensor(x, requires_grad=True)
        m(xt, scale=1.0).sum().backward()
        grads.append((xt.grad.data.copy(), m.lin.weight.data.copy(), m.lin.weight.grad.data.copy()))
    np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(grads[1][2], grads[0][2], rtol=0, atol=1e-12)
    assert calls == [3.0, 3.0, 3.0]      # plain forward; checkpointed forward and its recomputation
