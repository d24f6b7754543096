"""The HTTP endpoint on rank 0: standard library ``http.server`` (``ThreadingHTTPServer``).

==========================  =====================================================================
request                     answer
==========================  =====================================================================
``POST /generate``          JSON in (``protocol``); JSON out ``{"tokens": [...], "prompt_tokens": n,
                            "first_step": s, "last_step": s, "time_to_first_token_s": t,
                            "total_s": t}``, or with ``"stream": true`` **server-sent events**
                            (``text/event-stream``): ``data: {"token": id}`` per token, then
                            ``data: {"done": true, ...the JSON above}``; an error after the stream
                            began is an ``event: error`` with ``data: {"error": sentence}``
``GET /health``             200 ``{"status": "ok", "tp": p, "pids": [...], "running": n, "waiting": n,
                            "steps": n, "cancelled": n}``; 503 ``{"status": "failed", "error": sentence}``
``GET /config``             the model's configuration, ``tp``, ``pp``, ``max_batch``,
                            ``max_prefill_tokens``, the dtype, the checkpoint
==========================  =====================================================================

Errors are JSON ``{"error": sentence}``: 400/413/415 for a bad request (``protocol``), 404 for an
unknown path, 503 once the model's ranks failed or stopped (every request in flight gets it too, and
the server exits), 504 when a request waited longer than ``request_timeout`` seconds.

**Cancellation**: a client that disconnects (streaming or not) is noticed by its handler thread --
between tokens it polls the socket for the peer's close, and a write that fails says so too -- and
its request is cancelled (``ContinuousBatcher.cancel``): it leaves the batch at the next step, which
frees its place and drops its caches on every rank. A request that got its 504 is cancelled too.
(A client that shuts down only its sending side after the request reads as gone as well: none of the
usual clients -- curl, urllib, requests, browsers -- does.)

Why server-sent events rather than chunked JSON: one line per token that any HTTP client (``curl -N``,
a browser's ``EventSource``, ``urllib`` reading lines) can consume as it comes, without parsing a
partial JSON document; the body ends when the connection closes (HTTP/1.0 style), so no chunk framing
is needed either.

Example (rank 0; see ``worker`` for the loop that feeds the batcher)::

    server = ServingServer(("127.0.0.1", 8000), batcher, info={"tp": 2, "model": {...}})
    server.start()                           # a daemon thread; server.close() stops it
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from neural_arch.serve.protocol import MAX_BODY_BYTES, RequestError, parse_request

__all__ = ["ServingServer"]

#: Seconds a handler waits for its request's next event before it looks whether its client is still there.
_POLL_S = 0.05


class _Handler(BaseHTTPRequestHandler):
    server_version = "neural_arch.serve/1"
    # a client that sends nothing (or reads nothing) for this long loses its connection, not a thread
    timeout = 60.0

    def log_message(self, format, *args):
        if self.server.owner.verbose:
            super().log_message(format, *args)

    # -- helpers --------------------------------------------------------------------------------------
    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    # -- GET ------------------------------------------------------------------------------------------
    def do_GET(self):
        owner = self.server.owner
        if self.path == "/health":
            if owner.batcher.failed is not None:
                return self._json(503, {"status": "failed", "error": owner.batcher.failed})
            return self._json(200, {"status": "ok", "tp": owner.info.get("tp"), "pids": owner.info.get("pids"),
                                    **owner.batcher.counts(), "cancelled": owner.batcher.cancelled})
        if self.path == "/config":
            return self._json(200, owner.info)
        self._error(404, f"no such path {self.path!r}; use POST /generate, GET /health or GET /config")

    # -- POST -----------------------------------------------------------------------------------------
    def do_POST(self):
        owner = self.server.owner
        if self.path != "/generate":
            return self._error(404, f"no such path {self.path!r}; POST to /generate")
        kind = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if kind != "application/json":
            return self._error(415, f"the body must be application/json, got {kind!r}")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._error(411, "send a Content-Length header with the JSON body")
        if length > MAX_BODY_BYTES:
            return self._error(413, f"the request body has {length} bytes; at most {MAX_BODY_BYTES} are accepted")
        body = self.rfile.read(length)
        try:
            request = parse_request(body, owner.info["model"]["vocab_size"], owner.info["model"]["block_size"])
        except RequestError as exc:
            return self._error(exc.status, str(exc))
        try:
            active = owner.batcher.submit(request)
        except RuntimeError as exc:
            return self._error(503, str(exc))
        if request.stream:
            return self._stream(active)
        while True:
            event = self._next_event(active)
            if event is None:
                return                       # the client left: nobody to answer
            if event[0] == "done":
                return self._json(200, _summary(active))
            if event[0] == "error":
                return self._error(event[1], event[2])

    def _client_gone(self) -> bool:
        """The client closed its end (a readable socket with nothing to read) or the socket failed."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _next_event(self, active):
        """The request's next event; None (and the request cancelled) once its client has gone."""
        owner = self.server.owner
        deadline = time.monotonic() + owner.request_timeout
        while True:
            if self._client_gone():
                owner.batcher.cancel(active)
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                owner.batcher.cancel(active)     # nobody will read the rest of it
                return ("error", 504, (f"no token within {owner.request_timeout:g} s; the server is "
                                       "overloaded or stuck (see GET /health)"))
            try:
                return active.events.get(timeout=min(left, _POLL_S))
            except queue.Empty:
                pass

    def _stream(self, active) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            while True:
                event = self._next_event(active)
                if event is None:
                    return
                if event[0] == "token":
                    self.wfile.write(f"data: {json.dumps({'token': event[1]})}\n\n".encode())
                elif event[0] == "done":
                    self.wfile.write(f"data: {json.dumps({'done': True, **_summary(active)})}\n\n".encode())
                    return
                else:
                    self.wfile.write(f"event: error\ndata: {json.dumps({'error': event[2], 'status': event[1]})}\n\n"
                                     .encode())
                    return
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.server.owner.batcher.cancel(active)   # the client left: free its place at the next step


def _summary(active) -> dict:
    ttft = None if active.first_token_at is None else active.first_token_at - active.submitted
    end = active.finished_at or time.monotonic()
    return {"tokens": list(active.tokens), "prompt_tokens": len(active.request.prompt),
            "first_step": active.first_step, "last_step": active.last_step,
            "time_to_first_token_s": ttft, "total_s": end - active.submitted}


class _HTTPServer(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a sixth client connecting at once would have its SYN
    # dropped and retried a second later, which reads as a one-second time to first token
    request_queue_size = 128
    daemon_threads = True


class ServingServer:
    """``ThreadingHTTPServer`` on ``address`` answering from ``batcher``; ``info`` is what /config shows.

    Args:
        address: ``(host, port)``; port 0 picks a free one (read ``port``).
        batcher: the :class:`~neural_arch.serve.batcher.ContinuousBatcher` the main thread steps.
        info: ``{"model": {...}, "tp": p, "pids": [...], ...}`` (``model`` needs ``vocab_size`` and
            ``block_size``: requests are checked against them).
        request_timeout: seconds a request may wait for its next token before it gets a 504.

    Example::

        server = ServingServer(("127.0.0.1", 0), batcher, info)
        server.start(); print(server.port); ...; server.close()
    """

    def __init__(self, address, batcher, info: dict, request_timeout: float = 120.0, verbose: bool = False):
        self.batcher = batcher
        self.info = info
        self.request_timeout = float(request_timeout)
        self.verbose = verbose
        self.httpd = _HTTPServer(address, _Handler)
        self.httpd.owner = self
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        """Serve in a daemon thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="neural_arch.serve.http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and close the socket (handler threads already running finish their answer)."""
        self.httpd.shutdown()
        self.httpd.server_close()
