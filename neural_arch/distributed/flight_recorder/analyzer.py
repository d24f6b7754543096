"""Reading the dumps: where did the ranks' histories split?

:func:`load_dumps` reads a folder of ``rank<R>.json`` files (one per rank, as
:mod:`~neural_arch.distributed.flight_recorder.writer` writes them); :func:`analyze` compares the
ranks' collectives group by group, by sequence number, and returns a :class:`Verdict`:

* the **first sequence number at which the histories differ**, and how: ranks that are **behind**
  (they never issued that op: their last op is earlier), ranks that **took another op** (another
  op, shape, dtype, reduce op or root than the others at that number), or ranks that **never
  reported** (no dump: most likely dead, or hung where no dump could run);
* when every reporting rank agrees, the first op that did not complete everywhere (all ranks
  reached it and it failed or hangs: look at its error and at the ranks that never reported);
* the **last op every rank completed**, per group;
* then one row per rank: its last completed op, the op it was in, the caller's file:line.

What it reads with care, so that the verdict is never confidently wrong:

* **rings that wrapped** (``ring_size`` records kept): each number is compared among the ranks that
  still hold it; a rank that kept no op of a group is not "behind" there (:attr:`Divergence.forgotten`),
  and where a ring forgot the ops up to the split the verdict says the split may be earlier
  (:attr:`Divergence.unseen`);
* **several groups**: a rank blocked in a sub-group's split is "behind" on the world only because of
  it, so the divergence that is a cause comes first; when every split is only ranks waiting in
  another one, the verdict says the ranks wait for each other across groups (:attr:`Verdict.deadlock`);
* **groups with the same members**: records carry their group's id (``group_id``: the same on every
  member, different between groups of the same members, e.g. ``"pg1/group2"``), and groups are keyed
  by members *and* id, so a group made again (a new ``init_process_group``, an elastic re-form) and
  two live groups of the same members each get their own verdict (:attr:`Divergence.group_id`).
  Records without an id (dumps from before ids, a backend nothing named) are read as before: a
  group made again (numbers start over at 1) replaces the old one's records, and ranks whose rings
  do not show it are named as maybe holding the old group's (:attr:`Verdict.maybe_old`); two live
  groups of the same members cannot be told apart and are named, not compared (:attr:`Verdict.mixed`);
* ops queued behind the one a rank waits in (async) are not read as a split.

The verdict is worded after PyTorch's ``fr_trace``: it names ranks, ops and sequence numbers, never
"something went wrong". Point-to-point ops are not compared (their numbers count each rank's own
sends and receives); one that did not complete is named with its peer (:attr:`Verdict.p2p_pending`).

Example::

    >>> def d(rank, ops):   # a synthetic dump: (seq, op, state) on the world group of 2
    ...     return {"rank": rank, "world_size": 2, "entries": [
    ...         {"group": [0, 1], "seq": s, "op": o, "shape": [4], "dtype": "float32", "reduce_op": None,
    ...          "root": None, "state": st, "p2p": False} for s, o, st in ops]}
    >>> v = analyze([d(0, [(1, "all_reduce", "completed"), (2, "all_reduce", "failed")]),
    ...              d(1, [(1, "all_reduce", "completed"), (2, "broadcast", "failed")])])
    >>> v.first.seq, sorted(v.first.other_op)
    (2, [1])
"""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Divergence", "Verdict", "analyze", "describe", "load_dumps"]


def load_dumps(folder: str) -> list:
    """Every rank's dump in ``folder`` (``rank<R>.json``; half-written temp files are skipped).

    Example::

        dumps = load_dumps("/tmp/fr")
        sorted(d["rank"] for d in dumps)      # the ranks that reported
    """
    dumps = []
    for path in sorted(glob.glob(os.path.join(folder, "rank*.json"))):
        try:
            with open(path) as f:
                dumps.append(json.load(f))
        except (OSError, ValueError):
            continue
    return dumps


def _key(e: dict) -> tuple:
    shape = e.get("shape")
    return (e["op"], tuple(shape) if shape is not None else None, e.get("dtype"), e.get("reduce_op"), e.get("root"))


def describe(e: dict | None) -> str:
    """One record in words: ``all_reduce #4 (shape (4,), float32, sum)``.

    >>> describe({"op": "broadcast", "seq": 3, "shape": [2], "dtype": "float64", "root": 0})
    'broadcast #3 (shape (2,), float64, root 0)'
    """
    if e is None:
        return "nothing"
    parts = []
    if e.get("shape") is not None:
        parts.append(f"shape {tuple(e['shape'])}")
    if e.get("dtype"):
        parts.append(e["dtype"])
    if e.get("reduce_op"):
        parts.append(e["reduce_op"])
    if e.get("root") is not None:
        parts.append(("peer " if e.get("p2p") else "root ") + str(e["root"]))
    return f"{e['op']} #{e['seq']}" + (f" ({', '.join(parts)})" if parts else "")


def _label(members, group_id=None) -> str:
    """How the report names a group: ``group [0, 1]``, with its id when it has one.

    >>> _label((0, 1), "pg1/group2")
    'group [0, 1] (pg1/group2)'
    """
    return f"group {list(members)}" + (f" ({group_id})" if group_id else "")


def _where(e: dict | None) -> str:
    if not e or not e.get("file"):
        return ""
    return f"{e['file']}:{e['line']}"


@dataclass
class Divergence:
    """Where one group's histories split (or, with ``kind == "stuck"``, the op none got past).

    ``kind``: ``"mismatch"`` (some ranks took another op), ``"behind"`` (some ranks never issued
    it), ``"stuck"`` (all reporting ranks issued the same op and it did not complete everywhere:
    :attr:`ranks` are then the members that never reported, if any).
    ``expected``: the op most ranks issued at ``seq`` (ties: the lowest rank's).

    Example::

        >>> Divergence((0, 1), 5, "behind", behind={1: 4}).ranks
        [1]
    """

    group: tuple
    seq: int
    kind: str
    expected: dict | None = None
    expected_ranks: list = field(default_factory=list)
    #: rank -> the record it has at ``seq`` instead of ``expected``
    other_op: dict = field(default_factory=dict)
    #: rank -> its last sequence number on this group (< ``seq``)
    behind: dict = field(default_factory=dict)
    #: members of the group with no dump
    missing: list = field(default_factory=list)
    #: for ``"stuck"``, rank -> its record of the op none got past (state, error)
    waiting: dict = field(default_factory=dict)
    #: members whose ring wrapped and kept no op of this group (where they stand here is unknown)
    forgotten: list = field(default_factory=list)
    #: members whose ring no longer holds every op up to ``seq`` (it wrapped) where that matters: it
    #: forgot ``seq`` itself, or the op before it while another member still holds that one, or it
    #: holds ``seq`` only as queued behind an op it forgot. The histories may then split earlier
    #: than ``seq``, or at ``seq`` on these ranks.
    unseen: list = field(default_factory=list)
    #: the group's id (``"pg1/group2"``, None for records without one), which tells, with ``group``,
    #: which group of those with these members split
    group_id: str | None = None

    @property
    def ranks(self) -> list:
        """The ranks to look at first (those that took another op, are behind, never reported, or whose
        ring forgot this group)."""
        return sorted({*self.other_op, *self.behind, *self.missing, *self.forgotten})

    @property
    def op(self) -> str | None:
        """The op the other ranks were in at ``seq`` (what the named ranks did not match)."""
        return self.expected["op"] if self.expected else None


@dataclass
class Verdict:
    """What :func:`analyze` found (the first divergence, per-group details, the per-rank table).

    Example::

        verdict = analyze(load_dumps("/tmp/fr"))
        if verdict.first is not None:
            print(verdict.first.seq, verdict.first.ranks)   # where, and whom to look at first
        print(verdict.report())
    """

    world_size: int
    reported: list
    missing: list
    divergences: list
    #: group -> (seq, record) of the last op every reporting member completed; a group is keyed by its
    #: members (a tuple), or by ``(members, group_id)`` where several groups of the dumps have those members
    last_completed: dict
    #: per rank, a dict of its last completed record, its record in flight and why it dumped
    rows: dict
    #: True when every divergence's ranks are only waiting inside another group's divergence (the
    #: ranks called collectives of different groups in different orders and wait for each other)
    deadlock: bool = False
    #: group -> ranks whose records of it mix two groups with the same members (not compared)
    mixed: dict = field(default_factory=dict)
    #: rank -> its point-to-point records that did not complete (never compared across ranks)
    p2p_pending: dict = field(default_factory=dict)
    #: for each group, the ranks whose records of it may be the old group's (other ranks' rings show
    #: the group made again, numbers back to 1; theirs do not)
    maybe_old: dict = field(default_factory=dict)

    @property
    def first(self) -> Divergence | None:
        """The divergence to read first, the one on the largest group (the world, usually)."""
        return self.divergences[0] if self.divergences else None

    def report(self) -> str:
        """The verdict first, then one line per rank (what ``python -m ...flight_recorder`` prints)."""
        lines = []
        if self.missing:
            lines.append(f"ranks {self.missing} never reported (no dump: likely dead, or hung where no dump "
                         "could run; SIGUSR1 dumps a live rank)")
        for g, ranks in self.mixed.items():
            lines.append(f"{_label(*_unkey(g))}: not compared: the rings of ranks {ranks} mix the records of two "
                         "groups with these members (the records hold no group id); compare those ranks' records by "
                         "hand")
        for g, ranks in self.maybe_old.items():
            lines.append(f"{_label(*_unkey(g))}: made again with the same members (numbers start over at 1); the "
                         f"records of ranks {ranks} may be the old group's (the records hold no group id): read its "
                         "verdict with care")
        if not self.divergences:
            agree = ("the reporting ranks' histories agree" if not self.mixed else
                     "the other groups' histories agree")
            lines.append(f"{agree} and every recorded collective completed")
        if self.deadlock:
            waits = "; ".join(f"ranks {d.expected_ranks} wait in {describe(d.expected)} on "
                              f"{_label(d.group, d.group_id)} for ranks {d.ranks}" for d in self.divergences)
            lines.append(f"the ranks wait for each other across groups ({waits}): they called these groups' "
                         "collectives in different orders")
        for d in self.divergences:
            g = _label(d.group, d.group_id)
            if d.unseen:
                lines.append(f"{g}: the rings of ranks {d.unseen} no longer hold every op up to #{d.seq} "
                             f"(they wrapped): the histories may split before #{d.seq}, or at #{d.seq} on those ranks")
            if d.kind == "mismatch":
                tie = max(Counter(_key(e) for e in d.other_op.values()).values()) >= len(d.expected_ranks)
                lines.append(f"{g}: histories differ first at #{d.seq}"
                             f"{' (a tie: nothing says which side is right)' if tie else ''}: ranks {d.expected_ranks} "
                             f"called {describe(d.expected)}")
                for r, e in sorted(d.other_op.items()):
                    lines.append(f"  rank {r} called {describe(e)} instead ({_where(e) or 'caller unknown'})")
                for r, last in sorted(d.behind.items()):
                    lines.append(f"  rank {r} is behind: its last op on this group is #{last}")
            elif d.kind == "behind":
                called = (describe(d.expected) if d.expected is not None else
                          f"#{d.seq} (their rings no longer hold which op)")
                lines.append(f"{g}: histories differ first at #{d.seq}: ranks {d.expected_ranks} called "
                             f"{called}; ranks {sorted(d.behind)} never did (behind)")
                at = {(x.group, x.group_id, x.seq) for x in self.divergences if x is not d}
                for r, last in sorted(d.behind.items()):
                    row = self.rows.get(r, {})
                    cur = row.get("in_flight")
                    waits = (f"; it waits in {describe(cur)} on {_label(cur['group'], cur.get('group_id'))} "
                             "(a split above)"
                             if cur and (tuple(cur["group"]), cur.get("group_id"), cur["seq"]) in at
                             and not cur.get("p2p") else "")
                    lines.append(f"  rank {r}: last op on this group #{last}; last completed "
                                 f"{describe(row.get('last_completed'))}{waits}")
            else:
                state = Counter(e.get("state") for e in d.waiting.values())
                err = next((e.get("error") for e in d.waiting.values() if e.get("error")), None)
                who = f"; ranks {d.missing} never reported" if d.missing else ""
                forgot = (f"; ranks {d.forgotten} kept no op of this group (their ring wrapped): they may not have "
                          "arrived") if d.forgotten else ""
                who_reached = f"ranks {d.expected_ranks}" if d.unseen else "every reporting rank"
                lines.append(f"{g}: {who_reached} reached {describe(d.expected)} and it did not "
                             f"complete ({', '.join(f'{k}: {v}' for k, v in sorted(state.items()))}){who}{forgot}")
                if err:
                    lines.append(f"  error: {err}")
        for r, recs in sorted(self.p2p_pending.items()):
            for e in recs:
                group = e.get("group") or []
                root = e.get("root")
                peer = group[root] if root is not None and 0 <= root < len(group) else root
                lines.append(f"rank {r}: point-to-point {e['op']} #{e['seq']} with rank {peer} did not complete "
                             f"({e.get('state')}): rank {peer} did not post the matching "
                             f"{'recv' if e['op'].endswith('send') else 'send'}, or is stuck")
        for g, (seq, e) in self.last_completed.items():
            lines.append(f"{_label(*_unkey(g))}: last op every reporting rank completed: "
                         f"{describe(e) if e else 'none'}")
        lines.append("")
        lines.append(f"{'rank':>4}  {'last completed':<40}  {'in flight / failed':<40}  caller")
        for r in sorted(set(self.rows) | set(self.missing)):
            row = self.rows.get(r)
            if row is None:
                lines.append(f"{r:>4}  {'(no dump)':<40}")
                continue
            cur = row.get("in_flight")
            cur_s = f"{describe(cur)} {cur['state']}" if cur else "-"
            lines.append(f"{r:>4}  {describe(row.get('last_completed')):<40}  {cur_s:<40}  {_where(cur)}")
        return "\n".join(lines)


def analyze(dumps: list, world_size: int | None = None) -> Verdict:
    """Compare the ranks' dumps (see the module docstring).

    Example::

        print(analyze(load_dumps("/tmp/fr")).report())
    """
    by_rank = {d["rank"]: d for d in dumps if d.get("rank") is not None}
    world = max([world_size or 0, *(d.get("world_size") or 0 for d in dumps), *(r + 1 for r in by_rank)])
    missing = [r for r in range(world) if r not in by_rank]
    # (members, group id) -> rank -> seq -> record (collectives only)
    hist: dict = {}
    rows = {}
    mixed: dict = {}        # group -> ranks whose records of it cannot be one group's
    remade: dict = {}       # group -> ranks whose records show it made again (numbers back to 1)
    p2p_pending: dict = {}
    for r, d in by_rank.items():
        last_done = in_flight = None
        last_seq: dict = {}
        for e in d.get("entries", ()):
            if e.get("state") == "completed":
                last_done = e
            elif in_flight is None or e.get("state") != "queued" or in_flight.get("state") == "queued":
                in_flight = e          # the newest op that did not complete (queued ones only if nothing runs)
            if e.get("p2p"):
                if e.get("state") != "completed":
                    p2p_pending.setdefault(r, []).append(e)
                continue
            # a group is its members and its id: records with an id are one group's (an id names one
            # group for a process's life); for records without one (older dumps), the numbers tell
            g = (tuple(e["group"]), e.get("group_id"))
            mine = hist.setdefault(g, {}).setdefault(r, {})
            # One group's records in a ring are numbered 1, 2, 3... in the order they were issued.
            # Back to 1: the group was made again with the same members (a new init_process_group):
            # its older records belong to the group that is gone. Any other jump: two live groups have
            # the same members, and the records (which hold no group id) cannot be told apart.
            prev = last_seq.get(g)
            if prev is not None and e["seq"] != prev + 1:
                if e["seq"] == 1:
                    mine.clear()
                    remade.setdefault(g, set()).add(r)
                else:
                    mixed.setdefault(g, set()).add(r)
            last_seq[g] = e["seq"]
            mine[e["seq"]] = e
        rows[r] = {"last_completed": last_done, "in_flight": in_flight, "reason": d.get("reason")}
    divergences = []
    last_completed = {}
    for key in sorted(hist, key=lambda g: (-len(g[0]), g[0], g[1] or "")):
        if key in mixed:
            continue
        group, group_id = key
        per = hist[key]
        members = list(group)
        reporting = [r for r in members if r in by_rank]
        absent = [r for r in members if r not in by_rank]
        for r in reporting:
            per.setdefault(r, {})
        # A rank whose ring wrapped and kept no op of this group: its last op here is older than its
        # oldest record, so where it stands on this group is unknown -- never "behind" (it may have
        # completed every op of the group long ago).
        forgot = sorted(r for r in reporting if not per[r] and _wrapped(by_rank[r]))
        for r in forgot:
            del per[r]
        reporting = [r for r in reporting if r not in forgot]
        if not reporting:
            continue
        # from the oldest number any member still holds: a rank whose ring no longer holds a number
        # is left out there (the records of one group in a ring are a run of consecutive numbers)
        low = min((min(h) for h in per.values() if h), default=1)
        high = max((max(h) for h in per.values() if h), default=0)
        done = {r: max((s for s, e in h.items() if e.get("state") == "completed"), default=0)
                for r, h in per.items()}
        common = min(done.values(), default=0)
        ref = next((per[r][common] for r in reporting if common in per[r]), None)
        last_completed[key] = (common, ref)
        div = stuck = None
        for s in range(low, high + 1):
            present = {r: per[r][s] for r in reporting if s in per[r]}
            behind = {r: max(per[r], default=0) for r in reporting if s not in per[r] and not min(per[r], default=0) > s}
            # a rank whose last op here did not complete is waiting in it, not behind: what others
            # queued after it (async ops) says nothing about a split
            waiting_earlier = ([r for r in behind if per[r][behind[r]].get("state") != "completed"]
                               if stuck is not None else [])
            for r in waiting_earlier:
                del behind[r]
            if waiting_earlier and not behind:
                break
            if not present:
                # nobody holds #s any more; those whose ring starts after it issued it, the others did not
                passed = sorted(r for r in reporting if min(per[r], default=0) > s)
                if behind and passed:
                    div = Divergence(group, s, "behind", None, passed, {}, behind, absent, forgotten=forgot,
                                     unseen=_unseen(per, s))
                    break
                continue
            counts = Counter(_key(e) for e in present.values())
            top = max(counts.values())
            # the most common op; a tie goes to the lowest rank's
            best = next(_key(e) for r, e in sorted(present.items()) if counts[_key(e)] == top)
            expected_ranks = sorted(r for r, e in present.items() if _key(e) == best)
            expected = present[expected_ranks[0]]
            other = {r: e for r, e in present.items() if _key(e) != best}
            if other or behind:
                div = Divergence(group, s, "mismatch" if other else "behind", expected, expected_ranks, other,
                                 behind, absent, forgotten=forgot)
                div.unseen = _unseen(per, s)
                break
            if stuck is None and any(e.get("state") != "completed" for e in present.values()):
                stuck = Divergence(group, s, "stuck", expected, expected_ranks, {}, {}, absent, present, forgot,
                                   _unseen(per, s))
                if not stuck.unseen:
                    break
                # some rings no longer hold #s: a later number may still show ranks behind or another op
        if div is None:
            div = stuck
        if div is not None:
            div.group_id = group_id
            divergences.append(div)
    divergences, deadlock = _causes_first(divergences, by_rank)
    # members whose rings do not show the group made again may hold only the old group's records
    older = {g: sorted(r for r in g[0] if r in by_rank and r not in rs and hist[g].get(r))
             for g, rs in remade.items() if g not in mixed}
    # the Verdict's dicts are keyed by members alone where no other group of the dumps has them
    shared = Counter(g[0] for g in hist)

    def public(g):
        return g[0] if shared[g[0]] == 1 else g
    return Verdict(world, sorted(by_rank), missing, divergences, {public(g): v for g, v in last_completed.items()},
                   rows, deadlock, {public(g): sorted(rs) for g, rs in mixed.items()}, p2p_pending,
                   {public(g): rs for g, rs in older.items() if rs})


def _unkey(g: tuple) -> tuple:
    """``(members, group_id)`` of a key of the Verdict's dicts (members alone, or members and id)."""
    if len(g) == 2 and isinstance(g[0], tuple):
        return g
    return g, None


def _unseen(per: dict, seq: int) -> list:
    """The ranks whose ring no longer holds every op up to ``seq`` where it matters (see
    :attr:`Divergence.unseen`); ``per``: rank -> seq -> record on one group."""
    held = {r: min(h) for r, h in per.items() if h}
    # the op before: it matters only where a member that holds it did not complete it
    before = any(h.get(seq - 1, {}).get("state", "completed") != "completed" for h in per.values())
    return sorted(r for r, m in held.items()
                  if m > seq or (m == seq > 1 and (before or per[r][seq].get("state") == "queued")))


def _wrapped(dump: dict) -> bool:
    """Whether a rank's ring forgot records (it holds as many as it can; dumps without ``ring_size``: no)."""
    size = dump.get("ring_size")
    return bool(size) and len(dump.get("entries", ())) >= size


def _causes_first(divergences: list, by_rank: dict) -> tuple:
    """The divergences, those that are a cause first; and whether all are only effects (a deadlock).

    A divergence is an effect when its only named ranks are *behind* (or kept no op of its group) and
    each of them is blocked in the op where another group's histories split: a rank stuck in a
    sub-group's all_reduce is behind on the world only because of it, so the sub-group's divergence
    is the one to read first.
    """
    where = {(d.group, d.group_id, d.seq): d for d in divergences}

    def effect(d: Divergence) -> bool:
        if d.kind == "mismatch" or d.missing or not (d.behind or d.forgotten):
            return False
        for r in (*d.behind, *d.forgotten):
            blocked = any(e.get("state") != "completed" and not e.get("p2p") and
                          where.get((tuple(e["group"]), e.get("group_id"), e["seq"])) not in (None, d)
                          for e in by_rank[r].get("entries", ()))
            if not blocked:
                return False
        return True

    effects = [effect(d) for d in divergences]
    ordered = [d for d, e in zip(divergences, effects) if not e] + [d for d, e in zip(divergences, effects) if e]
    return ordered, bool(divergences) and all(effects)
