"""``TCPStore``: the rendezvous store served by rank 0 over TCP (a small threaded server; everyone
else connects to it, retrying while it is not up yet).

The wire protocol is length-prefixed binary frames; the store **never unpickles** anything it
receives.

Authentication (:mod:`neural_arch.distributed.auth`, shared with the TCP mesh
and the node agent): every connection must pass a mutual HMAC-SHA256 challenge before its first
request. The store never reads the environment; the process-group code passes what it read:

* ``auth_token`` (``NEURAL_ARCH_AUTH_TOKEN``, >= 128 bits, stretched with PBKDF2): the key, on any
  address. Master and clients refuse an open peer.
* no token, ``host`` on loopback: the master makes a random per-job secret in a file only this user
  can read (``handshake.local_job_secret``, named by the port); clients read that file and **require**
  the master to prove it -- an open store or another key on that port (another user's process that
  took ``MASTER_PORT`` first) is refused. ``job_id`` (srun's/mpiexec's job id, public) is mixed into
  that key only to keep two jobs of the same user apart; it never authenticates anything.
* no token, ``host`` not on loopback: no key can be shared, so master and clients refuse to start
  unless every rank passed ``allow_unauthenticated=True`` (``NEURAL_ARCH_ALLOW_UNAUTHENTICATED=1``):
  then the store runs open and says so loudly once.

What it survives: a connection that fails the handshake within ``HANDSHAKE_TIMEOUT`` (or sends a
malformed or oversized frame) is closed and logged, the server keeps serving everyone else; at most
``MAX_PENDING`` unauthenticated connections at once (and fewer than a quarter of the descriptor
limit), the rest are closed at once and honest clients retry; an ``accept`` error (``EMFILE`` in a
connection flood) is waited out, never the end of the server; frames are read in 1 MiB pieces as
their bytes arrive, within one store-wide ``MEMORY_BUDGET``; a blocking get/wait holds only its own
connection (the protocol is request-reply), and a get of a present key never waits.

Example::

    >>> master = TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=5)
    >>> worker = TCPStore("127.0.0.1", master.port, world_size=2, timeout=5)
    >>> worker.set("addr/1", "10.0.0.2:4000"); master.get("addr/1")
    b'10.0.0.2:4000'
    >>> master.add("count", 2), worker.add("count", 1)
    (2, 3)
    >>> worker.close(); master.close()
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import operator
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

from neural_arch.distributed import auth as handshake
from neural_arch.distributed.errors import (
    AuthenticationError,
    DistributedError,
    HandshakeError,
    PeerFailureError,
    RendezvousError,
    StoreTimeoutError,
)
from neural_arch.distributed.rendezvous.base import (
    BytesLike,
    Store,
    _amount,
    _b,
    _key,
    _keys,
    _pairs,
    _seconds,
    _to_int,
)

__all__ = ["TCPStore"]

log = logging.getLogger("neural_arch.distributed.rendezvous.store")  # one logger for the store layer

# -- wire protocol ------------------------------------------------------------------------------
# on accept:   the handshake of distributed.auth, purpose b"store"
# request:     u8 op | u32 nargs | nargs * (u32 len | bytes)
# response:    u8 status | u32 nargs | nargs * (u32 len | bytes)
_PURPOSE = b"store"
_HDR = struct.Struct("!BI")
_LEN = struct.Struct("!I")
_U64 = struct.Struct("!Q")
MAX_ARGS = 1 << 16           # wait()/check() on many keys, never more
MAX_FRAME = 256 << 20        # one request's payload, all arguments together
HANDSHAKE_TIMEOUT = 5.0      # a connection that does not finish the handshake in time is dropped
MAX_CONNECTIONS = 4096       # clients at once (each holds a thread); more are refused
MAX_WAITERS = MAX_CONNECTIONS  # one blocking get/wait per connection (request-reply), never a global pool
MAX_PENDING = 256            # connections still in the handshake (unauthenticated) at once
MEMORY_BUDGET = 1 << 30      # bytes of request frames all connections may buffer at once...
_FREE = 64 << 10             # ...beyond the first 64 KiB of each frame (rendezvous traffic never waits on it)
_PIECE = 1 << 20             # a frame's bytes are read (and buffered) this much at a time

OP_SET, OP_GET, OP_ADD, OP_CAS, OP_WAIT, OP_CHECK, OP_DELETE, OP_NUMKEYS = range(1, 9)
OP_APPEND, OP_MULTI_GET, OP_MULTI_SET = range(9, 12)
ST_OK, ST_TIMEOUT, ST_ERROR, ST_CLOSED = 0, 1, 2, 3
_WORKERS_KEY = "\x00workers"  # internal: counts connected clients (wait_for_workers)


class _Budget:
    """Bytes of request frames buffered by every connection together: a client announcing huge
    frames gets its connection closed, never the store's memory."""

    def __init__(self, limit: int):
        self.limit, self.used, self.lock = limit, 0, threading.Lock()

    def take(self, n: int) -> None:
        with self.lock:
            if self.used + n > self.limit:
                raise ValueError(f"the store already buffers {self.used} bytes of requests (budget "
                                 f"{self.limit}); a request of more cannot be read now")
            self.used += n

    def give(self, n: int) -> None:
        with self.lock:
            self.used -= n


def _recv_exact(sock: socket.socket, n: int, charge=None) -> bytes:
    """``n`` bytes, buffered in pieces as they arrive (never ``n`` announced bytes up front);
    ``charge(k)`` is called before each piece of up to ``k`` bytes is read (it may refuse), and
    ``charge(-unused)`` after it, for the part of ``k`` that did not arrive."""
    buf = bytearray()
    while len(buf) < n:
        k = min(_PIECE, n - len(buf))
        if charge is not None:
            charge(k)
        chunk = sock.recv(k)
        if charge is not None and len(chunk) < k:
            charge(len(chunk) - k)
        if not chunk:
            raise ConnectionError("connection closed by the other side")
        buf += chunk
    return bytes(buf)


def _write_frame(sock: socket.socket, code: int, args: Sequence[bytes]) -> None:
    parts = [_HDR.pack(code, len(args))]
    for a in args:
        parts.append(_LEN.pack(len(a)))
        parts.append(a)
    sock.sendall(b"".join(parts))


def _read_frame(sock: socket.socket, budget: _Budget | None = None,
                held: list | None = None) -> tuple[int, list[bytes]]:
    """Read one frame; ``ValueError`` on a malformed or oversized one (the caller drops the peer).
    The server passes its ``budget`` (charged beyond the frame's first ``_FREE`` bytes) and a list
    ``held`` of what it took (to give back once the request is answered)."""
    code, nargs = _HDR.unpack(_recv_exact(sock, _HDR.size))
    if nargs > MAX_ARGS:
        raise ValueError(f"frame announces {nargs} arguments (max {MAX_ARGS})")
    buffered = 0

    def charge(k: int) -> None:   # k < 0: a refund
        nonlocal buffered
        over = max(0, buffered + k - _FREE) - max(0, buffered - _FREE)
        if over > 0 and budget is not None:
            budget.take(over)
        elif over < 0 and budget is not None:
            budget.give(-over)
        buffered += k
        if over and held is not None:
            held.append(over)

    args, total = [], 0
    for _ in range(nargs):
        (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
        total += n
        if total > MAX_FRAME:
            raise ValueError(f"frame payload exceeds {MAX_FRAME} bytes")
        args.append(_recv_exact(sock, n, charge))
    return code, args


class _State:
    """The master's dictionary and the logic of every operation (shared by socket and local clients)."""

    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.closed = False

    def _wait_for(self, keys: list[str], timeout: float) -> list[str]:
        """Wait until every key exists; return the missing ones (empty on success)."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                missing = [k for k in keys if k not in self.data]
                left = end - time.monotonic()
                if not missing or left <= 0 or self.closed:
                    return missing
                self.cond.wait(min(left, 1.0))

    def handle(self, op: int, args: list[bytes]) -> tuple[int, list[bytes]]:
        if op == OP_SET:
            key, value = args[0].decode(), args[1]
            with self.cond:
                self.data[key] = value
                self.cond.notify_all()
            return ST_OK, []
        if op == OP_APPEND:
            key, value = args[0].decode(), args[1]
            with self.cond:
                self.data[key] = self.data.get(key, b"") + value
                self.cond.notify_all()
            return ST_OK, []
        if op == OP_MULTI_SET:
            if len(args) % 2:
                raise ValueError("multi_set needs one value per key")
            with self.cond:
                for i in range(0, len(args), 2):
                    self.data[args[i].decode()] = args[i + 1]
                self.cond.notify_all()
            return ST_OK, []
        if op in (OP_GET, OP_WAIT, OP_MULTI_GET):
            keys = [a.decode() for a in args[:-1]]
            (timeout_ms,) = _U64.unpack(args[-1])
            # No global count of waiters: a blocking request holds only its own connection's thread
            # (one request at a time per connection), so one client's many waits cannot make another
            # client's get fail -- least of all a get of a key that is already there.
            missing = self._wait_for(keys, timeout_ms / 1000.0)
            if missing and self.closed:
                return ST_CLOSED, []
            if missing:
                return ST_TIMEOUT, [k.encode() for k in missing]
            with self.cond:
                if op == OP_MULTI_GET:
                    return ST_OK, [self.data[k] for k in keys]
                return ST_OK, [self.data[keys[0]]] if op == OP_GET else []
        if op == OP_ADD:
            key = args[0].decode()
            amount = int(args[1].decode("ascii"))
            with self.cond:
                value = _to_int(self.data[key], key) + amount if key in self.data else amount
                self.data[key] = str(value).encode("ascii")
                self.cond.notify_all()
            return ST_OK, [self.data[key]]
        if op == OP_CAS:
            key, expected, desired = args[0].decode(), args[1], args[2]
            with self.cond:
                current = self.data.get(key)
                if (current is None and expected == b"") or current == expected:
                    self.data[key] = desired
                    self.cond.notify_all()
                    return ST_OK, [desired]
                return ST_OK, [expected if current is None else current]
        if op == OP_CHECK:
            with self.cond:
                return ST_OK, [b"\x01" if all(a.decode() in self.data for a in args) else b"\x00"]
        if op == OP_DELETE:
            with self.cond:
                found = self.data.pop(args[0].decode(), None) is not None
            return ST_OK, [b"\x01" if found else b"\x00"]
        if op == OP_NUMKEYS:
            with self.cond:
                n = sum(1 for k in self.data if not k.startswith("\x00"))
            return ST_OK, [str(n).encode()]
        raise ValueError(f"unknown store op {op}")


class _Server:
    """Threaded TCP server: one accept thread, one thread per connection (few clients, long-lived).

    ``key`` is the handshake key (None: open, on the caller's explicit opt-in); ``job_id`` scopes a
    per-user job secret (see :func:`_job_scoped`)."""

    def __init__(self, host: str, port: int, key: bytes | None, state: _State, job_id: str | None = None,
                 open_ok: bool = False):
        self.state, self.key, self.host = state, key, host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise DistributedError(
                f"the rendezvous store cannot listen on {host}:{port} ({exc}); pick a free MASTER_PORT "
                "or check that MASTER_ADDR is an address of this host (another process, maybe another "
                "user's, may hold that port)") from exc
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.secret: bytes | None = None
        if self.key is None and not open_ok:
            # every client is on this host: a per-job secret only this user can read
            try:
                self.secret = handshake.local_job_secret(self.port, create=True)
            except BaseException:
                self.sock.close()
                raise
            self.key = _job_scoped(self.secret, job_id)
        elif self.key is None:
            handshake.warn_open(f"the rendezvous store on {host}:{self.port}")
        # Descriptors are the scarce resource in a connection flood: stay well below the limit.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = soft if soft != resource.RLIM_INFINITY else 1 << 20
        self.max_pending = max(4, min(MAX_PENDING, soft // 4))
        self.max_conns = max(8, min(MAX_CONNECTIONS, soft * 3 // 4))
        self.pending = 0
        self.budget = _Budget(MEMORY_BUDGET)
        self.conns: set = set()
        self.lock = threading.Lock()
        self._last_warning = 0.0
        self.thread = threading.Thread(target=self._accept_loop, name="na-store-accept", daemon=True)
        self.thread.start()

    def _warn(self, msg: str, *args) -> None:
        """At most one warning a second: a flood must not flood the log too."""
        now = time.monotonic()
        if now - self._last_warning >= 1.0:
            self._last_warning = now
            log.warning(msg, *args)

    def _accept_loop(self) -> None:
        delay = 0.01
        while not self.state.closed:
            try:
                conn, addr = self.sock.accept()
            except OSError as exc:
                if self.state.closed:
                    return  # listening socket closed
                # EMFILE/ENFILE/ENOBUFS (a connection flood), ECONNABORTED...: wait, keep accepting --
                # returning here would lock every later rank out for good
                self._warn("store on %s:%d: accept failed (%s); retrying in %.2f s", self.host, self.port, exc, delay)
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
                continue
            delay = 0.01
            with self.lock:
                refuse = (f"{self.pending} connections are still in the handshake" if self.pending >= self.max_pending
                          else f"{len(self.conns)} clients already" if len(self.conns) >= self.max_conns else None)
                if refuse is None:
                    self.pending += 1
                    self.conns.add(conn)
            if refuse is not None:
                self._warn("store: refused a connection from %s: %s (a flood?)", addr, refuse)
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, addr), name="na-store-conn", daemon=True).start()
            except RuntimeError as exc:  # cannot start a thread: the same as EMFILE, shed this one
                with self.lock:
                    self.pending -= 1
                    self.conns.discard(conn)
                conn.close()
                self._warn("store: dropped a connection from %s: %s", addr, exc)

    def _serve(self, conn: socket.socket, addr) -> None:
        try:
            try:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                handshake.serve(conn, self.key, _PURPOSE, time.monotonic() + HANDSHAKE_TIMEOUT,
                                where=f"store {self.host}:{self.port} (client {addr})")
            except (HandshakeError, handshake.HandshakeRefused) as exc:
                log.warning("store: dropped a connection: %s", exc)
                return
            finally:
                with self.lock:
                    self.pending -= 1
            conn.settimeout(None)
            while not self.state.closed:
                held: list[int] = []
                try:
                    op, args = _read_frame(conn, self.budget, held)
                    try:
                        status, out = self.state.handle(op, args)
                    except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
                        status, out = ST_ERROR, [str(exc).encode()]
                finally:
                    self.budget.give(sum(held))
                _write_frame(conn, status, out)
        except (TimeoutError, ConnectionError, OSError, handshake.AuthenticationError):
            pass  # the client went away (normal at shutdown) or never authenticated
        except (ValueError, struct.error) as exc:
            log.warning("store: closed the connection from %s after a malformed or oversized frame: %s", addr, exc)
        finally:
            with self.lock:
                self.conns.discard(conn)
            conn.close()

    def close(self) -> None:
        with self.state.cond:
            self.state.closed = True
            self.state.cond.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self.secret is not None:
            handshake.forget_local_job_secret(self.port, self.secret)


class TCPStore(Store):
    """Client of (and, with ``is_master=True``, host of) a TCP key-value store.

    ``host``/``port``: where the master listens. The master binds **only** to ``host`` as given
    (``"0.0.0.0"`` to accept remote workers); ``port=0`` picks a free port, read it from ``.port``.
    ``timeout`` bounds connecting and every blocking ``get``/``wait``. ``wait_for_workers=True``
    makes the master's constructor wait until ``world_size - 1`` workers connected.

    Who may connect (module docstring): ``auth_token`` (the same on every rank, >= 128 bits); else,
    on a loopback ``host``, processes of this user on this host (``job_id``: a public job id that
    keeps two jobs of the same user apart); else nobody unless every rank passes
    ``allow_unauthenticated=True`` (then anyone who can reach the port: trusted networks only).

    Thread-safe: one request at a time per client object (a blocking ``get``/``wait`` holds the
    connection until it returns), so a thread that must not queue behind another's long ``wait``
    should open its own ``TCPStore`` client. Losing the master (rank 0 exited) raises
    ``PeerFailureError`` at once, never a hang.

    Example::

        store = TCPStore("127.0.0.1", 29500, world_size=4, is_master=(rank == 0), timeout=30)
        store.set(f"addr/{rank}", my_addr)
        peers = [store.get(f"addr/{r}") for r in range(4)]
    """

    def __init__(self, host: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: float | timedelta = 300.0, wait_for_workers: bool = False, *,
                 auth_token: BytesLike | None = None, job_id: str | None = None,
                 allow_unauthenticated: bool = False):
        # the first six in torch's order (a torch call passing wait_for_workers by position works);
        # the rest by keyword only
        host = str(host)
        if len(host) > 2 and host[0] == "[" and host[-1] == "]":
            host = host[1:-1]  # "[::1]", as in a URL: the address inside
        if isinstance(port, bool) or not 0 <= operator.index(port) < 65536:
            raise ValueError(f"TCPStore port {port!r} is not a TCP port (0..65535; 0 = any free port, on the "
                             "master only); check MASTER_PORT or init_method")
        if port == 0 and not is_master:
            raise ValueError("a TCPStore client needs the master's port, not 0 (port 0 lets the master pick a "
                             "free one: read it from master.port and give that to the other ranks)")
        self.host, self.world_size, self.is_master = host, world_size, is_master
        self.timeout = _seconds(timeout)
        token = None if auth_token is None or auth_token == "" else _b(auth_token)
        # checked (>= 128 bits) and stretched here, once: a weak token fails this constructor, with the fix
        self._key = handshake.job_key(token) if token is not None else None
        self._job_id = job_id or None
        self._open_ok = self._key is None and not _is_loopback(host)
        if self._open_ok and not allow_unauthenticated:
            raise AuthenticationError(
                f"the rendezvous store at {host}:{port} would run WITHOUT authentication: there is no "
                "NEURAL_ARCH_AUTH_TOKEN and the address is not on loopback, so the ranks cannot share the "
                "per-user secret of a one-host job (an srun/mpiexec job id is public: it does not count). "
                f"Fix: {handshake.FIX_LINE}; or, on a network you trust, set {handshake.OPEN_OPT_IN} on "
                "every rank")
        #: the key every connection of this job proves (the stretched token, or the per-user job
        #: secret, or None when the store runs open): the TCP mesh derives its own key from it
        self.job_secret: bytes | None = self._key
        self._lock = threading.Lock()  # one request at a time on the shared socket
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._state: _State | None = None
        if is_master:
            self._state = _State()
            self._server = _Server(host, port, self._key, self._state, self._job_id, self._open_ok)
            self.port = self._server.port
            self.job_secret = self._server.key
            if wait_for_workers and world_size and world_size > 1:
                self._wait_for_workers(world_size - 1)
        else:
            self.port = int(port)
            self._connect()
            self._request(OP_ADD, [_WORKERS_KEY.encode(), b"1"])

    def _wait_for_workers(self, expected: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            got = int(self._state.data.get(_WORKERS_KEY, b"0"))
            if got >= expected:
                return
            if time.monotonic() > deadline:
                self.close()
                raise RendezvousError(f"TCPStore master on {self.host}:{self.port}: only {got} of {expected} "
                                      f"workers connected within {self.timeout:.1f} s; check that every rank "
                                      "started and uses the same MASTER_ADDR/MASTER_PORT")
            time.sleep(0.01)

    # -- connection -----------------------------------------------------------------------------
    def _connect(self) -> None:
        where = f"the rendezvous store at {self.host}:{self.port} (connecting client)"
        # No token on loopback: the key is the per-user secret, read once the server asked for a key
        # (it writes the file before it answers anyone) -- and required: an open server is refused.
        key = self._key if self._key is not None or self._open_ok else self._local_key
        start = time.monotonic()
        deadline, delay, last = start + self.timeout, 0.01, None
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.1, deadline - time.monotonic()))
            except OSError as exc:  # not up yet: retry with backoff
                last = exc
                if time.monotonic() + delay > deadline:
                    raise RendezvousError(
                        f"could not reach the rendezvous store at {self.host}:{self.port} within "
                        f"{self.timeout:.1f} s ({last}); check that rank 0 started and that MASTER_ADDR/"
                        "MASTER_PORT are the same on every rank") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # a handshake gets HANDSHAKE_TIMEOUT, retries end at our deadline (if later)
                until = min(max(deadline, start + HANDSHAKE_TIMEOUT), time.monotonic() + HANDSHAKE_TIMEOUT)
                self.job_secret = handshake.greet(sock, key, _PURPOSE, until, where=where,
                                                  require_key=not self._open_ok)
                sock.settimeout(None)
            except (handshake.NotAnEndpointError, handshake.AuthenticationError):
                sock.close()
                raise
            except HandshakeError as exc:
                # closed or stalled before the handshake ended: a busy server sheds connections in a
                # flood (or is shutting down); retry until our deadline like a server not up yet
                sock.close()
                if time.monotonic() + delay > deadline:
                    raise
                last = exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            return

    def _local_key(self) -> bytes:
        """The per-user job secret of this port (scoped by ``job_id``), or a sentence saying why not."""
        secret = handshake.local_job_secret(self.port)
        if secret is None:
            raise AuthenticationError(
                f"the rendezvous store at {self.host}:{self.port} requires the job key: this rank has no "
                f"NEURAL_ARCH_AUTH_TOKEN and cannot read the per-user job secret "
                f"{os.path.join(handshake.secret_dir(), f'store-{self.port}.key')} (ranks without a token "
                "must run as the same user on the same host as rank 0, with the same XDG_RUNTIME_DIR; if "
                f"rank 0 has a token, give every rank the same one). {handshake.FIX_LINE}")
        return _job_scoped(secret, self._job_id)

    def _request(self, op: int, args: list[bytes], wait_s: float = 0.0) -> tuple[int, list[bytes]]:
        if self._state is not None:  # the master talks to its own dictionary directly
            if self._state.closed:
                raise DistributedError("this TCPStore was closed")
            status, out = self._state.handle(op, args)
        else:
            with self._lock:
                if self._sock is None:
                    raise DistributedError("this TCPStore was closed")
                # the server answers blocking ops itself at their deadline; the margin covers the network
                self._sock.settimeout(wait_s + max(self.timeout, 5.0))
                try:
                    _write_frame(self._sock, op, args)
                    status, out = _read_frame(self._sock)
                except (OSError, ValueError, struct.error) as exc:
                    self._sock.close()
                    self._sock = None
                    raise PeerFailureError(
                        f"lost the rendezvous store at {self.host}:{self.port} ({exc}); rank 0 (which hosts "
                        "it) probably exited or crashed -- look at its log first") from exc
        if status == ST_ERROR:
            raise ValueError(out[0].decode(errors="replace") if out else "store error")
        if status == ST_CLOSED:
            raise PeerFailureError(f"the rendezvous store at {self.host}:{self.port} shut down while this rank "
                                   "waited on it: rank 0 (which hosts it) exited -- look at its log first")
        return status, out

    # -- the interface --------------------------------------------------------------------------
    def set(self, key: str, value: BytesLike) -> None:
        self._request(OP_SET, [_key(key).encode(), _b(value)])

    def get(self, key: str) -> bytes:
        key = _key(key)
        status, out = self._request(OP_GET, [key.encode(), _U64.pack(int(self.timeout * 1000))], self.timeout)
        if status == ST_TIMEOUT:
            raise StoreTimeoutError(f"store key {key!r} did not appear within {self.timeout:.1f} s; "
                                    "the rank that should set it did not start, crashed, or is stuck")
        return out[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._request(OP_ADD, [_key(key).encode(), str(_amount(amount)).encode()])[1][0])

    def compare_set(self, key: str, expected: BytesLike, desired: BytesLike) -> bytes:
        return self._request(OP_CAS, [_key(key).encode(), _b(expected), _b(desired)])[1][0]

    def append(self, key: str, value: BytesLike) -> None:
        self._request(OP_APPEND, [_key(key).encode(), _b(value)])

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        keys = _keys(keys)
        if not keys:
            return []
        t = self.timeout
        status, out = self._request(OP_MULTI_GET, [k.encode() for k in keys] + [_U64.pack(int(t * 1000))], t)
        if status == ST_TIMEOUT:
            missing = [m.decode() for m in out]
            raise StoreTimeoutError(f"store keys {missing} did not appear within {t:.1f} s; "
                                    "the rank that should set them did not start, crashed, or is stuck")
        return list(out)

    def multi_set(self, keys: Sequence[str], values: Sequence[BytesLike]) -> None:
        keys, values = _pairs(keys, values)
        self._request(OP_MULTI_SET, [part for k, v in zip(keys, values) for part in (k.encode(), v)])

    def wait(self, keys: str | Sequence[str], timeout: float | timedelta | None = None) -> None:
        keys = _keys(keys)
        t = self.timeout if timeout is None else _seconds(timeout)
        status, out = self._request(OP_WAIT, [k.encode() for k in keys] + [_U64.pack(int(t * 1000))], t)
        if status == ST_TIMEOUT:
            missing = [m.decode() for m in out]
            raise StoreTimeoutError(f"store keys {missing} did not appear within {t:.1f} s")

    def check(self, keys: str | Sequence[str]) -> bool:
        return self._request(OP_CHECK, [k.encode() for k in _keys(keys)])[1][0] == b"\x01"

    def delete_key(self, key: str) -> bool:
        return self._request(OP_DELETE, [_key(key).encode()])[1][0] == b"\x01"

    def num_keys(self) -> int:
        return int(self._request(OP_NUMKEYS, [])[1][0])

    def close(self) -> None:
        """Disconnect; the master also stops its server (workers then see a lost-store error)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        if self._server is not None:
            self._server.close()
            self._server = None

    def __repr__(self) -> str:
        return f"TCPStore({self.host}:{self.port}, master={self.is_master})"


def _job_scoped(secret: bytes, job_id: str | None) -> bytes:
    """The store key of a per-user secret: the secret itself, or (in an srun/mpiexec job) an HMAC of
    the job id under it, so that a rank of another job of this user on the same port is refused.
    The job id is public: it separates jobs, the secret authenticates."""
    if not job_id:
        return secret
    return hmac.new(secret, b"neural_arch-job|" + job_id.encode(), hashlib.sha256).digest()


def _is_loopback(host: str) -> bool:
    try:
        return host in ("localhost", "::1") or socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False
