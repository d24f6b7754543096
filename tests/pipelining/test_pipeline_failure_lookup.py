"""The culprit lookup of ``pipelining/failure.py`` against a store written while it reads.

In-process, no ranks: a dict store whose record of one rank appears between two of the lookup's
reads, as happens when two neighbours of a hung stage time out together.
"""

import json

from neural_arch.distributed.pipelining import failure


class _RacyStore:
    """A store where ``late_key`` exists only from its ``appear_at``-th check on."""

    def __init__(self, records, late_key, late_record, appear_at):
        self.data = {k: json.dumps(v).encode() for k, v in records.items()}
        self.late_key, self.late = late_key, json.dumps(late_record).encode()
        self.appear_at, self.checks = appear_at, 0

    def check(self, keys):
        (key,) = keys
        if key == self.late_key:
            self.checks += 1
            if self.checks >= self.appear_at:
                self.data[key] = self.late
        return key in self.data

    def get(self, key):
        return self.data[key]


class _Group:
    ranks = [0, 1, 2, 3]


def _edge(rank, peer):
    return {"kind": "edge", "rank": rank, "stage": rank, "peer": peer, "peer_stage": peer,
            "action": f"RECV@s{peer}", "microbatch": 0, "error": "CollectiveTimeoutError: timed out"}


def test_a_neighbour_recording_mid_lookup_is_not_named_the_culprit(monkeypatch):
    group = _Group()
    monkeypatch.setattr(failure, "_generation", lambda: 0)
    monkeypatch.setattr(failure, "SETTLE_S", 0.05)
    base = failure._base(group, 1)
    # rank 1 waited for rank 2, which waited for the hung rank 3; rank 2's record lands after the
    # lookup's first scan and its first walk of the chain have read "no record" (its 3rd check)
    store = _RacyStore({f"{base}/rank1": _edge(1, 2)}, f"{base}/rank2", _edge(2, 3), appear_at=3)
    monkeypatch.setattr(failure, "_store", lambda: store)
    rank, text = failure.culprit(group, 1, 1, wait_s=2.0)
    assert rank == 3, text
    assert text.startswith("pipeline stage 3 (global rank 3) stopped answering: stage 2"), text
