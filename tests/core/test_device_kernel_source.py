"""The device kernels' source (neural_arch.core.device_kernels): the C subset's evaluator means what
CUDA C means, refuses what would silently differ on a GPU, the kernels use the CPU formulas' constants,
and on a GPU (marked ``gpu``) every kernel compiles and equals its unfused formula."""

from __future__ import annotations

import copy
import doctest
import importlib

import numpy as np
import pytest

from neural_arch.core import device_kernels, ops_activation
from neural_arch.core.device_kernels import catalogue
from neural_arch.core.device_kernels.c_subset import CSubsetError, parse_statements, run_statements
from neural_arch.core.device_kernels.kernel import ElementwiseKernel, ReductionKernel


def _run(source, types=None, **env):
    return run_statements(parse_statements(source), np, env, types or {"T": np.float32})


def test_statements_follow_c_precedence_and_conversion():
    env = _run("const T half = 0.5; T a = x + y * 2 - 1; T b = -a * half; T c = a > 0 && b < 0 ? a : b; c /= 2;",
               x=np.float32(1), y=np.float32(3))
    assert env["a"] == 6 and env["b"] == -3 and env["c"] == 3
    assert all(env[k].dtype == np.float32 for k in "abc")  # float32 stays float32 (no double literal)
    env = _run("int64 k = 7; k = k * 2 + 1;", types={})
    assert env["k"] == 15 and env["k"].dtype == np.int64


@pytest.mark.parametrize("source,match", [
    ("y = x * 0.5;", "const T"),                       # CUDA would compute in double
    ("const T c = x * 2.0;", "literal expression"),    # a const folds literals only
    ("y = 1 / 2;", "integer / integer"),              # 0 in C, 0.5 in Python
    ("y = erfc(x);", "not in the C subset"),
    ("y = x", "expected ';'"),
    ("y += x;", "before y has a value"),
    ("y = z;", "not a parameter"),
    ("T x = 1; T x = 2;", "declared twice"),
])
def test_the_subset_refuses_what_would_differ_on_a_gpu(source, match):
    with pytest.raises(CSubsetError, match=match):
        _run(source, x=np.float32(1))


def test_kernels_bind_types_and_outputs_as_cupy_does():
    scale = ElementwiseKernel("T x, T a, int64 k", "T y", "y = x * a + k;", "scale")
    y = scale(np, np.ones(3, np.float32), 2.0, np.arange(3))
    assert y.dtype == np.float32 and y.tolist() == [2.0, 3.0, 4.0]
    out = np.zeros((2, 3), np.float32)
    assert scale(np, np.ones(3, np.float32), 2.0, 1, out) is out and out.tolist() == [[3.0] * 3] * 2
    with pytest.raises(TypeError, match="mismatched"):
        scale(np, np.ones(3, np.float32), 2.0, 0, np.zeros(3))
    with pytest.raises(TypeError, match="not bound"):
        scale(np, 1.0, 2.0, 0)
    with pytest.raises(CSubsetError, match="never assigns"):
        ElementwiseKernel("T x", "T y, T z", "y = x;", "half")(np, np.ones(2))
    with pytest.raises(CSubsetError, match="reduce_expr"):
        ReductionKernel("T x", "T y", "x", "a * b", "y = a", "1", "product")
    with pytest.raises(CSubsetError, match="without ';'"):
        ReductionKernel("T x", "T y", "x", "a + b", "y = a;", "0", "total")
    biggest = ReductionKernel("T x", "T y", "fabs(x)", "max(a, b)", "y = a", "0", "biggest")
    assert biggest(np, np.array([[1.0, -3.0], [2.0, 0.5]]), axis=1).tolist() == [3.0, 2.0]


def test_the_kernels_use_the_cpu_formulas_constants():
    assert catalogue.AS_P == ops_activation._AS_P and catalogue.AS_A == ops_activation._AS_A
    assert catalogue.INV_SQRT_2 == ops_activation._INV_SQRT_2
    assert catalogue.INV_SQRT_2PI == ops_activation._INV_SQRT_2PI
    assert catalogue.SQRT_2_OVER_PI == ops_activation._SQRT_2_OVER_PI


def test_every_kernel_has_a_reference_and_an_example():
    for name, kernel in device_kernels.KERNELS.items():
        assert kernel.name == name and callable(kernel.reference) and callable(kernel.example), name


@pytest.mark.parametrize("module", ["c_subset", "kernel", "catalogue", "ops", ""])
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(module):
    name = "neural_arch.core.device_kernels" + (f".{module}" if module else "")
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0 and result.attempted > 0, name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_every_kernel_compiles_on_a_gpu_and_equals_its_formula(dtype):
    import cupy

    tol = {np.float32: 1e-5, np.float64: 1e-11}[dtype]
    for name, kernel in device_kernels.KERNELS.items():
        args, kwargs = kernel.example(np.random.default_rng(0), dtype)
        on_gpu = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in copy.deepcopy(args)]
        compiled = kernel(cupy, *on_gpu, **kwargs)
        unfused = kernel.reference(np, *copy.deepcopy(args), **kwargs)
        for got, want in zip(compiled if isinstance(compiled, tuple) else (compiled,),
                             unfused if isinstance(unfused, tuple) else (unfused,)):
            assert got.dtype == dtype, name
            np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=tol, atol=tol, err_msg=name)
