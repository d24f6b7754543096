"""The browsable reference (``docs/conf.py``): it builds with warnings as errors, and every public name
of the package has a docstring with an example.

The build runs once per session, in a subprocess queued in the background as soon as collection shows
these tests will run (``tests/background.py``), the way a reader builds it::

    sphinx-build -W --keep-going -D nb_execution_mode=off -b html docs <tmp>/html

with one difference from the full build (``sphinx-build -W --keep-going -b html docs docs/_build/html``,
which executes the notebooks so their outputs and plots are on the pages): the notebooks are not
executed here, because ``tests/examples`` already executes them.

Every module is held to both rules, ``neural_arch.distributed`` included.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import types
from pathlib import Path

import background
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"

pytest.importorskip("sphinx", reason="could not import 'sphinx': the docs extra (pip install -e '.[docs]')")
pytest.importorskip("myst_nb", reason="could not import 'myst_nb': the docs extra (pip install -e '.[docs]')")

# the build's own limit (600 s) waited for once in the background and, should it fail there, once again
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1230)]

#: an "Example(s)" section: napoleon's heading, a reST ``Example::`` block, or a doctest
EXAMPLE = re.compile(r"^\s*>>> |\bExamples?\b[^\n]*::[ \t]*$|^\s*Examples?:[ \t]*$", re.MULTILINE)

def _conf():
    spec = importlib.util.spec_from_file_location("neural_arch_docs_conf", DOCS / "conf.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def _build_job() -> background.Job:
    # first in the queue: the longest job, and its test comes before the notebooks'
    job = background.Job("the API reference's Sphinx build", [], cwd=REPO, timeout=600, first=True)
    # -j 2: reading the modules is most of the build, and it splits over this machine's two cores
    job.argv = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-j", "2", "-D", "nb_execution_mode=off",
                "-b", "html", "-d", str(job.workdir / "doctrees"), str(DOCS), str(job.workdir / "html")]
    return job


def background_jobs(items):
    """The build, queued at collection (``tests/background.py``): it runs beside the other tests."""
    return [_build_job()] if any(item.originalname in _NEED_THE_BUILD for item in items) else []


@pytest.fixture(scope="module")
def build():
    job = background.result("the API reference's Sphinx build", _build_job)
    assert not job.timed_out, f"the Sphinx build took more than {job.timeout:.0f} s"
    warnings = [line for line in job.stderr.splitlines() if "WARNING:" in line or "ERROR:" in line]
    return job, job.workdir / "html", warnings


_NEED_THE_BUILD = ("test_the_reference_has_every_layer_and_the_notebooks",
                   "test_the_whole_reference_builds_with_warnings_as_errors")


def test_the_reference_has_every_layer_and_the_notebooks(build):
    proc, html, _ = build
    assert (html / "index.html").is_file(), proc.stderr[-3000:]
    pages = {p.stem for p in (html / "api" / "generated").glob("*.html")}
    for module in ("neural_arch", "neural_arch.core.tensor", "neural_arch.nn", "neural_arch.optim",
                   "neural_arch.distributed", "neural_arch.distributed.ddp", "neural_arch.profiler.profiler"):
        assert module in pages, f"no reference page for {module}"
    notebooks = {p.stem for p in (html / "notebooks").glob("*.html")}
    assert {p.stem for p in (REPO / "examples" / "notebooks").glob("*.ipynb")} <= notebooks
    assert (html / "architecture.html").is_file()


def test_the_whole_reference_builds_with_warnings_as_errors(build):
    proc, _, warnings = build
    assert not warnings, f"{len(warnings)} warning(s) (warnings are errors):\n" + "\n".join(warnings)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _lacking_an_example(modnames) -> list[str]:
    conf = _conf()
    offenders = []
    for modname in modnames:
        module = importlib.import_module(modname)
        for name, kind, home in conf.public_api(modname):
            if home or kind not in ("class", "exception", "function"):
                continue    # described on its home page, or a value / another project's object
            doc = inspect.getdoc(getattr(module, name)) or ""
            if not doc or not EXAMPLE.search(doc):
                offenders.append(f"{modname}.{name}: {'no example' if doc else 'no docstring'}")
    return offenders


def test_every_public_name_has_a_docstring_with_an_example():
    modules = list(_conf()._public_modules())
    offenders = _lacking_an_example(modules)
    assert not offenders, f"{len(offenders)} public name(s):\n" + "\n".join(offenders)



PLANTED = """
__all__ = ["documented", "bare", "Undocumented"]

def documented():
    '''One.

    Example::

        >>> documented()
        1
    '''
    return 1

def bare():
    '''Two, in words only.'''

class Undocumented:
    pass
"""


def test_the_example_checker_names_what_lacks_one(monkeypatch):
    assert EXAMPLE.search("Sum.\n\nExamples:\n    >>> 1 + 1")
    assert not EXAMPLE.search("Sum of the elements (see Example 3 in the paper).")
    planted = types.ModuleType("neural_arch.planted_public_module")
    exec(PLANTED, planted.__dict__)  # noqa: S102  (the test's own constant text)
    monkeypatch.setitem(sys.modules, planted.__name__, planted)
    assert _lacking_an_example([planted.__name__]) == [
        "neural_arch.planted_public_module.bare: no example",
        "neural_arch.planted_public_module.Undocumented: no docstring"]
