"""The skip policy itself (tests/skip_policy.py): under CI an unlisted skip and a missing MPI fail the run.

Each case runs a real pytest in a subprocess on a small test file, with the policy loaded the way
``tests/conftest.py`` loads it and MPI made to look missing one layer below (``mpiexec_path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

CASES = textwrap.dedent('''
    import pytest

    def test_unlisted_skip():
        pytest.skip("gloo covers it")

    def test_listed_skip():
        pytest.skip("no CUDA device")

    @pytest.mark.mpi
    def test_needs_mpi():
        pass

    def test_plain():
        pass
''')

CONFTEST = textwrap.dedent('''
    import neural_arch.distributed.testing as testing

    testing.mpiexec_path = lambda: None   # MPI looks missing on this machine
    pytest_plugins = ["skip_policy"]
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy")
    (root / "conftest.py").write_text(CONFTEST)
    (root / "test_cases.py").write_text(CASES)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    mpi: needs MPI\n")
    return root


def _outcomes(project, **env_overrides):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "NEURAL_ARCH_REQUIRE_MPI")}
    # no third-party plugins in the inner run: their imports (hypothesis's above all) are most of its start
    env.update(env_overrides, PYTHONPATH=os.pathsep.join([TESTS, env.get("PYTHONPATH", "")]),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(project)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=120)
    outcomes = {}
    for line in proc.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR") and "test_cases.py::" in rest:
            outcomes[rest.split("::")[1].split()[0]] = word
    return proc, outcomes


def test_outside_ci_every_reason_skips(project):
    proc, outcomes = _outcomes(project)
    assert proc.returncode == 0, proc.stdout
    assert outcomes == {"test_plain": "PASSED"} and "1 passed, 3 skipped" in proc.stdout, proc.stdout


def test_under_ci_an_unlisted_skip_and_a_missing_mpi_fail(project):
    proc, outcomes = _outcomes(project, CI="true")
    assert proc.returncode == 1, proc.stdout
    # a missing MPI fails the test's set-up (an error in pytest's words): the run fails either way
    assert outcomes == {"test_unlisted_skip": "FAILED", "test_needs_mpi": "ERROR",
                        "test_plain": "PASSED"}, proc.stdout
    assert "1 skipped" in proc.stdout, proc.stdout          # the listed reason stays a skip
    assert "not on the allow-list: 'gloo covers it'" in proc.stdout, proc.stdout
    assert "this MPI test cannot run" in proc.stdout, proc.stdout


def test_require_mpi_alone_fails_only_the_missing_mpi(project):
    proc, outcomes = _outcomes(project, NEURAL_ARCH_REQUIRE_MPI="1")
    assert proc.returncode == 1, proc.stdout
    assert outcomes == {"test_needs_mpi": "ERROR", "test_plain": "PASSED"}, proc.stdout
    assert "1 passed, 2 skipped, 1 error" in proc.stdout, proc.stdout
