"""The one authenticated handshake of neural_arch: the store, the TCP mesh and the node agent use it.

A mutual HMAC-SHA256 challenge-response, as ``multiprocessing.connection`` does it (the key never
crosses the wire; ``hmac.compare_digest`` compares)::

    server -> client   MAGIC(8) | mode u8 | key id(8) | server nonce(32)
    client -> server   client nonce(32) | identity u32 | extra length u16 | extra | MAC_c(32)
    server -> client   status u8 | MAC_s(32) | reason length u16 | reason

    MAC_c = HMAC(key, purpose | "c" | server nonce | client nonce | identity | extra)
    MAC_s = HMAC(key, purpose | "s" | server nonce | client nonce | identity | status)

``purpose`` (``b"store"``, ``b"tcp"``, ``b"agent"``) is bound into every MAC, so an answer for one
service cannot be replayed to another; both nonces make every answer single-use. ``mode`` 0 means
*open* (no key could be established: the MACs are all zero and nothing is proven -- the caller warns
loudly, see :func:`warn_open`); ``key id`` (the first 8 bytes of SHA-256 of the key) lets a client
find the key among several (the per-user job secret, :func:`local_job_secret`) and say clearly
which one is missing. A server answers ``status`` 0 with a reason (wrong key, unexpected identity)
and closes.

Every read and write has a deadline: a peer that stalls gets :class:`HandshakeError` naming
``where`` (host:port and role) and the phase, never a bare ``TimeoutError``. Sizes are bounded
(``extra`` <= 64 KiB).

Example::

    # server thread                                   # client
    ident, extra = serve(conn, key, b"tcp", deadline)  greet(sock, key, b"tcp", deadline, identity=3)
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable

from neural_arch.distributed.errors import AuthenticationError, HandshakeError

__all__ = ["MAGIC", "HandshakeRefused", "greet", "key_id", "local_job_secret", "serve", "warn_open"]

log = logging.getLogger("neural_arch.distributed.handshake")

MAGIC = b"NAHS0001"
NO_IDENTITY = 0xFFFFFFFF
_NONCE = 32
_MAC = 32
_HELLO = struct.Struct("!8sB8s32s")
_CLIENT = struct.Struct("!32sIH")
_SERVER = struct.Struct("!B32sH")
_MAX_EXTRA = 1 << 16
FIX_LINE = ("export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))') "
            "with the same value on every rank/node")
_WARNED: set = set()


class HandshakeRefused(AuthenticationError):
    """The other side answered the handshake and refused (the message says why and what to fix)."""


def key_id(key: bytes | None) -> bytes:
    return hashlib.sha256(key).digest()[:8] if key else bytes(8)


def _mac(key: bytes | None, *parts: bytes) -> bytes:
    if not key:
        return bytes(_MAC)
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


def _recv(sock: socket.socket, n: int, deadline: float, where: str, phase: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeError(f"{where}: timed out during the handshake ({phase}); the other side stalled "
                                 "or is not a neural_arch endpoint")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            continue
        except OSError as exc:
            raise HandshakeError(f"{where}: connection lost during the handshake ({phase}): {exc}") from None
        if not chunk:
            raise HandshakeError(f"{where}: the other side closed the connection during the handshake ({phase})")
        buf += chunk
    return bytes(buf)


def _send(sock: socket.socket, data: bytes, deadline: float, where: str, phase: str) -> None:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        sock.sendall(data)
    except TimeoutError:
        raise HandshakeError(f"{where}: timed out during the handshake ({phase})") from None
    except OSError as exc:
        raise HandshakeError(f"{where}: connection lost during the handshake ({phase}): {exc}") from None


def serve(sock: socket.socket, key: bytes | None, purpose: bytes, deadline: float, where: str = "handshake",
          accept: Callable[[int, bytes], str | None] | None = None) -> tuple[int, bytes]:
    """Server side. Returns ``(identity, extra)`` of an authenticated client, else raises
    (:class:`HandshakeError` for a stalled/broken peer, :class:`HandshakeRefused` for a wrong key or
    an identity ``accept`` refused -- ``accept(identity, extra)`` returns None or the reason)."""
    nonce = os.urandom(_NONCE)
    _send(sock, _HELLO.pack(MAGIC, 1 if key else 0, key_id(key), nonce), deadline, where, "hello")
    cnonce, ident, n_extra = _CLIENT.unpack(_recv(sock, _CLIENT.size, deadline, where, "client answer"))
    if n_extra > _MAX_EXTRA:
        raise HandshakeError(f"{where}: protocol error: {n_extra} bytes of handshake data (max {_MAX_EXTRA})")
    extra = _recv(sock, n_extra, deadline, where, "client answer") if n_extra else b""
    mac = _recv(sock, _MAC, deadline, where, "client answer")
    idb = struct.pack("!I", ident)
    reason = None
    if key and not hmac.compare_digest(mac, _mac(key, purpose, b"c", nonce, cnonce, idb, extra)):
        reason = ("wrong or missing job key: every rank must use the same NEURAL_ARCH_AUTH_TOKEN (or, "
                  "without one, run as the same user on the same host)")
    elif accept is not None:
        reason = accept(ident, extra)
    status = b"\x00" if reason else b"\x01"
    text = (reason or "").encode()[:4000]
    _send(sock, _SERVER.pack(status[0], _mac(key, purpose, b"s", nonce, cnonce, idb, status), len(text)) + text,
          deadline, where, "server answer")
    if reason:
        raise HandshakeRefused(f"{where}: refused a client claiming identity {ident}: {reason}")
    return ident, extra


def greet(sock: socket.socket, key: bytes | None | Callable[[bytes], bytes | None], purpose: bytes,
          deadline: float, where: str = "handshake", identity: int = NO_IDENTITY, extra: bytes = b"",
          require_key: bool = False) -> bytes | None:
    """Client side: prove knowledge of the key, check that the server knows it too. ``key`` may be a
    function of the server's key id (returns the key, or None when this process does not have it).
    Returns the key used (None in open mode)."""
    magic, mode, kid, nonce = _HELLO.unpack(_recv(sock, _HELLO.size, deadline, where, "hello"))
    if magic != MAGIC:
        raise HandshakeError(f"{where} is not a neural_arch endpoint (another service on that port?)")
    if callable(key):
        key = key(kid) if mode else None
    if mode and not key:
        raise AuthenticationError(f"{where} requires the job key (id {kid.hex()}) and this process does not "
                                  f"have it; {FIX_LINE}")
    if not mode and (key or require_key):
        raise AuthenticationError(f"{where} runs without authentication but this rank has a job key: every "
                                  "rank must see the same NEURAL_ARCH_AUTH_TOKEN")
    if mode and key_id(key) != kid:
        raise AuthenticationError(f"{where} uses another job key (id {kid.hex()}, ours {key_id(key).hex()}); "
                                  "every rank must use the same NEURAL_ARCH_AUTH_TOKEN")
    cnonce = os.urandom(_NONCE)
    idb = struct.pack("!I", identity)
    _send(sock, _CLIENT.pack(cnonce, identity, len(extra)) + extra
          + _mac(key, purpose, b"c", nonce, cnonce, idb, extra), deadline, where, "client answer")
    status, mac, n = _SERVER.unpack(_recv(sock, _SERVER.size, deadline, where, "server answer"))
    text = _recv(sock, n, deadline, where, "server answer").decode("utf-8", "replace") if n else ""
    if status != 1:
        raise HandshakeRefused(f"{where} refused this connection: {text or 'no reason given'}")
    if key and not hmac.compare_digest(mac, _mac(key, purpose, b"s", nonce, cnonce, idb, b"\x01")):
        raise AuthenticationError(f"{where} could not prove that it knows the job key (an impostor on that "
                                  "port?); check MASTER_ADDR/MASTER_PORT")
    return key


# -- the per-user job secret (jobs started without a token, all ranks on one host) ----------------------
def _secret_dirs() -> list[str]:
    """Where job secrets live: ``$XDG_RUNTIME_DIR`` first, ``/tmp`` always (ranks started from shells
    with and without XDG_RUNTIME_DIR still find each other's secret)."""
    bases = [os.environ.get("XDG_RUNTIME_DIR") or "/tmp", "/tmp"]
    return list(dict.fromkeys(os.path.join(b, f"neural_arch-{os.getuid()}") for b in bases))


def _secret_dir(path: str | None = None) -> str:
    path = path or _secret_dirs()[0]
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    # someone else may have created it first (in /tmp): only a private directory of ours will do
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise AuthenticationError(f"{path} is not a private directory of this user (mode {oct(st.st_mode)}, "
                                  f"owner {st.st_uid}); remove it, or {FIX_LINE}")
    return path


def local_job_secret(port: int, create: bool = False, want_id: bytes | None = None) -> bytes | None:
    """The random secret of the store on ``port`` of this host, in a file only this user can read.

    ``create=True`` (the store's master) writes a fresh one; otherwise it is read, and returned only
    when its key id is ``want_id``. Other users cannot read it: they cannot join the job's store or
    mesh. (Processes of the same user can: they could read our memory anyway.)"""
    if create:
        secret = os.urandom(32)
        for folder in _secret_dirs():   # every place a client of this user may look
            folder = _secret_dir(folder)
            _forget_dead(folder)
            path = os.path.join(folder, f"store-{int(port)}.key")
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secret + f"|{os.getpid()}".encode())   # the pid: see _forget_dead
            os.replace(tmp, path)
        return secret
    for folder in _secret_dirs():
        try:
            with open(os.path.join(_secret_dir(folder), f"store-{int(port)}.key"), "rb") as f:
                secret = f.read(32)
        except OSError:
            continue
        if want_id is None or key_id(secret) == want_id:
            return secret
    return None


def _forget_dead(folder: str) -> None:
    """Remove the secrets of stores whose master process is gone (it exited without close())."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith("store-") and n.endswith(".key")]
    except OSError:
        return
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                pid = int(f.read(64)[33:] or b"0")
            if pid > 0 and pid != os.getpid():
                os.kill(pid, 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                os.unlink(path)
        except (OSError, ValueError):
            continue


def forget_local_job_secret(port: int, secret: bytes) -> None:
    """Remove the secret file of ``port`` if it is still ours (the master closes)."""
    for folder in _secret_dirs():
        path = os.path.join(folder, f"store-{int(port)}.key")
        try:
            with open(path, "rb") as f:
                if f.read(32) == secret:
                    os.unlink(path)
        except OSError:
            pass


def warn_open(where: str) -> None:
    """Say once, loudly, that ``where`` accepts unauthenticated peers, with the line that fixes it."""
    if where in _WARNED:
        return
    _WARNED.add(where)
    log.warning("neural_arch: %s runs WITHOUT authentication: no NEURAL_ARCH_AUTH_TOKEN and the ranks are not "
                "all on this host, so any process that can reach it can join the job and inject data. "
                "Fix: %s", where, FIX_LINE)
