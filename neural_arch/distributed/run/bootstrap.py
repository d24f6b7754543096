"""What every launcher child runs first: ``python -m neural_arch.distributed.run.bootstrap``.

Usage (the launcher builds this command line; users never type it)::

    python /path/to/neural_arch/distributed/run/bootstrap.py train.py --epochs 3
    python /path/to/neural_arch/distributed/run/bootstrap.py -m mypkg.train --epochs 3

It is run by *path*, not with ``-m``, on purpose: that way starting a rank does not import the
``neural_arch`` package (and NumPy) before the user's script decides what it needs, which keeps
restarts fast and keeps a rank startable even while the package itself fails to import.

It (1) installs the parent-death watch so the rank (and its process group) exits if the launcher
is SIGKILLed, (2) reports "started" by creating ``$NEURAL_ARCH_READY_DIR/started_{rank}`` (the
launcher's ``--start_timeout`` waits for ``rank_{rank}``, written after rendezvous; ``started_``
only sharpens its message), and (3) runs the user's script exactly as ``python
script.py args`` would (``__name__ == "__main__"``, ``sys.argv``, ``sys.path[0]`` = script folder),
or the module as ``python -m`` would. (4) When the script raises, it records the error with the time
it was caught in ``$NEURAL_ARCH_READY_DIR/error_{rank}.json``: the launcher's summary then names the
rank whose error came *first* (the cause), not the first rank to exit (often a peer that saw the
cause as a lost connection).
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys


def _load_settings():
    """Load the settings table (``neural_arch/config.py``, standard library only) by path, without
    importing the package (the rank's ``sys.path`` is not set up yet)."""
    module = sys.modules.get("_neural_arch_bootstrap_config")
    if module is None:
        here = os.path.dirname(os.path.abspath(__file__))
        module = _load_by_path(os.path.join(here, "..", "..", "config.py"), "_neural_arch_bootstrap_config")
    return module


def _install_parent_watch(_config) -> None:
    """The sibling ``parent_watch.py`` (standard library only), loaded by path like the settings."""
    here = os.path.dirname(os.path.abspath(__file__))
    watch = _load_by_path(os.path.join(here, "parent_watch.py"), "_neural_arch_bootstrap_parent_watch")
    # Each rank leads its own session (the launcher starts it so): on the launcher's death the
    # watch ends the rank's whole process group, grandchildren included.
    watch.install_parent_death_watch(parent_pid=_config.get("NEURAL_ARCH_PARENT_PID"), poll_interval=0.2,
                                     grace=3.0, kill_group=True)


def _load_by_path(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses looks the defining module up by name
    spec.loader.exec_module(module)
    return module


def _report_started(_config) -> None:
    # "started_{rank}" (not the "rank_{rank}" rendezvous marker): lets the launcher's start-timeout
    # message tell a rank that never got here from one that hangs before its rendezvous.
    folder = _config.get("NEURAL_ARCH_READY_DIR")
    if not folder:
        return
    try:
        with open(os.path.join(folder, f"started_{os.environ.get('RANK', '0')}"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass  # the launcher is gone or its temp dir was removed; the death watch handles the rest


def report_error(exc: BaseException, folder: str | None = None) -> None:
    """Write ``error_{rank}.json`` (rank, wall-clock time, type, message) for the launcher; best effort.
    (Wall-clock, not monotonic: the records of different processes are compared.)

    Example: ``{"rank": 1, "time": 1732700000.25, "type": "ValueError", "message": "bad shape"}``.

    Example::

        try:
            run_user_script()
        except BaseException as exc:
            report_error(exc)                # error_{rank}.json in $NEURAL_ARCH_READY_DIR
            raise
    """
    import time

    if folder is None:   # the settings table main() loaded (or loads now), as _report_started reads it
        _config = _load_settings()
        folder = _config.get("NEURAL_ARCH_READY_DIR")
    if not folder:
        return
    record = {"rank": int(os.environ.get("RANK", "0") or 0), "time": time.time(),
              "type": type(exc).__name__, "message": str(exc)[:2000]}
    path = os.path.join(folder, f"error_{record['rank']}.json")
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)  # the launcher never reads half a record
    except OSError:
        pass  # the launcher is gone or its folder was removed: the traceback is still printed


def _set_path0(folder: str) -> None:
    """Make ``folder`` the first import location, replacing this file's folder if Python put it there.

    (Under ``PYTHONSAFEPATH``/``-P`` Python adds no script folder; then we insert rather than
    overwrite a real entry.)
    """
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)


def main(argv: list[str]) -> None:
    """Run ``argv`` (``script.py args`` or ``-m module args``) as this rank, steps (1) to (4) above.

    Example::

        python /path/to/neural_arch/distributed/run/bootstrap.py train.py --epochs 3
    """
    _config = _load_settings()
    _install_parent_watch(_config)
    if not argv:
        raise SystemExit("usage: python -m neural_arch.distributed.run.bootstrap "
                         "script.py [args] | -m module [args]")
    _report_started(_config)
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("-m needs a module name")
        sys.argv = [argv[1], *argv[2:]]
        _set_path0(os.getcwd())  # as `python -m` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        if not os.path.exists(script):
            raise SystemExit(f"neural_arch launcher: script {script!r} not found "
                             f"(working directory {os.getcwd()!r})")
        sys.argv = [script, *argv[1:]]
        _set_path0(os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


def _user_frames(tb):
    """Drop the bootstrap's and runpy's frames so a traceback starts in the user's script."""
    here = os.path.abspath(__file__)
    while tb is not None and (os.path.abspath(tb.tb_frame.f_code.co_filename) == here
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as exc:
        if exc.code not in (None, 0):  # sys.exit(5) is a failure too: its time orders the summary
            report_error(exc)
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - print like Python would, minus our frames
        import traceback

        report_error(exc)
        sys.last_value = exc  # as for an uncaught exception: at-exit code knows the script failed

        traceback.print_exception(type(exc), exc, _user_frames(exc.__traceback__) or exc.__traceback__)
        sys.stderr.flush()
        sys.exit(1)
