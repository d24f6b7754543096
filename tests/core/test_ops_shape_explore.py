"""Exploring properties of the shape and indexing ops against NumPy: every one is linear, so its
gradient is the transpose map of the upstream gradient (written here with NumPy's own reshape,
transpose, ``add.at`` scatter...). reshape/view/transpose/permute/expand/squeeze/unsqueeze/flatten
with negative dims, cat/stack/split (int and list)/chunk with torch's piece sizes (uneven, empty
dims), getitem with slices, steps, None, Ellipsis, integer arrays with repeated entries (gradients
accumulate) and boolean masks, embedding with repeated ids and ``padding_idx``. Float32 and float64.
Pinned ``@example`` cases are bugs this exploration found.

Example of what one property checks::

    >>> import numpy as np
    >>> from neural_arch import Tensor
    >>> x = Tensor(np.arange(3.0), requires_grad=True)
    >>> x[np.array([2, 2, 0])].sum().backward()
    >>> x.grad.tolist()
    [1.0, 0.0, 2.0]
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch.nn.functional as F
from neural_arch import Tensor

DTYPES = st.sampled_from([np.float64, np.float32])


def _data(seed, shape, dtype=np.float64):
    return np.asarray(np.random.default_rng(seed).standard_normal(shape)).astype(dtype)


def _check(out, want, x, grad_of, seed):
    """``out`` equals ``want`` exactly (shape ops move values, no arithmetic) and ``x.grad`` is
    ``grad_of(g)`` for a random upstream ``g``."""
    assert out.shape == want.shape and out.dtype == want.dtype
    np.testing.assert_array_equal(out.data, want)
    g = _data(seed + 1, want.shape, want.dtype)
    out.backward(Tensor(g))
    expected = grad_of(g)
    assert x.grad.shape == x.shape
    np.testing.assert_allclose(x.grad.data, expected, rtol=1e-6, atol=1e-12)


shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)


@settings(max_examples=40)
@given(shape=shapes, dtype=DTYPES, seed=st.integers(0, 2**16), data=st.data())
def test_transpose_permute_flatten_squeeze_unsqueeze_match_numpy(shape, dtype, seed, data):
    a = _data(seed, shape, dtype)
    nd = len(shape)
    op = data.draw(st.sampled_from(["transpose", "permute", "flatten", "squeeze", "unsqueeze", "reshape"]))
    x = Tensor(a, requires_grad=True)
    if op == "transpose" and nd:
        d0, d1 = data.draw(st.integers(-nd, nd - 1)), data.draw(st.integers(-nd, nd - 1))
        _check(x.transpose(d0, d1), np.swapaxes(a, d0, d1), x, lambda g: np.swapaxes(g, d0, d1), seed)
    elif op == "permute":
        perm = data.draw(st.permutations(range(nd)))
        perm = [p - nd if data.draw(st.booleans()) else p for p in perm]
        _check(x.permute(*perm), np.transpose(a, perm), x, lambda g: np.transpose(g, np.argsort([p % nd for p in perm])),
               seed)
    elif op == "flatten" and nd:
        s = data.draw(st.integers(-nd, nd - 1))
        e = data.draw(st.integers(s % nd, nd - 1))
        want = a.reshape(shape[:s % nd] + (-1 if a.size else int(np.prod(shape[s % nd:e + 1])),) + shape[e + 1:])
        _check(x.flatten(s, e), want, x, lambda g: g.reshape(shape), seed)
    elif op == "squeeze" and nd:
        d = data.draw(st.integers(-nd, nd - 1))
        want = np.squeeze(a, d) if shape[d] == 1 else a  # torch: a non-1 dim is left alone
        _check(x.squeeze(d), want, x, lambda g: g.reshape(shape), seed)
    elif op == "unsqueeze":
        d = data.draw(st.integers(-nd - 1, nd))
        _check(x.unsqueeze(d), np.expand_dims(a, d), x, lambda g: g.reshape(shape), seed)
    else:
        _check(x.reshape(-1), a.reshape(-1), x, lambda g: g.reshape(shape), seed)


def test_out_of_range_dims_raise_instead_of_wrapping():
    """Pins: ``transpose(0, 5)`` on a 2-d tensor swapped dims 0 and 1 (5 % 2), ``flatten(1, 0)``
    returned a (2, 1, 3) tensor and ``flatten(0, 5)`` wrapped around; torch raises for all three.
    ``transpose(0, -1)`` of a 1-d tensor is the identity, as torch."""
    x = Tensor(np.ones((2, 3)))
    with pytest.raises(IndexError):
        x.transpose(0, 5)
    with pytest.raises(RuntimeError, match="start_dim"):
        x.flatten(1, 0)
    with pytest.raises(IndexError):
        Tensor(np.ones((2, 3, 4))).flatten(0, 5)
    assert Tensor(np.ones(3)).transpose(0, -1).shape == (3,)
    assert Tensor(np.float64(2.0)).flatten().shape == (1,)


def _torch_split_sizes(n, size):
    return [size] * (n // size) + ([n % size] if n % size else []) if n else [0]


def _torch_chunk_sizes(n, chunks):
    if n == 0:
        return [0] * chunks
    size = -(-n // chunks)
    return _torch_split_sizes(n, size)


@settings(max_examples=40)
@given(n=st.integers(0, 7), other=st.integers(1, 2), dtype=DTYPES, seed=st.integers(0, 2**16),
       how=st.sampled_from(["split_int", "split_list", "chunk"]), k=st.integers(1, 4), dim_neg=st.booleans())
@example(n=0, other=2, dtype=np.float64, seed=0, how="chunk", k=2, dim_neg=False)
@example(n=0, other=2, dtype=np.float64, seed=0, how="split_int", k=2, dim_neg=False)
@example(n=5, other=1, dtype=np.float64, seed=0, how="chunk", k=4, dim_neg=True)
def test_split_chunk_pieces_follow_torch_and_cat_undoes_them(n, other, dtype, seed, how, k, dim_neg):
    """torch's piece sizes: ``split(s)`` pieces of s (the last smaller; one empty piece for an empty
    dim), ``chunk(c)`` pieces of ``ceil(n / c)`` (maybe fewer than c; c empty pieces for an empty dim).
    Pins: an empty dim gave no pieces at all."""
    a = _data(seed, (other, n), dtype)
    x = Tensor(a, requires_grad=True)
    dim = -1 if dim_neg else 1
    if how == "split_int":
        pieces, sizes = x.split(k, dim=dim), _torch_split_sizes(n, k)
    elif how == "chunk":
        pieces, sizes = x.chunk(k, dim=dim), _torch_chunk_sizes(n, k)
    else:
        cuts = sorted(np.random.default_rng(seed).integers(0, n + 1, k - 1).tolist())
        sizes = np.diff([0] + cuts + [n]).tolist()  # zero-size sections included
        pieces = x.split(sizes, dim=dim)
    assert [p.shape[1] for p in pieces] == sizes
    joined = F.cat(pieces, dim=dim)
    np.testing.assert_array_equal(joined.data, a)
    g = _data(seed + 1, a.shape, dtype)
    (joined * Tensor(g)).sum().backward()
    np.testing.assert_array_equal(x.grad.data, g)


def test_split_refuses_negative_sizes():
    """Pin: ``split([-1, 3])`` of a length-2 dim returned two length-1 pieces (slices with -1)."""
    with pytest.raises(ValueError, match="non-negative"):
        Tensor(np.ones(2)).split([-1, 3])
    with pytest.raises(ValueError):
        Tensor(np.ones(3)).split(0)


@settings(max_examples=30)
@given(n=st.integers(1, 3), count=st.integers(1, 3), dtype=DTYPES, seed=st.integers(0, 2**16), dim=st.integers(-3, 2))
def test_stack_and_cat_route_gradients_to_each_input(n, count, dtype, seed, dim):
    arrays = [_data(seed + i, (2, n), dtype) for i in range(count)]
    xs = [Tensor(a, requires_grad=True) for a in arrays]
    out = F.stack(xs, dim=dim)
    want = np.stack(arrays, axis=dim)
    np.testing.assert_array_equal(out.data, want)
    g = _data(seed + 9, want.shape, dtype)
    out.backward(Tensor(g))
    for i, x in enumerate(xs):
        np.testing.assert_array_equal(x.grad.data, np.take(g, i, axis=dim))


INDEXES = {
    "slice_step": lambda s: (slice(None, None, 2),),
    "neg_step": lambda s: (slice(None, None, -1),),
    "none_ellipsis": lambda s: (None, Ellipsis, slice(1, None)),
    "int_then_slice": lambda s: (-1, slice(None)),
    "repeated_rows": lambda s: (np.array([0, 0, s[0] - 1, 0]),),
    "repeated_pairs": lambda s: (np.array([0, 0, 1 % s[0]]), np.array([1 % s[1], 1 % s[1], 0])),
    "list_in_tuple": lambda s: (slice(None), [0, 0, s[1] - 1]),
    "negative_ints": lambda s: (np.array([-1, -1, 0]),),
    "bool_rows": lambda s: (np.arange(s[0]) % 2 == 0,),
    "bool_full": lambda s: (np.arange(s[0] * s[1]).reshape(s[0], s[1]) % 3 == 0,),
    "bool_and_int": lambda s: (np.arange(s[0]) < 2, 0),
    "index_2d": lambda s: (np.array([[0, 0], [s[0] - 1, 0]]),),
    "tensor_index": lambda s: (Tensor(np.array([0, 0])),),
}


@settings(max_examples=60)
@given(kind=st.sampled_from(sorted(INDEXES)), rows=st.integers(1, 4), cols=st.integers(1, 4),
       dtype=DTYPES, seed=st.integers(0, 2**16), transposed=st.booleans())
def test_getitem_gradients_accumulate_like_add_at(kind, rows, cols, dtype, seed, transposed):
    a = _data(seed, (cols, rows) if transposed else (rows, cols), dtype)
    a = a.T if transposed else a
    x = Tensor(a, requires_grad=True)
    idx = INDEXES[kind]((rows, cols))
    np_idx = tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    np_idx = np_idx[0] if len(np_idx) == 1 else np_idx
    out = x[idx[0] if len(idx) == 1 else idx]
    want = a[np_idx]

    def grad_of(g):
        gx = np.zeros(a.shape, dtype)
        np.add.at(gx, np_idx, g)
        return gx

    _check(out, np.asarray(want), x, grad_of, seed)


@settings(max_examples=30)
@given(num=st.integers(1, 5), dim=st.integers(1, 3), ids_shape=st.sampled_from([(4,), (2, 3), (0,), (70,)]),
       padding=st.sampled_from([None, 0, -1]), dtype=DTYPES, seed=st.integers(0, 2**16))
@example(num=3, dim=2, ids_shape=(70,), padding=-1, dtype=np.float64, seed=0)
def test_embedding_matches_numpy_with_repeated_ids_and_padding_idx(num, dim, ids_shape, padding, dtype, seed):
    """torch's ``padding_idx``: that row is read like any other but gets no gradient (the (70,)
    case takes the sorted-rows scatter path, >= 64 ids)."""
    rng = np.random.default_rng(seed)
    w = _data(seed, (num, dim), dtype)
    ids = rng.integers(0, num, ids_shape)
    tw = Tensor(w, requires_grad=True)
    out = F.embedding(ids, tw, padding_idx=padding)
    want = w[ids]
    g = _data(seed + 1, want.shape, dtype)
    out.backward(Tensor(g))
    gw = np.zeros((num, dim))
    np.add.at(gw, ids.reshape(-1), g.reshape(-1, dim).astype(np.float64))
    if padding is not None:
        gw[padding] = 0
    np.testing.assert_array_equal(out.data, want)
    tol = 1e-12 if dtype == np.float64 else 2e-5  # float32 sums of up to 70 rows
    np.testing.assert_allclose(tw.grad.data, gw, rtol=tol, atol=tol)


def test_embedding_refuses_negative_ids_and_bad_padding_idx():
    """Pin: id -1 silently read the last row (NumPy's wrap-around); torch raises."""
    w = Tensor(np.arange(6.0).reshape(3, 2))
    with pytest.raises(IndexError, match="out of range"):
        F.embedding(np.array([0, -1]), w)
    with pytest.raises(IndexError):
        F.embedding(np.array([3]), w)
    with pytest.raises(ValueError, match="padding_idx"):
        F.embedding(np.array([0]), w, padding_idx=3)


def test_expand_and_setitem():
    x = Tensor(np.arange(3.0).reshape(3, 1), requires_grad=True)
    out = x.expand(2, -1, 4)
    np.testing.assert_array_equal(out.data, np.broadcast_to(np.arange(3.0).reshape(3, 1), (2, 3, 4)))
    out.sum().backward()
    assert x.grad.tolist() == [[8.0], [8.0], [8.0]]
    y = Tensor(np.zeros((2, 3)))
    y[np.array([0, 0]), np.array([1, 1])] = 5.0
    y[:, ::2] = np.array([1.0, 2.0])
    assert y.tolist() == [[1.0, 5.0, 2.0], [1.0, 0.0, 2.0]]
