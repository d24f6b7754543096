"""The quorum rule, as plain data: who steps together next, who heals from whom.

The lighthouse (:mod:`neural_arch.distributed.ft.lighthouse`) gathers ``QuorumRequest``
records (one per replica that asked to step) and the set of replicas whose heartbeats are fresh,
and calls ``plan_quorum``. It is a pure function, so the rule is tested without processes:

1. Only requests of healthy replicas count (a dead replica's last request is dropped).
2. Fewer than ``min_replicas`` such requests: wait.
3. Every healthy replica asked: the quorum is all of them.
4. Some healthy replica did not ask (slow, or hung in user code while its heartbeat thread still
   beats): wait ``join_timeout`` from the oldest request, then go on without it; it joins a later
   quorum and heals there.

A quorum keeps its ``quorum_id`` (and so its process group) while the members stay the same and
none asks to reconfigure (a replica whose last step was not committed always asks: its group may be
poisoned). Members whose ``step`` is behind the quorum's ``max_step`` heal from an up-to-date member
before the step, sources spread round-robin over the up-to-date ones; at step 0 (with
``init_sync``, the default) every member heals from the first, so replicas whose initialisations
differ start from one state.

Example:
    >>> reqs = {m: QuorumRequest(m, n=1, step=4, since=0.0) for m in ("a", "b")}
    >>> reqs["c"] = QuorumRequest("c", n=1, step=0, since=0.5)     # a replacement, at step 0
    >>> q = plan_quorum(reqs, healthy={"a", "b", "c"}, previous=None, min_replicas=2,
    ...                 join_timeout=1.0, now=0.6)
    >>> q.members, q.max_step, q.heal
    (('a', 'b', 'c'), 4, {'c': 'a'})
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

__all__ = ["Quorum", "QuorumRequest", "plan_quorum"]


@dataclass(frozen=True)
class QuorumRequest:
    """One replica asks to take part in the next step.

    Args:
        member: the replica's member id (unique per live replica process).
        n: the replica's request number (the lighthouse answers each number once).
        step: committed steps the replica has (what it would heal from or to).
        since: when the lighthouse first saw this request (its own clock, seconds).
        reconfigure: the replica's last step was not committed: it needs a fresh process group.
        min_replicas: the smallest quorum this replica accepts (its ``Manager(min_replica_size=)``).
        init_sync: at step 0 the replicas' states may differ (unseeded initialisation): heal every
            member from the first one (torchft's ``init_sync``); False when every replica starts
            from the same seed.

    Example:
        >>> QuorumRequest("r0:1a2b", n=3, step=7, since=12.5).step
        7
    """

    member: str
    n: int
    step: int
    since: float
    reconfigure: bool = False
    min_replicas: int = 1
    init_sync: bool = True


@dataclass(frozen=True)
class Quorum:
    """The lighthouse's answer for one round: every member gets the same record.

    ``round`` numbers answers (votes on the step's commit are keyed by it); ``quorum_id`` changes
    only when the process group must be rebuilt; ``members`` is sorted (a member's index is its
    participating rank); ``steps`` holds each member's committed steps; ``heal`` maps each member
    that is behind to the up-to-date member it copies its state from.

    Example:
        >>> q = Quorum(round=5, quorum_id=2, members=("a", "b"), steps=(3, 3))
        >>> q.rank_of("b"), q.max_step, q.heal
        (1, 3, {})
    """

    round: int
    quorum_id: int
    members: tuple[str, ...]
    steps: tuple[int, ...]
    heal: dict[str, str] = field(default_factory=dict)

    @property
    def max_step(self) -> int:
        return max(self.steps) if self.steps else 0

    @property
    def size(self) -> int:
        return len(self.members)

    def rank_of(self, member: str) -> int:
        return self.members.index(member)

    def to_json(self) -> dict:
        return {"round": self.round, "quorum_id": self.quorum_id, "members": list(self.members),
                "steps": list(self.steps), "heal": dict(self.heal)}

    @classmethod
    def from_json(cls, data: Mapping) -> Quorum:
        return cls(int(data["round"]), int(data["quorum_id"]), tuple(data["members"]),
                   tuple(int(s) for s in data["steps"]), dict(data["heal"]))


def plan_quorum(requests: Mapping[str, QuorumRequest], healthy: AbstractSet[str], previous: Quorum | None,
                min_replicas: int, join_timeout: float, now: float) -> Quorum | None:
    """The next quorum, or None to wait (the rule in the module docstring).

    Args:
        requests: the pending request of each member (answered ones removed).
        healthy: members whose heartbeat is fresh.
        previous: the last quorum issued (None before the first).
        min_replicas: the lighthouse's smallest quorum (a request may ask for more).
        join_timeout: seconds to wait for healthy members that did not ask.
        now: the lighthouse's clock.

    Example:
        >>> reqs = {"a": QuorumRequest("a", 1, 0, since=0.0)}
        >>> plan_quorum(reqs, {"a", "b"}, None, 1, join_timeout=1.0, now=0.5) is None   # b may still ask
        True
        >>> plan_quorum(reqs, {"a", "b"}, None, 1, join_timeout=1.0, now=1.5).members  # b is late: go on
        ('a',)
    """
    candidates = {m: r for m, r in requests.items() if m in healthy}
    if not candidates:
        return None
    needed = max([int(min_replicas)] + [r.min_replicas for r in candidates.values()])
    if len(candidates) < needed:
        return None
    if not set(healthy) <= set(candidates):
        oldest = min(r.since for r in candidates.values())
        if now - oldest < join_timeout:
            return None
    members = tuple(sorted(candidates))
    steps = tuple(candidates[m].step for m in members)
    same = previous is not None and previous.members == members
    reconfigure = any(candidates[m].reconfigure for m in members)
    quorum_id = previous.quorum_id if same and not reconfigure else (previous.quorum_id + 1 if previous else 1)
    top = max(steps)
    if top == 0 and any(candidates[m].init_sync for m in members):
        sources, behind = [members[0]], list(members[1:])     # step 0: everyone takes the first one's state
    else:
        sources = [m for m, s in zip(members, steps) if s == top]
        behind = [m for m, s in zip(members, steps) if s < top]
    heal = {m: sources[i % len(sources)] for i, m in enumerate(behind)}
    return Quorum(round=(previous.round + 1 if previous else 1), quorum_id=quorum_id, members=members,
                  steps=steps, heal=heal)
