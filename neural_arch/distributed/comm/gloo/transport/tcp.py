"""TCP links for the transport: a full mesh of authenticated, non-blocking sockets.

Setup (inside :func:`~neural_arch.distributed.comm.gloo.transport.engine.connect_transport`): every
rank listens on its bind address (port chosen by the kernel) and publishes ``host:port`` in the
store; a rank *connects* to its lower-ranked TCP peers and *accepts* the higher ones. Each
connection starts with the shared authenticated handshake (:mod:`neural_arch.distributed.auth`,
purpose ``b"tcp"``, identity = the connecting rank): the key is the mesh key that
:func:`~neural_arch.distributed.comm.gloo.transport.engine.connect_transport` derives from the job
key (token or per-user job secret) **and** random nonces every rank published at this rendezvous, so
only processes that took part in it can join. Handshakes run concurrently, each with a
``HANDSHAKE_TIMEOUT`` deadline: idle connections cannot hold the rendezvous up. A connection that
fails is logged and dropped; the mesh keeps waiting for the real peers until the rendezvous
deadline, then names the ranks that never connected.

Where a rank listens: ``NEURAL_ARCH_BIND_ADDR`` if set -- an address, a host name, or a network
interface's name (``eth0``, ``ib0``, ``lo``: its IPv4 address, so one setting fits every node of a
cluster); else the local address that routes to ``MASTER_ADDR`` (so multi-host jobs use the interface
the store is reached on); else 127.0.0.1.

Data path: ``sendmsg([header, payload])`` (one syscall, no copy of the payload) and ``recv_into``
straight into the destination; ``TCP_NODELAY`` so small messages are not held back.

Example::

    links = connect_tcp_links(store, rank, peers=[0, 2], deadline=time.monotonic() + 30, auth_token=None)
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time

from neural_arch import config
from neural_arch.distributed import auth as handshake
from neural_arch.distributed.comm.gloo.transport.framing import Link, PeerGone
from neural_arch.distributed.errors import DistributedError, RendezvousError

__all__ = ["TcpLink", "bind_address", "connect_tcp_links", "resolve_bind_address"]

log = logging.getLogger("neural_arch.distributed.transport")

_PURPOSE = b"tcp"
HANDSHAKE_TIMEOUT = 5.0       # per connection: a peer that does not finish in time is dropped
_MAX_PENDING = 256            # handshakes in progress at once (each on its own thread)
BIND_ENV = "NEURAL_ARCH_BIND_ADDR"
_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class TcpLink(Link):
    """One peer over one TCP socket (both directions).

    Example::

        links = connect_tcp_links(store, rank, peers=[0, 2], deadline=time.monotonic() + 30)
        links[2].kind, links[2].poll_fd()        # "tcp", the socket's fd
    """

    kind = "tcp"

    def __init__(self, peer: int, sock: socket.socket):
        super().__init__(peer)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a peer *host* that vanishes sends no RST: keepalive notices it in ~30 s, not at the timeout
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()

    def write_some(self, views) -> int:
        try:
            return self.sock.sendmsg(views, (), _FLAGS)
        except (BlockingIOError, InterruptedError):
            return 0
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            raise PeerGone(f"connection lost while sending ({exc.strerror or exc})") from None

    def read_some(self, view: memoryview) -> int:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return 0
        except (ConnectionResetError, TimeoutError) as exc:  # TimeoutError: keepalive gave up
            raise PeerGone(f"connection lost ({exc.strerror or exc})") from None
        if n == 0:
            raise PeerGone("the peer closed the connection")
        return n

    def poll_fd(self) -> int | None:
        return self.fd

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)  # FIN after the data already queued: nothing sent is lost
        except OSError:
            pass
        self.sock.close()


def _interfaces() -> dict[str, list[str]]:
    """This host's network interfaces and their IPv4 addresses (psutil; empty without it)."""
    try:
        import psutil
    except ImportError:
        return {}
    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def resolve_bind_address(value: str, interfaces: dict[str, list[str]] | None = None) -> str:
    """The address to listen on for a ``NEURAL_ARCH_BIND_ADDR`` value: an interface's name gives its
    (first) IPv4 address; an address or a host name that resolves is kept as it is. Anything else is a
    ``ValueError`` that lists this host's interfaces.

    Example::

        >>> resolve_bind_address("eth0", {"lo": ["127.0.0.1"], "eth0": ["10.0.0.5"]})
        '10.0.0.5'
        >>> resolve_bind_address("10.0.0.7", {"lo": ["127.0.0.1"]})
        '10.0.0.7'
    """
    value = value.strip()
    interfaces = _interfaces() if interfaces is None else interfaces
    if value in interfaces:
        if not interfaces[value]:
            raise ValueError(f"{BIND_ENV}={value!r}: the interface has no IPv4 address; give an address, or one "
                             f"of {_describe(interfaces)}")
        return interfaces[value][0]
    try:
        ipaddress.ip_address(value.split("%")[0])
        return value
    except ValueError:
        pass
    try:
        socket.getaddrinfo(value, None)
        return value            # a host name (resolved again by bind)
    except OSError:
        raise ValueError(f"{BIND_ENV}={value!r} is neither a network interface of this host, an address, nor a "
                         f"host name that resolves; interfaces: {_describe(interfaces)}") from None


def _describe(interfaces: dict[str, list[str]]) -> str:
    return ", ".join(f"{name} ({', '.join(addrs) or 'no IPv4'})" for name, addrs in sorted(interfaces.items())) \
        or "none found (psutil missing?)"


def bind_address() -> str:
    """The address this rank listens on (see the module docstring).

    Example::

        # NEURAL_ARCH_BIND_ADDR=10.0.0.5 python train.py   -> listen on that address
        # NEURAL_ARCH_BIND_ADDR=eth0 python train.py       -> on eth0's IPv4 address, whatever the node
        listener.bind((bind_address(), 0))
    """
    env = (config.get(BIND_ENV) or "").strip()
    if env:
        return resolve_bind_address(env)
    master = os.environ.get("MASTER_ADDR", "").strip()
    if not master:
        return "127.0.0.1"
    try:
        ip = socket.gethostbyname(master)
        if ipaddress.ip_address(ip).is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect((ip, 9))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _token(auth_token) -> bytes | None:
    if auth_token is None or auth_token == "" or auth_token == b"":
        return None
    return auth_token.encode() if isinstance(auth_token, str) else bytes(auth_token)


class _Acceptor(threading.Thread):
    """Accepts the higher-ranked peers until all arrived or the deadline passed.

    Each connection's handshake runs on its own short-lived thread with a short deadline, so idle or
    slow connections (a port scanner, an attacker) cannot hold the rendezvous up: the real peers'
    handshakes proceed beside them. The first authenticated connection per expected rank wins."""

    def __init__(self, listener: socket.socket, expected: list[int], token: bytes | None, deadline: float,
                 rank: int, where: str):
        super().__init__(name="na-tcp-accept", daemon=True)
        self.listener, self.expected, self.token, self.deadline = listener, set(expected), token, deadline
        self.rank, self.where = rank, where
        self.socks: dict[int, socket.socket] = {}
        self.error: BaseException | None = None
        #: set once every expected peer is connected (by the handshake that completes the set, so the
        #: constructor need not wait for the accept loop's next timeout), or when the acceptor gives up
        self.settled = threading.Event()
        self._lock = threading.Lock()
        self._pending = 0

    def run(self) -> None:
        try:
            while True:
                with self._lock:
                    if set(self.socks) == self.expected:
                        return
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return
                self.listener.settimeout(min(left, 0.2))
                try:
                    conn, addr = self.listener.accept()
                except TimeoutError:
                    continue
                with self._lock:
                    if self._pending >= _MAX_PENDING:
                        log.warning("transport: rank %d dropped a connection from %s: %d handshakes already "
                                    "in progress", self.rank, addr, _MAX_PENDING)
                        conn.close()
                        continue
                    self._pending += 1
                threading.Thread(target=self._handshake, args=(conn, addr), name="na-tcp-handshake",
                                 daemon=True).start()
        except BaseException as exc:  # noqa: BLE001 - reported by the constructor thread
            self.error = exc
        finally:
            self.settled.set()

    def stop(self) -> None:
        """End the accept loop now: wake a blocked ``accept`` (``shutdown`` does on Linux; elsewhere the
        loop's short timeout ends it) and wait for the thread, so the listener is closed only once no
        thread can be inside a call on its descriptor."""
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.join(1.0)

    def _accept_peer(self, peer: int, extra: bytes) -> str | None:
        with self._lock:
            if peer not in self.expected:
                return f"rank {peer} is not one of the ranks rank {self.rank} accepts ({sorted(self.expected)})"
            if peer in self.socks:
                return f"rank {peer} is already connected"
        return None

    def _handshake(self, conn: socket.socket, addr) -> None:
        keep = False
        try:
            deadline = min(self.deadline, time.monotonic() + HANDSHAKE_TIMEOUT)
            peer, _ = handshake.serve(conn, self.token, _PURPOSE, deadline,
                                      where=f"{self.where} (connection from {addr})", accept=self._accept_peer)
            conn.settimeout(None)
            with self._lock:
                if peer in self.expected and peer not in self.socks:
                    self.socks[peer] = conn
                    keep = True
                    if set(self.socks) == self.expected:
                        self.settled.set()
        except (OSError, DistributedError) as exc:
            log.warning("transport: rank %d rejected a connection from %s: %s", self.rank, addr, exc)
        finally:
            with self._lock:
                self._pending -= 1
            if not keep:
                conn.close()


def _connect(addr: str, rank: int, peer: int, token: bytes | None, deadline: float) -> socket.socket:
    host, port = addr.rsplit(":", 1)
    delay = 0.01
    while True:
        try:
            sock = socket.create_connection((host, int(port)), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as exc:
            if time.monotonic() + delay >= deadline:
                raise RendezvousError(f"rank {rank} could not connect to rank {peer} at {addr} ({exc}); check "
                                      f"firewalls and {BIND_ENV} on rank {peer}") from exc
            time.sleep(delay)
            delay = min(2 * delay, 0.5)
    try:
        where = f"rank {peer}'s TCP endpoint {addr} (rank {rank} connecting, transport rendezvous)"
        handshake.greet(sock, token, _PURPOSE, min(deadline, time.monotonic() + HANDSHAKE_TIMEOUT),
                        where=where, identity=rank, require_key=False)
        sock.settimeout(None)
        return sock
    except BaseException:
        sock.close()
        raise


def connect_tcp_links(store, rank: int, peers: list[int], deadline: float, auth_token=None) -> dict[int, TcpLink]:
    """Build TCP links to ``peers`` (world ranks). Called by every rank with symmetric peer sets.

    Example::

        # rank 1 of 3: a link to each other rank; auth_token is the mesh key (None: open, opt-in only)
        links = connect_tcp_links(store, 1, peers=[0, 2], deadline=time.monotonic() + 30, auth_token=key)
    """
    token = _token(auth_token)
    addr = bind_address()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((addr, 0))
    except OSError as exc:
        listener.close()
        raise RendezvousError(f"rank {rank} cannot listen on {addr} ({exc}); set {BIND_ENV} to an address of "
                              "this host") from exc
    listener.listen(max(16, len(peers)))
    public = addr if addr not in ("0.0.0.0", "::") else socket.gethostbyname(socket.gethostname())
    store.set(f"transport/tcp/{rank}", f"{public}:{listener.getsockname()[1]}")
    acceptor = _Acceptor(listener, [p for p in peers if p > rank], token, deadline, rank,
                         f"rank {rank}'s TCP endpoint {public}:{listener.getsockname()[1]}")
    acceptor.start()
    socks: dict[int, socket.socket] = {}
    try:
        for peer in sorted(p for p in peers if p < rank):
            key = f"transport/tcp/{peer}"
            from neural_arch.distributed.errors import StoreTimeoutError

            try:
                store.wait([key], timeout=max(0.0, deadline - time.monotonic()))
            except StoreTimeoutError:
                raise RendezvousError(f"rank {peer} never published its TCP address (rank {rank} waited); "
                                      "check that it started") from None
            socks[peer] = _connect(store.get(key).decode(), rank, peer, token, deadline)
        acceptor.settled.wait(max(0.0, deadline - time.monotonic()) + 1.0)
        if acceptor.error is not None:
            raise acceptor.error
        with acceptor._lock:
            missing = sorted({p for p in peers if p > rank} - set(acceptor.socks))
        if missing:
            raise RendezvousError(f"ranks {missing} never connected to rank {rank} over TCP before the rendezvous "
                                  f"deadline; check that they started and can reach {public}")
        socks.update(acceptor.socks)
    except BaseException:
        for s in list(socks.values()) + list(acceptor.socks.values()):
            s.close()
        raise
    finally:
        acceptor.stop()
        listener.close()
    return {peer: TcpLink(peer, s) for peer, s in socks.items()}
