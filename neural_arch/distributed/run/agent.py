"""Launcher-to-launcher rendezvous for multi-node jobs: node 0 listens, the others join, all agree.

Why it exists: before any rank starts, every node's launcher must know the world's layout (how
many processes each node runs, so which global ranks are its own) and ``--start_timeout`` must be
able to say *which nodes* never showed up. The rendezvous store belongs to rank 0's process, so
the launchers use their own side channel:

* node 0's launcher listens on ``master_addr:agent_port`` (default ``master_port + 1``), on that
  address only;
* a joining launcher connects and authenticates with the project's one handshake
  (:mod:`neural_arch.distributed.auth`, purpose ``b"agent"``: mutual HMAC over
  ``NEURAL_ARCH_AUTH_TOKEN``, which never crosses the wire), sending its node rank as identity and
  its view of the job (``nnodes``, ``nproc_per_node``, backend, master port) as data;
* node 0 checks that view: a node that disagrees on the job (another ``--nnodes``, backend or
  master port, a node rank given twice) is refused **and fails the whole job at once**: every
  node's launcher exits with the same reason instead of node 0 waiting out its timeout;
* once every node has joined, node 0 sends each one the :class:`NodeLayout` (processes per node;
  they may differ, as torchrun allows) and every launcher starts its ranks.

Nothing here waits in silence: node 0 logs each refused join as it happens (a wrong token, a
disagreement) and, every ``log_interval`` seconds, the nodes still missing; a joining node logs
what it waits for (node 0 unreachable, and why; or the other nodes). The accept loop survives
``OSError`` (EMFILE in a connection flood: it backs off and goes on) and runs at most
:func:`pending_cap` unauthenticated handshakes at a time, well below the descriptor limit.

Example (one host, two "nodes" running 2 and 1 processes)::

    >>> import threading
    >>> token = "5ca1ab1e" * 4     # in a job: the same NEURAL_ARCH_AUTH_TOKEN (>= 128 bits) on every node
    >>> server = NodeAgentServer(0, nnodes=2, nproc_per_node=2, token=token, host="127.0.0.1")
    >>> got = []
    >>> t = threading.Thread(target=lambda: got.append(join_node0("127.0.0.1", server.port, 1, 1, token, 5)))
    >>> t.start()
    >>> server.wait_layout(5)
    NodeLayout(nproc=(2, 1))
    >>> t.join(); got[0].ranks_of(1), got[0].world_size
    (range(2, 3), 3)
    >>> server.close()
"""

from __future__ import annotations

import errno
import json
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from neural_arch.distributed.auth import HandshakeRefused, greet, serve
from neural_arch.distributed.errors import DistributedError

__all__ = ["NodeAgentServer", "NodeLayout", "join_node0", "pending_cap"]

_PURPOSE = b"agent"
_HANDSHAKE_S = 5.0   # per connection: an idle or slow client (a port scan) costs one thread this long
_LEN = struct.Struct("!I")
_MAX_REPLY = 1 << 20
WAIT_LOG_S = 30.0    # default of --wait_log_interval: how often a waiting launcher says what it waits for
_ACCEPT_BACKOFF_S = (0.05, 1.0)  # after a failed accept() (EMFILE, ENFILE, ENOBUFS): first and longest pause


def _quiet(message: str) -> None:
    """The default log: library users of the agent get no output unless they pass ``log=``."""


def pending_cap() -> int:
    """How many unauthenticated connections an agent handles at once: a quarter of this process's
    descriptor limit, at most 64 (each costs a descriptor and a thread for up to 5 s).

    >>> 1 <= pending_cap() <= 64
    True
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 64
    return max(1, min(64, int(soft) // 4))


class _Every:
    """True once every ``interval`` seconds (the first time after one interval): periodic log lines."""

    def __init__(self, interval: float) -> None:
        self.interval = float(interval)
        self._next = time.monotonic() + self.interval

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.interval
        return True


def bind_hint(exc: OSError, host: str) -> str:
    """What a failed ``bind`` of node 0's agent port most likely means, for its error message."""
    if exc.errno == errno.EADDRINUSE:
        return (" -- another process listens there: a second launcher started with --node_rank 0 (give "
                "each node a distinct --node_rank), a previous job still running, or a port taken by "
                "something else (then pass --agent_port to every launcher)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f" -- {host} is not an address of this host, so this is not node 0: pass the --node_rank "
                "this node really has (node 0 is the host --master_addr names)")
    return ""


@dataclass(frozen=True)
class NodeLayout:
    """Processes per node, in node order: which global ranks each node runs.

    >>> layout = NodeLayout((2, 3))
    >>> layout.world_size, layout.rank_offset(1), list(layout.ranks_of(1))
    (5, 2, [2, 3, 4])
    """

    nproc: tuple[int, ...]

    @property
    def world_size(self) -> int:
        return sum(self.nproc)

    def rank_offset(self, node: int) -> int:
        return sum(self.nproc[:node])

    def ranks_of(self, node: int) -> range:
        start = self.rank_offset(node)
        return range(start, start + self.nproc[node])


def _job_view(nnodes: int | None, nproc_per_node: int, backend: str, master_port: int | None) -> dict:
    """What a launcher believes about the job; ``None`` means "not stated" (never a disagreement)."""
    return {"nnodes": None if nnodes is None else int(nnodes), "nproc_per_node": int(nproc_per_node),
            "backend": str(backend).lower(), "master_port": master_port}


def check_join_request(extra: bytes, ours: dict) -> tuple[dict | None, list[str]]:
    """A joiner's view of the job (the handshake's data) against ``ours``: ``(theirs, problems)``,
    or ``(None, [reason])`` for a malformed request. ``None`` on either side is "not stated";
    ``nproc_per_node`` may differ between nodes but must be a positive integer.

    >>> check_join_request(b'{"nnodes": 3, "nproc_per_node": 0}', {"nnodes": 2})[1]
    ['nnodes=3 but node 0 has nnodes=2', 'nproc_per_node=0 is not a positive integer']
    """
    try:
        view = json.loads(extra.decode())
        theirs = {k: view[k] for k in (*ours, "nproc_per_node")}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, ["malformed join request (an older neural_arch launcher?)"]
    problems = [f"{k}={theirs[k]} but node 0 has {k}={ours[k]}" for k in ours if k != "nproc_per_node"
                and theirs[k] is not None and ours[k] is not None and str(theirs[k]) != str(ours[k])]
    nproc = theirs["nproc_per_node"]
    if not isinstance(nproc, int) or nproc < 1:
        problems.append(f"nproc_per_node={nproc} is not a positive integer")
    return theirs, problems


def _send_message(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message).encode()
    sock.sendall(_LEN.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("node 0's launcher closed the connection")
        buf += chunk
    return bytes(buf)


class NodeAgentServer:
    """Node 0's side: authenticates the other launchers, checks they agree, hands out the layout.

    Example::

        server = NodeAgentServer(port=29400, nnodes=2, nproc_per_node=4, token=token, host="0.0.0.0")
        layout = server.wait_layout(timeout=600)     # a NodeLayout once node 1 has joined
        server.close()
    """

    def __init__(self, port: int, nnodes: int, nproc_per_node: int, token: str, host: str = "127.0.0.1",
                 backend: str = "gloo", master_port: int | None = None,
                 log: Callable[[str], None] = _quiet) -> None:
        if not token:
            raise ValueError("NodeAgentServer needs the job token (NEURAL_ARCH_AUTH_TOKEN)")
        self.nnodes = int(nnodes)
        self._log = log
        self._refusals = _RefusalLog(log)
        self._key = token.encode()
        self._view = _job_view(nnodes, nproc_per_node, backend, master_port)
        self._nproc = {0: int(nproc_per_node)}
        self._held: dict[int, socket.socket] = {}      # joined nodes waiting for the layout
        self._error: str | None = None                # the first disagreement: fails every node
        self._layout: NodeLayout | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise RuntimeError(
                f"node-0 launcher could not listen on agent port {host}:{port} ({exc}){bind_hint(exc, host)}; "
                f"the other nodes' launchers join there. Free the port or pass --agent_port to every launcher"
            ) from None
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._where = f"node-0 launcher agent {host}:{self.port}"
        self._thread = threading.Thread(target=self._serve, name="neural-arch-node-agent", daemon=True)
        self._thread.start()

    def joined(self) -> set[int]:
        """Node ranks that have joined so far (node 0 included)."""
        with self._cond:
            return set(self._nproc)

    def missing(self) -> list[int]:
        with self._cond:
            return sorted(set(range(self.nnodes)) - set(self._nproc))

    def wait_layout(self, timeout: float, should_stop: Callable[[], bool] = lambda: False,
                    log_interval: float = WAIT_LOG_S) -> NodeLayout:
        """Block until every node joined (-> the layout) or the job cannot form.

        Says (through ``log``) what it waits for at the start and every ``log_interval`` seconds.
        Raises ``RuntimeError`` naming the disagreement (every joined node is told the same),
        ``TimeoutError`` naming the nodes that never joined, ``InterruptedError`` when stopped.
        """
        deadline = time.monotonic() + timeout
        every = _Every(log_interval)
        self._log(f"waiting for nodes {self.missing()} to join at {self._where} (start timeout {timeout:g} s)")
        with self._cond:
            while self._layout is None and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0 or should_stop():
                    break
                self._cond.wait(min(left, 0.2))
                if self._layout is None and self._error is None and every():
                    missing = sorted(set(range(self.nnodes)) - set(self._nproc))
                    self._log(f"still waiting for nodes {missing} to join at {self._where} ({left:.0f} s left "
                              f"of the start timeout; joined: {sorted(self._nproc)}): start their launchers with "
                              "the same --master_addr, --master_port and NEURAL_ARCH_AUTH_TOKEN")
            if self._error is not None:
                raise RuntimeError(self._error)
            if self._layout is not None:
                return self._layout
        missing = self.missing()
        reason = (f"node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never joined "
                  f"within {timeout:g} s")
        self._fail(f"node 0 gave up forming the job: {reason}")
        if should_stop():
            raise InterruptedError("interrupted while waiting for the other nodes")
        raise TimeoutError(reason)

    # -- server side ------------------------------------------------------------------------
    def _check(self, node: int, extra: bytes) -> str | None:
        """None if ``node`` may join; else the reason (and, for a real disagreement, the job fails)."""
        theirs, problems = check_join_request(extra, self._view)
        if theirs is None:
            return problems[0]
        if not 0 < node < self.nnodes:
            problems.append(f"node_rank {node} is outside 1..{self.nnodes - 1}")
        nproc = theirs["nproc_per_node"]
        with self._cond:
            if self._error is not None:
                return self._error
            if self._layout is not None:
                problems.append("the job has already formed (a node launched twice?)")
            elif node in self._nproc:
                problems.append(f"node_rank {node} joined twice; give each node a distinct --node_rank")
            if problems:
                self._fail_locked(f"node {node}'s launcher disagrees with node 0: " + "; ".join(problems)
                                  + ". Start every node with the same --nnodes, --backend and "
                                    "--master_port, and a distinct --node_rank")
                return self._error
            self._nproc[node] = nproc
        return None

    def _serve(self) -> None:
        accept_forever(self._sock, self._stop, self._handshake, "neural-arch-agent-hello", log=self._log)

    def _handshake(self, conn: socket.socket, authenticated: Callable[[], None] = lambda: None) -> None:
        try:
            node, _extra = serve(conn, self._key, _PURPOSE, time.monotonic() + _HANDSHAKE_S, self._where,
                                 accept=self._check)
        except HandshakeRefused as exc:
            self._refusals(conn, exc)  # the client was told why; node 0 says so too, as it happens
            conn.close()
            return
        except (DistributedError, OSError):
            conn.close()  # a half-open probe or a stalled client: nothing joined, nothing to say
            return
        authenticated()
        with self._cond:
            if self._error is not None:
                self._answer(conn, {"error": self._error})
                return
            self._held[node] = conn
            if len(self._nproc) == self.nnodes:
                self._layout = NodeLayout(tuple(self._nproc[n] for n in range(self.nnodes)))
                for held in self._held.values():
                    self._answer(held, {"layout": list(self._layout.nproc)})
                self._held.clear()
            self._cond.notify_all()

    @staticmethod
    def _answer(conn: socket.socket, message: dict) -> None:
        try:
            conn.settimeout(_HANDSHAKE_S)
            _send_message(conn, message)
        except OSError:
            pass  # that launcher is gone: its own ranks never start, the others' start timeout says so
        finally:
            conn.close()

    def _fail(self, reason: str) -> None:
        with self._cond:
            if self._error is None and self._layout is None:
                self._fail_locked(reason)

    def _fail_locked(self, reason: str) -> None:
        self._error = reason
        for held in self._held.values():
            self._answer(held, {"error": reason})
        self._held.clear()
        self._cond.notify_all()

    def close(self) -> None:
        self._fail("node 0's launcher stopped before the job formed")
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self._thread.join(2.0)


class _RefusalLog:
    """Logs refused joins as they happen, at most one line a second (a flood of bad clients must not
    flood the log: the lines left out are counted in the next one)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log, self._lock = log, threading.Lock()
        self._last, self._skipped = 0.0, 0

    def __call__(self, conn: socket.socket, exc: BaseException) -> None:
        try:
            host, port = conn.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "a client"
        with self._lock:
            now = time.monotonic()
            if now - self._last < 1.0:
                self._skipped += 1
                return
            skipped, self._skipped, self._last = self._skipped, 0, now
        more = f" ({skipped} more refused since the last such line)" if skipped else ""
        self._log(f"refused a join from {peer}: {exc}{more}")


def accept_forever(sock: socket.socket, stop: threading.Event,
                   handshake: Callable[[socket.socket, Callable[[], None]], None], name: str,
                   log: Callable[[str], None] = _quiet, cap: int | None = None) -> None:
    """Accept connections on ``sock`` (a 0.2 s timeout) until ``stop`` or ``sock`` is closed.

    Each handshake gets its own short-lived thread, so an idle or slow client (a port scan) cannot
    hold up the real nodes; ``handshake(conn, authenticated)`` calls ``authenticated()`` once the
    client proved the token. At most ``cap`` (default :func:`pending_cap`) connections may be
    unauthenticated at once: past that, new ones wait in the listen backlog. A failed ``accept()``
    (EMFILE/ENFILE during a flood, ECONNABORTED) is logged and retried after a growing pause
    (0.05 s .. 1 s): the loop never stops before ``stop``.
    """
    slots = threading.BoundedSemaphore(cap or pending_cap())
    pause = 0.0
    while not stop.is_set():
        if not slots.acquire(timeout=0.2):
            continue  # at the cap: the handshakes under way end within _HANDSHAKE_S
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            slots.release()
            continue
        except OSError as exc:
            slots.release()
            if stop.is_set() or sock.fileno() == -1:
                return  # closed by our owner
            if pause == 0.0:
                log(f"accepting a connection failed ({exc}); backing off and accepting again")
            pause = min(max(pause * 2, _ACCEPT_BACKOFF_S[0]), _ACCEPT_BACKOFF_S[1])
            stop.wait(pause)
            continue
        pause = 0.0
        released = threading.Event()

        def release(released=released) -> None:
            if not released.is_set():
                released.set()
                slots.release()

        def run(conn=conn, release=release) -> None:
            try:
                handshake(conn, release)
            finally:
                release()

        try:
            threading.Thread(target=run, name=name, daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: drop this client, keep serving
            conn.close()
            release()
            log(f"dropped a connection: cannot start a thread for it ({exc})")


def join_node0(addr: str, port: int, node_rank: int, nproc_per_node: int, token: str, timeout: float,
               should_stop: Callable[[], bool] = lambda: False, nnodes: int | None = None,
               backend: str = "gloo", master_port: int | None = None,
               log: Callable[[str], None] = _quiet, log_interval: float = WAIT_LOG_S) -> NodeLayout:
    """Join node 0's launcher and wait for the job's layout (retries connecting until ``timeout``).

    Says (through ``log``) what it waits for at the start and every ``log_interval`` seconds: node 0
    unreachable (with the last error: a wrong --master_port shows here), or the other nodes.

    Raises ``RuntimeError`` when node 0 refuses (wrong token, a disagreement about the job: then
    every node fails with the same reason) or cannot prove it knows the token, ``TimeoutError``
    when node 0 cannot be reached or the job does not form in time.

    Example::

        layout = join_node0("node0.example", 29400, node_rank=1, nproc_per_node=4, token=token, timeout=600)
        first_rank = layout.rank_offset(1)
    """
    if not token:
        raise RuntimeError("joining node 0 needs NEURAL_ARCH_AUTH_TOKEN: export the same value on "
                           "every node of the job")
    where = f"node 0's launcher at {addr}:{port}"
    view = _job_view(nnodes, nproc_per_node, backend, master_port)
    deadline = time.monotonic() + timeout
    every = _Every(log_interval)
    log(f"node {node_rank}: joining {where} (start timeout {timeout:g} s)")
    sock = _connect_and_greet(addr, port, node_rank, token, view, deadline, should_stop, where,
                              lambda text: log(f"node {node_rank}: {text}") if every() else None)
    log(f"node {node_rank}: joined {where}; waiting for the other nodes to join")
    with sock:
        reply = _wait_reply(sock, deadline, should_stop, where,
                            lambda text: log(f"node {node_rank}: {text}") if every() else None)
    if reply is None:
        if should_stop():
            raise InterruptedError("interrupted while joining node 0")
        raise TimeoutError(f"node {node_rank} joined {where} but the job did not form within {timeout:.0f} s")
    if "error" in reply:
        raise RuntimeError(f"{where}: the job cannot start: {reply['error']}")
    return NodeLayout(tuple(int(n) for n in reply["layout"]))


def _connect_and_greet(addr: str, port: int, node_rank: int, token: str, view: dict, deadline: float,
                       should_stop: Callable[[], bool], where: str,
                       waiting: Callable[[str], None] = _quiet) -> socket.socket:
    """Connect to node 0's agent and pass the handshake (retrying until ``deadline``): the socket.
    ``waiting(text)`` is called on every retry with what we wait for (it decides whether to log)."""
    last_error = "no attempt made"
    while time.monotonic() < deadline and not should_stop():
        if last_error != "no attempt made":
            waiting(f"still cannot reach {where} ({deadline - time.monotonic():.0f} s left of the start "
                    f"timeout; last error: {last_error}): is node 0's launcher running, with the same "
                    "--master_addr and --master_port (its agent listens on master_port + 1, or --agent_port)?")
        try:
            sock = socket.create_connection((addr, port), timeout=2.0)
        except OSError as exc:
            last_error = str(exc)
            time.sleep(0.2)
            continue
        try:
            greet(sock, token.encode(), _PURPOSE, min(deadline, time.monotonic() + _HANDSHAKE_S), where,
                  identity=node_rank, extra=json.dumps(view).encode(), require_key=True)
            return sock
        except HandshakeRefused as exc:
            sock.close()
            raise RuntimeError(f"{where} refused node {node_rank}: {exc}") from None
        except DistributedError as exc:
            sock.close()
            if "could not prove" in str(exc) or "another job key" in str(exc):
                raise RuntimeError(str(exc)) from None
            last_error = str(exc)
        except OSError as exc:
            sock.close()
            last_error = str(exc)
        time.sleep(0.2)
    if should_stop():
        raise InterruptedError("interrupted while joining node 0")
    raise TimeoutError(
        f"node {node_rank} could not reach node 0's launcher at {addr}:{port} within the start timeout "
        f"(last error: {last_error}); start node 0's launcher, check --master_addr/--agent_port "
        f"and the firewall"
    )


def _wait_reply(sock: socket.socket, deadline: float, should_stop: Callable[[], bool], where: str,
                waiting: Callable[[str], None] = _quiet) -> dict | None:
    """The layout (or error) node 0 sends once every node joined; None when our deadline passes."""
    while not should_stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        waiting(f"joined {where}; still waiting for the other nodes to join ({left:.0f} s left of the "
                "start timeout; node 0's launcher logs which ones are missing)")
        sock.settimeout(min(left, 0.5))
        try:
            head = sock.recv(_LEN.size, socket.MSG_PEEK)
        except TimeoutError:
            continue
        except OSError as exc:
            raise RuntimeError(f"{where} dropped the connection before the job formed: {exc}") from None
        if not head:
            raise RuntimeError(f"{where} closed the connection before the job formed (did node 0 stop?)")
        if len(head) < _LEN.size:
            continue
        sock.settimeout(max(1.0, left))
        (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
        if n > _MAX_REPLY:
            raise RuntimeError(f"{where}: protocol error ({n}-byte reply)")
        return json.loads(_recv_exact(sock, n).decode())
    return None
