"""Child-process plumbing shared by the launcher and :func:`neural_arch.distributed.launch`.

* :class:`OutputPump` reads each child's stdout/stderr in threads and writes *whole lines* with a
  ``[rank{r}]:`` prefix (and a space) under one lock, so lines from different ranks never interleave mid-line.
  A partial last line is flushed (with a newline) at EOF, so nothing is lost when a child dies.
* :func:`start_child` starts a child in its own session (process group) so that teardown can signal
  the child *and* anything it spawned (data-loader workers) with one ``killpg``.
* :func:`terminate_all` is the one teardown path: SIGTERM (or the given signal), a grace period,
  then SIGKILL, then reap. It never waits without a timeout.
* :func:`prepare_log_dir` / :func:`open_log`: ``--log_dir`` is created ``0700`` and refused when another
  user owns it or may write into it; each log is opened without following a symlink, mode ``0600``
  (a rank's output may hold data and paths that are nobody else's business).

Example::

    >>> import io, sys
    >>> out = io.StringIO()
    >>> pump = OutputPump(stdout=out)
    >>> child = start_child([sys.executable, "-c", "print('hi')"], dict(os.environ), rank=3, pump=pump)
    >>> child.proc.wait(timeout=30)
    0
    >>> finish_children([child]); out.getvalue().splitlines()
    ['[rank3]: hi']
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

__all__ = ["Child", "OutputPump", "describe_exit", "open_log", "prepare_log_dir", "signal_name", "start_child",
           "terminate_all"]


def signal_name(signum: int) -> str:
    """The name of signal ``signum`` (``SIGKILL``), or ``signal N`` for a number without one.

    Example::

        >>> signal_name(9), signal_name(250)
        ('SIGKILL', 'signal 250')
    """
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(returncode: int | None) -> str:
    """Human wording of a Popen return code: ``exit code 3`` / ``killed by SIGKILL``.

    Example::

        >>> describe_exit(3), describe_exit(-9), describe_exit(None)
        ('exit code 3', 'killed by SIGKILL', 'still running')
    """
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exit code {returncode}"


def exit_status(returncode: int) -> int:
    """Shell-style status for the launcher's own exit: a signal N becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class OutputPump:
    """Line-atomic, rank-prefixed copying of child output to this process's streams.

    ``stdout``/``stderr`` default to ``sys.stdout``/``sys.stderr`` *at write time*, so pytest's
    capture and Jupyter's stream redirection both see the lines.

    Example::

        pump = OutputPump()
        child = start_child([sys.executable, "train.py"], env, rank=0, pump=pump)
        # the child's lines appear here as "[rank0]: ..."
    """

    def __init__(self, stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 prefix: bool = True, on_eof: Callable[[], None] | None = None) -> None:
        self._stdout, self._stderr = stdout, stderr
        self._prefix = prefix
        self._lock = threading.Lock()
        self._on_eof = on_eof

    def _write(self, which: str, prefix: str, text: str, log: IO[str] | None) -> None:
        stream = (self._stdout or sys.stdout) if which == "out" else (self._stderr or sys.stderr)
        with self._lock:
            try:
                stream.write((prefix if self._prefix else "") + text)
                stream.flush()
            except (ValueError, OSError):
                pass  # our own stream was closed (interpreter shutting down): keep draining the pipe
            if log is not None:
                try:
                    log.write(text)
                    log.flush()
                except (ValueError, OSError):
                    pass

    def _pump(self, pipe, which: str, prefix: str, log: IO[str] | None) -> None:
        try:
            pieces = _Pieces()
            # read1: whatever the pipe holds now (at least one byte), so a progress bar's "\r"-ended
            # update is forwarded when it is printed, not when the next "\n" (often the end) comes.
            for raw in iter(lambda: pipe.read1(65536), b""):
                for text in pieces.feed(raw):
                    # CR_LF_END: the "\n" of a "\r\n" split across reads ends the line just forwarded
                    self._write(which, "" if text is CR_LF_END else prefix, text, log)
            tail = pieces.close()
            if tail:
                self._write(which, prefix, tail + "\n", log)
        except (OSError, ValueError):
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass
            if self._on_eof is not None:
                self._on_eof()

    def attach(self, proc: subprocess.Popen, prefix: str, log: IO[str] | None) -> list[threading.Thread]:
        threads = []
        for pipe, which in ((proc.stdout, "out"), (proc.stderr, "err")):
            if pipe is None:
                continue
            t = threading.Thread(target=self._pump, args=(pipe, which, prefix, log),
                                 name=f"neural-arch-pump-{which}-{proc.pid}", daemon=True)
            t.start()
            threads.append(t)
        return threads


#: The "\n" that completes a "\r\n" whose "\r" was already forwarded (an object of its own: compared by identity).
class _LineEnd(str):
    """A str of its own class: CPython shares one-character strings, so identity needs a new type."""


CR_LF_END = _LineEnd("\n")


class _Pieces:
    r"""Split a child's output into the pieces :class:`OutputPump` forwards: lines ended by ``"\n"``
    and progress-bar updates ended by ``"\r"`` (tqdm), each whole; a piece without its end waits.

    A ``"\n"`` right after a forwarded ``"\r"`` (a ``"\r\n"`` split across reads) comes back alone as
    :data:`CR_LF_END`, to be written without a prefix (an empty line of its own is a new ``"\n"``). Bytes are decoded incrementally (a UTF-8 character split between
    two reads stays whole).

    >>> p = _Pieces()
    >>> p.feed(b"a\rb"), p.feed(b"\rc\n"), p.feed(b"x\r"), p.feed(b"\ny"), p.close()
    (['a\r'], ['b\r', 'c\n'], ['x\r'], ['\n'], 'y')
    """

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._after_cr = False

    def feed(self, raw: bytes) -> list[str]:
        text = self._pending + self._decoder.decode(raw)
        if not text:
            return []           # half of a UTF-8 character: nothing to forward yet
        out, start = [], 0
        if self._after_cr and text.startswith("\n"):
            out.append(CR_LF_END)
            start = 1
        self._after_cr = False
        i = start
        while i < len(text):
            ch = text[i]
            if ch == "\n" or ch == "\r":
                end = i + 1
                if ch == "\r" and end < len(text) and text[end] == "\n":
                    end += 1            # "\r\n": one line
                out.append(text[start:end])
                start = i = end
                continue
            i += 1
        self._pending = text[start:]
        if out and out[-1].endswith("\r") and not self._pending:
            self._after_cr = True
        return out

    def close(self) -> str:
        """The unterminated tail at end of output ("" if none)."""
        tail, self._pending = self._pending + self._decoder.decode(b"", final=True), ""
        return tail


def prepare_log_dir(path: str) -> str:
    """Create ``path`` (mode 0700) if needed and check that it is safe to write logs into.

    Refused with ``ValueError`` (saying what to do): not a directory, owned by another user, or
    writable by group or others (they could plant a symlink or read what we write). A symlink to
    such a directory is refused the same way: the check is on the directory it leads to.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> prepare_log_dir(os.path.join(d, "logs")) == os.path.join(d, "logs")
    True
    """
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"--log_dir {path!r} is not a directory")
    if st.st_uid != os.geteuid():
        raise ValueError(f"--log_dir {path!r} belongs to another user (uid {st.st_uid}); the launcher writes "
                         "its logs only into a directory you own: pick one of yours")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"--log_dir {path!r} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}), who "
                         f"could replace a log with a link to one of your files: run `chmod go-w {path}` or "
                         "pick a directory only you can write")
    return path


def open_log(path: str) -> IO[str]:
    """Open a rank's log for appending: never through a symlink, created mode 0600, a regular file of
    ours; ``ValueError`` naming the file otherwise. An existing log is made 0600 too.

    >>> import tempfile; f = open_log(os.path.join(tempfile.mkdtemp(), "rank_0.log"))
    >>> oct(os.fstat(f.fileno()).st_mode & 0o777); f.close()
    '0o600'
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise ValueError(f"log file {path!r} is a symbolic link; the launcher does not write through "
                             "links (someone may aim it at one of your files): remove it") from None
        raise ValueError(f"cannot open the log file {path!r}: {exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"log file {path!r} is not a regular file of yours; remove it or pick another --log_dir")
        os.set_blocking(fd, True)  # O_NONBLOCK only kept a FIFO planted there from blocking the open
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


@dataclass
class Child:
    """One started rank: its process, identity and the threads copying its output.

    Example::

        child = start_child([sys.executable, "train.py"], env, rank=1, pump=OutputPump())
        child.proc.wait()
        print(child.rank, describe_exit(child.returncode))
    """

    rank: int
    proc: subprocess.Popen
    local_rank: int = 0
    node_rank: int = 0
    log_path: str | None = None
    log_file: IO[str] | None = None
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()


def start_child(cmd: list[str], env: dict, rank: int, pump: OutputPump, local_rank: int = 0,
                node_rank: int = 0, log_path: str | None = None, header: str | None = None,
                cwd: str | None = None, stdin=subprocess.DEVNULL) -> Child:
    """Start one rank with pipes for its output (and the log file opened in append mode).

    ``stdin`` is the child's standard input: none by default; ``None`` inherits this process's
    (the launcher gives it to rank 0, as torchrun does).

    Example::

        pump = OutputPump()
        children = [start_child(cmd, rank_env(rank=r, world_size=2), rank=r, pump=pump) for r in range(2)]
    """
    log_file = None
    if log_path is not None:
        # Stays open while the rank runs (the pump threads write to it); closed in finish_children.
        log_file = open_log(log_path)
        if header:
            log_file.write(header)
            log_file.flush()
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except BaseException:
        if log_file is not None:
            log_file.close()
        raise
    child = Child(rank=rank, proc=proc, local_rank=local_rank, node_rank=node_rank,
                  log_path=log_path, log_file=log_file)
    child.threads = pump.attach(proc, f"[rank{rank}]: ", log_file)
    return child


def _signal_group(child: Child, sig: int) -> None:
    """Signal the child's whole process group; fall back to the child alone."""
    try:
        os.killpg(child.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        if child.proc.poll() is None:
            try:
                child.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def send_signal_all(children: list[Child], sig: int) -> None:
    """Signal each child's process group, also of children that exited: what they started
    (a shell's ``sleep``, loader workers) may still be there and must get a polite SIGTERM too."""
    for child in children:
        _signal_group(child, sig)


def terminate_all(children: list[Child], grace: float = 5.0, sig: int = signal.SIGTERM,
                  already_signalled: bool = False) -> None:
    """Stop every child: ``sig``, wait up to ``grace`` s, SIGKILL the rest, reap, close logs.

    Also SIGKILLs each child's process group at the end so that grandchildren a rank started
    (and that outlived it) do not linger.

    Example::

        terminate_all(children, grace=5.0)           # SIGTERM, then SIGKILL whatever is left
    """
    if not already_signalled:
        send_signal_all(children, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in children):
        time.sleep(0.02)
    for child in children:
        if child.proc.poll() is None:
            _signal_group(child, signal.SIGKILL)
    for child in children:
        try:
            child.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            print(f"neural_arch.launcher: rank {child.rank} (pid {child.proc.pid}) did not die "
                  f"after SIGKILL within 10 s", file=sys.stderr)
        try:
            os.killpg(child.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    finish_children(children)


def finish_children(children: list[Child], timeout: float = 5.0) -> None:
    """Wait (bounded) for the output threads to drain, then close the log files."""
    deadline = time.monotonic() + timeout
    for child in children:
        for t in child.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if child.log_file is not None:
            try:
                child.log_file.close()
            except OSError:
                pass
            child.log_file = None
