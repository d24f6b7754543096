"""Grad mode is per thread, as in torch: another thread's ``no_grad``, ``set_grad_enabled`` or
backward never changes what this thread's forward records.

With one process-wide switch (before), a forward that overlapped another thread's ``no_grad``
dropped the ops of that window out of the graph and their share of the gradient was lost with
no error. Each case lines the two threads up with events, so the overlap is certain.
"""

import threading

import numpy as np
import pytest

import neural_arch as na
from neural_arch.core import is_grad_enabled


def _in_thread(fn):
    """Run ``fn`` on a new thread, return what it returned (re-raising what it raised)."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below in the test's thread
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert not t.is_alive(), "the helper thread did not finish"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("switch", ["no_grad", "set_grad_enabled", "inference_mode", "plain_set"])
def test_another_threads_switch_leaves_this_forward_recording(switch):
    w = na.tensor([1.5, -2.0, 0.25], dtype=na.float64, requires_grad=True)
    inside, done = threading.Event(), threading.Event()
    seen = {}

    def other():
        if switch == "plain_set":          # called plainly: sets the mode of its own thread only
            na.set_grad_enabled(False)
            inside.set()
            done.wait(10)
            seen["other"] = is_grad_enabled()
            return
        ctx = {"no_grad": na.no_grad, "set_grad_enabled": lambda: na.set_grad_enabled(False),
               "inference_mode": na.inference_mode}[switch]()
        with ctx:
            inside.set()
            done.wait(10)
            seen["other"] = is_grad_enabled()
    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(10)
        a = w * w                       # recorded while the other thread is inside its switch
        seen["main"] = is_grad_enabled()
    finally:
        done.set()
        t.join(10)
    loss = (a * 3.0).sum()
    loss.backward()
    assert seen == {"main": True, "other": False}
    np.testing.assert_array_equal(w.grad.numpy(), 6.0 * w.numpy())


def test_new_thread_starts_enabled_and_its_no_grad_stays_there():
    with na.no_grad():
        assert _in_thread(is_grad_enabled) is True      # not inherited from the spawning thread
        assert is_grad_enabled() is False

    def switch_off():
        na.set_grad_enabled(False)
        return is_grad_enabled()
    assert _in_thread(switch_off) is False
    assert is_grad_enabled() is True


def test_backward_in_one_thread_does_not_stop_recording_in_another():
    # the engine turns grad mode off while it runs hooks; a forward on another thread at that
    # moment must still record
    w = na.tensor([2.0, 3.0], dtype=na.float64, requires_grad=True)
    v = na.tensor([0.5, -1.0], dtype=na.float64, requires_grad=True)
    in_hook, release = threading.Event(), threading.Event()

    def hold(grad):
        in_hook.set()
        release.wait(10)
        return grad
    w.register_hook(hold)
    t = threading.Thread(target=lambda: (w * w).sum().backward())
    t.start()
    try:
        assert in_hook.wait(10)
        b = (v * v).sum()               # while the other thread's backward is inside a hook
    finally:
        release.set()
        t.join(10)
    assert b.requires_grad and b.grad_fn is not None
    b.backward()
    np.testing.assert_array_equal(v.grad.numpy(), 2.0 * v.numpy())
    np.testing.assert_array_equal(w.grad.numpy(), 2.0 * w.numpy())
