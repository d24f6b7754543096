"""The fused synchronous all_to_allv path (``Backend.alltoallv``) reuses its OpInfo only while nobody
else holds it, like all_reduce's: a kept Work, a recorded span or a held reference keeps its own.

In-process: a backend of size 2 whose ``_alltoallv`` is local (the output gets the input's rows), so
the front end itself is under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.comm.backend import Backend
from neural_arch.distributed.comm.debug import wire_word
from neural_arch.distributed.comm.work import OpInfo

pytestmark = pytest.mark.timeout(60)


class Mirror(Backend):
    """Size 2, no peer: all_to_allv copies the input's rows into the output (the splits are mirrored)."""

    name = "mirror"

    def __init__(self):
        super().__init__(0, 2, timeout=10.0)
        self.log: list = []

    def _alltoallv(self, output, input, output_splits, input_splits, info):
        self.log.append((info.seq, info.nbytes, list(output_splits), list(input_splits)))
        output[...] = input

    def _allreduce(self, array, op, info):
        pass

    def _broadcast(self, array, root, info):
        pass

    def _allgather(self, output, input, info):
        output[...] = input

    def _send(self, array, dst, tag, info):  # pragma: no cover - not used
        raise NotImplementedError("Mirror has no peers")

    def _recv(self, array, src, tag, info):  # pragma: no cover - not used
        raise NotImplementedError("Mirror has no peers")

    def _new_group(self, ranks):  # pragma: no cover - not used
        raise NotImplementedError("Mirror has no peers")


def test_the_fused_alltoallv_reuses_its_opinfo_only_while_nobody_else_holds_it(monkeypatch):
    import neural_arch.distributed.comm.backend as backend_module

    built = []

    class Counted(OpInfo):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            built.append(args[1])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(backend_module, "OpInfo", Counted)
    b = Mirror()
    x = np.arange(6.0).reshape(3, 2)
    y = np.arange(8, dtype=np.int32).reshape(4, 2)
    first = b.alltoallv(np.empty_like(x), x, [1, 2], [2, 1])
    second = b.alltoallv(np.empty_like(y), y, [4, 0], [0, 4])      # op 1's Work is alive: a new OpInfo
    assert built == [1, 2] and first.info is not second.info
    assert (first.info.seq, first.info.shape, first.info.dtype, first.info.nbytes) == (1, (3, 2), "float64", 16)
    assert (second.info.seq, second.info.shape, second.info.dtype, second.info.nbytes) == (2, (4, 2), "int32", 8)
    del first, second
    out = np.empty_like(x)
    assert b.alltoallv(out, x, [3, 0], [1, 2], _work=False) is None     # no Work: op 2's OpInfo is op 3's
    assert built == [1, 2] and out.tolist() == x.tolist()
    info = b._a2av_info
    assert (info.seq, info.shape, info.dtype, info.nbytes, info.name) == (3, (3, 2), "float64", 16, "all_to_allv")
    assert info.wire == wire_word("all_to_allv", 3, "float64", None) and info.root is None
    held = [info]
    del info
    b.alltoallv(out, x, [1, 2], [2, 1], _work=False)
    assert built == [1, 2, 4] and held[0].seq == 3 and b._a2av_info.seq == 4
    assert [entry[0] for entry in b.log] == [1, 2, 3, 4]


def test_a_recorded_span_keeps_its_own_alltoallv_opinfo():
    from neural_arch.profiler import events

    b = Mirror()
    spans: list = []
    events.subscribe(spans.append)
    try:
        for rows in (1, 2, 3):
            x = np.ones((rows, 2), np.float32)
            b.alltoallv(np.empty_like(x), x, [rows, 0], [0, rows], _work=False)
    finally:
        events.unsubscribe(spans.append)
    assert [(s.args["seq"], s.args["shape"]) for s in spans] == [(1, (1, 2)), (2, (2, 2)), (3, (3, 2))]
