"""Suite-wide test settings.

* hypothesis: the "ci" profile (default) is deterministic (``derandomize``) with no deadline,
  so a run on a loaded 2-core machine neither flakes nor times out; ``HYPOTHESIS_PROFILE=dev``
  explores more and randomly.
* markers ``mpi`` and ``gpu`` skip cleanly, with the reason, where mpiexec or a GPU is missing, and
  under CI an unlisted skip reason or a missing MPI runtime fails instead: ``skip_policy.py`` is the one
  owner of both (tests that start a script under mpiexec use ``run_mpiexec`` and the marker).
* ``leak_check.py`` fails the run when tests leave processes or shared-memory segments behind.
* ``background.py`` runs the long self-contained subprocesses (the Sphinx build, the notebooks) in
  a background queue from the end of collection, on the cycles other tests leave idle.
* the package, the tests' helpers and the examples are compiled to bytecode once, at the start
  (:func:`pytest_sessionstart`).
"""

from __future__ import annotations

import compileall
import os
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["skip_policy", "leak_check", "background"]

settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev", deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REPO = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session):
    """Compile ``neural_arch``, ``tests`` and ``examples`` to bytecode (``__pycache__``, git-ignored) once.

    The suite starts well over a thousand Python processes (ranks, launchers, ``mpiexec`` jobs), each
    importing much of the package. Where ``PYTHONDONTWRITEBYTECODE`` is set -- CI's image sets it --
    no process writes the bytecode it compiles, so in a fresh clone every one of them compiles the
    package from source again: about 0.2 s of CPU per rank on a 2-core machine. Reading bytecode is not
    affected by the variable, so compiling once here (``compileall`` writes regardless; files already
    compiled and unchanged are skipped) gives every later process the cached form.
    """
    for folder in ("neural_arch", "tests", "examples"):
        compileall.compile_dir(str(REPO / folder), quiet=2, workers=0)


@pytest.fixture
def world_of_one(monkeypatch):
    """A process group of one rank in the pytest process, destroyed afterwards (whatever started pytest
    -- a launcher, mpiexec -- must not make it a bigger job)."""
    import neural_arch.distributed as dist
    from neural_arch.distributed.testing import LAUNCHER_VARS

    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group()
    yield dist
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def doctest_tempdir(tmp_path_factory, monkeypatch):
    """A ``tempfile`` folder of the test's own under pytest's ``tmp_path`` root, for tests that run
    docstring examples: those are documentation, call ``tempfile.mkdtemp()`` as a reader would and do
    not clean up, and the leak check fails the run on anything left in the temporary directory."""
    folder = str(tmp_path_factory.mktemp("docstring-examples"))
    monkeypatch.setattr(tempfile, "tempdir", folder)
    monkeypatch.setenv("TMPDIR", folder)
    return folder


@pytest.fixture(autouse=True)
def _stop_allocation_tracing_a_test_started():
    """``neural_arch.memory`` starts ``tracemalloc`` on first use and leaves it on (the peak counts from
    then): a test that used it would slow every Python allocation of every later test in this process
    (2-3x). Stop what the test started."""
    was_tracing = tracemalloc.is_tracing()
    yield
    if not was_tracing and tracemalloc.is_tracing():
        tracemalloc.stop()
