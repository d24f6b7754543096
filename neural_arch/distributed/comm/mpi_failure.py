"""How an MPI job fails loudly instead of hanging: MPI_Init under a watchdog, timeout messages that
name the missing ranks, and aborting the job when a pending MPI operation can never end.

MPI cannot cancel a started collective, and a blocking MPI call cannot be interrupted. So:

* the first ``import mpi4py.MPI`` (MPI_Init, which waits for every rank) runs under
  ``faulthandler``'s C-level watchdog (:func:`_mpi`);
* a timed-out *nonblocking* operation raises :class:`CollectiveTimeoutError` in the caller, the group
  is refused from then on, and when the process exits :func:`_abort_if_broken` calls
  ``MPI_Abort`` (``MPI_Finalize`` would wait for the pending operation forever);
* a *blocking* MPI call that passes its deadline (``MPIBackend(blocking_collectives=True)``) cannot
  return an error at all: the watchdog thread prints the same message and aborts the job at once
  (:func:`abort_job`), as PyTorch's NCCL watchdog tears a process down.

Every message names the op, its sequence number and the ranks that did not arrive
(:func:`timeout_message`, which asks the peers' :class:`~.mpi_progress.Presence` threads).

Example::

    >>> from neural_arch.distributed.comm.work import OpInfo
    >>> info = OpInfo("all_reduce", 7, [0, 1], 0, (4,), "float32")
    >>> timeout_message(info, 2.0, None, tail="")
    'all_reduce #7 (shape (4,), float32) on group [0, 1] timed out after 2.0 s on rank 0: some of ranks [1] did not arrive (MPI does not report which; rank 0 was waiting). '
"""

from __future__ import annotations

import contextlib
import sys
import time

from neural_arch.distributed import config
from neural_arch.distributed.comm.mpi_progress import where
from neural_arch.distributed.comm.work import OpInfo

__all__ = ["ABORT_OUTPUT_GRACE_S", "abort_job", "timeout_message"]

_BROKEN: list[str] = []      # descriptions of MPI operations that timed out in this process

# Seconds between flushing our output and MPI_Abort. Why: on Abort, MPICH's hydra kills the job as
# soon as its proxy handles the abort request, and the proxy does not first drain the rank's
# stdout/stderr pipes: 2 runs in 20 lost everything the aborting rank printed (its traceback,
# this module's message, even lines flushed seconds earlier). Output already in the pipe is
# forwarded within milliseconds once the proxy gets to it, so a short pause makes it arrive.
ABORT_OUTPUT_GRACE_S = 0.5


def _mpi(timeout: float | None = None):
    """``mpi4py.MPI``, imported (which runs MPI_Init) under a watchdog.

    MPI_Init blocks until every rank of the ``mpiexec`` job has called it: one rank that starts late
    (or never) would hang the others there, far past any rendezvous timeout, in C code that no Python
    thread can interrupt. So the first import runs under ``faulthandler``'s C-level watchdog: after
    ``timeout`` seconds (default ``NEURAL_ARCH_RENDEZVOUS_TIMEOUT``, else 60) it prints the stack --
    whose innermost frame is named ``MPI_Init_did_not_finish_within_the_rendezvous_timeout`` -- and
    exits the process with status 1, which makes ``mpiexec`` end the job.
    """
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None:
        return MPI
    if timeout is None:
        timeout = config.get("NEURAL_ARCH_RENDEZVOUS_TIMEOUT")
    return MPI_Init_did_not_finish_within_the_rendezvous_timeout(timeout)


def MPI_Init_did_not_finish_within_the_rendezvous_timeout(timeout: float):
    """Named for the watchdog's stack dump: this frame on top means a rank never reached MPI_Init."""
    import faulthandler

    sys.stderr.flush()
    faulthandler.dump_traceback_later(max(1.0, float(timeout)), exit=True)
    try:
        from mpi4py import MPI  # initialises MPI on first import (mpi4py's default: THREAD_MULTIPLE)
    finally:
        faulthandler.cancel_dump_traceback_later()
    return MPI


def timeout_message(info: OpInfo, waited: float, presence, tail: str, missing_peer: int | None = None) -> str:
    """``info`` timed out: which ranks did not arrive and what they are doing, then ``tail``.

    ``missing_peer`` (a global rank): a point-to-point op, whose missing rank is known. Otherwise
    the peers' presence threads are asked (``presence`` None: MPI does not say which rank is late).
    """
    if missing_peer is not None:
        return f"{info.timeout_error([missing_peer], waited)} {tail}"
    group = list(info.group_ranks)
    others = [r for r in group if r != info.rank]
    answers = presence.ask(others) if presence is not None else {}
    if not answers:
        return (f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: some of "
                f"ranks {others} did not arrive (MPI does not report which; rank {info.rank} was waiting). {tail}")
    mine = where(info)
    waiting = [info.rank] + [r for r in others if mine in (answers.get(r) or "")]
    missing = [r for r in others if r not in waiting]
    doing = "; ".join(f"rank {r} is {answers[r]}" if answers.get(r) else
                      f"rank {r} did not answer (dead, or not making MPI progress)" for r in missing)
    return (f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: ranks "
            f"{missing} did not arrive; ranks {sorted(waiting)} were waiting ({doing}). {tail}")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or replaced stream must not stop the abort
            stream.flush()


def _abort_if_broken() -> None:
    """atexit: a pending MPI operation would make MPI_Finalize hang; end the whole job instead."""
    if not _BROKEN:
        return
    _flush()
    sys.stderr.write(f"neural_arch MPI backend: {_BROKEN[0]} never completed; aborting the MPI job "
                     "(MPI cannot cancel a started collective, and MPI_Finalize would hang)\n")
    _flush()
    time.sleep(ABORT_OUTPUT_GRACE_S)
    _mpi().COMM_WORLD.Abort(1)


def abort_job(message: str) -> None:
    """Print ``message`` (a CollectiveTimeoutError's text) and abort the whole MPI job now: what the
    watchdog does when a *blocking* MPI call passed its deadline (nothing can return to its caller)."""
    _BROKEN.append(message)
    _flush()
    sys.stderr.write(f"neural_arch MPI backend: CollectiveTimeoutError: {message}\n"
                     "neural_arch MPI backend: a blocking MPI call cannot be interrupted (blocking_collectives=True); "
                     "aborting the MPI job\n")
    _flush()
    time.sleep(ABORT_OUTPUT_GRACE_S)
    _mpi().COMM_WORLD.Abort(1)
