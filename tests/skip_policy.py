"""Which skips may land: a pytest plugin loaded by ``tests/conftest.py``.

A skip is honest only when the machine lacks something the test needs (a GPU, an optional extra, a
platform feature). Every other skip hides a test that should have run, so under CI (``CI=true``) a skip
whose reason matches none of :data:`ALLOWED_SKIP_REASONS` turns into a failure that names the reason
and this file. ``NEURAL_ARCH_REQUIRE_MPI=1`` (and CI) makes a missing MPI runtime a failure too: the
MPI tests never vanish silently.

Example (run a test file the way CI does)::

    CI=true python -m pytest -q tests/ddp      # an unlisted skip reason fails the run

To allow a new reason, add a pattern below with the sentence saying why it cannot run everywhere.

A case that does not apply to one parametrization (point-to-point in a world of one, a 4-rank layout on
a 2-rank pool) is not generated at all, rather than skipped: mark the test with
``@pytest.mark.cases(predicate)``, where ``predicate(params)`` gets the case's parameters (fixture
parameters included) and returns whether the case exists::

    @pytest.mark.cases(lambda p: p["pool"][1] >= 2)     # the pool fixture's param is (backend, world)
    def test_send_recv(pool): ...
"""

from __future__ import annotations

import os
import re

import pytest

#: reason patterns (regular expressions, searched in the skip reason) for skips that only say what this
#: machine lacks; each is a hardware, platform or optional-install fact, never "covered elsewhere"
ALLOWED_SKIP_REASONS: tuple[str, ...] = (
    r"\bGPUs?\b", r"\bCUDA\b", r"\bCuPy\b", r"\bcupy\b", r"\bNCCL\b", r"\bnccl\b",   # no GPU here
    r"needs Linux on x86-64",                                   # shared-memory direct collectives
    r"madvise",                                                 # sharded storage release
    r"could not import '(tensorboardX|cloudpickle|sklearn|ml_dtypes|isal|zlib_ng|google_crc32c|crc32c)[\w.]*'",
    r"cannot listen on 0\.0\.0\.0",                             # a sandbox without external interfaces
    r"mounting a 1 MiB tmpfs needs root",                      # the full-/dev/shm test (CI runs as root)
    r"Slurm not installed \(slurmctld/slurmd/munge\)",         # tests/slurm's cluster (.ci/run installs it)
)

_TRUTHY = {"1", "true", "yes", "on"}


def strict_skips(environ=os.environ) -> bool:
    """True where an unlisted skip must fail the run (CI)."""
    return environ.get("CI", "").strip().lower() in _TRUTHY


def require_mpi(environ=os.environ) -> bool:
    """True where a missing MPI runtime must fail the MPI tests instead of skipping them."""
    return strict_skips(environ) or environ.get("NEURAL_ARCH_REQUIRE_MPI", "").strip().lower() in _TRUTHY


def skip_allowed(reason: str) -> bool:
    return any(re.search(pattern, reason) for pattern in ALLOWED_SKIP_REASONS)


def _mpi_missing_reason():
    from neural_arch.distributed import testing

    return None if testing.mpiexec_path() else testing.MPI_MISSING


def _gpu_missing_reason():
    from neural_arch.backend import gpu_unavailable_reason

    return gpu_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    """Drop the cases a ``cases`` marker rules out; own the ``mpi`` and ``gpu`` markers' skip (or, for MPI
    under CI, failure)."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("cases")
        exists = marker is None or marker.args[0](getattr(getattr(item, "callspec", None), "params", {}))
        (kept if exists else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    reasons = {}
    for item in items:
        for marker, probe in (("mpi", _mpi_missing_reason), ("gpu", _gpu_missing_reason)):
            # get_closest_marker, not item.keywords: directory names (tests/gpu) are keywords too
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in reasons:
                reasons[marker] = probe()
            if not reasons[marker]:
                continue
            if marker == "mpi" and require_mpi():
                item.stash[_MPI_MISSING] = reasons[marker]
            else:
                item.add_marker(pytest.mark.skip(reason=reasons[marker]))


_MPI_MISSING = pytest.StashKey[str]()


def pytest_runtest_setup(item):
    missing = item.stash.get(_MPI_MISSING, None)
    if missing:
        pytest.fail(f"this MPI test cannot run: {missing} (CI and NEURAL_ARCH_REQUIRE_MPI=1 make a missing MPI "
                    "runtime a failure: pip install -e '.[dev]' installs mpi4py and the mpich wheel)", pytrace=False)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not strict_skips():
        return
    reason = _skip_reason(report)
    if skip_allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI with a reason that is not on the allow-list: {reason!r}. A skip may "
                       "only say what this machine lacks (tests/skip_policy.py, ALLOWED_SKIP_REASONS): make "
                       "the test run here, or generate its parameters so the case does not exist")
