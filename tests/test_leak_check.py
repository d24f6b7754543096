"""The leak check itself (tests/leak_check.py): a test that leaves a process, a segment or a temporary
folder behind fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.abspath(__file__))

LEAKY = textwrap.dedent('''
    import os, subprocess, sys

    def test_leaves_a_process():
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    def test_leaves_a_segment():
        with open("/dev/shm/na-{tag}-leak-check", "wb") as f:   # named by a creator that has exited
            f.write(b"x")

    def test_leaves_a_temporary_folder():
        import tempfile
        tempfile.mkdtemp(prefix="leak-check-{tag}-")          # never removed
''')


def _inner_env(tmp_path) -> dict:
    """The inner run's environment: the plugin importable, no third-party plugins (their imports --
    hypothesis's above all -- are most of a pytest start), and its temporary folder inside tmp_path."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]),
                PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", TMPDIR=str(tmp_path))


def test_a_leaked_process_and_segment_fail_the_run_and_are_removed(tmp_path):
    with open("/proc/sys/kernel/pid_max") as f:   # a creator pid no process can have: its creator has exited
        gone = int(f.read()) + 1                      # (a reaped child's pid could be reused on a busy machine)
    tag = f"{gone}-{os.urandom(3).hex()}"
    (tmp_path / "conftest.py").write_text('import leak_check\n\nleak_check.GRACE_S = 0.3\n'
                                          'pytest_plugins = ["leak_check"]\n')
    (tmp_path / "test_leaky.py").write_text(LEAKY.replace("{tag}", tag))
    # the inner run keeps its temporary folder when it fails: inside tmp_path, not in this session's
    env = _inner_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    assert "3 passed" in proc.stdout and "tests left behind" in proc.stdout, proc.stdout
    assert f"temporary folder leak-check-{tag}-" in proc.stdout, proc.stdout
    assert "time.sleep(60)" in proc.stdout, proc.stdout
    assert f"/dev/shm/na-{tag}-leak-check" in proc.stdout, proc.stdout
    assert not os.path.exists(f"/dev/shm/na-{tag}-leak-check")


def test_a_clean_run_passes(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["leak_check"]\n')
    (tmp_path / "test_clean.py").write_text("def test_nothing():\n    pass\n")
    # the inner run keeps its temporary folder when it fails: inside tmp_path, not in this session's
    env = _inner_env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "left behind" not in proc.stdout, proc.stdout
