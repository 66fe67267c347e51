"""A FAKE vector database: an HTTP server that answers with canned bodies.

Used by `retrieval-gate demo` and by the integration tests as the fixture
upstream behind Envoy. It stands in for Qdrant (whose server cannot be
installed on the build machines); it does no search, it replays whatever
body was registered for a method and path, and records every request it saw
so tests can check what reached the "database". A test may register a
responder instead (a callable from the request to a response): still a fake,
it answers as the test's own model of a database does
(tests/fixtures/documented_databases.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class CannedResponse:
    body: bytes
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    delay_seconds: float = 0.0  # a slow database, for tests of what happens meanwhile


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str
    headers: Mapping[str, str]  # lowercase names
    body: bytes


# Computes the answer to one request (a test's model of a database).
Responder = Callable[[SeenRequest], CannedResponse]

_NOT_FOUND = CannedResponse(b'{"status":{"error":"Not found"},"time":0.0}', status=404)


class FixtureUpstream:
    """Serves canned responses on 127.0.0.1; start() before use, stop() after."""

    def __init__(self) -> None:
        self._responses: dict[tuple[str, str], CannedResponse | Responder] = {}
        self._lock = threading.Lock()
        self.requests: list[SeenRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def respond(self, method: str, path: str, response: CannedResponse) -> None:
        """Answer ``method path`` (path without query string) with ``response`` from now on."""
        with self._lock:
            self._responses[(method.upper(), path)] = response

    def respond_with(self, method: str, path: str, responder: Responder) -> None:
        """Answer ``method path`` (path without query string) with what ``responder``
        computes from each request, from now on (replacing a canned body)."""
        with self._lock:
            self._responses[(method.upper(), path)] = responder

    def start(self) -> FixtureUpstream:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _lookup(self, request: SeenRequest) -> CannedResponse:
        with self._lock:
            found = self._responses.get((request.method, request.path.split("?", 1)[0]))
        if found is None:
            return _NOT_FOUND
        # Called outside the lock: a responder may take its time.
        return found if isinstance(found, CannedResponse) else found(request)

    def _record(self, request: SeenRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes; with Nagle on, the body
            # waits for Envoy's delayed ACK (about 40 ms a response).
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen = SeenRequest(self.command, self.path, headers, body)
                upstream._record(seen)
                canned = upstream._lookup(seen)
                if canned.delay_seconds:
                    time.sleep(canned.delay_seconds)
                self.send_response(canned.status)
                for name, value in canned.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, format: str, *args: object) -> None:
                return None

        return Handler
