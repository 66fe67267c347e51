"""Raw HTTP/1.1 to Envoy: header lines exactly as a case writes them.

An HTTP library would fold duplicate headers, fix case, trim whitespace or
refuse control characters before Envoy ever saw them; the cases are about
what Envoy and the gate do with such requests, so the bytes go out as given.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

_TIMEOUT_SECONDS = 15.0


@dataclass(frozen=True)
class RawResponse:
    """The status, headers (lowercase names, last value wins) and body Envoy sent."""

    status: int
    headers: dict[str, str]
    body: bytes


def request_bytes(path: str, header_lines: Sequence[bytes], body: bytes) -> bytes:
    """A POST of ``body`` to ``path`` with the case's header lines after the framing ones."""
    head = [
        f"POST {path} HTTP/1.1".encode(),
        b"host: gate.test",
        b"content-type: application/json",
        f"content-length: {len(body)}".encode(),
        b"connection: close",
        *header_lines,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def send(port: int, data: bytes) -> RawResponse:
    """Send ``data`` to 127.0.0.1:``port`` and read the answer until Envoy closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=_TIMEOUT_SECONDS) as connection:
        connection.sendall(data)
        received = bytearray()
        # Stop at the end of the answer: Envoy may hold a closing connection open
        # for its delayed-close timeout.
        while not _complete(received) and (chunk := connection.recv(65536)):
            received += chunk
    return parse(bytes(received))


def _complete(data: bytes | bytearray) -> bool:
    head, separator, rest = bytes(data).partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(rest) >= int(value.strip())
    return False  # chunked or unframed: read to the close


def parse(data: bytes) -> RawResponse:
    """One HTTP/1.1 response (content-length, chunked, or read to the close)."""
    head, separator, rest = data.partition(b"\r\n\r\n")
    if not separator:
        raise ValueError(f"no complete HTTP response ({len(data)} bytes)")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        rest = _unchunk(rest)
    elif "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return RawResponse(int(status_line.split(" ")[1]), headers, rest)


def _unchunk(data: bytes) -> bytes:
    body = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        body += data[:size]
        data = data[size + 2 :]
    return bytes(body)
