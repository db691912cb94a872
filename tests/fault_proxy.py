"""A small HTTP proxy on 127.0.0.1 that injects faults between a client and a real server.

For the remote tests: it forwards every request to the upstream server (moto's S3 server) and, for
requests whose path contains a planned key, answers with a fault first: a 503, a response cut short
(headers promise the whole body, the connection closes halfway), a delay, or a dropped connection.
Each planned fault is used once, in order; then requests pass through untouched. It counts the
requests it saw per path, so a test can assert what was fetched and how often.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter, defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("503", "truncate", "drop", "delay")


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
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def plan(self, key: str, *faults: str) -> None:
        """Answer the next requests whose path contains ``key`` with ``faults``, one each, in order."""
        for fault in faults:
            assert fault in FAULTS, fault
        with self._lock:
            self.plans[key].extend(faults)

    def _next_fault(self, method: str, path: str) -> str | None:
        with self._lock:
            self.seen[f"{method} {path}"] += 1
            for key, faults in self.plans.items():
                if key in path and faults and method == "GET":
                    fault = faults.popleft()
                    self.faults_served.append((fault, path))
                    return fault
        return None

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                fault = proxy._next_fault(self.command, self.path)
                if fault == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault == "503":
                    body = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
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
