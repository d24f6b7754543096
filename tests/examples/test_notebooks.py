"""Every notebook in ``examples/notebooks/`` runs top to bottom without error.

The code cells of a notebook are concatenated, in order, into one script that runs in a fresh
``python`` process (no Jupyter needed; queued at collection to run beside the other tests,
``tests/background.py``): the notebooks assert their own claims against NumPy, so
this also checks that what they teach is still true. Every notebook draws what it teaches: the
script saves each figure a cell leaves open (as Jupyter's inline backend displays it) to a PNG,
and the test asserts at least one was drawn. Functions a notebook passes to
``launch`` are defined in the script's ``__main__``; ``cloudpickle`` sends them to the ranks by
value, as it does from a notebook kernel, so without it the test is skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import background
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "examples" / "notebooks").glob("*.ipynb"))


# Jupyter's inline backend shows every figure still open when a cell ends, then closes it; the
# script does the same with Agg, saving each one as figure_<n>.png in the working directory.
_FIGURE_PROLOGUE = """\
import matplotlib as _mpl
_mpl.use("Agg")
import matplotlib.pyplot as _plt
_FIGURES = [0]

def _flush_figures(*_args, **_kwargs):
    for _num in _plt.get_fignums():
        _plt.figure(_num).savefig(f"figure_{_FIGURES[0]}.png", dpi=60)
        _FIGURES[0] += 1
    _plt.close("all")

_plt.show = _flush_figures
"""


def notebook_script(path: Path, save_figures: bool = False) -> str:
    """The notebook's code cells joined into one script; IPython magics and shell lines dropped.

    With ``save_figures`` the script saves every figure a cell leaves open to ``figure_<n>.png``.
    """
    nb = json.loads(path.read_text(encoding="utf-8"))
    chunks = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        if save_figures:
            lines.append("_flush_figures()")
        chunks.append(f"# --- cell {i} ---\n" + "\n".join(lines))
    return (_FIGURE_PROLOGUE if save_figures else "") + "\n\n".join(chunks) + "\n"


def test_notebooks_found():
    assert NOTEBOOKS, "no notebooks in examples/notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_clean(path):
    """Notebooks are committed without outputs, so diffs show only what a person wrote."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    dirty = [i for i, c in enumerate(nb["cells"])
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have stored outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_section_draws(path):
    """Every content section (a ``## `` heading; exercises and "Where next" exempt) draws a figure: the
    course teaches with pictures, not only printed tables."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    section, figures = None, {}
    for cell in nb["cells"]:
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in src.splitlines():
                if line.startswith("## "):
                    section = line
                    figures[section] = 0
        elif section is not None and "plt.show()" in src:
            figures[section] += 1
    bare = [s for s, n in figures.items() if n == 0 and "Exercise" not in s and "Where next" not in s]
    assert not bare, f"{path.name}: sections without a figure: {bare}"


def _run_job(path: Path) -> background.Job:
    """The notebook as one script in a folder of its own, where it saves its figures."""
    job = background.Job(f"notebook {path.name}", [], timeout=150)
    script = job.workdir / (path.stem + ".py")
    script.write_text(notebook_script(path, save_figures=True), encoding="utf-8")
    job.argv = [sys.executable, str(script)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                "NEURAL_ARCH_DISTRIBUTED_DEBUG"):
        env.pop(var, None)  # notebooks start from a plain environment (section 1: a world of one)
    env.setdefault("MPLBACKEND", "Agg")
    job.env = env
    return job


def background_jobs(items):
    """Each notebook's run, queued at collection (``tests/background.py``): it runs beside the other tests."""
    if importlib.util.find_spec("cloudpickle") is None:
        return []   # the test skips, saying why
    return [_run_job(item.callspec.params["path"]) for item in items if item.originalname == "test_notebook_runs"]


@pytest.mark.timeout(330)   # the run's 150 s limit, waited for in the background and once more if it failed there
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path):
    pytest.importorskip("cloudpickle", reason="notebooks launch functions defined in cells: "
                                              "pip install cloudpickle (or '.[examples]')")
    job = background.result(f"notebook {path.name}", lambda: _run_job(path))
    assert not job.timed_out, (f"{path.name} did not finish within {job.timeout:.0f} s\n--- stdout ---\n"
                               f"{job.stdout}\n--- stderr ---\n{job.stderr}")
    assert job.returncode == 0, (
        f"{path.name} failed (exit code {job.returncode}); script: {job.argv[-1]}\n"
        f"--- stdout (tail) ---\n{job.stdout[-4000:]}\n--- stderr ---\n{job.stderr[-8000:]}")
    figures = sorted(job.workdir.glob("figure_*.png"))
    assert figures and all(f.stat().st_size > 0 for f in figures), (
        f"{path.name} drew no figure: every notebook draws what it teaches (matplotlib, plt.show())")
