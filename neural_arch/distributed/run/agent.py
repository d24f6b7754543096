"""Launcher-to-launcher rendezvous for multi-node jobs: node 0 listens, the others join, all agree.

Why it exists: before any rank starts, every node's launcher must know the world's layout (how
many processes each node runs, so which global ranks are its own) and ``--start_timeout`` must be
able to say *which nodes* never showed up. The rendezvous store belongs to rank 0's process, so
the launchers use their own side channel:

* node 0's launcher listens on ``master_addr:agent_port`` (default ``master_port + 1``), on that
  address only;
* a joining launcher connects and authenticates with the project's one handshake
  (:mod:`neural_arch.distributed.comm.transport.handshake`, purpose ``b"agent"``: mutual HMAC over
  ``NEURAL_ARCH_AUTH_TOKEN``, which never crosses the wire), sending its node rank as identity and
  its view of the job (``nnodes``, ``nproc_per_node``, backend, master port) as data;
* node 0 checks that view: a node that disagrees on the job (another ``--nnodes``, backend or
  master port, a node rank given twice) is refused **and fails the whole job at once**: every
  node's launcher exits with the same reason instead of node 0 waiting out its timeout;
* once every node has joined, node 0 sends each one the :class:`NodeLayout` (processes per node;
  they may differ, as torchrun allows) and every launcher starts its ranks.

Example (one host, two "nodes" running 2 and 1 processes)::

    >>> import threading
    >>> server = NodeAgentServer(0, nnodes=2, nproc_per_node=2, token="abc", host="127.0.0.1")
    >>> got = []
    >>> t = threading.Thread(target=lambda: got.append(join_node0("127.0.0.1", server.port, 1, 1, "abc", 5)))
    >>> t.start()
    >>> server.wait_layout(5)
    NodeLayout(nproc=(2, 1))
    >>> t.join(); got[0].ranks_of(1), got[0].world_size
    (range(2, 3), 3)
    >>> server.close()
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from neural_arch.distributed.comm.transport.handshake import HandshakeRefused, greet, serve
from neural_arch.distributed.errors import DistributedError

__all__ = ["NodeAgentServer", "NodeLayout", "join_node0"]

_PURPOSE = b"agent"
_HANDSHAKE_S = 5.0   # per connection: an idle or slow client (a port scan) costs one thread this long
_LEN = struct.Struct("!I")
_MAX_REPLY = 1 << 20


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
    """Node 0's side: authenticates the other launchers, checks they agree, hands out the layout."""

    def __init__(self, port: int, nnodes: int, nproc_per_node: int, token: str, host: str = "127.0.0.1",
                 backend: str = "gloo", master_port: int | None = None) -> None:
        if not token:
            raise ValueError("NodeAgentServer needs the job token (NEURAL_ARCH_AUTH_TOKEN)")
        self.nnodes = int(nnodes)
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
                f"node-0 launcher could not listen on agent port {port} ({exc}); the other nodes' "
                f"launchers join there. Free the port or pass --agent_port to every launcher"
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

    def wait_layout(self, timeout: float, should_stop: Callable[[], bool] = lambda: False) -> NodeLayout:
        """Block until every node joined (-> the layout) or the job cannot form.

        Raises ``RuntimeError`` naming the disagreement (every joined node is told the same),
        ``TimeoutError`` naming the nodes that never joined, ``InterruptedError`` when stopped.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._layout is None and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0 or should_stop():
                    break
                self._cond.wait(min(left, 0.2))
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
        accept_forever(self._sock, self._stop, self._handshake, "neural-arch-agent-hello")

    def _handshake(self, conn: socket.socket) -> None:
        try:
            node, _extra = serve(conn, self._key, _PURPOSE, time.monotonic() + _HANDSHAKE_S, self._where,
                                 accept=self._check)
        except (DistributedError, OSError):
            conn.close()  # refused (the client was told why) or a half-open probe: nothing joined
            return
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


def accept_forever(sock: socket.socket, stop: threading.Event, handshake: Callable[[socket.socket], None],
                   name: str) -> None:
    """Accept connections on ``sock`` (a 0.2 s timeout) until ``stop``; each handshake gets its own
    short-lived thread, so an idle or slow client (a port scan) cannot hold up the real nodes."""
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=handshake, args=(conn,), name=name, daemon=True).start()


def join_node0(addr: str, port: int, node_rank: int, nproc_per_node: int, token: str, timeout: float,
               should_stop: Callable[[], bool] = lambda: False, nnodes: int | None = None,
               backend: str = "gloo", master_port: int | None = None) -> NodeLayout:
    """Join node 0's launcher and wait for the job's layout (retries connecting until ``timeout``).

    Raises ``RuntimeError`` when node 0 refuses (wrong token, a disagreement about the job: then
    every node fails with the same reason) or cannot prove it knows the token, ``TimeoutError``
    when node 0 cannot be reached or the job does not form in time.
    """
    if not token:
        raise RuntimeError("joining node 0 needs NEURAL_ARCH_AUTH_TOKEN: export the same value on "
                           "every node of the job")
    where = f"node 0's launcher at {addr}:{port}"
    view = _job_view(nnodes, nproc_per_node, backend, master_port)
    deadline = time.monotonic() + timeout
    sock = _connect_and_greet(addr, port, node_rank, token, view, deadline, should_stop, where)
    with sock:
        reply = _wait_reply(sock, deadline, should_stop, where)
    if reply is None:
        if should_stop():
            raise InterruptedError("interrupted while joining node 0")
        raise TimeoutError(f"node {node_rank} joined {where} but the job did not form within {timeout:.0f} s")
    if "error" in reply:
        raise RuntimeError(f"{where}: the job cannot start: {reply['error']}")
    return NodeLayout(tuple(int(n) for n in reply["layout"]))


def _connect_and_greet(addr: str, port: int, node_rank: int, token: str, view: dict, deadline: float,
                       should_stop: Callable[[], bool], where: str) -> socket.socket:
    """Connect to node 0's agent and pass the handshake (retrying until ``deadline``): the socket."""
    last_error = "no attempt made"
    while time.monotonic() < deadline and not should_stop():
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


def _wait_reply(sock: socket.socket, deadline: float, should_stop: Callable[[], bool], where: str) -> dict | None:
    """The layout (or error) node 0 sends once every node joined; None when our deadline passes."""
    while not should_stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return None
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
