"""Exploring properties of the ``nn.Module`` API a ported PyTorch script relies on, against torch 2.13's
documented semantics (written down here as plain Python/NumPy references, no torch import):
``state_dict`` / ``load_state_dict`` (prefix, keep_vars, strict, assign, tied parameters, shape
errors that leave the module unchanged, the same Parameter objects an optimizer holds), traversal
(``named_*`` with ``remove_duplicate``, ``named_children`` / ``apply`` once per module), the
registration rules and their error types, re-assignment keeping the order, ``train()`` through each
child's own ``train``, forward hooks (``prepend``, ``with_kwargs``, removal) and ``to(dtype)``.

Each bug this explorer found is pinned as an ``@example`` or a case below.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor, nn
from neural_arch.optim import SGD


# ----------------------------------------------------------------------------- a model drawn from a spec
class _Net(nn.Module):
    """Linear layers in a Sequential, a buffer (persistent or not), optionally a weight tied from
    layer i into layer j and layer 0 registered a second time under ``alias``."""

    def __init__(self, spec, tie, persistent, shared, dtype, seed):
        super().__init__()
        na.manual_seed(seed)
        self.register_buffer("stat", Tensor(np.arange(3, dtype=dtype) + seed), persistent=persistent)
        self.layers = nn.Sequential(*[nn.Linear(i, o, bias=b, dtype=dtype) for i, o, b in spec])
        if tie is not None:
            i, j = tie
            self.layers[j].weight = self.layers[i].weight
        if shared:
            self.alias = self.layers[0]


def _tie_for(spec, pick):
    """A pair (i, j), i != j, of layers whose weights have one shape, or None."""
    pairs = [(i, j) for i in range(len(spec)) for j in range(len(spec))
             if i != j and spec[i][:2] == spec[j][:2]]
    return pairs[pick % len(pairs)] if pairs and pick >= 0 else None


def _expected_keys(spec, persistent):
    """torch's state_dict order: the module's own parameters, its buffers, then each child in turn."""
    keys = ["stat"] if persistent else []
    for k, (_, _, bias) in enumerate(spec):
        keys += [f"layers.{k}.weight"] + ([f"layers.{k}.bias"] if bias else [])
    return keys


def _tensor_of(net, key):
    """The tensor a state-dict key names, found by walking attributes (independent of state_dict)."""
    obj = net
    for part in key.split("."):
        obj = obj[int(part)] if isinstance(obj, nn.Sequential) else getattr(obj, part)
    return obj


specs = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.booleans()), min_size=1, max_size=4)
nets = st.fixed_dictionaries({
    "spec": specs, "pick": st.integers(-1, 5), "persistent": st.booleans(), "shared": st.booleans(),
    "dtype": st.sampled_from([np.float64, np.float32]),
})


def _build(case, seed, dtype=None):
    return _Net(case["spec"], _tie_for(case["spec"], case["pick"]), case["persistent"], case["shared"],
                dtype or case["dtype"], seed)


@settings(max_examples=20)
@given(case=nets, prefix=st.sampled_from(["", "model.", "m", "a.b."]))
# bug: state_dict(prefix="model.") gave "model..weight" (torch puts the prefix in front as given)
@example(case={"spec": [(2, 2, True)], "pick": -1, "persistent": True, "shared": False, "dtype": np.float64},
         prefix="model.")
def test_state_dict_keys_prefix_and_keep_vars(case, prefix):
    net = _build(case, seed=0)
    keys = _expected_keys(case["spec"], case["persistent"])
    sd = net.state_dict(prefix=prefix)
    assert list(sd) == [prefix + k for k in keys]
    for k in keys:
        assert isinstance(sd[prefix + k], np.ndarray) and sd[prefix + k] is not _tensor_of(net, k).data
        np.testing.assert_array_equal(sd[prefix + k], _tensor_of(net, k).data)
    kept = net.state_dict(keep_vars=True)
    assert list(kept) == keys and all(kept[k] is _tensor_of(net, k) for k in keys)
    dest = {"already": 1}
    assert net.state_dict(destination=dest) is dest and list(dest) == ["already", *keys]

    names = [n for n, _ in net.named_parameters()]
    tie = _tie_for(case["spec"], case["pick"])
    # a tied weight is named once, under its first name in order
    assert names == [k for k in keys if k != "stat" and (tie is None or k != f"layers.{max(tie)}.weight")]
    every = [n for n, _ in net.named_parameters(remove_duplicate=False)]
    alias = [k.replace("layers.0.", "alias.", 1) for k in keys if k.startswith("layers.0.")]
    assert every == [k for k in keys if k != "stat"] + (alias if case["shared"] else [])
    assert [n for n, _ in net.named_parameters(prefix="p", recurse=False)] == []
    assert [n for n, _ in net.named_buffers(prefix="p", recurse=False)] == ["p.stat"]


@settings(max_examples=20)
@given(case=nets, dest_dtype=st.sampled_from([np.float32, np.float64]))
def test_load_state_dict_keeps_parameters_dtype_and_trains(case, dest_dtype):
    src, dst = _build(case, seed=1), _build(case, seed=2, dtype=dest_dtype)
    params_before = [(n, p) for n, p in dst.named_parameters()]
    opt = SGD(dst.parameters(), lr=0.5)   # built before the load: must train the loaded values
    sd = src.state_dict()
    result = dst.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == [] and result._fields == (
        "missing_keys", "unexpected_keys")
    assert [(n, id(p)) for n, p in dst.named_parameters()] == [(n, id(p)) for n, p in params_before]
    for k, v in sd.items():
        t = _tensor_of(dst, k)
        assert t.dtype == np.dtype(dest_dtype), "load must copy into the module's own dtype (torch)"
        np.testing.assert_array_equal(t.data, v.astype(dest_dtype))
    tie = _tie_for(case["spec"], case["pick"])
    if tie is not None:
        assert dst.layers[tie[1]].weight is dst.layers[tie[0]].weight
    for p in dst.parameters():
        p.grad = Tensor(np.ones_like(p.data))
    opt.step()
    for n, p in dst.named_parameters():
        np.testing.assert_allclose(p.data, sd[n].astype(dest_dtype) - dest_dtype(0.5), rtol=0, atol=1e-6)


@settings(max_examples=20)
@given(case=nets, drop=st.sets(st.integers(0, 12), max_size=4), extra=st.lists(
    st.sampled_from(["extra", "layers.9.weight", "stat2"]), unique=True, max_size=2))
def test_load_state_dict_non_strict_reports_and_loads_the_rest(case, drop, extra):
    src, dst = _build(case, seed=3), _build(case, seed=4)
    keys = list(src.state_dict())
    sd = {k: v for i, (k, v) in enumerate(src.state_dict().items()) if i not in drop}
    sd.update({k: np.ones(1) for k in extra})
    if not case["persistent"]:
        sd["stat"] = np.full(3, 9.0)       # a non-persistent buffer is not expected: unexpected
    want = {id(_tensor_of(dst, k)): _tensor_of(dst, k).data.copy() for k in keys}
    for k in keys:                          # torch copies key by key in state-dict order
        if k in sd:
            want[id(_tensor_of(dst, k))] = np.asarray(sd[k]).astype(_tensor_of(dst, k).dtype)
    missing = [k for k in keys if k not in sd]
    unexpected = [k for k in sd if k not in keys]
    if missing or unexpected:
        with pytest.raises(RuntimeError, match="strict"):
            _build(case, seed=4).load_state_dict(sd)
    result = dst.load_state_dict(sd, strict=False)
    assert result.missing_keys == missing and result.unexpected_keys == unexpected
    for k in keys:
        np.testing.assert_array_equal(_tensor_of(dst, k).data, want[id(_tensor_of(dst, k))])


@settings(max_examples=15)
@given(case=nets, which=st.integers(0, 20), strict=st.booleans())
# bug: a shape mismatch raised only after the keys before it were already copied (half-loaded module)
@example(case={"spec": [(2, 2, True), (2, 1, False)], "pick": -1, "persistent": True, "shared": False,
               "dtype": np.float64}, which=3, strict=False)
def test_shape_mismatch_raises_and_leaves_the_module_unchanged(case, which, strict):
    src, dst = _build(case, seed=5), _build(case, seed=6)
    sd = src.state_dict()
    bad = list(sd)[which % len(sd)]
    sd[bad] = np.zeros(sd[bad].shape + (2,))
    before = dst.state_dict()
    with pytest.raises(RuntimeError, match=f"shape mismatch.*'{bad}'"):
        dst.load_state_dict(sd, strict=strict)   # torch raises even with strict=False
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_load_state_dict_assign_and_bad_input():
    layer = nn.Linear(2, 3)                       # float32
    weight = layer.weight
    sd = {"weight": np.arange(6.0).reshape(3, 2), "bias": Tensor(np.ones(3))}
    layer.load_state_dict(sd, assign=True)         # torch: the checkpoint's dtype is kept
    assert layer.weight is weight and layer.weight.dtype == np.float64 and layer.bias.dtype == np.float64
    np.testing.assert_array_equal(layer.weight.data, sd["weight"])
    with pytest.raises(TypeError, match="dict-like"):
        layer.load_state_dict([("weight", np.zeros((3, 2)))])   # a list of pairs (was: unhashable error)
    layer.load_state_dict({"weight": [[1, 2], [3, 4], [5, 6]], "bias": 0.5 * np.ones(3)})
    assert layer.weight.data.tolist() == [[1, 2], [3, 4], [5, 6]]


class _Counted(nn.Module):
    """A layer with a non-Tensor state torch keeps under ``_extra_state``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 1)
        self.register_buffer("seen", Tensor(np.zeros(1)))
        self.steps = 0

    def get_extra_state(self):
        return {"steps": self.steps}

    def set_extra_state(self, state):
        self.steps = state["steps"]


def test_extra_state_is_saved_and_restored():
    model = nn.Sequential(_Counted(), nn.Linear(1, 1))
    model[0].steps = 7
    sd = model.state_dict()
    # bug: get_extra_state was never called: a ported module's counters were silently lost on resume
    assert list(sd) == ["0.seen", "0._extra_state", "0.lin.weight", "0.lin.bias", "1.weight", "1.bias"]
    assert sd["0._extra_state"] == {"steps": 7}
    fresh = nn.Sequential(_Counted(), nn.Linear(1, 1))
    assert fresh.load_state_dict(sd) == ([], []) and fresh[0].steps == 7
    del sd["0._extra_state"]
    with pytest.raises(RuntimeError, match="0._extra_state"):
        fresh.load_state_dict(sd)
    with pytest.raises(RuntimeError, match="1._extra_state"):
        fresh.load_state_dict(model.state_dict() | {"1._extra_state": 1})


# ----------------------------------------------------------------------------- traversal and modes
def test_shared_child_counts_once_in_apply_and_named_modules():
    shared = nn.Linear(2, 2)
    root = nn.Module()
    root.a, root.b, root.c = shared, shared, nn.ReLU()
    # every name (unlike torch, which yields "a", "c"): positional walkers must see both, see below
    assert [n for n, _ in root.named_children()] == ["a", "b", "c"]
    calls = []
    root.apply(lambda m: calls.append(type(m).__name__))
    # bug: apply visited the shared child twice (an init that scales weights scaled them twice)
    assert calls == ["Linear", "ReLU", "Module"]
    assert [n for n, _ in root.named_modules()] == ["", "a", "c"]
    assert [n for n, _ in root.named_modules(remove_duplicate=False)] == ["", "a", "b", "c"]
    assert [n for n, _ in root.named_modules(prefix="net")] == ["net", "net.a", "net.c"]
    with pytest.raises(TypeError, match="memo"):
        list(root.named_modules("net"))   # torch's first argument is memo


class _FrozenNorm(nn.Module):
    """A block whose BatchNorm stays in eval whatever the parent asks (a common fine-tuning pattern)."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(2)

    def train(self, mode: bool = True):
        super().train(mode)
        self.bn.eval()
        return self


@settings(max_examples=15)
@given(modes=st.lists(st.booleans(), min_size=1, max_size=4))
# bug: Module.train set the flag on every descendant directly: a child's own train() never ran
@example(modes=[True])
def test_train_runs_each_childs_own_train(modes):
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(_FrozenNorm(), nn.Dropout(0.5)))
    for mode in modes:
        assert (model.train(mode) if mode else model.eval()) is model
        assert model.training == mode and model[1].training == mode and model[1][1].training == mode
        assert model[1][0].training == mode and model[1][0].bn.training is False


def test_get_submodule_parameter_buffer():
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    model.add_module("gone", None)
    assert model.get_parameter("0.weight") is model[0].weight
    assert model.get_buffer("1.running_mean") is model[1].running_mean
    assert model.get_submodule("") is model
    # bug: a submodule slot set to None came back as None (torch: AttributeError)
    for call, target in [(model.get_submodule, "gone"), (model.get_submodule, "0.weight"),
                         (model.get_parameter, "0.nope"), (model.get_buffer, "0.weight"),
                         (model.get_parameter, "5.weight")]:
        with pytest.raises(AttributeError):
            call(target)


# ----------------------------------------------------------------------------- registration
def _holder():
    m = nn.Module()
    m.plain = 3
    m.register_buffer("buf", Tensor(np.zeros(1)))
    m.w = nn.Parameter(np.zeros(1))
    m.child = nn.ReLU()
    return m


# torch 2.13's error types: a non-str name TypeError, '' / '.' / an existing attribute KeyError,
# a wrong value TypeError.
_REGISTRATION_ERRORS = [
    ("register_parameter", (1, None), TypeError), ("register_buffer", (1, None), TypeError),
    ("add_module", (1, None), TypeError), ("register_parameter", ("", None), KeyError),
    ("register_buffer", ("a.b", None), KeyError), ("add_module", ("a.b", nn.ReLU()), KeyError),
    ("register_parameter", ("plain", None), KeyError), ("register_buffer", ("w", None), KeyError),
    ("add_module", ("buf", nn.ReLU()), KeyError), ("register_parameter", ("training", None), KeyError),
    ("register_parameter", ("p", Tensor(np.zeros(1))), TypeError), ("add_module", ("m", 3), TypeError),
]


@pytest.mark.parametrize("method,args,error", _REGISTRATION_ERRORS)
def test_registration_errors_are_torchs(method, args, error):
    m = _holder()
    with pytest.raises(error):
        getattr(m, method)(*args)


@pytest.mark.parametrize("name,value", [("w", Tensor(np.zeros(1))), ("child", 3), ("buf", 3)])
def test_setattr_wrong_kind_is_a_type_error(name, value):
    with pytest.raises(TypeError):
        setattr(_holder(), name, value)


@settings(max_examples=20)
@given(ops=st.lists(st.tuples(st.sampled_from(["p", "m", "b"]), st.integers(0, 3)), min_size=1, max_size=8))
# bug: re-assigning a parameter or child (``model.conv1 = nn.Conv2d(...)``) moved it to the end of
# parameters(): the optimizer state and checkpoint order no longer matched torch's
@example(ops=[("m", 0), ("m", 1), ("m", 0)])
def test_reassignment_keeps_the_order(ops):
    m = nn.Module()
    ref = {"_parameters": {}, "_modules": {}, "_buffers": {}}
    for kind, k in ops:
        name = f"{kind}{k}"   # names of one kind never collide with another's
        if kind == "p":
            value, registry = nn.Parameter(np.zeros(1)), "_parameters"
        elif kind == "m":
            value, registry = nn.Identity(), "_modules"
        else:
            value, registry = Tensor(np.zeros(1)), "_buffers"
        if registry == "_buffers":
            m.register_buffer(name, value)
        else:
            setattr(m, name, value)
        ref[registry][name] = value   # a dict keeps an existing key's place
    for registry, want in ref.items():
        assert list(getattr(m, registry)) == list(want)
        assert all(getattr(m, registry)[n] is v for n, v in want.items())


# ----------------------------------------------------------------------------- forward hooks
class _Affine(nn.Module):
    def forward(self, x, *, bias=0.0):
        return x * 2.0 + bias


hook_ops = st.lists(st.tuples(st.sampled_from(["pre", "pre_kw", "fwd", "fwd_kw"]), st.integers(1, 3),
                              st.booleans(), st.booleans(), st.booleans()), max_size=6)


def _register_hook(module, kind, c, none, prepend):
    if kind == "pre":
        def hook(m, args):
            return None if none else (args[0] * c,)
    elif kind == "pre_kw":
        def hook(m, args, kw):
            return None if none else ((args[0] * c,), {**kw, "bias": kw.get("bias", 0.0) + c})
    elif kind == "fwd":
        def hook(m, args, out):
            return None if none else out + c
    else:
        def hook(m, args, kw, out):
            return None if none else out + kw.get("bias", 0.0)
    register = module.register_forward_pre_hook if kind.startswith("pre") else module.register_forward_hook
    return register(hook, prepend=prepend, with_kwargs=kind.endswith("_kw"))


@settings(max_examples=25)
@given(ops=hook_ops)
@example(ops=[("pre", 2, False, False, False), ("pre_kw", 3, False, True, False),
              ("fwd", 1, False, True, False)])
def test_forward_hooks_against_a_reference(ops):
    """Each op: (kind, c, returns None, prepend, removed). A pre hook scales the input by c; a kwargs
    pre hook also adds c to ``bias``; a forward hook adds c to the output; a kwargs one adds bias."""
    module = _Affine()
    pre, post = [], []
    for kind, c, none, prepend, removed in ops:
        handle = _register_hook(module, kind, c, none, prepend)
        entry = (kind, c, none)
        target = pre if kind.startswith("pre") else post
        if removed:
            handle.remove()
        elif prepend:
            target.insert(0, entry)
        else:
            target.append(entry)
    x = np.array([1.0, -2.0])
    args_x, kwargs = x.copy(), {"bias": 0.5}
    for kind, c, none in pre:
        if not none:
            args_x = args_x * c
            if kind == "pre_kw":
                kwargs = {**kwargs, "bias": kwargs["bias"] + c}
    out = args_x * 2.0 + kwargs["bias"]
    for kind, c, none in post:
        if not none:
            out = out + (c if kind == "fwd" else kwargs["bias"])
    got = module(Tensor(x), bias=0.5)
    np.testing.assert_allclose(got.data, out, rtol=0, atol=1e-12)


def test_forward_pre_hook_with_kwargs_bad_return_is_an_error():
    module = _Affine()
    module.register_forward_pre_hook(lambda m, args, kw: args, with_kwargs=True)
    with pytest.raises(RuntimeError, match="new_args, new_kwargs"):
        module(Tensor(np.ones((2, 2))))


# ----------------------------------------------------------------------------- dtype moves and grads
@pytest.mark.parametrize("convert,dtype", [("double", np.float64), ("float", np.float32),
                                           ("half", np.float16)])
def test_dtype_moves_keep_parameters_and_convert_grads(convert, dtype):
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    model[0].weight.grad = Tensor(np.ones((2, 2), np.float32))
    before = [id(p) for p in model.parameters()]
    assert getattr(model, convert)() is model
    assert [id(p) for p in model.parameters()] == before
    assert all(type(p) is nn.Parameter and p.dtype == dtype for p in model.parameters())
    assert model[0].weight.grad.dtype == dtype                  # torch converts .grad too
    assert model[1].num_batches_tracked.dtype == np.int64       # integer buffers keep their dtype
    model.zero_grad()                                            # set_to_none=True is the default
    assert model[0].weight.grad is None
    model.requires_grad_(False)
    assert not any(p.requires_grad for p in model.parameters())


def test_to_refuses_integer_dtypes_and_takes_non_blocking():
    model = nn.Linear(2, 2)
    # bug: model.to(dtype=int64) cast nothing and returned (torch: TypeError)
    for call in (lambda: model.to(dtype=np.int64), lambda: model.to(np.dtype("int32"))):
        with pytest.raises(TypeError, match="floating point"):
            call()
    assert model.weight.dtype == np.float32
    assert model.to("cpu", non_blocking=True).to(Tensor(np.ones(1))).weight.dtype == np.float64


def test_requires_grad_refuses_an_integer_parameter():
    model = nn.Module()
    model.steps = nn.Parameter(np.arange(3), requires_grad=False)
    # bug: Module.requires_grad_(True) set the flag on an integer parameter (truncated integer gradients)
    with pytest.raises(TypeError, match="floating-point"):
        model.requires_grad_(True)
    assert model.requires_grad_(False) is model and not model.steps.requires_grad


def test_a_child_used_twice_runs_twice_in_checkpoint_sequential():
    # torch's named_children yields a shared child once; checkpoint_sequential over its children
    # would then compute a(x) for Sequential(a, a): named_children keeps every position here
    from neural_arch.utils.checkpoint import checkpoint_sequential

    layer = nn.Linear(2, 2, dtype=np.float64)
    model = nn.Sequential(layer, layer)
    x = Tensor(np.array([[1.0, -2.0]]))
    np.testing.assert_allclose(checkpoint_sequential(model, 1, x, use_reentrant=False).data,
                               layer(layer(x)).data, rtol=0, atol=1e-12)
