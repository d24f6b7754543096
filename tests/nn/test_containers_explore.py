"""Exploring properties of ``nn.Sequential`` / ``nn.ModuleList`` / ``nn.ModuleDict`` against a plain
Python list / dict written from torch 2.13's documented semantics (no torch import): random
sequences of append / insert / extend / ``+=`` / pop / ``del`` / item assignment with negative and
out-of-range indices, slicing (a ``Sequential`` slice keeps the original keys, as torch), ``+``,
and ModuleDict's update from a dict, a ModuleDict or pairs, pop, clear and re-assignment in place.

Each bug this explorer found is pinned as an ``@example`` or a case below.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import nn

list_ops = st.lists(st.tuples(
    st.sampled_from(["append", "insert", "extend", "iadd", "pop", "del", "set", "delslice", "get"]),
    st.integers(-5, 5), st.integers(0, 3)), max_size=10)


def _apply(container, ref, op, i, k):
    """Apply one op to the container and to the reference list; both must raise the same error."""
    fresh = [nn.Identity() for _ in range(k)]
    if op in ("append", "insert"):
        new = nn.Identity()
        if op == "append":
            assert container.append(new) is container
            ref.append(new)
        elif isinstance(container, nn.Sequential) and not -len(ref) <= i <= len(ref):
            with pytest.raises(IndexError):
                container.insert(i, new)  # torch's Sequential.insert checks the range
        else:
            container.insert(i, new)      # list.insert's rule (torch's ModuleList.insert has no check)
            ref.insert(i, new)
    elif op in ("extend", "iadd"):
        if op == "extend":
            container.extend(fresh)
        else:
            container += fresh
        ref.extend(fresh)
    elif op in ("pop", "del", "set", "get"):
        try:
            ref_result = ref[i]
        except IndexError:
            with pytest.raises(IndexError):
                {"pop": container.pop, "del": container.__delitem__, "get": container.__getitem__,
                 "set": lambda i: container.__setitem__(i, nn.Identity())}[op](i)
            return
        if op == "pop":
            assert container.pop(i) is ref.pop(i)
        elif op == "del":
            del container[i]
            del ref[i]
        elif op == "set":
            new = nn.Identity()
            container[i] = new
            ref[i] = new
        else:
            assert container[i] is ref_result
    elif op == "delslice":
        del container[i:i + k]
        del ref[i:i + k]


@settings(max_examples=25)
@given(ops=list_ops, kind=st.sampled_from(["ModuleList", "Sequential"]))
# bug: ModuleList/Sequential had no pop and no ``+=`` (torch has both)
@example(ops=[("append", 0, 0), ("iadd", 0, 2), ("pop", -1, 0), ("pop", 5, 0)], kind="ModuleList")
# bug: Sequential.insert(5, m) on a shorter Sequential appended silently (torch: IndexError)
@example(ops=[("append", 0, 0), ("insert", 5, 0), ("insert", -2, 0)], kind="Sequential")
def test_list_ops_match_a_python_list(ops, kind):
    container = nn.ModuleList() if kind == "ModuleList" else nn.Sequential()
    ref: list = []
    for op, i, k in ops:
        _apply(container, ref, op, i, k)
        assert [id(m) for m in container] == [id(m) for m in ref]
        assert list(container._modules) == [str(n) for n in range(len(ref))]   # renumbered, as torch
        assert len(container) == len(ref)
    with pytest.raises(TypeError):
        container[1.0]                   # torch: a float index is a TypeError, never truncated


@settings(max_examples=25)
@given(n=st.integers(1, 5), start=st.integers(-6, 6) | st.none(), stop=st.integers(-6, 6) | st.none(),
       step=st.sampled_from([None, 1, 2, -1]))
# bug (documented gap closed): a Sequential slice renumbered its children; torch keeps the keys
@example(n=3, start=1, stop=None, step=None)
def test_slices_keep_torchs_keys(n, start, stop, step):
    layers = [nn.Linear(1, 1) for _ in range(n)]
    seq, mlist = nn.Sequential(*layers), nn.ModuleList(layers)
    picked = slice(start, stop, step)
    want_keys = [str(i) for i in range(n)][picked]
    part = seq[picked]
    assert type(part) is nn.Sequential and list(part._modules) == want_keys
    assert [id(m) for m in part] == [id(m) for m in layers[picked]]
    assert list(part.state_dict()) == [f"{k}.{w}" for k in want_keys for w in ("weight", "bias")]
    lpart = mlist[picked]
    assert type(lpart) is nn.ModuleList and list(lpart._modules) == [str(i) for i in range(len(want_keys))]
    assert [id(m) for m in lpart] == [id(m) for m in layers[picked]]
    # appending to a slice that kept higher keys must not replace a child (torch's str(len) would)
    extra = nn.ReLU()
    part.append(extra)
    assert [id(m) for m in part] == [id(m) for m in layers[picked]] + [id(extra)]
    x = na.ones(2, 1)
    np.testing.assert_array_equal(seq[picked](x).data if want_keys else x.data,
                                  _run(layers[picked], x).data)


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def test_sequential_named_slice_add_and_negative_index():
    a, b, c = nn.Linear(1, 1), nn.ReLU(), nn.Linear(1, 1)
    seq = nn.Sequential(__import__("collections").OrderedDict(first=a, act=b, last=c))
    assert list(seq[1:]._modules) == ["act", "last"] and seq[-1] is c and seq["act"] is b
    both = nn.Sequential(a) + nn.Sequential(b, c)
    assert [id(m) for m in both] == [id(a), id(b), id(c)] and list(both._modules) == ["0", "1", "2"]
    lst = nn.ModuleList([a]) + [b, c]                            # torch's ModuleList + any iterable
    assert [id(m) for m in lst] == [id(a), id(b), id(c)]
    with pytest.raises(TypeError):
        nn.Sequential(a) + [b]                                   # torch: Sequential + Sequential only
    with pytest.raises(TypeError, match="iterable"):
        nn.ModuleList().extend(nn.Linear(1, 1))
    with pytest.raises(TypeError):
        nn.ModuleList().append(3)


dict_ops = st.lists(st.tuples(
    st.sampled_from(["set", "pop", "del", "update_dict", "update_md", "update_pairs", "clear"]),
    st.sampled_from(["a", "b", "c", "d"])), max_size=10)


@settings(max_examples=25)
@given(ops=dict_ops)
# bug: ModuleDict.update(another ModuleDict) iterated its keys as (key, module) pairs ("ab" -> "a", "b")
@example(ops=[("update_md", "a")])
def test_module_dict_ops_match_a_dict(ops):
    md, ref = nn.ModuleDict(), {}
    for op, key in ops:
        new = nn.Identity()
        if op == "set":
            md[key] = new
            ref[key] = new                                         # an existing key keeps its place
        elif op in ("pop", "del"):
            if key not in ref:
                with pytest.raises(KeyError):
                    md.pop(key) if op == "pop" else md.__delitem__(key)
                continue
            if op == "pop":
                assert md.pop(key) is ref.pop(key)
            else:
                del md[key]
                del ref[key]
        elif op == "clear":
            md.clear()
            ref.clear()
        else:
            other = {key + "x": new, key: nn.Identity()}
            source = {"update_dict": other, "update_md": nn.ModuleDict(other),
                      "update_pairs": list(other.items())}[op]
            md.update(source)
            ref.update(other)
        assert list(md.keys()) == list(ref) and all(md[k] is v for k, v in ref.items())
        assert [k for k, _ in md.items()] == list(ref) and len(md) == len(ref)
        assert [n for n, _ in md.named_children()] == list(ref)


@pytest.mark.parametrize("bad,error", [("ab", TypeError), ([("a", nn.ReLU(), 3)], ValueError),
                                       ([("a",)], ValueError), (3, TypeError), ([("a", 3)], TypeError),
                                       ({"a.b": nn.ReLU()}, KeyError), ({"update": nn.ReLU()}, KeyError)])
def test_module_dict_update_errors(bad, error):
    with pytest.raises(error):
        nn.ModuleDict().update(bad)
