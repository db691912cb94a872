"""A small HTTP proxy on 127.0.0.1 that injects faults between a client and a real server.

For the remote tests: it forwards every request to the upstream server (moto's S3 server) and, for
requests whose path contains a planned key, answers with a fault first: a 503 or a 403, a response cut short
(headers promise the whole body, the connection closes halfway), a delay, or a dropped connection.
Each planned fault is used once, in order; then requests pass through untouched. It counts the
requests it saw per path, so a test can assert what was fetched and how often.

Outages: ``down()`` closes the listening socket and every open connection (a connect is then refused,
ECONNREFUSED) and ``up()`` listens again on the same port; ``outage(seconds)`` does both, the second
in a timer. ``fail_for(seconds)`` answers every request with a 503 until then.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import Counter, defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("503", "403", "truncate", "drop", "delay")
_STATUS_BODIES = {"503": b"<Error><Code>SlowDown</Code></Error>", "403": b"<Error><Code>AccessDenied</Code></Error>"}


class FaultProxy:
    """Forward HTTP to ``upstream`` (``http://host:port``) with planned faults; ``url`` is where to connect."""

    def __init__(self, upstream: str, delay_s: float = 2.0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.delay_s = delay_s
        self.plans: dict[str, deque[str]] = defaultdict(deque)
        self.seen: Counter[str] = Counter()
        self.faults_served: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._failing_until = 0.0  # fail_for(): every request answers 503 until this time.monotonic()
        self._timers: list[threading.Timer] = []
        self.refused_since: float | None = None  # while down(): when it began
        self._listen(0)
        self.url = f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> None:
        """Serve on 127.0.0.1:``port`` (0: a free one) in a thread of its own."""
        self._server = _QuietServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def down(self) -> None:
        """Stop listening and close every open connection: connects are refused until ``up()``."""
        with self._lock:
            if self.refused_since is not None:
                return
            self.refused_since = time.monotonic()
            connections = list(self._connections)
        self._server.shutdown()
        try:  # shut down, not only closed: a process forked meanwhile (a DataLoader worker) shares the socket
            self._server.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.server_close()
        for connection in connections:  # kept-alive connections too: the store is gone, not just its door
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def up(self) -> None:
        """Listen again on the same port (after ``down()``)."""
        with self._lock:
            if self.refused_since is None:
                return
            self.refused_since = None
        self._listen(self.port)

    def outage(self, seconds: float) -> None:
        """Refuse connections for ``seconds`` from now (``down()``, then ``up()`` in a timer)."""
        self.down()
        timer = threading.Timer(seconds, self.up)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def fail_for(self, seconds: float) -> None:
        """Answer every request (any method, any path) with a 503 for ``seconds`` from now."""
        with self._lock:
            self._failing_until = time.monotonic() + seconds

    def plan(self, key: str, *faults: str) -> None:
        """Answer the next requests whose path contains ``key`` with ``faults``, one each, in order."""
        for fault in faults:
            assert fault in FAULTS, fault
        with self._lock:
            self.plans[key].extend(faults)

    def _next_fault(self, method: str, path: str) -> str | None:
        """Count the request; return the fault to answer it with (``fail_for``'s 503, a planned one), or None."""
        with self._lock:
            self.seen[f"{method} {path}"] += 1
            if time.monotonic() < self._failing_until:
                self.faults_served.append(("503", path))
                return "503"
            for key, faults in self.plans.items():
                if key in path and faults and method == "GET":
                    fault = faults.popleft()
                    self.faults_served.append((fault, path))
                    return fault
        return None

    def close(self) -> None:
        """Stop serving and close the listening socket (an outage's timer is cancelled)."""
        for timer in self._timers:
            timer.cancel()
        self.down()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def setup(self) -> None:
                """Keep the connection, for ``down()`` to close."""
                super().setup()
                with proxy._lock:
                    proxy._connections.add(self.connection)

            def finish(self) -> None:
                """Forget the connection; one ``down()`` closed is not an error."""
                with proxy._lock:
                    proxy._connections.discard(self.connection)
                try:
                    super().finish()
                except (OSError, ValueError):  # closed by down(), or by a "drop"
                    pass

            def _forward(self) -> None:
                fault = proxy._next_fault(self.command, self.path)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault in _STATUS_BODIES:
                    body = _STATUS_BODIES[fault]
                    self.send_response(int(fault))
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if self.command != "HEAD":  # (a HEAD answer has no body: one would be read as the next answer)
                        self.wfile.write(body)
                    return
                if fault == "delay":
                    time.sleep(proxy.delay_s)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    headers["Host"] = f"{proxy.upstream[0]}:{proxy.upstream[1]}"
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status)
                    for k, v in response.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command == "HEAD":
                        return
                    if fault == "truncate":  # the promised length, half of it sent, then the connection closes
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.close()
                        return
                    self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        return Handler


class _QuietServer(ThreadingHTTPServer):
    """The proxy's server: a connection that ``down()`` closed under its handler is not a printed traceback."""

    def handle_error(self, request: object, client_address: object) -> None:
        """Say nothing (the client sees the closed connection)."""
