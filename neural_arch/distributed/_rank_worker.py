"""One rank of a :class:`neural_arch.distributed.testing.RankPool`.

Started by the pool (``python -m neural_arch.distributed._rank_worker``, or under
``mpiexec``), it connects back to the pool over an authenticated loopback connection,
initialises the process group, and then runs the functions the pool sends until the pool
says stop or goes away. It exits when its parent dies: the pool connection reaches EOF,
and on Linux the kernel also sends SIGTERM (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # best effort: EOF on the pool connection still ends us


def _env_rank() -> int:
    for var in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return -1


def main() -> int:
    from multiprocessing.connection import Client

    if os.environ.get("NEURAL_ARCH_POOL_LAUNCHER") != "mpiexec":
        _die_with_parent()  # under mpiexec our parent is the MPI proxy, which handles teardown
    host, port = os.environ["NEURAL_ARCH_POOL_ADDR"].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ["NEURAL_ARCH_POOL_KEY"]))
    rank = _env_rank()
    dist = None
    if os.environ.get("NEURAL_ARCH_POOL_INIT", "1") == "1":
        try:
            import neural_arch.distributed as dist

            dist.init_process_group(backend=os.environ.get("NEURAL_ARCH_BACKEND") or None)
            rank = dist.get_rank()
        except BaseException:  # noqa: BLE001 - reported to the pool, which raises it
            conn.send(("init-error", rank, os.getpid(), traceback.format_exc()))
            return 1
    conn.send(("hello", rank, os.getpid(), None))
    try:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                return 0  # the pool is gone
            if msg[0] == "stop":
                return 0
            _, fn, args, kwargs = msg
            try:
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
            except BaseException:  # noqa: BLE001 - exiting anyway
                pass


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: background threads of a failed group must not delay exit.
    os._exit(code)
