"""Launcher-to-launcher handshake for multi-node jobs (node 0 listens, the others join).

Why it exists: ``--start_timeout`` must be able to say *which nodes* never showed up. The
rendezvous store belongs to rank 0's process (the process-group code), so the launchers use their
own tiny side channel instead:

* node 0's launcher listens on ``master_addr:agent_port`` (default ``master_port + 1``), on that
  address only - not on every interface;
* a joining launcher connects *before starting its ranks*; node 0 sends ``CHALLENGE <nonce>``;
* the joiner answers ``HELLO <node_rank> <nproc_per_node> <its nonce> <mac>`` with
  ``mac = HMAC-SHA256(token, "join|<node 0 nonce>|<its nonce>|<node_rank>|<nproc>")``;
* node 0 checks the MAC (``hmac.compare_digest``) and answers ``OK <mac>`` proving that it knows
  the token too (``HMAC(token, "ok|<its nonce>|<joiner nonce>|<node_rank>")``), or ``ERR <what to fix>``.

The token itself never crosses the wire: every node must have the same ``NEURAL_ARCH_AUTH_TOKEN``
exported. A client that does not know it learns nothing but "authentication failed".

Example (one host)::

    >>> server = NodeAgentServer(0, nnodes=2, nproc_per_node=1, token="abc", host="127.0.0.1")
    >>> join_node0("127.0.0.1", server.port, 1, 1, "abc", timeout=5)
    >>> sorted(server.joined())
    [0, 1]
    >>> server.close()
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["NodeAgentServer", "join_node0"]


def _mac(token: str, *parts) -> str:
    message = "|".join(str(p) for p in parts).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


class NodeAgentServer:
    """Accepts ``HELLO`` lines from the other nodes' launchers (runs on node 0)."""

    def __init__(self, port: int, nnodes: int, nproc_per_node: int, token: str,
                 host: str = "127.0.0.1") -> None:
        if not token:
            raise ValueError("NodeAgentServer needs the job token (NEURAL_ARCH_AUTH_TOKEN)")
        self.nnodes, self.nproc_per_node, self.token = nnodes, nproc_per_node, token
        self._joined = {0}
        self._lock = threading.Lock()
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
        self._thread = threading.Thread(target=self._serve, name="neural-arch-node-agent", daemon=True)
        self._thread.start()

    def joined(self) -> set[int]:
        with self._lock:
            return set(self._joined)

    def _answer(self, line: str, nonce: str) -> str:
        parts = line.split()
        if len(parts) != 5 or parts[0] != "HELLO":
            return "ERR malformed hello (is another program using the launcher's agent port?)"
        expected = _mac(self.token, "join", nonce, parts[3], parts[1], parts[2])
        if not hmac.compare_digest(expected, parts[4]):
            # Checked before anything else, so an unauthenticated client learns nothing else.
            return ("ERR authentication failed: NEURAL_ARCH_AUTH_TOKEN differs from node 0's; "
                    "export the same token on every node")
        try:
            node, nproc = int(parts[1]), int(parts[2])
        except ValueError:
            return "ERR malformed hello"
        if not 0 < node < self.nnodes:
            return f"ERR node_rank {node} is outside 1..{self.nnodes - 1} (node 0 has nnodes={self.nnodes})"
        if nproc != self.nproc_per_node:
            return (f"ERR nproc_per_node {nproc} differs from node 0's {self.nproc_per_node}; "
                    f"use the same --nproc_per_node on every node")
        with self._lock:
            if node in self._joined:
                return f"ERR node_rank {node} already joined; give each node a distinct --node_rank"
            self._joined.add(node)
        return "OK " + _mac(self.token, "ok", parts[3], nonce, node)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                conn.settimeout(5.0)
                nonce = secrets.token_hex(16)
                with conn, conn.makefile("rw", encoding="utf-8", newline="\n") as f:
                    f.write(f"CHALLENGE {nonce}\n")
                    f.flush()
                    f.write(self._answer(f.readline(400).strip(), nonce) + "\n")
                    f.flush()
            except OSError:
                pass  # a half-open probe: the joining node retries

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self._thread.join(2.0)


def join_node0(addr: str, port: int, node_rank: int, nproc_per_node: int, token: str,
               timeout: float, should_stop: Callable[[], bool] = lambda: False) -> None:
    """Announce this node to node 0's launcher (mutual HMAC proof of ``token``). Retries until ``timeout``.

    Raises ``RuntimeError`` when node 0 refuses (wrong token, mismatched options) or cannot prove
    that it knows the token, ``TimeoutError`` when node 0 cannot be reached in time.
    """
    if not token:
        raise RuntimeError("joining node 0 needs NEURAL_ARCH_AUTH_TOKEN: export the same value on "
                           "every node of the job")
    deadline = time.monotonic() + timeout
    last_error = "no attempt made"
    while time.monotonic() < deadline and not should_stop():
        mine = secrets.token_hex(16)
        try:
            with socket.create_connection((addr, port), timeout=2.0) as sock:
                sock.settimeout(max(1.0, min(10.0, deadline - time.monotonic())))
                with sock.makefile("rw", encoding="utf-8", newline="\n") as f:
                    challenge = f.readline(200).split()
                    if len(challenge) != 2 or challenge[0] != "CHALLENGE":
                        raise ConnectionError(f"unexpected greeting {challenge!r}")
                    theirs = challenge[1]
                    f.write(f"HELLO {node_rank} {nproc_per_node} {mine} "
                            f"{_mac(token, 'join', theirs, mine, node_rank, nproc_per_node)}\n")
                    f.flush()
                    reply = f.readline(4096).strip()
        except OSError as exc:
            last_error = str(exc)
            time.sleep(0.2)
            continue
        if reply.startswith("OK "):
            if hmac.compare_digest(reply[3:], _mac(token, "ok", mine, theirs, node_rank)):
                return
            raise RuntimeError(f"the launcher at {addr}:{port} could not prove it knows "
                               f"NEURAL_ARCH_AUTH_TOKEN: is it another job's launcher?")
        if reply.startswith("ERR "):
            raise RuntimeError(f"node 0's launcher at {addr}:{port} refused node {node_rank}: {reply[4:]}")
        last_error = f"unexpected reply {reply!r}"
        time.sleep(0.2)
    if should_stop():
        raise InterruptedError("interrupted while joining node 0")
    raise TimeoutError(
        f"node {node_rank} could not reach node 0's launcher at {addr}:{port} within {timeout:.0f} s "
        f"(last error: {last_error}); start node 0's launcher, check --master_addr/--agent_port "
        f"and the firewall"
    )
