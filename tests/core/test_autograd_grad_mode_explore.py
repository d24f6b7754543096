"""Exploring properties of the grad-mode switches against a plain model of the mode stack:
``no_grad``, ``enable_grad``, ``set_grad_enabled(b)`` and ``inference_mode(b)`` used as context
managers, as decorators (``@no_grad()``, bare ``@no_grad``) and on generator functions, nested in
any order, with an exception raised at the innermost level. The mode inside each level, what ops
record there, and the mode restored after each level must match the model.

Example of what one property checks::

    >>> import neural_arch as na
    >>> @na.set_grad_enabled(False)          # decorating must not switch recording off globally
    ... def predict(x):
    ...     return x * 2
    >>> na.is_grad_enabled(), predict(na.ones(1, requires_grad=True)).requires_grad
    (True, False)
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch import Tensor

MODES = ["no_grad", "enable_grad", "set_grad_enabled_true", "set_grad_enabled_false",
         "inference_mode_true", "inference_mode_false"]
STYLES = ["with", "decorator", "bare_decorator", "generator"]


def _context(mode):
    return {
        "no_grad": lambda: na.no_grad(),
        "enable_grad": lambda: na.enable_grad(),
        "set_grad_enabled_true": lambda: na.set_grad_enabled(True),
        "set_grad_enabled_false": lambda: na.set_grad_enabled(False),
        "inference_mode_true": lambda: na.inference_mode(),
        "inference_mode_false": lambda: na.inference_mode(False),
    }[mode]


def _model(mode, outer: bool) -> bool:
    """The grad mode inside ``mode`` entered while the mode is ``outer`` (torch's rules)."""
    return {"no_grad": False, "enable_grad": True, "set_grad_enabled_true": True,
            "set_grad_enabled_false": False, "inference_mode_true": False,
            "inference_mode_false": outer}[mode]


class Boom(Exception):
    pass


def _run_level(levels, seen, raise_inside, w):
    """Enter ``levels[0]`` in its style, record (mode, does an op record?) inside, recurse."""
    if not levels:
        seen.append((na.is_grad_enabled(), (w * 2).requires_grad))
        if raise_inside:
            raise Boom
        return
    (mode, style), rest = levels[0], levels[1:]
    make = _context(mode)

    def body():
        seen.append((na.is_grad_enabled(), (w * 2).requires_grad))
        _run_level(rest, seen, raise_inside, w)
        seen.append((na.is_grad_enabled(), (w * 2).requires_grad))   # inner levels restored ours

    if style == "with":
        with make():
            body()
    elif style == "decorator":
        make()(body)()
    elif style == "bare_decorator":
        if mode not in ("no_grad", "enable_grad", "inference_mode_true"):
            make()(body)()        # only these three have a bare form (torch's too)
        else:
            {"no_grad": na.no_grad, "enable_grad": na.enable_grad,
             "inference_mode_true": na.inference_mode}[mode](body)()
    else:
        def gen():
            yield body()
            yield na.is_grad_enabled()

        it = make()(gen)()
        next(it)
        seen.append(("resumed", next(it)))   # the mode holds again at every resumption
        assert list(it) == []


@settings(max_examples=40)
@given(
    levels=st.lists(st.tuples(st.sampled_from(MODES), st.sampled_from(STYLES)), min_size=1, max_size=4),
    start=st.booleans(),
    raise_inside=st.booleans(),
)
# @set_grad_enabled(False) used to switch grad mode off at decoration time and never back
@example(levels=[("set_grad_enabled_false", "decorator")], start=True, raise_inside=False)
# a decorated generator ran its body in the caller's mode (the context closed on the first call)
@example(levels=[("no_grad", "generator"), ("inference_mode_false", "with")], start=True, raise_inside=False)
@example(levels=[("enable_grad", "generator")], start=False, raise_inside=True)
def test_nested_grad_modes_match_the_model_and_are_restored(levels, start, raise_inside):
    w = Tensor(np.ones(2), requires_grad=True)
    expected = []
    mode = start
    for m, _ in levels:       # going in
        mode = _model(m, mode)
        expected.append(mode)
    modes_in = [start] + expected
    before = na.is_grad_enabled()
    seen = []
    na.set_grad_enabled(start)
    try:
        if raise_inside:
            with pytest.raises(Boom):
                _run_level(levels, seen, True, w)
        else:
            _run_level(levels, seen, False, w)
        assert na.is_grad_enabled() == start, "the outermost mode was not restored"
    finally:
        na.set_grad_enabled(before)

    # the entries recorded on the way in: one per level plus the innermost
    inward = [s for s in seen if s[0] != "resumed"][:len(levels) + 1]
    assert [m for m, _ in inward] == modes_in[1:] + [modes_in[-1]]
    assert all(rec == m for m, rec in inward), "an op recorded (or not) against the grad mode"
    if not raise_inside:
        # after each inner level returns, the mode of the level around it is back
        outward = [s for s in seen if s[0] != "resumed"][len(levels) + 1:]
        assert [m for m, _ in outward] == modes_in[1:][::-1]
        resumed = [v for tag, v in seen if tag == "resumed"]
        gen_levels = [modes_in[i + 1] for i, (_, style) in enumerate(levels) if style == "generator"]
        assert resumed == gen_levels[::-1]


def test_decorated_generator_keeps_its_mode_across_send_throw_and_close():
    @na.no_grad()
    def gen():
        got = yield na.is_grad_enabled()
        try:
            yield (got, na.is_grad_enabled())
        except KeyError:
            yield ("thrown", na.is_grad_enabled())
        finally:
            closing.append(na.is_grad_enabled())

    closing = []
    it = gen()
    assert next(it) is False and na.is_grad_enabled()
    assert it.send("x") == ("x", False) and na.is_grad_enabled()
    assert it.throw(KeyError) == ("thrown", False) and na.is_grad_enabled()
    it.close()
    assert closing == [False] and na.is_grad_enabled()


def test_set_grad_enabled_called_plainly_sets_the_mode_and_a_with_block_restores_it():
    try:
        na.set_grad_enabled(False)
        assert not na.is_grad_enabled()
        with na.set_grad_enabled(True):
            assert na.is_grad_enabled()
        assert not na.is_grad_enabled()
    finally:
        na.set_grad_enabled(True)
    assert na.is_grad_enabled()
