"""Run the docstring examples of the core modules (they are documentation that must not rot)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "neural_arch",
    "neural_arch.backend",
    "neural_arch.config",
    "neural_arch.nn.functional",
    "neural_arch.core",
    "neural_arch.core.autograd",
    "neural_arch.core.tensor",
    "neural_arch.core.ops_basic",
    "neural_arch.core.op_utils",
    "neural_arch.core.ops_reduce",
    "neural_arch.core.ops_shape",
    "neural_arch.core.ops_nn",
    "neural_arch.core.ops_attention",
    "neural_arch.nn.moe",
    "neural_arch.core.ops_activation",
    "neural_arch.core.ops_loss",
    "neural_arch.core.rng",
    "neural_arch.core.generator",
    "neural_arch.core.dtypes",
    "neural_arch.core.factory",
    "neural_arch.core.ops_inplace",
    "neural_arch.core.ops_conv",
    "neural_arch.core.ops_norm",
    "neural_arch.serialization",
    "neural_arch.utils.atomic_file",
    "neural_arch.data.dataset",
    "neural_arch.data.dataloader",
    "neural_arch.data.sampler",
]


@pytest.mark.parametrize("name", MODULES)
@pytest.mark.usefixtures("doctest_tempdir")
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
