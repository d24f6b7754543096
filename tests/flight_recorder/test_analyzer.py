"""The analyzer on synthetic dumps: a missing rank, a different op, a rank behind, histories that
agree, a tie between two ranks, rings that forgot different amounts, point-to-point ops, the CLI."""

from __future__ import annotations

import json

from neural_arch.distributed.flight_recorder import analyze, load_dumps
from neural_arch.distributed.flight_recorder.__main__ import main

WORLD = [0, 1, 2]


def entry(seq, op="all_reduce", state="completed", shape=(4,), group=WORLD, root=None, p2p=False, error=None):
    return {"group": list(group), "seq": seq, "op": op, "shape": list(shape) if shape is not None else None,
            "dtype": "float32", "reduce_op": "sum" if op == "all_reduce" else None, "root": root, "state": state,
            "t_start": 1.0, "t_end": 2.0, "file": "train.py", "line": 10 + seq, "error": error, "p2p": p2p}


def dump(rank, entries, world=3, reason="timeout"):
    return {"version": 1, "rank": rank, "world_size": world, "reason": reason, "entries": entries}


def done(n, **kw):
    return [entry(s, **kw) for s in range(1, n + 1)]


def test_a_missing_rank_is_named_and_the_others_wait_where_they_stopped():
    dumps = [dump(r, done(5) + [entry(6, state="failed", error="PeerFailureError: rank 2 died")]) for r in (0, 1)]
    v = analyze(dumps)
    assert v.missing == [2] and v.first.kind == "stuck" and v.first.seq == 6 and v.first.ranks == [2]
    report = v.report()
    assert report.splitlines()[0].startswith("ranks [2] never reported")
    assert "rank 2 died" in report and "(no dump)" in report
    assert v.last_completed[(0, 1, 2)][0] == 5


def test_a_different_op_names_the_rank_its_op_and_its_caller():
    other = done(2) + [entry(3, op="broadcast", root=0, state="failed")]
    v = analyze([dump(0, done(2) + [entry(3, state="failed")]), dump(1, other), dump(2, done(2) + [entry(3)])])
    d = v.first
    assert (d.kind, d.seq, d.op, d.ranks, d.expected_ranks) == ("mismatch", 3, "all_reduce", [1], [0, 2])
    assert "rank 1 called broadcast #3 (shape (4,), float32, root 0) instead (train.py:13)" in v.report()


def test_a_different_shape_or_dtype_is_another_op():
    odd = done(1) + [entry(2, shape=(5,))]
    assert analyze([dump(0, done(2)), dump(1, odd), dump(2, done(2))]).first.other_op[1]["shape"] == [5]
    dt = done(2)
    dt[1]["dtype"] = "float64"
    assert analyze([dump(0, done(2)), dump(1, done(2)), dump(2, dt)]).first.ranks == [2]


def test_a_rank_behind_is_named_with_its_last_op():
    v = analyze([dump(0, done(3) + [entry(4, state="failed")]), dump(1, done(3)),
                 dump(2, done(3) + [entry(4, state="failed")])])
    d = v.first
    assert (d.kind, d.seq, d.behind, d.ranks) == ("behind", 4, {1: 3}, [1])
    assert "ranks [1] never did (behind)" in v.report()


def test_histories_that_agree_say_so():
    v = analyze([dump(r, done(3), world=2) for r in (0, 1)])
    assert v.first is None and v.missing == []
    assert "histories agree" in v.report()


def test_a_tie_between_two_ranks_goes_to_the_lowest_rank():
    pair = [0, 1]
    v = analyze([dump(0, done(1, group=pair) + [entry(2, group=pair)], world=2),
                 dump(1, done(1, group=pair) + [entry(2, op="barrier", shape=None, group=pair)], world=2)])
    assert v.first.expected_ranks == [0] and v.first.ranks == [1]


def test_rings_that_forgot_different_amounts_are_compared_where_all_remember():
    v = analyze([dump(0, [entry(s) for s in range(5, 9)]), dump(1, [entry(s) for s in range(3, 9)]),
                 dump(2, [entry(s) for s in range(7, 9)] + [entry(9, state="failed")])])
    assert (v.first.kind, v.first.seq, v.first.ranks) == ("behind", 9, [0, 1])


def test_point_to_point_ops_and_other_groups_are_kept_apart():
    p2p = [entry(1, op="send", root=1, p2p=True)]
    sub = [entry(1, group=[0, 1]), entry(2, group=[0, 1], state="failed")]
    v = analyze([dump(0, done(2) + p2p + sub), dump(1, done(2) + sub[:1]), dump(2, done(2))])
    assert [(d.group, d.kind, d.seq, d.ranks) for d in v.divergences] == [((0, 1), "behind", 2, [1])]


def test_the_command_line_prints_the_verdict_first(tmp_path, capsys):
    for d in (dump(0, done(2)), dump(1, done(1))):
        (tmp_path / f"rank{d['rank']}.json").write_text(json.dumps(d))
    (tmp_path / "rank2.json.tmp-x").write_text("{half")           # a write in progress is skipped
    assert [d["rank"] for d in load_dumps(str(tmp_path))] == [0, 1]
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ranks [2] never reported") and "#2" in out[1]
    assert main([str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["missing"] == [2]
