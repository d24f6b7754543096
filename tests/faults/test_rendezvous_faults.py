"""Rendezvous with a missing rank: every present rank names the missing one, within the timeout."""

from __future__ import annotations

import fault_fns
import pytest

from neural_arch.distributed.testing import run_ranks

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("absent", [0, 1])
def test_every_rank_names_the_missing_rank(absent):
    results = run_ranks(fault_fns.rendezvous_without, 3, args=(absent, 3.0), init=False, timeout=50)
    for r in results:
        assert r.ok, r.traceback
        kind, message, seconds, _ = r.value
        if r.rank == absent:
            continue
        assert kind == "RendezvousError", (r.rank, kind, message)
        if absent == 0:   # rank 0 hosts the store: its absence is "the store is unreachable"
            assert "rank 0" in message and "127.0.0.1" in message, message
        else:
            assert f"ranks [{absent}] never arrived" in message, message
        assert seconds < 15, seconds
