"""The one authenticated handshake of neural_arch: the store, the TCP mesh and the node agent use it.

A mutual HMAC-SHA256 challenge-response, as ``multiprocessing.connection`` does it (the key never
crosses the wire; ``hmac.compare_digest`` compares)::

    server -> client   MAGIC(8) | mode u8 | server nonce(32)
    client -> server   client nonce(32) | identity u32 | extra length u16 | extra | MAC_c(32)
    server -> client   status u8 | MAC_s(32) | reason length u16 | reason

    MAC_c = HMAC(key, purpose | "c" | server nonce | client nonce | identity | extra)
    MAC_s = HMAC(key, purpose | "s" | server nonce | client nonce | identity | status)

``purpose`` (``b"store"``, ``b"tcp"``, ``b"agent"``) is bound into every MAC, so an answer for one
service cannot be replayed to another; both nonces make every answer single-use. ``mode`` 0 means
*open* (no key: the MACs are all zero and nothing is proven). A client that has a key, or was told
to require one (``require_key``), refuses an open server: an impostor holding the port cannot make a
rank join it by simply not asking for a key.

Nothing an unauthenticated peer sees depends on the key alone: the hello carries no key id (it used
to carry ``sha256(key)[:8]``, which let one connection test token guesses offline), and a refused
client gets an all-zero ``MAC_s``. A peer that *does* get a MAC (an impostor server answered by a
real client) can still test guesses offline, so text tokens must carry at least 128 bits
(:func:`job_key` refuses weaker ones, saying how to make one) and are stretched with PBKDF2 (50 000
rounds of HMAC-SHA256, once per process per token). Binary keys -- the per-user job secret
(:func:`local_job_secret`) and the mesh keys derived from the rendezvous -- are 32 random or hashed
bytes and are used as they are.

The handshake authenticates the *start* of a connection only: the frames after it carry no MAC and
are not encrypted, so an on-path attacker between hosts can read them and, by relaying a real
handshake, inject frames (docs/security.md, "On-path attackers").

Every read and write has a deadline: a peer that stalls gets
:class:`~neural_arch.distributed.errors.HandshakeError` naming
``where`` (host:port and role) and the phase, never a bare ``TimeoutError``. Sizes are bounded
(``extra`` <= 64 KiB).

Example::

    # server thread                                   # client
    ident, extra = serve(conn, key, b"tcp", deadline)  greet(sock, key, b"tcp", deadline, identity=3)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import logging
import math
import os
import socket
import stat
import string
import struct
import time
from collections.abc import Callable

from neural_arch.distributed.errors import AuthenticationError, HandshakeError

__all__ = ["MAGIC", "MIN_TOKEN_BITS", "HandshakeRefused", "NotAnEndpointError", "WeakTokenError", "greet", "job_key",
           "local_job_secret", "secret_dir", "serve", "token_bits", "warn_open"]

log = logging.getLogger("neural_arch.distributed.handshake")

MAGIC = b"NAHS0002"          # 0002: no key id in the hello (0001 peers are told "not a neural_arch endpoint")
NO_IDENTITY = 0xFFFFFFFF
_NONCE = 32
_MAC = 32
_HELLO = struct.Struct("!8sB32s")
_CLIENT = struct.Struct("!32sIH")
_SERVER = struct.Struct("!B32sH")
_MAX_EXTRA = 1 << 16
MIN_TOKEN_BITS = 128
_KDF_SALT = b"neural_arch/handshake/v2"   # fixed: every rank must derive the same key from the same token
_KDF_ROUNDS = 50_000                      # once per process and token: cheap for a rank, dear for a guesser
_B64 = frozenset(string.ascii_letters + string.digits + "+/-_=")
OPEN_OPT_IN = "NEURAL_ARCH_ALLOW_UNAUTHENTICATED=1"
FIX_LINE = ("export NEURAL_ARCH_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))') "
            "with the same value on every rank/node")
_WARNED: set = set()


class HandshakeRefused(AuthenticationError):
    """The other side answered the handshake and refused (the message says why and what to fix).

    Example::

        >>> from neural_arch.distributed.auth import HandshakeRefused
        >>> from neural_arch.distributed.errors import AuthenticationError
        >>> issubclass(HandshakeRefused, AuthenticationError)
        True
    """


class NotAnEndpointError(HandshakeError):
    """The other side does not speak this handshake (another service on the port, another version).

    Example::

        >>> from neural_arch.distributed.auth import NotAnEndpointError
        >>> from neural_arch.distributed.errors import HandshakeError
        >>> issubclass(NotAnEndpointError, HandshakeError)
        True
    """


class WeakTokenError(AuthenticationError, ValueError):
    """A job token too short to resist offline guessing (the message says how to make a good one).

    Example::

        >>> from neural_arch.distributed.auth import WeakTokenError, job_key
        >>> try:
        ...     job_key("secret")
        ... except WeakTokenError as err:
        ...     print(str(err)[:37])
        the job token (NEURAL_ARCH_AUTH_TOKEN
    """


# -- keys -----------------------------------------------------------------------------------------------
def token_bits(token: bytes | str) -> float:
    """A generous estimate of a token's strength: its length times the bits per character of the
    smallest alphabet it fits (digits 3.3, hex 4, base64 6, printable text 6.6, binary 8).

    >>> token_bits("123456"), token_bits("0123456789abcdef" * 2), token_bits(bytes(range(200, 232)))
    (19.931568569324174, 128.0, 256.0)
    """
    raw = token.encode() if isinstance(token, str) else bytes(token)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return 8.0 * len(raw)
    if not text.isprintable():
        return 8.0 * len(raw)
    for alphabet, bits in ((string.digits, math.log2(10)), (string.hexdigits, 4.0), (_B64, 6.0)):
        if all(c in alphabet for c in text):
            return len(text) * bits
    return len(text) * math.log2(95)


def _is_text(raw: bytes) -> bool:
    try:
        return raw.decode("ascii").isprintable()
    except UnicodeDecodeError:
        return False


@functools.lru_cache(maxsize=64)
def _key_of(raw: bytes) -> bytes:
    if token_bits(raw) < MIN_TOKEN_BITS:
        what = f"{len(raw)} characters" if _is_text(raw) else f"{len(raw)} bytes"
        raise WeakTokenError(
            f"the job token (NEURAL_ARCH_AUTH_TOKEN) is too weak: {what}, about {token_bits(raw):.0f} bits, and a "
            f"token needs at least {MIN_TOKEN_BITS} (anyone who watches one handshake can test guesses offline); "
            f"make one with: {FIX_LINE}")
    if not _is_text(raw):
        return raw      # random or hashed bytes: already full strength
    return hashlib.pbkdf2_hmac("sha256", raw, _KDF_SALT, _KDF_ROUNDS)


def job_key(token: bytes | str) -> bytes:
    """The handshake key of ``token``: a text token (what people and launchers export) must carry at
    least 128 bits (:class:`WeakTokenError` otherwise, with the line that makes one) and is stretched
    with PBKDF2-HMAC-SHA256; binary keys of at least 16 bytes are used as they are. Cached: the
    stretch costs once per process and token.

    >>> len(job_key("0123456789abcdef" * 2)), job_key(bytes(range(200, 232))) == bytes(range(200, 232))
    (32, True)
    >>> job_key("123456")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    WeakTokenError: the job token (NEURAL_ARCH_AUTH_TOKEN) is too weak: ...
    """
    return _key_of(token.encode() if isinstance(token, str) else bytes(token))


def _mac(key: bytes | None, *parts: bytes) -> bytes:
    if not key:
        return bytes(_MAC)
    return hmac.new(key, b"|".join(parts), hashlib.sha256).digest()


# -- the wire -------------------------------------------------------------------------------------------
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


def serve(sock: socket.socket, key: bytes | str | None, purpose: bytes, deadline: float, where: str = "handshake",
          accept: Callable[[int, bytes], str | None] | None = None) -> tuple[int, bytes]:
    """Server side. Returns ``(identity, extra)`` of an authenticated client, else raises
    (:class:`~neural_arch.distributed.errors.HandshakeError` for a stalled/broken peer,
    :class:`HandshakeRefused` for a wrong key or an identity ``accept`` refused --
    ``accept(identity, extra)`` returns None or the reason).
    ``key`` None serves *open* (callers allow that only on an explicit opt-in).

    Example (both ends in one process, over a socket pair)::

        >>> import os, socket, threading, time
        >>> server_end, client_end = socket.socketpair()
        >>> key, answers = os.urandom(32), []
        >>> server = threading.Thread(target=lambda: answers.append(
        ...     serve(server_end, key, b"tcp", time.monotonic() + 5)))
        >>> server.start()
        >>> greet(client_end, key, b"tcp", time.monotonic() + 5, identity=3) == key
        True
        >>> server.join(); answers
        [(3, b'')]
    """
    key = job_key(key) if key else None
    nonce = os.urandom(_NONCE)
    _send(sock, _HELLO.pack(MAGIC, 1 if key else 0, nonce), deadline, where, "hello")
    cnonce, ident, n_extra = _CLIENT.unpack(_recv(sock, _CLIENT.size, deadline, where, "client answer"))
    if n_extra > _MAX_EXTRA:
        raise HandshakeError(f"{where}: protocol error: {n_extra} bytes of handshake data (max {_MAX_EXTRA})")
    extra = _recv(sock, n_extra, deadline, where, "client answer") if n_extra else b""
    mac = _recv(sock, _MAC, deadline, where, "client answer")
    idb = struct.pack("!I", ident)
    reason = None
    if key and not hmac.compare_digest(mac, _mac(key, purpose, b"c", nonce, cnonce, idb, extra)):
        reason = ("wrong or missing job key: every rank must use the same NEURAL_ARCH_AUTH_TOKEN (or, without one, "
                  "run as the same user on the same host, in the same srun/mpiexec job)")
    elif accept is not None:
        reason = accept(ident, extra)
    status = b"\x00" if reason else b"\x01"
    # A refused client gets no MAC: a MAC over values it knows would let it test token guesses offline.
    mac_s = bytes(_MAC) if reason else _mac(key, purpose, b"s", nonce, cnonce, idb, status)
    text = (reason or "").encode()[:4000]
    _send(sock, _SERVER.pack(status[0], mac_s, len(text)) + text, deadline, where, "server answer")
    if reason:
        raise HandshakeRefused(f"{where}: refused a client claiming identity {ident}: {reason}")
    return ident, extra


def greet(sock: socket.socket, key: bytes | str | None | Callable[[], bytes | None], purpose: bytes,
          deadline: float, where: str = "handshake", identity: int = NO_IDENTITY, extra: bytes = b"",
          require_key: bool = False) -> bytes | None:
    """Client side: prove knowledge of the key, check that the server knows it too.

    ``key`` may be a function (called once the server asked for a key: it returns the key, or None
    when this process does not have it -- e.g. reading the per-user job secret). A client with a
    key, or with ``require_key=True``, refuses a server that runs open. Returns the handshake key
    used (:func:`job_key` of ``key``; None in open mode).

    Example (the server side is in :func:`serve`'s example)::

        sock = socket.create_connection((host, port))
        greet(sock, key, b"tcp", time.monotonic() + 30, where=f"{host}:{port}", identity=rank)
    """
    magic, mode, nonce = _HELLO.unpack(_recv(sock, _HELLO.size, deadline, where, "hello"))
    if magic != MAGIC:
        raise NotAnEndpointError(f"{where} is not a neural_arch endpoint of this version (another service on that "
                             "port, or ranks running different neural_arch versions?)")
    if not mode:
        if require_key or (key is not None and not callable(key)):
            raise AuthenticationError(
                f"{where} runs WITHOUT authentication, but this process requires an authenticated endpoint "
                "(it has a job key, or it is a rank of a job without NEURAL_ARCH_AUTH_TOKEN whose rank 0 must "
                "prove the per-user job secret): the process holding that port is not this job's rank 0 -- "
                "another user's process may have taken it. Check MASTER_ADDR/MASTER_PORT (pick a free port); "
                f"to run a multi-host job open on a trusted network, set {OPEN_OPT_IN} on every rank")
        key = None
    else:
        if callable(key):
            key = key()
        if not key:
            raise AuthenticationError(f"{where} requires the job key and this process does not have it; "
                                      f"{FIX_LINE}")
        key = job_key(key)
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
_FALLBACK_BASE = "/tmp"   # only when this user has no runtime directory


def secret_dir() -> str:
    """The one folder of this user's job secrets: ``$XDG_RUNTIME_DIR/neural_arch-<uid>`` when the
    runtime directory exists (else systemd's ``/run/user/<uid>`` when it is this user's), and only
    when neither exists ``/tmp/neural_arch-<uid>``. One folder, so that another user who pre-creates
    ``/tmp/neural_arch-<uid>`` cannot block users who have a runtime directory.

    >>> secret_dir().endswith(f"neural_arch-{os.getuid()}")
    True
    """
    uid = os.getuid()
    for base in (os.environ.get("XDG_RUNTIME_DIR"), f"/run/user/{uid}"):
        with contextlib.suppress(OSError):
            if base and stat.S_ISDIR(os.stat(base).st_mode) and os.stat(base).st_uid == uid:
                return os.path.join(base, f"neural_arch-{uid}")
    return os.path.join(_FALLBACK_BASE, f"neural_arch-{uid}")


def _checked_dir(path: str, create: bool) -> str | None:
    """``path`` if it is a private directory of this user (made when ``create``), None when it does
    not exist, else :class:`AuthenticationError` with a sentence (a folder someone else made first
    could hold a secret of *their* choosing)."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise AuthenticationError(f"cannot create the per-user job-secret folder {path} ({exc}); set "
                                      f"XDG_RUNTIME_DIR to a private folder of yours, or {FIX_LINE}") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a folder"
        raise AuthenticationError(
            f"{path} is not a private folder of this user ({kind}, owner uid {st.st_uid}, mode "
            f"{oct(st.st_mode & 0o7777)}): another user may have created it to block or hijack your jobs "
            f"without a token. Remove it (as its owner or root), set XDG_RUNTIME_DIR to a private folder "
            f"of yours, or {FIX_LINE}")
    return path


def _secret_path(port: int) -> str:
    return os.path.join(secret_dir(), f"store-{int(port)}.key")


def local_job_secret(port: int, create: bool = False) -> bytes | None:
    """The random secret of the store on ``port`` of this host, in a file only this user can read
    (:func:`secret_dir`, folder 0700, file 0600, created exclusively).

    ``create=True`` (the store's master) writes a fresh one; otherwise it is read: None when there
    is none (or it is not a private file of this user). Other users cannot read it: they cannot
    join the job's store or mesh. (Processes of the same user can: they could read our memory anyway.)

    Example::

        secret = local_job_secret(29500, create=True)     # the store's master
        secret == local_job_secret(29500)                  # True on a rank of the same user and host
    """
    folder = _checked_dir(secret_dir(), create)
    if create:
        secret = os.urandom(32)
        _forget_dead(folder)
        path = os.path.join(folder, f"store-{int(port)}.key")
        tmp = f"{path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret + f"|{os.getpid()}".encode())   # the pid: see _forget_dead
        os.replace(tmp, path)
        return secret
    if folder is None:
        return None
    try:
        fd = os.open(os.path.join(folder, f"store-{int(port)}.key"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        secret = f.read(32)
    return secret if len(secret) == 32 else None


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
    path = _secret_path(port)
    try:
        with open(path, "rb") as f:
            if f.read(32) == secret:
                os.unlink(path)
    except OSError:
        pass


def warn_open(where: str) -> None:
    """Say once, loudly, that ``where`` accepts unauthenticated peers (on the job's explicit opt-in).

    Example::

        if key is None:
            warn_open(f"the rendezvous store on {host}:{port}")
    """
    if where in _WARNED:
        return
    _WARNED.add(where)
    log.warning("neural_arch: %s runs WITHOUT authentication: any process that can reach it can join the "
                "job, read and inject data, and run code in every rank through the *_object collectives. "
                "Fix: %s", where, FIX_LINE)
