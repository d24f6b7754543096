"""Elastic jobs (``--nnodes MIN:MAX``, or ``--max_restarts > 0`` with several nodes): rounds of rendezvous.

The static multi-node handshake, the layout record and the wire helpers live in
:mod:`neural_arch.distributed.run.agent`; this module adds the long-lived rounds: node 0's
:class:`ElasticAgentServer` forms a round from the connected launchers, re-forms it after a
failure, and :class:`ElasticMember` is one launcher's connection to it.

Example (node 0's launcher; the others only create an ``ElasticMember``)::

    server = ElasticAgentServer(port, min_nodes=1, max_nodes=2, token=token, host="127.0.0.1")
    member = ElasticMember("127.0.0.1", server.port, 0, nproc_per_node=2, token=token, timeout=30)
"""

from __future__ import annotations

import itertools
import json
import queue
import socket
import threading
import time
from collections.abc import Callable

from neural_arch.distributed.auth import HandshakeRefused, serve
from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.run.agent import (
    _HANDSHAKE_S,
    _LEN,
    _MAX_REPLY,
    _PURPOSE,
    WAIT_LOG_S,
    NodeLayout,
    _connect_and_greet,
    _Every,
    _recv_exact,
    _RefusalLog,
    _send_message,
    accept_forever,
    bind_hint,
    check_join_request,
)

__all__ = ["ElasticAgentServer", "ElasticMember"]

# Node 0's agent is the rendezvous host for the whole job (like torchrun's c10d backend on the
# endpoint's host): if node 0 dies, the job ends. Every launcher, node 0's own included, is a
# *member*: it connects, passes the same handshake, and keeps the connection for the whole job.
# Messages are length-prefixed JSON objects:
#
#   agent -> member  {"round": r, "node_rank": k, "layout": [...], "master_port": p, "restart": c}
#                    {"stop": r, "reason": ...}      stop your ranks, answer "stopped", wait
#                    {"finished": true}              every rank of every node exited 0: exit 0
#                    {"exit": code, "reason": ...}   the job failed (restarts used up, too few nodes)
#   member -> agent  {"done": r}                     all my ranks exited 0
#                    {"failed": r, "code": c, "summary": ...}   a rank failed; my ranks are stopped
#                    {"stopped": r}                  my ranks are stopped (answer to "stop")

_STOP_ACK_S = 30.0   # a member that does not confirm "stopped" within this is dropped from the job


class _Member:
    """One connected launcher as node 0's agent sees it."""

    def __init__(self, identity: int, nproc: int, conn: socket.socket, seq: int) -> None:
        self.identity, self.nproc, self.conn, self.seq = identity, nproc, conn, seq

    def send(self, message: dict) -> bool:
        try:
            _send_message(self.conn, message)
            return True
        except OSError:
            return False  # gone: its reader thread reports the drop

    def close(self) -> None:
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


class _JobOver(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code, self.reason = code, reason


class ElasticAgentServer:
    """Node 0's rendezvous host of an elastic job: forms rounds, re-forms them after a failure.

    A round forms once node 0 and at least ``min_nodes`` members are connected, after a last-call
    window of ``last_call`` s for more (or at once with ``max_nodes``). Re-forming after a failure
    with survivors only (every connected member was in the last round) skips the last call: no
    newcomer asked to join, and one that comes later is taken in by the rule below. Node ranks
    are dense, in join order, node 0 first; each round gets a fresh master port. A failed rank or
    a lost member stops every member's ranks and starts the next round (restart count + 1) while
    ``max_restarts`` allows. A member that joins while a round runs with fewer than ``max_nodes``
    nodes stops the round too and joins the next one (torchrun's "new nodes waiting" restart):
    a membership change, which neither uses up a restart nor changes the restart count.

    >>> token = "5ca1ab1e" * 4
    >>> server = ElasticAgentServer(0, 1, 2, token=token, last_call=0.0)
    >>> me = ElasticMember("127.0.0.1", server.port, 0, 2, token, timeout=5, nnodes_spec="1:2")
    >>> msg = me.get(5); (msg["round"], msg["node_rank"], msg["layout"])
    (0, 0, [2])
    >>> me.send({"done": 0}); me.get(5)
    {'finished': True}
    >>> me.close(); server.close()
    """

    def __init__(self, port: int, min_nodes: int, max_nodes: int, token: str, host: str = "127.0.0.1",
                 backend: str = "gloo", master_port: int | None = None, max_restarts: int = 0,
                 last_call: float = 1.0, start_timeout: float = 600.0,
                 log: Callable[[str], None] = lambda message: None, log_interval: float = WAIT_LOG_S) -> None:
        if not token:
            raise ValueError("ElasticAgentServer needs the job token (NEURAL_ARCH_AUTH_TOKEN)")
        if not 1 <= min_nodes <= max_nodes:
            raise ValueError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes}:{max_nodes}")
        self.min_nodes, self.max_nodes, self.max_restarts = int(min_nodes), int(max_nodes), int(max_restarts)
        self.last_call, self.start_timeout, self._log, self._host = float(last_call), float(start_timeout), log, host
        self._refusals = _RefusalLog(log)
        self._log_interval = float(log_interval)
        self._key = token.encode()
        self._view = {"nnodes": f"{min_nodes}:{max_nodes}", "backend": str(backend).lower(),
                      "master_port": master_port}
        self._lock = threading.Lock()
        self._connected: dict[int, _Member] = {}     # identity -> member (coordinator thread writes)
        self._events: queue.Queue = queue.Queue()
        self._seq = itertools.count()
        self._ports: set[int] = set() if master_port is None else {int(master_port)}
        self.rounds: list[dict] = []                 # history: {"round", "nodes", "layout", "restart", ...}
        self.result: tuple[int, str] | None = None   # (exit code, reason) once the job is over
        self.finished = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise RuntimeError(f"node-0 launcher could not listen on agent port {host}:{port} ({exc})"
                               f"{bind_hint(exc, host)}; free the port or pass --agent_port to every launcher"
                               ) from None
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._where = f"node-0 elastic agent {host}:{self.port}"
        self._threads = [threading.Thread(target=self._accept_loop, name="neural-arch-elastic-accept", daemon=True),
                         threading.Thread(target=self._coordinate, name="neural-arch-elastic-rounds", daemon=True)]
        for t in self._threads:
            t.start()

    def joined(self) -> set[int]:
        """Identities (``--node_rank``) of the members connected now."""
        with self._lock:
            return set(self._connected)

    # -- connections ------------------------------------------------------------------------
    def _check(self, node: int, extra: bytes) -> str | None:
        theirs, problems = check_join_request(extra, self._view)
        if theirs is None:
            return problems[0]
        if not 0 <= node < self.max_nodes:
            problems.append(f"node_rank {node} is outside 0..{self.max_nodes - 1}")
        with self._lock:
            if node in self._connected:
                problems.append(f"node_rank {node} is already connected (a node launched twice?)")
        if problems:
            # Only this joiner is refused: a running elastic job must not die of a misconfigured node.
            return "; ".join(problems) + ". Start every node with the same --nnodes MIN:MAX, --backend and " \
                                         "--master_port, and a distinct --node_rank"
        return None

    def _accept_loop(self) -> None:
        accept_forever(self._sock, self._stop, self._handshake, "neural-arch-elastic-hello", log=self._log)

    def _handshake(self, conn: socket.socket, authenticated: Callable[[], None] = lambda: None) -> None:
        try:
            node, extra = serve(conn, self._key, _PURPOSE, time.monotonic() + _HANDSHAKE_S, self._where,
                                accept=self._check)
        except HandshakeRefused as exc:
            self._refusals(conn, exc)  # the joiner was told why; node 0 says so too, as it happens
            conn.close()
            return
        except (DistributedError, OSError):
            conn.close()  # a half-open probe or a stalled client
            return
        authenticated()  # from here on this member no longer counts against the handshake cap
        conn.settimeout(None)
        _keepalive(conn)
        member = _Member(node, int(json.loads(extra.decode())["nproc_per_node"]), conn, next(self._seq))
        self._events.put(("join", member, None))
        while True:  # this member's reader: every message (or its loss) becomes an event
            try:
                (n,) = _LEN.unpack(_recv_exact(conn, _LEN.size))
                if n > _MAX_REPLY:
                    raise ConnectionError(f"protocol error ({n}-byte message)")
                message = json.loads(_recv_exact(conn, n).decode())
            except (OSError, ConnectionError, ValueError):
                self._events.put(("drop", member, None))
                return
            self._events.put(("msg", member, message))

    # -- rounds -----------------------------------------------------------------------------
    def _next_event(self, timeout: float):
        """One event, with membership already updated; None after ``timeout``."""
        try:
            kind, member, message = self._events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if kind == "close":
            raise _JobOver(1, "node 0's launcher stopped the job")
        with self._lock:
            if kind == "join":
                if member.identity in self._connected:  # raced with a twin: keep the first
                    member.send({"exit": 1, "reason": f"node_rank {member.identity} is already connected"})
                    member.close()
                    return None
                self._connected[member.identity] = member
            elif kind == "drop" and self._connected.get(member.identity) is member:
                del self._connected[member.identity]
        if kind == "join":
            self._log(f"node {member.identity} joined ({member.nproc} processes)")
        return kind, member, message

    def _coordinate(self) -> None:
        restart, failure = 0, None
        try:
            while True:
                members = self._form(len(self.rounds), restart)
                failure = self._watch(len(self.rounds) - 1, members)
                if failure is None:
                    self._finish(0, "every rank of every node exited 0")
                    return
                code, reason, stopped = failure
                if code is None:  # a node is waiting to join: re-form without counting a restart
                    self._log(f"{reason}; re-forming the job with it (restart count stays {restart})")
                    self._stop_round(len(self.rounds) - 1, members, stopped, reason)
                    continue
                if restart >= self.max_restarts:
                    used = f"restarts used: {restart} of {self.max_restarts}"
                    self._stop_round(len(self.rounds) - 1, members, stopped, reason)
                    raise _JobOver(code, f"{reason}\n  {used}")
                self._log(f"{reason.splitlines()[0]}; re-forming the job (restart {restart + 1} of {self.max_restarts})")
                self._stop_round(len(self.rounds) - 1, members, stopped, reason)
                restart += 1
        except _JobOver as over:
            self._finish(over.code, over.reason)
        except Exception as exc:  # noqa: BLE001 - a bug here must end the job loudly, not hang it
            self._finish(1, f"node 0's elastic agent failed: {type(exc).__name__}: {exc}")

    def _form(self, rnd: int, restart: int) -> list[_Member]:
        deadline = time.monotonic() + self.start_timeout
        every = _Every(self._log_interval)  # a round that cannot form says why while it waits
        last_call_at = None
        survivors_of = set(self.rounds[-1]["nodes"]) if self.rounds else None
        while True:
            with self._lock:
                members = sorted(self._connected.values(), key=lambda m: (m.identity != 0, m.seq))
            ready = members and members[0].identity == 0 and len(members) >= self.min_nodes
            now = time.monotonic()
            if ready:
                last_call_at = now + self.last_call if last_call_at is None else last_call_at
                # Survivors only: nobody new asked to join, so waiting for more only delays the
                # restart (a node that comes later makes the next round; see _watch).
                survivors_only = survivors_of is not None and {m.identity for m in members} <= survivors_of
                if len(members) >= self.max_nodes or now >= last_call_at or survivors_only:
                    break
            else:
                last_call_at = None
                if every():
                    self._log(f"round {rnd}: still waiting for nodes: joined {sorted(m.identity for m in members)}, "
                              f"need node 0 and at least {self.min_nodes} in all ({deadline - now:.0f} s left of "
                              "the start timeout)")
            if now >= deadline:
                raise _JobOver(1, self._too_few(rnd, members))
            wake = min(deadline, last_call_at if last_call_at is not None else deadline)
            self._next_event(min(0.2, wake - now))  # stale messages of waiting members need no answer
        members = members[:self.max_nodes]
        layout = NodeLayout(tuple(m.nproc for m in members))
        port = self._fresh_port()
        self.rounds.append({"round": rnd, "restart": restart, "nodes": [m.identity for m in members],
                            "layout": layout.nproc, "master_port": port, "formed_at": time.time()})
        self._log(f"round {rnd}: nodes {[m.identity for m in members]} (world size {layout.world_size}, "
                  f"restart {restart}, master port {port})")
        for k, m in enumerate(members):
            m.send({"round": rnd, "node_rank": k, "layout": list(layout.nproc), "master_port": port,
                    "restart": restart})
        return members

    def _too_few(self, rnd: int, members: list[_Member]) -> str:
        have = sorted(m.identity for m in members)
        if rnd > 0:
            missing = sorted(set(self.rounds[-1]["nodes"]) - set(have))
        else:
            missing = sorted(set(range(self.max_nodes)) - set(have))
        text = (f"elastic rendezvous round {rnd}: only {len(have)} node(s) {have} connected within "
                f"{self.start_timeout:g} s, the job needs at least {self.min_nodes}")
        if 0 not in have:
            text += " including node 0"
        return text + (f"; missing: node{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
                       if missing else "")

    def _fresh_port(self) -> int:
        from neural_arch.distributed.run.child_env import free_port

        for _ in range(100):  # a fresh port per round: a stale store of the last round is never reused
            port = free_port(self._host)
            if port not in self._ports:
                self._ports.add(port)
                return port
        raise RuntimeError("no fresh master port found after 100 tries")

    def _watch(self, rnd: int, members: list[_Member]):
        """None when every member reported done; else (exit code, reason, members already stopped).

        The exit code is None for a membership change: a node joined while this round has room.
        """
        done: set[int] = set()
        while True:
            event = self._next_event(0.5)
            if event is None:
                continue
            kind, member, message = event
            if member not in members:
                if kind == "join" and len(members) < self.max_nodes and not done:  # (not once ranks finish)
                    return None, f"node {member.identity} is waiting to join round {rnd + 1}", set()
                continue  # the job is at --nnodes MAX: a waiting member joins after the next failure
            if kind == "drop":
                return 1, (f"node {member.identity}'s launcher disconnected during round {rnd} (the node died "
                           f"or its launcher was killed)"), {member}
            if kind == "msg" and message.get("failed") == rnd:
                return int(message.get("code", 1)), str(message.get("summary", "a rank failed")), {member}
            if kind == "msg" and message.get("done") == rnd:
                done.add(id(member))
                if len(done) == len(members):
                    return None

    def _stop_round(self, rnd: int, members: list[_Member], stopped: set, reason: str) -> None:
        pending = [m for m in members if m not in stopped]
        for m in pending:
            m.send({"stop": rnd, "reason": reason})
        deadline = time.monotonic() + _STOP_ACK_S
        while pending and time.monotonic() < deadline:
            event = self._next_event(deadline - time.monotonic())
            if event is None:
                break
            kind, member, message = event
            if member in pending and (kind == "drop" or message.get("stopped") == rnd or message.get("failed") == rnd):
                pending.remove(member)
        for m in pending:  # never confirmed: treat as dead, so its ranks cannot mix with the next round
            self._log(f"node {m.identity} did not confirm stopping its ranks within {_STOP_ACK_S:g} s; dropping it")
            m.close()

    def _finish(self, code: int, reason: str) -> None:
        self.result = (code, reason)
        with self._lock:
            members = sorted(self._connected.values(), key=lambda m: m.identity == 0)  # node 0 last
        for m in members:
            m.send({"finished": True} if code == 0 else {"exit": code, "reason": reason})
        self.finished.set()

    def close(self) -> None:
        self._stop.set()
        self._events.put(("close", None, None))
        try:
            self._sock.close()
        except OSError:
            pass
        for t in self._threads:
            t.join(2.0)
        with self._lock:
            for m in self._connected.values():
                m.close()


def _keepalive(sock: socket.socket) -> None:
    """Notice a node that vanished without closing its socket (power loss) within ~20 s."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, name):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    except OSError:
        pass


class ElasticMember:
    """A launcher's connection to node 0's elastic agent (node 0's own launcher has one too).

    Messages from the agent arrive in a queue (read by a thread, which calls ``on_message`` so a
    waiting monitor loop wakes at once); a lost connection arrives as ``{"lost": reason}``.

    Example::

        member = ElasticMember("10.0.0.1", agent_port, identity=node_rank, nproc_per_node=8,
                               token=os.environ["NEURAL_ARCH_AUTH_TOKEN"], timeout=600)
        round_ = member.get(timeout=600)     # {"round": 0, "node_rank": ..., "layout": [...], ...}
        member.send({"done": 0})
    """

    def __init__(self, addr: str, port: int, identity: int, nproc_per_node: int, token: str, timeout: float,
                 should_stop: Callable[[], bool] = lambda: False, nnodes_spec: str | None = None,
                 backend: str = "gloo", master_port: int | None = None,
                 on_message: Callable[[], None] = lambda: None,
                 log: Callable[[str], None] = lambda message: None, log_interval: float = WAIT_LOG_S) -> None:
        if not token:
            raise RuntimeError("joining node 0 needs NEURAL_ARCH_AUTH_TOKEN: export the same value on "
                               "every node of the job")
        self.where = f"node 0's elastic agent at {addr}:{port}"
        view = {"nnodes": nnodes_spec, "nproc_per_node": int(nproc_per_node), "backend": str(backend).lower(),
                "master_port": master_port}
        every = _Every(log_interval)  # a node that cannot reach node 0 says so, not only at the timeout
        self._sock = _connect_and_greet(addr, port, identity, token, view, time.monotonic() + timeout,
                                        should_stop, self.where,
                                        lambda text: log(f"node {identity}: {text}") if every() else None)
        self._sock.settimeout(None)
        _keepalive(self._sock)
        self._queue: queue.Queue = queue.Queue()
        self._on_message = on_message
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="neural-arch-elastic-member", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                (n,) = _LEN.unpack(_recv_exact(self._sock, _LEN.size))
                if n > _MAX_REPLY:
                    raise ConnectionError(f"protocol error ({n}-byte message)")
                self._queue.put(json.loads(_recv_exact(self._sock, n).decode()))
            except (OSError, ConnectionError, ValueError) as exc:
                self._queue.put({"lost": f"{self.where} is gone ({exc}); node 0 hosts the rendezvous, so "
                                         f"the job ends"})
                self._on_message()
                return
            self._on_message()

    def get(self, timeout: float) -> dict | None:
        """The next message, or None after ``timeout`` s."""
        try:
            return self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def poll(self) -> dict | None:
        return self.get(0)

    def send(self, message: dict) -> None:
        with self._send_lock:
            try:
                _send_message(self._sock, message)
            except OSError:
                pass  # the reader reports the lost connection

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(2.0)
