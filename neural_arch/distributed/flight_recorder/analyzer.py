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

The verdict is worded after PyTorch's ``fr_trace``: it names ranks, ops and sequence numbers, never
"something went wrong". Point-to-point ops are listed in the table but not compared (their numbers
count each rank's own sends and receives).

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

    @property
    def ranks(self) -> list:
        """The ranks to look at first (those that took another op, are behind, or never reported)."""
        return sorted({*self.other_op, *self.behind, *self.missing})

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
    #: group -> (seq, record) of the last op every reporting member completed
    last_completed: dict
    #: per rank, a dict of its last completed record, its record in flight and why it dumped
    rows: dict

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
        if not self.divergences:
            lines.append("the reporting ranks' histories agree and every recorded collective completed")
        for d in self.divergences:
            g = list(d.group)
            if d.kind == "mismatch":
                lines.append(f"group {g}: histories differ first at #{d.seq}: ranks {d.expected_ranks} called "
                             f"{describe(d.expected)}")
                for r, e in sorted(d.other_op.items()):
                    lines.append(f"  rank {r} called {describe(e)} instead ({_where(e) or 'caller unknown'})")
                for r, last in sorted(d.behind.items()):
                    lines.append(f"  rank {r} is behind: its last op on this group is #{last}")
            elif d.kind == "behind":
                lines.append(f"group {g}: histories differ first at #{d.seq}: ranks {d.expected_ranks} called "
                             f"{describe(d.expected)}; ranks {sorted(d.behind)} never did (behind)")
                for r, last in sorted(d.behind.items()):
                    row = self.rows.get(r, {})
                    lines.append(f"  rank {r}: last op on this group #{last}; last completed "
                                 f"{describe(row.get('last_completed'))}")
            else:
                state = Counter(e.get("state") for e in d.waiting.values())
                err = next((e.get("error") for e in d.waiting.values() if e.get("error")), None)
                who = f"; ranks {d.missing} never reported" if d.missing else ""
                lines.append(f"group {g}: every reporting rank reached {describe(d.expected)} and it did not "
                             f"complete ({', '.join(f'{k}: {v}' for k, v in sorted(state.items()))}){who}")
                if err:
                    lines.append(f"  error: {err}")
        for g, (seq, e) in self.last_completed.items():
            lines.append(f"group {list(g)}: last op every reporting rank completed: "
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
    # group -> rank -> seq -> record (collectives only)
    hist: dict = {}
    rows = {}
    for r, d in by_rank.items():
        last_done = in_flight = None
        for e in d.get("entries", ()):
            if e.get("state") == "completed":
                last_done = e
            else:
                in_flight = e          # the newest op that did not complete
            if e.get("p2p"):
                continue
            hist.setdefault(tuple(e["group"]), {}).setdefault(r, {})[e["seq"]] = e
        rows[r] = {"last_completed": last_done, "in_flight": in_flight, "reason": d.get("reason")}
    divergences = []
    last_completed = {}
    for group in sorted(hist, key=lambda g: (-len(g), g)):
        per = hist[group]
        members = list(group)
        reporting = [r for r in members if r in by_rank]
        absent = [r for r in members if r not in by_rank]
        for r in reporting:
            per.setdefault(r, {})
        low = max((min(h) for h in per.values() if h), default=1)
        high = max((max(h) for h in per.values() if h), default=0)
        done = {r: max((s for s, e in h.items() if e.get("state") == "completed"), default=0)
                for r, h in per.items()}
        common = min(done.values(), default=0)
        ref = next((per[r][common] for r in reporting if common in per[r]), None)
        last_completed[group] = (common, ref)
        div = None
        for s in range(low, high + 1):
            here = {r: per[r].get(s) for r in reporting}
            present = {r: e for r, e in here.items() if e is not None}
            behind = {r: max(per[r], default=0) for r, e in here.items() if e is None}
            counts = Counter(_key(e) for e in present.values())
            top = max(counts.values())
            # the most common op; a tie goes to the lowest rank's
            best = next(_key(e) for r, e in sorted(present.items()) if counts[_key(e)] == top)
            expected_ranks = sorted(r for r, e in present.items() if _key(e) == best)
            expected = present[expected_ranks[0]]
            other = {r: e for r, e in present.items() if _key(e) != best}
            if other or behind:
                div = Divergence(group, s, "mismatch" if other else "behind", expected, expected_ranks, other,
                                 behind, absent)
                break
            if any(e.get("state") != "completed" for e in present.values()):
                div = Divergence(group, s, "stuck", expected, expected_ranks, {}, {}, absent, present)
                break
        if div is not None:
            divergences.append(div)
    return Verdict(world, sorted(by_rank), missing, divergences, last_completed, rows)
