"""A device kernel declared as data: its name, its typed parameters, its CUDA C source, the unfused
NumPy formula it replaces, and an example input.

Called with an array module, a kernel runs where the arrays live:

* **CuPy**: compiled once into a ``cupy.ElementwiseKernel`` / ``cupy.ReductionKernel`` (CuPy caches the
  binary per dtype) and launched: one pass over memory for the whole formula;
* **anything else** (the strict fake device, NumPy): the same source is evaluated statement by
  statement over whole arrays (:mod:`neural_arch.core.device_kernels.c_subset`), with the semantics of
  the kernel's threads -- ``T`` bound from the arrays (a mismatch raises, as CuPy does), scalars made
  ``T``, outputs allocated at the broadcast shape or written in place when passed.

``reference`` is the formula as the unfused NumPy code writes it (any array module); tests and
``benchmarks/gpu_check.py`` compare each kernel against it on the fake device and on a GPU.

Example::

    >>> import numpy as np
    >>> from neural_arch.core.device_kernels.kernel import ElementwiseKernel
    >>> axpy = ElementwiseKernel("T a, T x, T y", "T z", "z = a * x + y;", "axpy",
    ...                          reference=lambda xp, a, x, y: a * x + y)
    >>> axpy(np, 2.0, np.arange(3.0), np.ones(3)).tolist()      # NumPy: the source, evaluated
    [1.0, 3.0, 5.0]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from neural_arch.core.device_kernels.c_subset import (
    _C_TYPES,
    CSubsetError,
    dtype_of,
    evaluate_expression,
    parse_expression,
    parse_statements,
    run_statements,
)

__all__ = ["ElementwiseKernel", "ReductionKernel", "is_cupy"]


def is_cupy(xp) -> bool:
    """Whether ``xp`` is the real CuPy module (only then are kernels compiled; the check never imports
    CuPy).

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.kernel import is_cupy
        >>> is_cupy(np)
        False
    """
    return xp is sys.modules.get("cupy") and xp is not None


def _params(text: str) -> list[tuple[str, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        words = part.split()
        if len(words) != 2:
            raise CSubsetError(f"kernel parameter {part!r}: write it as 'TYPE name'")
        out.append((words[0], words[1]))
    return out


def _is_array(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype") and not isinstance(a, np.generic)


class _Signature:
    """Typed parameters, and binding arguments to them as CuPy does."""

    def __init__(self, name: str, in_params: str, out_params: str):
        self.name = name
        self.ins, self.outs = _params(in_params), _params(out_params)

    def bind(self, args, outputs) -> tuple[dict, dict, dict, tuple]:
        """``(env, types, declared, shape)``: parameter values, placeholder dtypes, each parameter's
        dtype, and the broadcast shape of the array arguments."""
        if len(args) != len(self.ins):
            raise TypeError(f"{self.name}: {len(self.ins)} input(s) expected, {len(args)} given")
        if outputs and len(outputs) != len(self.outs):
            raise TypeError(f"{self.name}: {len(self.outs)} output(s) expected, {len(outputs)} given")
        types: dict = {}
        pairs = list(zip(self.ins, args)) + list(zip(self.outs, outputs or ()))
        for (type_, pname), a in pairs:
            if type_ in _C_TYPES or not _is_array(a):
                continue
            bound = types.setdefault(type_, a.dtype)
            if bound != a.dtype:
                raise TypeError(f"{self.name}: type {type_} is mismatched: {pname} is {a.dtype}, an earlier "
                                f"argument made {type_} {bound}")
        env, declared, shapes = {}, {}, []
        for (type_, pname), a in pairs:
            if type_ not in _C_TYPES and type_ not in types:
                raise TypeError(f"{self.name}: type {type_} of {pname} is not bound by any array argument")
            dt = dtype_of(type_, types)
            declared[pname] = dt
            if _is_array(a):
                shapes.append(a.shape)
                env[pname] = a if a.dtype == dt else a.astype(dt)
            else:
                env[pname] = dt.type(a)
        for type_, pname in self.outs:
            declared.setdefault(pname, dtype_of(type_, types))
        return env, types, declared, np.broadcast_shapes(*shapes)


class ElementwiseKernel:
    """An elementwise formula over broadcast arrays: ``cupy.ElementwiseKernel`` on a GPU, the C source
    evaluated elsewhere (module docstring).

    Args:
        in_params: CuPy's parameter list (``"T x, T y"``; a placeholder such as ``T`` takes its dtype
            from the arrays, a concrete type such as ``int64`` converts).
        out_params: the outputs, written the same way.
        operation: the body, in the C subset of :mod:`~neural_arch.core.device_kernels.c_subset`;
            out params may be read before they are written (in-place updates pass them in).
        name: the kernel's name (a C identifier).
        reference: ``reference(xp, *inputs[, *outputs])`` -> the output(s), the unfused formula.
        example: ``example(rng, dtype)`` -> the host arguments of a typical call (tests, GPU check).

    Call as ``kernel(xp, *inputs)`` (fresh outputs) or ``kernel(xp, *inputs, *outputs)`` (in place);
    one output comes back as an array, several as a tuple.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.kernel import ElementwiseKernel
        >>> ema = ElementwiseKernel("T g, T beta", "T m", "m = m * beta + g;", "ema")
        >>> m = np.zeros(2)
        >>> _ = ema(np, np.ones(2), 0.5, m)          # m updated in place
        >>> m.tolist()
        [1.0, 1.0]
    """

    def __init__(self, in_params: str, out_params: str, operation: str, name: str,
                 reference: Callable | None = None, example: Callable | None = None):
        self.signature = _Signature(name, in_params, out_params)
        self.in_params, self.out_params, self.operation, self.name = in_params, out_params, operation, name
        self.statements = parse_statements(operation)  # a source outside the subset fails at import
        self.reference, self.example = reference, example
        self._compiled = None

    def __repr__(self) -> str:
        return f"ElementwiseKernel({self.name}: {self.in_params} -> {self.out_params})"

    def __call__(self, xp, *args):
        if is_cupy(xp):
            return self.compiled(xp)(*args)
        return self.evaluate(xp, *args)

    def compiled(self, cupy):
        """The ``cupy.ElementwiseKernel`` (built once; CuPy compiles it per dtype at first launch)."""
        if self._compiled is None:
            self._compiled = cupy.ElementwiseKernel(self.in_params, self.out_params, self.operation,
                                                    self.name)
        return self._compiled

    def evaluate(self, xp, *args):
        """Run the C source with array module ``xp`` (what a non-CuPy device executes)."""
        n = len(self.signature.ins)
        inputs, outputs = args[:n], args[n:]
        env, types, declared, shape = self.signature.bind(inputs, outputs)
        env = run_statements(self.statements, xp, env, types, declared)
        results = []
        for i, (_, pname) in enumerate(self.signature.outs):
            if pname not in env:
                raise CSubsetError(f"{self.name}: the body never assigns the output {pname}")
            target = outputs[i] if outputs else xp.empty(shape, dtype=declared[pname])
            target[...] = env[pname]
            results.append(target)
        return results[0] if len(results) == 1 else tuple(results)


_REDUCTIONS = {
    ("binary", "+", ("name", "a"), ("name", "b")): "sum",
    ("call", "max", (("name", "a"), ("name", "b"))): "max",
    ("call", "min", (("name", "a"), ("name", "b"))): "min",
}


class ReductionKernel:
    """A map-reduce formula: ``cupy.ReductionKernel`` on a GPU, evaluated elsewhere as the mapped
    expression reduced by the array module (``a + b`` is a sum, ``max(a, b)`` a max) and then the
    post-map statements, which read the reduced value as ``a``.

    Call as ``kernel(xp, *inputs, axis=..., keepdims=...)``; ``reference(xp, *inputs, axis=,
    keepdims=)`` is the unfused formula; ``example(rng, dtype)`` -> ``(args, kwargs)``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.kernel import ReductionKernel
        >>> sum_sq = ReductionKernel("T x", "T y", "x * x", "a + b", "y = a", "0", "sum_sq")
        >>> sum_sq(np, np.array([[1.0, 2.0], [3.0, 4.0]]), axis=1).tolist()
        [5.0, 25.0]
    """

    def __init__(self, in_params: str, out_params: str, map_expr: str, reduce_expr: str, post_map_expr: str,
                 identity: str, name: str, reference: Callable | None = None,
                 example: Callable | None = None):
        self.signature = _Signature(name, in_params, out_params)
        if len(self.signature.outs) != 1:
            raise CSubsetError(f"{name}: a reduction kernel has one output")
        self.in_params, self.out_params, self.name = in_params, out_params, name
        self.map_expr, self.reduce_expr = map_expr, reduce_expr
        self.post_map_expr, self.identity = post_map_expr, identity
        self.mapped = parse_expression(map_expr)
        self.reduction = _REDUCTIONS.get(parse_expression(reduce_expr))
        if self.reduction is None:
            raise CSubsetError(f"{name}: reduce_expr {reduce_expr!r} is not one of 'a + b', 'max(a, b)', "
                               f"'min(a, b)'")
        if ";" in post_map_expr:  # CuPy puts it in parentheses: one assignment expression, no statements
            raise CSubsetError(f"{name}: post_map_expr must be one expression without ';', as CuPy reads it")
        self.post = parse_statements(post_map_expr + ";")
        self.reference, self.example = reference, example
        self._compiled = None

    def __repr__(self) -> str:
        return f"ReductionKernel({self.name}: {self.in_params} -> {self.out_params})"

    def __call__(self, xp, *args, axis=None, keepdims: bool = False):
        if is_cupy(xp):
            return self.compiled(xp)(*args, axis=axis, keepdims=keepdims)
        return self.evaluate(xp, *args, axis=axis, keepdims=keepdims)

    def compiled(self, cupy):
        """The ``cupy.ReductionKernel`` (built once)."""
        if self._compiled is None:
            self._compiled = cupy.ReductionKernel(self.in_params, self.out_params, self.map_expr,
                                                  self.reduce_expr,
                                                  self.post_map_expr, self.identity, self.name)
        return self._compiled

    def evaluate(self, xp, *args, axis=None, keepdims: bool = False):
        """Run the map, the reduction and the post-map with array module ``xp``."""
        env, types, declared, shape = self.signature.bind(args, ())
        (_, out_name), = self.signature.outs
        acc = declared[out_name]  # CuPy's default reduce type: the output's
        mapped = evaluate_expression(self.mapped, xp, env)
        if not _is_array(mapped) or mapped.shape != shape:
            mapped = xp.broadcast_to(xp.asarray(mapped) if not _is_array(mapped) else mapped, shape)
        mapped = mapped.astype(acc, copy=False)
        reduced = getattr(xp, self.reduction)(mapped, axis=axis, keepdims=keepdims)
        post = run_statements(self.post, xp, {"a": reduced}, types, {"a": acc, out_name: acc})
        if out_name not in post:
            raise CSubsetError(f"{self.name}: post_map_expr never assigns {out_name}")
        value = post[out_name]
        return value if _is_array(value) else xp.asarray(value)
