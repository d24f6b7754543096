"""The small subset of CUDA C that the device kernels are written in, and an evaluator of it on arrays.

A kernel's body (:mod:`neural_arch.core.device_kernels.kernel`) is compiled by CuPy on a GPU. Everywhere
else (the strict fake device, NumPy) the same text is *evaluated* here, one statement at a time over whole
arrays, so the CPU-run tests exercise the very formula the GPU runs rather than a copy of it.

The subset, which is also valid CUDA C++ (every kernel compiles as written)::

    const T name = <literal expression>;      // a constant: literals only, folded in double, then made T
    T name = <expression>;                    // a local variable (any declared type name)
    name = <expression>;   name += ...;       // assignment (also -=, *=, /=) to a local or an out param
    // comments

Expressions: names, integer literals, ``+ - * /``, unary ``-`` and ``!``, comparisons, ``&&``, ``||``,
``c ? a : b`` and the functions ``exp log sqrt fabs tanh copysign max min``.

Why one rule is stricter than C: a *floating* literal may appear only in a ``const`` declaration. In
CUDA C ``x * 0.5`` with ``float x`` computes in double (``0.5`` is a double), twice as slow and rounded
differently from the NumPy formula (where a Python float adopts the array's dtype). Naming the constant
``const T half = 0.5;`` makes both sides compute in ``T``. An integer literal converts to ``T`` in both
languages, so it may appear anywhere (but not ``1 / 2``: integer division in C, 0.5 in Python).

Evaluation semantics, matching a kernel thread's: ``T`` is the dtype of the arrays bound to it, Python
scalars given for a ``T`` parameter become ``T`` scalars, a declaration casts its value to its type,
``?:`` is ``xp.where`` (both sides are evaluated: the subset has no side effects).

Example::

    >>> import numpy as np
    >>> from neural_arch.core.device_kernels.c_subset import parse_statements, run_statements
    >>> program = parse_statements("const T half = 0.5; T s = x + y; z = s > 0 ? s * half : -s;")
    >>> env = run_statements(program, np, {"x": np.array([1.0, -3.0]), "y": np.array([1.0, 1.0])},
    ...                      {"T": np.dtype(np.float64)})
    >>> env["z"].tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

__all__ = ["CSubsetError", "Statement", "dtype_of", "evaluate_expression", "parse_expression",
           "parse_statements",
           "run_statements"]


class CSubsetError(ValueError):
    """Kernel source outside the subset this module evaluates (the message names the construct).

    Example::

        >>> from neural_arch.core.device_kernels.c_subset import CSubsetError, parse_statements
        >>> try:
        ...     parse_statements("y = x * 0.5;")
        ... except CSubsetError as exc:
        ...     "const T" in str(exc)
        True
    """


#: function name -> (number of arguments, name of the array-module function)
FUNCTIONS = {
    "exp": (1, "exp"), "log": (1, "log"), "sqrt": (1, "sqrt"), "fabs": (1, "abs"), "tanh": (1, "tanh"),
    "copysign": (2, "copysign"), "max": (2, "maximum"), "min": (2, "minimum"),
}

_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<float>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>&&|\|\||[<>=!+\-*/]=|[-+*/<>!?:;(),=])
""", re.VERBOSE | re.DOTALL)


def _tokens(source: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise CSubsetError(f"kernel source: cannot read {source[pos:pos + 20]!r} (outside the C subset)")
        pos = m.end()
        if m.lastgroup != "space":
            out.append((m.lastgroup, m.group()))
    out.append(("end", ""))
    return out


# --------------------------------------------------------------------------------------- syntax tree
# Expressions are tuples: ("num", value, is_float) | ("name", n) | ("call", f, args) | ("unary", op, e)
# | ("binary", op, a, b) | ("cond", c, a, b).

@dataclass(frozen=True)
class Statement:
    """One statement: ``type`` is the declared type name (``None`` for an assignment), ``op`` is
    ``"="`` or a compound ``"+="``..., ``const`` marks a constant declaration.

    Example::

        >>> from neural_arch.core.device_kernels.c_subset import parse_statements
        >>> [(s.type, s.target, s.op) for s in parse_statements("T a = x; a += 1;")]
        [('T', 'a', '='), (None, 'a', '+=')]
    """

    type: str | None
    target: str
    op: str
    value: tuple
    const: bool = False


class _Parser:
    def __init__(self, source: str):
        self.toks = _tokens(source)
        self.i = 0

    def peek(self, k: int = 0):
        return self.toks[self.i + k]

    def take(self, text: str | None = None):
        kind, value = self.toks[self.i]
        if text is not None and value != text:
            raise CSubsetError(f"kernel source: expected {text!r}, found {value or 'the end'!r}")
        self.i += 1
        return kind, value

    def statements(self) -> list[Statement]:
        out = []
        while self.peek()[0] != "end":
            out.append(self.statement())
        return out

    def statement(self) -> Statement:
        const = self.peek()[1] == "const"
        if const:
            self.take()
        if self.peek()[0] == "name" and self.peek(1)[0] == "name":  # a declaration: TYPE NAME = ...
            type_, target = self.take()[1], self.take()[1]
            self.take("=")
            value = self.expression(const_init=const)
            if const and _names(value):
                raise CSubsetError(f"kernel source: const {target} must be a literal expression")
            self.take(";")
            return Statement(type_, target, "=", value, const)
        if const:
            raise CSubsetError("kernel source: const needs a type and a name (const T name = ...;)")
        kind, target = self.take()
        if kind != "name":
            raise CSubsetError(f"kernel source: a statement must start with a name, found {target!r}")
        _, op = self.take()
        if op not in ("=", "+=", "-=", "*=", "/="):
            raise CSubsetError(f"kernel source: expected an assignment to {target}, found {op!r}")
        value = self.expression()
        self.take(";")
        return Statement(None, target, op, value)

    def expression(self, const_init: bool = False):
        self.const_init = const_init
        return self.conditional()

    def conditional(self):
        cond = self.binary(0)
        if self.peek()[1] == "?":
            self.take()
            a = self.conditional()
            self.take(":")
            return ("cond", cond, a, self.conditional())
        return cond

    _LEVELS = (("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/"))

    def binary(self, level: int):
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[1] in self._LEVELS[level] and self.peek()[0] == "op":
            op = self.take()[1]
            right = self.binary(level + 1)
            if op == "/" and left[0] == right[0] == "num" and not (left[2] or right[2]):
                raise CSubsetError("kernel source: integer / integer divides differently in C and "
                                   "Python; write the quotient as a const")
            left = ("binary", op, left, right)
        return left

    def unary(self):
        if self.peek()[1] in ("-", "!"):
            op = self.take()[1]
            return ("unary", op, self.unary())
        return self.primary()

    def primary(self):
        kind, value = self.take()
        if kind == "float":
            if not self.const_init:
                raise CSubsetError(
                    f"kernel source: the floating literal {value} would make CUDA C compute in double; "
                    f"declare it as a constant (const T name = {value};) and use the name")
            return ("num", float(value), True)
        if kind == "int":
            return ("num", int(value), False)
        if value == "(":
            e = self.conditional()
            self.take(")")
            return e
        if kind == "name":
            if self.peek()[1] != "(":
                return ("name", value)
            if value not in FUNCTIONS:
                raise CSubsetError(f"kernel source: function {value}() is not in the C subset "
                                   f"({', '.join(sorted(FUNCTIONS))})")
            self.take("(")
            args = [self.conditional()]
            while self.peek()[1] == ",":
                self.take()
                args.append(self.conditional())
            self.take(")")
            if len(args) != FUNCTIONS[value][0]:
                raise CSubsetError(f"kernel source: {value}() takes {FUNCTIONS[value][0]} argument(s)")
            return ("call", value, tuple(args))
        raise CSubsetError(f"kernel source: unexpected {value or 'end of source'!r}")


def _names(expr) -> set:
    kind = expr[0]
    if kind == "name":
        return {expr[1]}
    if kind == "num":
        return set()
    children = expr[2] if kind == "call" else expr[2:] if kind in ("unary", "binary") else expr[1:]
    out = set()
    for child in children:
        out |= _names(child)
    return out


def parse_statements(source: str) -> list[Statement]:
    """Parse a kernel body (statements ending in ``;``) into :class:`Statement` objects.

    Example::

        >>> from neural_arch.core.device_kernels.c_subset import parse_statements
        >>> len(parse_statements("const T two = 2.0;  // a constant\\ny = x * two;"))
        2
    """
    return _Parser(source).statements()


def parse_expression(source: str):
    """Parse one expression (a reduction's ``map_expr`` or ``reduce_expr``) into its syntax tree.

    Example::

        >>> from neural_arch.core.device_kernels.c_subset import parse_expression
        >>> parse_expression("a + b")
        ('binary', '+', ('name', 'a'), ('name', 'b'))
    """
    p = _Parser(source)
    e = p.expression()
    p.take("")
    return e


# --------------------------------------------------------------------------------------- evaluation
_BINARY = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "<": "less", ">": "greater",
           "<=": "less_equal", ">=": "greater_equal", "==": "equal", "!=": "not_equal",
           "&&": "logical_and", "||": "logical_or"}


def evaluate_expression(expr, xp, env: dict):
    """Evaluate a syntax tree over the arrays and scalars of ``env`` with array module ``xp``.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.c_subset import evaluate_expression, parse_expression
        >>> evaluate_expression(parse_expression("fabs(x) + 1"), np, {"x": np.array([-2.0])}).tolist()
        [3.0]
    """
    kind = expr[0]
    if kind == "num":
        return expr[1]
    if kind == "name":
        try:
            return env[expr[1]]
        except KeyError:
            raise CSubsetError(f"kernel source: {expr[1]} is not a parameter or an earlier variable"
                               ) from None
    if kind == "call":
        return getattr(xp, FUNCTIONS[expr[1]][1])(*(evaluate_expression(a, xp, env) for a in expr[2]))
    if kind == "unary":
        v = evaluate_expression(expr[2], xp, env)
        return -v if expr[1] == "-" else xp.logical_not(v)
    if kind == "binary":
        a, b = evaluate_expression(expr[2], xp, env), evaluate_expression(expr[3], xp, env)
        return getattr(xp, _BINARY[expr[1]])(a, b)
    cond, a, b = (evaluate_expression(e, xp, env) for e in expr[1:])
    return xp.where(cond, a, b)


def _cast(value, dtype):
    if hasattr(value, "astype") and not isinstance(value, np.generic):
        return value.astype(dtype, copy=False)
    return dtype.type(value)


def run_statements(statements: list[Statement], xp, env: dict, types: dict,
                   declared: dict | None = None) -> dict:
    """Run parsed statements over ``env`` (parameter name -> array or scalar); returns the final
    environment (parameters as reassigned, plus the locals). ``types`` maps each placeholder type name
    (``T``...) to its NumPy dtype (``float``, ``double``, ``intN`` are known); ``declared`` maps names
    whose type is fixed (the parameters) to their dtypes: as in C, assigning to them converts.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.c_subset import parse_statements, run_statements
        >>> env = run_statements(parse_statements("m *= 2; m += g;"), np,
        ...                      {"m": np.array([1.0]), "g": np.array([0.5])}, {})
        >>> env["m"].tolist()
        [2.5]
    """
    env = dict(env)
    declared = dict(declared or {})
    for s in statements:
        value = evaluate_expression(s.value, xp, env)
        if s.op != "=":
            if s.target not in env:
                raise CSubsetError(f"kernel source: {s.target} {s.op} before {s.target} has a value")
            value = getattr(xp, _BINARY[s.op[0]])(env[s.target], value)
        if s.type is not None:
            if s.target in env:
                raise CSubsetError(f"kernel source: {s.target} is declared twice")
            declared[s.target] = dtype_of(s.type, types)
        if s.target in declared:
            value = _cast(value, declared[s.target])
        env[s.target] = value
    return env


_C_TYPES = {"float": np.float32, "double": np.float64, "float32": np.float32, "float64": np.float64,
            "int": np.int32, "int32": np.int32, "int64": np.int64, "bool": np.bool_}


def dtype_of(type_name: str, types: dict) -> np.dtype:
    """The dtype a type name stands for: a placeholder bound in ``types``, or a concrete C/CuPy name.

    Example::

        >>> import numpy as np
        >>> from neural_arch.core.device_kernels.c_subset import dtype_of
        >>> dtype_of("T", {"T": np.float32}), dtype_of("int64", {})
        (dtype('float32'), dtype('int64'))
    """
    if type_name in types:
        return np.dtype(types[type_name])
    if type_name in _C_TYPES:
        return np.dtype(_C_TYPES[type_name])
    raise CSubsetError(f"kernel source: type {type_name} is neither a bound placeholder nor a known type")
