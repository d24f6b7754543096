"""Device kernels: the fused formulas of the GPT step (GELU, softmax, log-softmax, layer norm, cross
entropy, Adam/AdamW) as CUDA C, compiled by CuPy on a GPU and evaluated from the same source elsewhere.

On a GPU an op made of NumPy-style calls launches one kernel per operation, each reading and writing
the whole activation (GELU's erf polynomial alone is about twenty). Here each formula is one kernel:

* :mod:`~neural_arch.core.device_kernels.kernel` -- a kernel declared as data (name, typed parameters,
  C source, the unfused formula it replaces, an example input); ``cupy.ElementwiseKernel`` /
  ``cupy.ReductionKernel`` on CuPy, the source evaluated over whole arrays on any other array module;
* :mod:`~neural_arch.core.device_kernels.c_subset` -- the C subset the sources are written in, and its
  evaluator (which refuses a floating literal outside a ``const``: CUDA would compute in double);
* :mod:`~neural_arch.core.device_kernels.catalogue` -- the kernels, each the CPU formula operation for
  operation;
* :mod:`~neural_arch.core.device_kernels.ops` -- the ops' device paths built from them.

The ops (``gelu``, ``softmax``, ``log_softmax``, ``layer_norm``, ``cross_entropy``, ``Adam.step``) take
these paths for float32/float64 device arrays only; NumPy arrays keep their CPU code. On the strict fake
device the evaluated source runs with no host transfer, which the strict-device tests check, together
with every kernel against its unfused formula; ``benchmarks/gpu_check.py`` compiles and checks them on
a GPU.

Example::

    >>> import numpy as np
    >>> from neural_arch.core import device_kernels
    >>> sorted(device_kernels.KERNELS)[:3]
    ['adam_l2', 'adam_l2_amsgrad', 'adamw']
    >>> device_kernels.softmax(np, np.zeros((1, 2)), -1).tolist()
    [[0.5, 0.5]]
"""

import importlib

# The names load on first use (PEP 562): the ops import this package at start-up, but only a device
# array ever reaches a kernel, so a NumPy-only process (every rank of a CPU job) skips the C-subset
# evaluator and the catalogue.
_HOMES = {
    "KERNELS": "catalogue", "adam_kernel": "catalogue",
    "ElementwiseKernel": "kernel", "ReductionKernel": "kernel", "is_cupy": "kernel",
    **{name: "ops" for name in ("KERNEL_DTYPES", "adam_step", "applies", "cross_entropy_backward", "gelu",
                                "layer_norm", "layer_norm_backward", "log_softmax", "log_softmax_backward",
                                "softmax", "softmax_backward")},
}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))


__all__ = [
    "KERNELS", "KERNEL_DTYPES", "ElementwiseKernel", "ReductionKernel", "adam_kernel", "adam_step", "applies",
    "cross_entropy_backward", "gelu", "is_cupy", "layer_norm", "layer_norm_backward", "log_softmax",
    "log_softmax_backward", "softmax", "softmax_backward",
]
