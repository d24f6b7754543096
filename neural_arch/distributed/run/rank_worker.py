"""One rank of a :class:`neural_arch.distributed.testing.RankPool` (and so of ``launch()``).

Started by the pool (``python -m neural_arch.distributed.run.rank_worker``, or under
``mpiexec``), it connects back to the pool over an authenticated loopback connection,
initialises the process group, and then runs the calls the pool sends until the pool
says stop or goes away. It exits when its parent dies: the pool connection reaches EOF,
and the parent-death watch (:func:`~neural_arch.distributed.run.parent_watch.install_parent_death_watch`) ends its whole
process group when the pool process is SIGKILLed.

Calls travel as :func:`pack_call` payloads: with ``cloudpickle`` a function typed into a
notebook goes by value; without it functions go by reference, and one defined in the
parent's ``__main__`` *script* is found by re-importing that script as ``__mp_main__`` (as
``multiprocessing`` does)::

    >>> blob, main_path = pack_call(len, ([1, 2],), {})
    >>> _unpack_call(blob, main_path)[0] is len
    True
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import traceback

_imported_main: set = set()


def pack_call(fn, args: tuple, kwargs: dict, user_fn=None) -> tuple[bytes, str | None]:
    """Pickle ``(fn, args, kwargs)``; also return the ``__main__`` script a rank must import first.

    ``user_fn`` (default ``fn``) is the function whose home decides that script: ``spawn()`` sends
    a wrapper that calls the user's function, which is the one that may live in ``__main__``.
    Raises ``ValueError`` (saying what to do) when ``fn`` cannot reach another process.

    Example::

        >>> blob, main_path = pack_call(print, ("hello",), {})
        >>> isinstance(blob, bytes), main_path       # a library function needs no script
        (True, None)
    """
    probe = fn if user_fn is None else user_fn
    try:
        import cloudpickle  # optional: lets notebook-defined functions travel by value
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return cloudpickle.dumps((fn, args, kwargs)), None
        except Exception as exc:
            raise ValueError(f"cannot send {fn!r} and its args to the ranks: {exc}") from exc
    main_path = None
    if getattr(probe, "__module__", None) == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise ValueError(
                f"{getattr(probe, '__qualname__', probe)!r} is defined in an interactive session "
                f"(notebook/REPL), so the child processes cannot import it. Either `pip install "
                f"cloudpickle` (then it is sent by value) or move it into a .py module and "
                f"import it from there.")
        main_path = os.path.abspath(main_path)
    try:
        return pickle.dumps((fn, args, kwargs)), main_path
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(f"cannot send {fn!r} and its args to the ranks: {exc}. Use a "
                         f"module-level function and picklable args (or install cloudpickle)"
                         ) from exc


def _import_main(path: str) -> None:
    # multiprocessing's spawn trick: run the parent's script as "__mp_main__" (so its
    # `if __name__ == "__main__":` block does not run) and let "__main__.fn" resolve to it.
    if path in _imported_main:
        return
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    spec.loader.exec_module(module)
    _imported_main.add(path)


def _unpack_call(blob: bytes, main_path: str | None):
    if main_path:
        _import_main(main_path)
    return pickle.loads(blob)


def _env_rank() -> int:
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return -1


def _export_identity() -> None:
    """Under mpiexec, give the functions the same RANK/WORLD_SIZE variables as other ranks see."""
    if "RANK" in os.environ:
        return
    from neural_arch.distributed.launch_env import detect_launch_env

    info = detect_launch_env()
    if info is not None:
        os.environ.update(RANK=str(info["rank"]), WORLD_SIZE=str(info["world_size"]),
                          LOCAL_RANK=str(info["local_rank"]),
                          LOCAL_WORLD_SIZE=str(info["local_world_size"]))


def main() -> int:
    """One pool rank: connect back to the pool, then run each call it is sent until told to stop.

    Example::

        python -m neural_arch.distributed.run.rank_worker      # started by RankPool, not by users
    """
    from multiprocessing.connection import Client

    from neural_arch import config

    if config.get("NEURAL_ARCH_POOL_LAUNCHER") != "mpiexec":
        # Under mpiexec our parent is the MPI proxy, which handles teardown.
        from neural_arch.distributed.run.parent_watch import install_parent_death_watch

        install_parent_death_watch(poll_interval=0.2, grace=2.0, kill_group=True)
    host, port = config.get("NEURAL_ARCH_POOL_ADDR").rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(config.get("NEURAL_ARCH_POOL_KEY")))
    rank = _env_rank()
    dist = None
    if config.get("NEURAL_ARCH_POOL_INIT"):
        try:
            from neural_arch.distributed import groups as dist

            dist.init_process_group(backend=config.get("NEURAL_ARCH_BACKEND") or None)
            rank = dist.get_rank()
        except BaseException:  # noqa: BLE001 - reported to the pool, which raises it
            conn.send(("init-error", rank, os.getpid(), traceback.format_exc()))
            return 1
    _export_identity()
    conn.send(("hello", rank, os.getpid(), None))
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return 0  # the pool is gone
            if msg[0] == "stop":
                return 0
            _, blob, main_path = msg
            try:
                fn, args, kwargs = _unpack_call(blob, main_path)
                value = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the pool
                conn.send(("err", type(exc).__name__, str(exc), traceback.format_exc()))
            else:
                try:
                    conn.send(("ok", value))
                except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable return value
                    conn.send(("err", type(exc).__name__, f"cannot send the result back: {exc}",
                               traceback.format_exc()))
    finally:
        if dist is not None:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            except BaseException:  # noqa: BLE001, S110 - exiting anyway
                pass


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: background threads of a failed group must not delay exit.
    os._exit(code)
