"""How an MPI job fails loudly instead of hanging: MPI_Init under a watchdog, timeout messages that
name the missing ranks, and aborting the job when a pending MPI operation can never end.

MPI cannot cancel a started collective, and a blocking MPI call cannot be interrupted. So:

* the first ``import mpi4py.MPI`` (MPI_Init, which waits for every rank) runs under
  ``faulthandler``'s C-level watchdog, after a one-line cause printed by a forked helper (:func:`_mpi`);
* once the MPI backend is up, an uncaught exception on one rank ends the job at once with
  ``MPI_Abort`` (:func:`abort_on_uncaught_exception`, ``NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION``), as
  ``python -m mpi4py`` does, instead of the other ranks waiting out their timeout;
* a timed-out *nonblocking* operation raises
  :class:`~neural_arch.distributed.errors.CollectiveTimeoutError` in the caller, the group
  is refused from then on, and when the process exits :func:`_abort_if_broken` calls
  ``MPI_Abort`` (``MPI_Finalize`` would wait for the pending operation forever);
* a *blocking* MPI call that passes its deadline (``MPIBackend(blocking_collectives=True)``) cannot
  return an error at all: the watchdog thread prints the same message and aborts the job at once
  (:func:`abort_job`), as PyTorch's NCCL watchdog tears a process down.

Every message names the op, its sequence number and the ranks that did not arrive
(:func:`timeout_message`, which asks the peers'
:class:`~neural_arch.distributed.comm.mpi.progress.Presence` threads).

Example::

    >>> from neural_arch.distributed.comm.work import OpInfo
    >>> info = OpInfo("all_reduce", 7, [0, 1], 0, (4,), "float32")
    >>> timeout_message(info, 2.0, None, tail="")
    'all_reduce #7 (shape (4,), float32) on group [0, 1] timed out after 2.0 s on rank 0: some of ranks [1] did not arrive (MPI does not report which; rank 0 was waiting). '
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
import warnings

from neural_arch import config
from neural_arch.distributed.comm.mpi.progress import where
from neural_arch.distributed.comm.work import OpInfo

__all__ = ["ABORT_OUTPUT_GRACE_S", "abort_job", "abort_on_uncaught_exception", "p2p_timeout_message",
           "timeout_message"]

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
    ``timeout`` seconds (default ``NEURAL_ARCH_RENDEZVOUS_TIMEOUT``, else 60) one line says why
    (``MPI_Init did not finish within 60 s on rank 0 ...: another rank ... never reached MPI_Init``),
    then the stack -- whose innermost frame is named
    ``MPI_Init_did_not_finish_within_the_rendezvous_timeout`` -- and the process exits with status 1,
    which makes ``mpiexec`` end the job.
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

    timeout = max(1.0, float(timeout))
    sys.stderr.flush()
    herald = _InitHerald.start(timeout)
    # (a moment after the herald's line, so that the one-line cause comes first)
    faulthandler.dump_traceback_later(timeout + _HERALD_LEAD_S, exit=True)
    try:
        from mpi4py import MPI  # initialises MPI on first import (mpi4py's default: THREAD_MULTIPLE)
    finally:
        faulthandler.cancel_dump_traceback_later()
        if herald is not None:
            herald.stop()
    return MPI


_HERALD_LEAD_S = 0.3   # seconds between the herald's line and faulthandler's dump + exit


class _InitHerald:
    """A forked helper that prints, in one line, why this rank is about to exit if MPI_Init has not
    finished after ``timeout`` seconds: faulthandler's dump alone says *where* the rank waited, not
    *why* the job ends. A fork, not a thread: MPI_Init runs inside ``import mpi4py.MPI`` holding the
    GIL, so no Python thread of this process runs until it returns. The child only waits on a pipe
    and writes (async-signal-safe calls); the parent closing the pipe (MPI_Init finished, or the
    process died) ends it."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, timeout: float):
        rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "?"))
        line = (f"neural_arch MPI backend: MPI_Init did not finish within {timeout:g} s on rank {rank} "
                "(NEURAL_ARCH_RENDEZVOUS_TIMEOUT): another rank of this mpiexec job never reached MPI_Init -- "
                "it crashed, hangs or started late (look at its output); this rank exits now, the stack dump "
                "below shows where it waited\n").encode()
        try:
            read_end, write_end = os.pipe()
            with warnings.catch_warnings():   # Python >= 3.12 warns about fork in a threaded process:
                warnings.simplefilter("ignore", DeprecationWarning)   # this child only waits and writes
                pid = os.fork()
        except (AttributeError, OSError):   # no fork (or no resources): faulthandler's dump alone
            return None
        if pid == 0:                        # the child: wait for the parent's word, or print the line
            try:
                os.close(write_end)
                ready, _, _ = select.select([read_end], [], [], timeout)
                if not ready:
                    os.write(2, line)
            finally:
                os._exit(0)
        os.close(read_end)
        return cls(pid, write_end)

    def stop(self) -> None:
        os.close(self.fd)                   # the child sees end-of-file and exits
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def timeout_message(info: OpInfo, waited: float, presence, tail: str, missing_peer: int | None = None) -> str:
    """``info`` timed out: which ranks did not arrive and what they are doing, then ``tail``.

    ``missing_peer`` (a global rank): a point-to-point op, whose missing rank is known. Otherwise
    the peers' presence threads are asked (``presence`` None: MPI does not say which rank is late).

    Example::

        >>> from neural_arch.distributed.comm.work import OpInfo
        >>> info = OpInfo("barrier", 4, [0, 1, 2], 0)
        >>> timeout_message(info, 5.0, None, tail="").split(":")[0]
        'barrier #4 on group [0, 1, 2] timed out after 5.0 s on rank 0'
    """
    if missing_peer is not None:
        return p2p_timeout_message(info, waited, missing_peer)
    group = list(info.group_ranks)
    others = [r for r in group if r != info.rank]
    answers = presence.ask(others) if presence is not None else {}
    if not answers:
        return (f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: some of "
                f"ranks {others} did not arrive (MPI does not report which; rank {info.rank} was waiting). {tail}")
    mine = where(info)
    waiting = [info.rank] + [r for r in others if mine in (answers.get(r) or "")]
    missing = [r for r in others if r not in waiting]
    if not missing:
        # (a rank that timed out keeps answering "timed out ... in <op>": ranks that time out together see each other)
        return (f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: every rank "
                f"of the group was waiting in it (ranks {sorted(waiting)}), so none is missing: MPI made no progress "
                "on it -- e.g. one rank is blocked inside MPI on another thread or communicator, or the operation "
                f"needs longer than the timeout. {tail}")
    doing = "; ".join(f"rank {r} is {answers[r]}" if answers.get(r) else
                      f"rank {r} did not answer (dead, or not making MPI progress)" for r in missing)
    return (f"{info.describe()} on group {group} timed out after {waited:.1f} s on rank {info.rank}: ranks "
            f"{missing} did not arrive; ranks {sorted(waiting)} were waiting ({doing}). {tail}")


def p2p_timeout_message(info: OpInfo, waited: float, peer: int) -> str:
    """The timeout message of a point-to-point ``send``/``recv`` whose peer (global rank ``peer``) never
    matched it. Why its own text: a send has a destination, not a root, and the advice differs from a
    collective's -- under MPI, a blocking send of a large message waits for the receiver (see below).

    >>> from neural_arch.distributed.comm.work import OpInfo
    >>> info = OpInfo("send", 3, [0, 1], 0, (1024,), "float64", 1)
    >>> p2p_timeout_message(info, 2.0, 1).split(". ")[0]
    'send #3 (shape (1024,), float64) to rank 1 timed out after 2.0 s on rank 0, waiting for peer [1]: the receiver did not post the matching recv (same tag)'
    """
    what = f"{info.name} #{info.seq}"
    if info.shape is not None:
        what += f" (shape {tuple(info.shape)}, {info.dtype})"
    if info.name == "send":
        head = (f"{what} to rank {peer} timed out after {waited:.1f} s on rank {info.rank}, waiting for peer "
                f"[{peer}]: the receiver did not post the matching recv (same tag).")
        advice = ("Under MPI a blocking send of a large message (above MPI's eager limit, about 64 KiB on shared "
                  "memory) returns only once the receiver has posted its recv -- unlike gloo's, which returns once "
                  "the bytes are buffered -- so two ranks that both send before they recv deadlock under MPI. Post "
                  "the recv first on one side, or start both directions at once: isend() + irecv(), or "
                  "batch_isend_irecv([P2POp(isend, ...), P2POp(irecv, ...)]).")
    else:
        head = (f"{what} from rank {peer} timed out after {waited:.1f} s on rank {info.rank}, waiting for peer "
                f"[{peer}]: the sender did not send a matching message (same tag).")
        advice = (f"Check that rank {peer} calls send(..., dst={info.rank}) with this tag; if it is itself blocked "
                  "in a send (both ranks send first), see the send's message on that rank: under MPI a blocking "
                  "send of a large message waits for the matching recv.")
    return (f"{head} {advice} MPI cannot cancel a started operation: this process group is unusable now and the "
            "MPI job is aborted when this process exits; if the peer is only slow, raise "
            "init_process_group(timeout=...).")


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


_HOOK_INSTALLED = False


def abort_on_uncaught_exception(environ=None) -> bool:
    """Make an uncaught exception on this rank end the whole MPI job at once (``MPI_Abort``), as
    ``python -m mpi4py`` does; called when the MPI backend is initialised (``MPIBackend.create``).

    Why: ``mpiexec`` ends a job only when a rank *exits*, and a Python rank that dies of an exception
    exits through ``MPI_Finalize`` -- which waits for the other ranks, themselves waiting for it in a
    collective until their timeout (300 s by default). The hook prints the traceback as Python would,
    then one line saying why the job ends, then calls ``MPI_Abort`` (the launcher's behaviour:
    the first failure takes the job down). Only ``sys.excepthook`` is wrapped (an exception in the
    main thread ends the process; one in another thread does not); an excepthook installed later wins.
    ``NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION=0`` turns it off. Returns whether the hook is installed.

    Example::

        abort_on_uncaught_exception()       # MPIBackend.create() does this
        raise RuntimeError("boom")          # traceback, one line, then MPI_Abort ends every rank
    """
    global _HOOK_INSTALLED
    if _HOOK_INSTALLED:
        return True
    if not config.get("NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION", environ):
        return False
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)          # the traceback first, exactly as without the hook
        try:
            MPI = sys.modules.get("mpi4py.MPI")
            if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() < 2:
                return
            _flush()
            sys.stderr.write(f"neural_arch MPI backend: rank {MPI.COMM_WORLD.Get_rank()} ended with an uncaught "
                             f"{exc_type.__name__}; aborting the MPI job so that the other ranks do not wait for it "
                             "(NEURAL_ARCH_MPI_ABORT_ON_EXCEPTION=0 turns this off)\n")
            _flush()
            time.sleep(ABORT_OUTPUT_GRACE_S)
            MPI.COMM_WORLD.Abort(1)
        except Exception:  # noqa: BLE001 - never hide the user's exception behind our own  # pragma: no cover
            return

    sys.excepthook = hook
    _HOOK_INSTALLED = True
    return True


def abort_job(message: str) -> None:
    """Print ``message`` (a CollectiveTimeoutError's text) and abort the whole MPI job now: what the
    watchdog does when a *blocking* MPI call passed its deadline (nothing can return to its caller).

    Example::

        # the watchdog thread, when a blocking MPI_Allreduce passed its deadline
        abort_job(timeout_message(info, waited, presence, tail=""))     # never returns
    """
    _BROKEN.append(message)
    _flush()
    sys.stderr.write(f"neural_arch MPI backend: CollectiveTimeoutError: {message}\n"
                     "neural_arch MPI backend: a blocking MPI call cannot be interrupted (blocking_collectives=True); "
                     "aborting the MPI job\n")
    _flush()
    time.sleep(ABORT_OUTPUT_GRACE_S)
    _mpi().COMM_WORLD.Abort(1)
