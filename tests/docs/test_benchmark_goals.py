"""The goals table of docs/benchmarks.md is generated from committed raw results, and says "met"
only where the worst committed run meets the goal (issue 30, "Figures a reader can reproduce").

Pure Python, no benchmark is run: the committed JSON files are read, and the rules are pinned on
tiny fabricated runs.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest

from benchmarks import goals
from benchmarks.goals import Goal, goal_met, meets, worst

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")


def _doc() -> str:
    with open(DOC) as fh:
        return fh.read()


# --- the committed page ----------------------------------------------------------------------

def test_doc_table_is_the_generated_one():
    current = goals.doc_block(_doc())
    assert current is not None, "docs/benchmarks.md lost its goals markers"
    assert current == goals.block(), "run `python benchmarks/goals.py --write` (and commit the result files)"


_FIGURE = re.compile(r"\d+(\.\d+)?\s*(x|ms|us|µs|s|%|GB/s|MB/s|MiB|KiB|tokens/s)\b")
# a section may quote figures without a raw result of its own only when it says which kind of figure it is
_NO_RAW_OK = re.compile(r"^#+ The suite|README's test command")      # the suite's own time: not a benchmark


def test_every_section_that_quotes_figures_names_its_raw_result_or_says_it_is_history():
    """Below the goals table the page is a log of what each stop measured: a section that quotes a
    figure names a committed raw result (``benchmarks/results/...`` or ``results/...``), or is about
    the test suite's own time. Figures without raw results live in docs/benchmark_history.md."""
    text = _doc()
    sections = re.split(r"\n(?=#{2,4} )", text[text.index("<!-- goals:end"):])
    bare = []
    for section in sections[1:]:
        heading = section.splitlines()[0]
        if _FIGURE.search(section) and "results/" not in section and not _NO_RAW_OK.search(section):
            bare.append(heading)
    assert not bare, (f"sections quoting figures with no committed raw result: {bare}; commit the run's JSON "
                      "under benchmarks/results/ and name it, or move the figures to docs/benchmark_history.md")


def test_goals_table_sits_in_goals_at_a_glance():
    text = _doc()
    heading = text.index("## Goals at a glance\n")
    following = text.index("\n## ", heading + 1)
    assert heading < text.index(goals.BEGIN) < text.index(goals.END) < following


def _expand(path: str) -> list:
    """Shell-style braces: ``a{1,2}`` and ``a{1..3}``."""
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    body = match.group(1)
    span = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    alternatives = [str(i) for i in range(int(span.group(1)), int(span.group(2)) + 1)] if span else body.split(",")
    return [q for alt in alternatives for q in _expand(path[:match.start()] + alt + path[match.end():])]


def test_expand_braces():
    assert _expand("r/x_run{1,2}.json") == ["r/x_run1.json", "r/x_run2.json"]
    assert _expand("r/x_run{1..3}.{md,json}")[-1] == "r/x_run3.json"


def test_every_raw_result_the_page_names_exists():
    # `benchmarks/results/...` or, in backticks, `results/...`. Plots (.png) are outputs the scripts
    # write and .gitignore keeps out of the tree; every other file there is a raw result.
    text = _doc()
    named = re.findall(r"benchmarks/results/[\w.{},*-]+[\w}*]", text)
    named += ["benchmarks/" + p for p in re.findall(r"`(results/[\w.{},*-]+[\w}*])", text)]
    assert len(named) > 10
    missing = []
    for path in named:
        for one in _expand(path):
            if one.endswith((".png", "/")):
                continue
            if not glob.glob(os.path.join(ROOT, one)):
                missing.append(one)
    assert not missing, f"docs/benchmarks.md names raw results that are not in benchmarks/results/: {missing}"


def test_every_met_goal_has_a_committed_run_whose_worst_meets_it():
    for goal in goals.GOALS:
        runs = goals.load_runs(goal)
        cell = goals.met_cell(goal, runs)
        if cell.startswith("yes"):
            assert runs, goal.key
            for label, values in goals.by_label([r.values for r in runs]).items():
                assert meets(worst(values, goal.better), goal), (goal.key, label, values)
        for run in runs:
            assert os.path.isfile(os.path.join(goals.RESULTS, run.name))


def test_goal_keys_and_commands_are_well_formed():
    keys = [g.key for g in goals.GOALS]
    assert len(keys) == len(set(keys))
    names = {}
    for goal in goals.GOALS:
        assert goal.better in ("higher", "lower")
        command = goal.command
        if command is None:
            continue
        assert ("{out}" in command.argv) != ("{stem}" in command.argv), command.argv
        script = command.argv.split()[1]
        assert os.path.isfile(os.path.join(ROOT, script)), script
        assert names.setdefault(command.name, command) == command, f"two commands named {command.name}"
        assert command.run_glob() in goal.globs()


# --- the rules, on fabricated runs ------------------------------------------------------------

HIGHER = Goal("h", 0, "busbw >= 1.3x", None, (), lambda d: d.get("v"), 1.3, "higher", goals.ratio)
LOWER = Goal("l", 0, "step <= 1.15x", None, (), lambda d: d.get("v"), 1.15, "lower", goals.ratio)
STRICT = Goal("s", 0, "restart < 5 s", None, (), lambda d: d.get("v"), 5.0, "lower", goals.seconds, strict=True)


def test_a_single_run():
    assert goal_met(HIGHER, [{"": 1.4}]) is True
    assert goal_met(HIGHER, [{"": 1.2}]) is False
    assert goal_met(LOWER, [{"": 1.1}]) is True


def test_a_run_exactly_at_the_threshold():
    assert goal_met(HIGHER, [{"": 1.3}]) is True
    assert goal_met(LOWER, [{"": 1.15}]) is True
    assert goal_met(STRICT, [{"": 5.0}]) is False
    assert goal_met(STRICT, [{"": 4.999}]) is True


def test_the_worst_run_decides_in_each_direction():
    # higher is better: the lowest run counts; lower is better: the highest run counts
    assert goal_met(HIGHER, [{"": 1.9}, {"": 1.29}, {"": 1.8}]) is False
    assert goal_met(HIGHER, [{"": 1.9}, {"": 1.31}, {"": 1.8}]) is True
    assert goal_met(LOWER, [{"": 0.9}, {"": 1.16}]) is False
    assert goal_met(LOWER, [{"": 0.9}, {"": 1.14}]) is True


def test_every_label_must_meet_it():
    runs = [{"256 KiB": 1.5, "4 MiB": 1.9}, {"256 KiB": 1.2, "4 MiB": 1.8}]
    assert goal_met(HIGHER, runs) is False
    assert goal_met(HIGHER, [{"256 KiB": 1.5, "4 MiB": 1.9}]) is True


def test_no_run_is_not_measured():
    assert goal_met(HIGHER, []) is None
    assert goals.met_cell(HIGHER, []) == "not measured"


def _write(folder, name: str, payload: dict) -> None:
    with open(os.path.join(folder, name), "w") as fh:
        json.dump(payload, fh)


def test_rows_from_fabricated_files(tmp_path):
    env = {"commit": "0123456789abcdef+dirty", "load_average": [1.234, 2.0, 3.0]}
    _write(tmp_path, "x_run1.json", {"environment": env, "v": {"": 1.8}})
    _write(tmp_path, "x_run2.json", {"environment": {}, "loadavg_1min": 0.5, "v": {"": 1.3}})
    _write(tmp_path, "x_run3.json", {"environment": {}, "v": {"": 1.5}})
    _write(tmp_path, "x_other.json", {"environment": {}, "unrelated": 1})  # not a run of this goal
    goal = Goal("x", 16, "busbw >= 1.3x", None, ("x_*.json",), lambda d: d.get("v"), 1.3, "higher", goals.ratio)
    issue, _text, measured, raw, met = goals.row(goal, str(tmp_path))
    assert issue == "#16"
    assert measured == "1.50x (1.30x - 1.80x); 3 runs"
    assert raw == ("`x_run1.json` (0123456+dirty, load 1.23); `x_run2.json` (commit not recorded, load 0.50); "
                   "`x_run3.json` (commit not recorded, load not recorded)")
    assert met == "yes (worst 1.30x)"
    _write(tmp_path, "x_run4.json", {"environment": {}, "v": {"": 1.29}})
    assert goals.row(goal, str(tmp_path))[4] == "no (1.29x)"


def test_a_blocked_goal_says_why(tmp_path):
    goal = Goal("g", 6, "GPU", None, ("none*.json",), lambda d: None, 1.5, "lower", blocked="no GPU lent")
    assert goals.row(goal, str(tmp_path))[2:] == ["not measured", "none", "blocked: no GPU lent"]
    _write(tmp_path, "none_run1.json", {"environment": {}})
    unblocked = Goal("g", 6, "GPU", None, ("none*.json",), lambda d: {"": 1.4}, 1.5, "lower", blocked="no GPU lent")
    assert goals.row(unblocked, str(tmp_path))[4] == "yes (worst 1.4)"  # a committed run ends the block


def test_extractors_on_tiny_json():
    mpi = {"results": {"all_reduce:262144:mpi": 2.0, "all_reduce:262144:mpi4py": 1.8}}
    assert goals.mpi_backend((262144,))(mpi) == {"256 KiB": pytest.approx(0.9)}
    coll = {"ranks": 2, "results": {"gloo": {"all_reduce": {"1048576": 1.0}}, "mpi4py": {"all_reduce": {"1048576": 1.5}}}}
    assert goals.collectives_speedup("gloo", "mpi4py", (1 << 20,))(coll) == {"1 MiB": 1.5}
    assert goals.collectives_speedup("gloo", "torch", (1 << 20,))(coll) == {}  # no torch in that run
    moe = {"environment": {}, "a2a": [{"bytes": 1 << 20, "ours_s": 2.0, "mpich_s": 3.0}]}
    assert goals.moe_all_to_all(moe) == {"1 MiB": 1.5}
    per_iteration = {"runs": [[{"bytes": 1 << 20, "ours_s": [1.0, 2.0, 4.0], "mpich_s": [1.0, 3.0, 2.0]}]]}
    assert goals.moe_all_to_all(per_iteration) == {"1 MiB": 1.0}  # the median of the paired ratios
    table = {"runs": per_iteration["runs"], "table": [{"bytes": 65536, "ratio": [0.8, 1.2, 0.9]}]}
    assert goals.moe_all_to_all(table) == {"64 KiB": 0.9}  # the script's own per-repeat ratios win


def test_check_and_write(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n\n## Goals at a glance\n\n{goals.BEGIN}\n| stale |\n{goals.END}\n\n## Next\n")
    assert goals.main(["--check", "--doc", str(doc)]) == 1
    assert goals.main(["--write", "--doc", str(doc)]) == 0
    assert goals.main(["--check", "--doc", str(doc)]) == 0
    assert doc.read_text().endswith(f"{goals.END}\n\n## Next\n")


def test_rerun_writes_one_file_per_run(tmp_path, capsys):
    command = goals.Command("fake", "python -c \"import json,sys; json.dump({'v': 1}, open(sys.argv[1], 'w'))\" {out}",
                            0.01)
    (tmp_path / "fake_run1.json").write_text("{}")  # an earlier run is kept, the next number is taken
    assert goals.rerun([command], 2, None, str(tmp_path)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake_run1.json", "fake_run2.json", "fake_run3.json"]
    assert json.loads((tmp_path / "fake_run3.json").read_text()) == {"v": 1}
    assert "fake (goals ): 2 run(s) in" in capsys.readouterr().out
