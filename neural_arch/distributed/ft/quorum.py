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
5. **Never two lines of history.** A healthy replica that did not ask may hold a newer state than
   every candidate: it stepped on in a quorum the candidates were not in (its step committed, or is
   still in flight). Then wait -- past ``join_timeout`` -- until it asks (and the others heal from it)
   or its heartbeat stops. Without this rule two replicas could each commit steps alone while the
   other is slow, reach the same step count with different weights, and later average gradients
   with no heal: a silent divergence. (torchft avoids it by requiring a majority of the heartbeating
   replicas in every quorum; this rule keeps going on without a slow replica that is not ahead.)

6. **Same step, other history.** A replica whose heartbeat lapsed (a stalled process, not a dead
   one) is left out while the others commit steps; if it had itself committed steps alone before,
   it comes back at the same step count with other weights. The lighthouse records each member's
   *line* (the round of the last quorum whose step its state holds: ``lines``); up-to-date replicas
   on different lines are not equal: those off the newest line heal from it.

A quorum keeps its ``quorum_id`` (and so its process group) while the members stay the same and
none asks to reconfigure (a replica whose last step was not committed always asks: its group may be
poisoned). Members whose ``step`` is behind the quorum's ``max_step`` heal from an up-to-date member
before the step, sources spread round-robin over the up-to-date ones; at step 0 (with
``init_sync``, the default) every member heals from the first, so replicas whose initialisations
differ start from one state.

**Sharded replicas** (ZeRO/FSDP inside a replica): each rank of a replica asks as a member of its own,
naming its ``replica`` and its ``shard`` index out of ``num_shards``. The rule then counts
*replicas*: a replica takes part only when every one of its shards asked (else it is waited for,
like a healthy replica that did not ask); a replica's step is its shards' smallest; and a replica
that is behind heals shard by shard, each member from the member of the source replica with the
**same shard index**. Members are ordered by (replica, shard), so a replica has the same rank in
every shard's *lane* (the members of one shard index: they reduce together).

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

        replica: the replica this member belongs to ("": the member is a whole replica).
        shard: the member's shard index in its replica (0 unless the replica is sharded).
        num_shards: how many members (shards) make up the replica; every replica has as many.
        heal_head: the size of the heal's first message this member asks for if it is healed (a
            new replica computes it from its own state:
            :func:`~neural_arch.distributed.ft.transfer.head_bytes_for`); 0: the default.

    Example:
        >>> QuorumRequest("r0:1a2b", n=3, step=7, since=12.5).step
        7
        >>> QuorumRequest("r0/s1:9f", n=1, step=0, since=0.0, replica="r0", shard=1, num_shards=2).shard
        1
    """

    member: str
    n: int
    step: int
    since: float
    reconfigure: bool = False
    min_replicas: int = 1
    init_sync: bool = True
    replica: str = ""
    shard: int = 0
    num_shards: int = 1
    heal_head: int = 0


@dataclass(frozen=True)
class Quorum:
    """The lighthouse's answer for one round: every member gets the same record.

    ``round`` numbers answers (votes on the step's commit are keyed by it); ``quorum_id`` changes
    only when the process group must be rebuilt; ``members`` is sorted (a member's index is its
    participating rank); ``steps`` holds each member's committed steps; ``heal`` maps each member
    that is behind to the up-to-date member it copies its state from. With sharded replicas
    ``shards`` holds each member's shard index: the members of one index form a *lane* (its own
    process group); ``size`` and ``rank_of`` are then counted within the lane, i.e. in replicas.
    ``heal_head`` holds, for each member in ``heal`` that asked for one, the size of the heal's
    first message (the receiver posts exactly that; its healer sends exactly that).

    Example:
        >>> q = Quorum(round=5, quorum_id=2, members=("a", "b"), steps=(3, 3))
        >>> q.rank_of("b"), q.max_step, q.heal, q.size
        (1, 3, {}, 2)
        >>> q = Quorum(1, 1, members=("a0", "a1", "b0", "b1"), steps=(3,) * 4, shards=(0, 1, 0, 1))
        >>> q.lane("b1"), q.rank_of("b1"), q.size
        (('a1', 'b1'), 1, 2)
    """

    round: int
    quorum_id: int
    members: tuple[str, ...]
    steps: tuple[int, ...]
    heal: dict[str, str] = field(default_factory=dict)
    shards: tuple[int, ...] = ()
    heal_head: dict[str, int] = field(default_factory=dict)

    @property
    def max_step(self) -> int:
        return max(self.steps) if self.steps else 0

    @property
    def size(self) -> int:
        """Replicas in the quorum (members, unless the replicas are sharded)."""
        return len(self.lane(self.members[0])) if self.members else 0

    def shard_of(self, member: str) -> int:
        return self.shards[self.members.index(member)] if self.shards else 0

    def lane(self, member: str) -> tuple[str, ...]:
        """The members with ``member``'s shard index, in rank order (all members if unsharded)."""
        if not self.shards:
            return self.members
        shard = self.shard_of(member)
        return tuple(m for m, s in zip(self.members, self.shards) if s == shard)

    def rank_of(self, member: str) -> int:
        """``member``'s rank in its lane: its replica's index in the quorum."""
        return self.lane(member).index(member)

    def to_json(self) -> dict:
        return {"round": self.round, "quorum_id": self.quorum_id, "members": list(self.members),
                "steps": list(self.steps), "heal": dict(self.heal), "shards": list(self.shards),
                "heal_head": dict(self.heal_head)}

    @classmethod
    def from_json(cls, data: Mapping) -> Quorum:
        return cls(int(data["round"]), int(data["quorum_id"]), tuple(data["members"]),
                   tuple(int(s) for s in data["steps"]), dict(data["heal"]),
                   tuple(int(s) for s in data.get("shards", ())),
                   {m: int(n) for m, n in data.get("heal_head", {}).items()})


def plan_quorum(requests: Mapping[str, QuorumRequest], healthy: AbstractSet[str], previous: Quorum | None,
                min_replicas: int, join_timeout: float, now: float,
                known_steps: Mapping[str, int] | None = None,
                lines: Mapping[str, int] | None = None) -> Quorum | None:
    """The next quorum, or None to wait (the rule in the module docstring).

    Args:
        requests: the pending request of each member (answered ones removed).
        healthy: members whose heartbeat is fresh.
        previous: the last quorum issued (None before the first).
        min_replicas: the lighthouse's smallest quorum (a request may ask for more).
        join_timeout: seconds to wait for healthy members that did not ask.
        now: the lighthouse's clock.
        known_steps: for members that did not ask, the newest step they may hold (the lighthouse's
            record of the quorums they were in and whether those committed): rule 5.
        lines: for members that asked, the round of the last quorum whose step their state holds
            (the lighthouse's record; a member not in it is on an unknown line): rule 6.

    Example:
        >>> reqs = {"a": QuorumRequest("a", 1, 0, since=0.0)}
        >>> plan_quorum(reqs, {"a", "b"}, None, 1, join_timeout=1.0, now=0.5) is None   # b may still ask
        True
        >>> plan_quorum(reqs, {"a", "b"}, None, 1, join_timeout=1.0, now=1.5).members  # b is late: go on
        ('a',)
        >>> plan_quorum(reqs, {"a", "b"}, None, 1, 1.0, now=9.0, known_steps={"b": 2}) is None  # b went ahead
        True
    """
    candidates = {m: r for m, r in requests.items() if m in healthy}
    if not candidates:
        return None
    replicas: dict[str, dict[int, QuorumRequest]] = {}
    for r in sorted(candidates.values(), key=lambda r: r.since):   # a newer member of a shard replaces an older
        replicas.setdefault(r.replica or r.member, {})[r.shard] = r
    complete = {key: shards for key, shards in replicas.items()
                if all(r.num_shards == len(shards) for r in shards.values()) and set(shards) == set(range(len(shards)))}
    needed = max([int(min_replicas)] + [r.min_replicas for r in candidates.values()])
    if len(complete) < needed:
        return None
    taking_part = {r.member for shards in complete.values() for r in shards.values()}
    superseded = set(candidates) - {r.member for shards in replicas.values() for r in shards.values()}
    replica_step = {key: min(r.step for r in shards.values()) for key, shards in complete.items()}
    top = max(replica_step.values())
    absent = set(healthy) - taking_part - superseded   # healthy but not asked, or a shard of theirs missing
    if absent:
        oldest = min(r.since for shards in complete.values() for r in shards.values())
        if now - oldest < join_timeout:
            return None
        if known_steps and any(known_steps.get(m, -1) > top for m in absent):
            return None   # rule 5: one of them may hold a newer state than every candidate
    order = sorted(complete)
    ranked = [complete[key][s] for key in order for s in range(len(complete[key]))]
    members = tuple(r.member for r in ranked)
    steps = tuple(r.step for r in ranked)
    sharded = any(len(complete[key]) > 1 for key in order)
    same = previous is not None and previous.members == members
    reconfigure = any(r.reconfigure for r in ranked)
    quorum_id = previous.quorum_id if same and not reconfigure else (previous.quorum_id + 1 if previous else 1)
    if top == 0 and any(r.init_sync for r in ranked):
        sources, behind = [order[0]], order[1:]     # step 0: everyone takes the first one's state
    else:
        sources = [key for key in order if replica_step[key] == top]
        behind = [key for key in order if replica_step[key] < top]
        line = {key: lines.get(complete[key][0].member) for key in sources} if lines else {}
        if len({v for v in line.values() if v is not None}) > 1:   # rule 6: two histories at one step
            newest = max(v for v in line.values() if v is not None)
            behind = sorted(behind + [key for key in sources if line[key] != newest])
            sources = [key for key in sources if line[key] == newest]
    heal = {}
    for i, key in enumerate(behind):              # shard s of a replica heals from shard s of its source
        source = complete[sources[i % len(sources)]]
        for s, r in complete[key].items():
            heal[r.member] = source[s].member
    heal_head = {m: candidates[m].heal_head for m in heal if candidates[m].heal_head > 0}
    return Quorum(round=(previous.round + 1 if previous else 1), quorum_id=quorum_id, members=members,
                  steps=steps, heal=heal, shards=tuple(r.shard for r in ranked) if sharded else (),
                  heal_head=heal_head)
