"""Arithmetic ops promote dtypes the way torch does (``torch.result_type``), where NumPy differs.

Before, an integer tensor with a float32 tensor or a Python float, and integer true division, gave
float64 (NumPy's rule): one integer position tensor silently turned a float32 model's activations
into float64; a bfloat16 tensor times a Python float gave float32. torch's rule, the oracle below:
the result's category (bool < integer < float < complex) is the highest among the operands; within
it the dtype comes from the dimensioned tensors of that category, else from the 0-d tensors, else
(only Python numbers) the default dtype of that category (float32 for floats); integer true
division gives the default float.
"""

import operator

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na

DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv}
_CAT = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2}


def _dt(name):
    return np.dtype(na.bfloat16) if name == "bfloat16" else np.dtype(name)


def torch_result_dtype(a, b, op):
    """The oracle: ``a``/``b`` are (dtype, ndim) for tensors or a Python number."""
    def cat(x):
        return ({bool: 0, int: 1, float: 2}[type(x)] if not isinstance(x, tuple) else _CAT[x[0].kind])
    top = max(cat(a), cat(b))
    result = None
    for dimensioned in (True, False):
        dts = [x[0] for x in (a, b) if isinstance(x, tuple) and cat(x) == top and (x[1] > 0) == dimensioned]
        if dts:
            result = dts[0] if len(dts) == 1 else np.promote_types(*dts)
            if {str(d) for d in dts} == {"bfloat16", "float16"}:
                result = np.dtype("float32")
            break
    if result is None:
        result = {0: np.dtype(bool), 1: np.dtype("int64"), 2: np.dtype("float32")}[top]
    if op == "truediv" and result.kind in "biu":
        result = np.dtype("float32")
    return result


def _tensor(name, ndim):
    data = (np.array([1, 0, 1]) if ndim else np.array(1)).astype(_dt(name))
    return na.tensor(data if name == "bool" else data + data.dtype.type(1))


operand = st.one_of(
    st.tuples(st.sampled_from(DTYPES), st.sampled_from([0, 1])),
    st.sampled_from([True, 3, 0.5]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(a=st.tuples(st.sampled_from(DTYPES), st.sampled_from([0, 1])), b=operand, op=st.sampled_from(sorted(OPS)))
@example(a=("int64", 1), b=("float32", 1), op="mul")      # position ids times a float32 tensor
@example(a=("int64", 1), b=0.5, op="mul")                  # an integer tensor times a Python float
@example(a=("int64", 1), b=2, op="truediv")                # integer true division
@example(a=("bfloat16", 1), b=0.5, op="mul")               # bfloat16 stays bfloat16 with a Python float
@example(a=("float32", 1), b=("float64", 0), op="add")     # a 0-d float64 tensor does not widen float32
@example(a=("float64", 0), b=("float32", 1), op="sub")
def test_result_dtype_follows_torch(a, b, op):
    if op == "truediv" and a[0] == "bool" and b is True:
        return
    x = _tensor(*a)
    other = _tensor(*b) if isinstance(b, tuple) else b
    if op == "sub" and (a[0] == "bool" or (isinstance(b, tuple) and b[0] == "bool") or b is True):
        return                           # torch refuses bool subtraction; not a promotion question
    out = OPS[op](x, other)
    expect = torch_result_dtype((_dt(a[0]), a[1]), (_dt(b[0]), b[1]) if isinstance(b, tuple) else b, op)
    assert out.dtype == expect, (a, b, op, out.dtype, expect)
    # the values: the float64 result rounded to the result dtype (torch's opmath for low precision)
    ref = OPS[op](x.numpy().astype(np.float64), other.numpy().astype(np.float64) if isinstance(other, na.Tensor)
                  else float(other))
    np.testing.assert_array_equal(out.numpy().astype(np.float64), np.asarray(ref).astype(expect).astype(np.float64))


@pytest.mark.parametrize("op", ["mul", "add", "truediv"])
def test_the_float_operand_gets_its_gradient_in_its_own_dtype(op):
    w = na.tensor([0.5, -1.5, 2.0], dtype=na.float32, requires_grad=True)
    ids = na.tensor([1, 2, 3])
    out = OPS[op](w, ids)
    assert out.dtype == np.float32
    out.sum().backward()
    assert w.grad.dtype == np.float32
    expect = {"mul": [1.0, 2.0, 3.0], "add": [1.0, 1.0, 1.0], "truediv": [1.0, 0.5, 1 / 3]}[op]
    np.testing.assert_allclose(w.grad.numpy(), expect, rtol=1e-6)
