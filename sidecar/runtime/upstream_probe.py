"""Reaching the vector database from here, as the proxy's Envoy would: a TCP connection,
and a format's schema request (``sidecar.formats.schema_probe``) sent over HTTP or
gRPC with the credential Envoy would add.

For ``retrieval-gate check``. Proxies named in the environment are not used:
Envoy does not use them either. The credential's value is sent, never shown.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

import grpc
import requests

from sidecar.config import Settings
from sidecar.formats.schema_probe import SchemaAnswerError, SchemaRequest, shorten
from sidecar.runtime.bootstrap import Upstream

# The gRPC statuses of a call that reached no server (or no answer in time).
_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class UpstreamUnreachable(Exception):
    """No answer from the database: ``str()`` says what failed (a refused connection, a
    timeout, a TLS failure)."""


def connect(upstream: Upstream, timeout_s: float) -> None:
    """Open and close a TCP connection to ``upstream``; UpstreamUnreachable when it fails."""
    try:
        with socket.create_connection((upstream.host, upstream.port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise UpstreamUnreachable(
            f"cannot connect to {upstream.host}:{upstream.port}: {exc.strerror or exc}"
        ) from None


def credential_headers(settings: Settings) -> dict[str, str]:
    """The header the proxy's Envoy adds to every request (``[upstream]``), or none."""
    given = settings.upstream
    if given.credential_file is None or given.credential_header is None:
        return {}
    try:
        value = given.credential_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return {}  # check_upstream_credential names the file's problem
    return {given.credential_header: given.credential_prefix + value}


def send(
    request: SchemaRequest,
    upstream: Upstream,
    headers: Mapping[str, str],
    timeout_s: float,
) -> tuple[int, bytes]:
    """Send ``request`` to ``upstream``: the HTTP status (200 for a gRPC OK) and the body.

    Raises UpstreamUnreachable when no answer comes, and SchemaAnswerError when
    a gRPC call ends with another status than OK.
    """
    if request.grpc:
        return 200, _call(request, upstream, headers, timeout_s)
    scheme = "https" if upstream.tls else "http"
    url = f"{scheme}://{_authority(upstream)}{request.path}"
    with requests.Session() as session:
        session.trust_env = False
        try:
            response = session.request(
                request.method,
                url,
                data=request.body,
                headers={**headers, "accept": "application/json"},
                timeout=timeout_s,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            raise UpstreamUnreachable(f"{request.method} {url}: {type(exc).__name__}") from None
        return response.status_code, response.content


def _call(
    request: SchemaRequest, upstream: Upstream, headers: Mapping[str, str], timeout_s: float
) -> bytes:
    target = _authority(upstream)
    options = [("grpc.enable_http_proxy", 0)]
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials(), options=options)
        if upstream.tls
        else grpc.insecure_channel(target, options=options)
    )
    with channel:
        method = channel.unary_unary(request.path)
        try:
            reply: bytes = method(
                request.body or b"", timeout=timeout_s, metadata=tuple(headers.items())
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else None
            name = code.name if code is not None else "error"
            message = f"gRPC {name}" + (f": {shorten(details)}" if details else "")
            if code in _NO_ANSWER:
                raise UpstreamUnreachable(f"{request.path} on {target}: {message}") from None
            raise SchemaAnswerError(message) from None
    return reply


def _authority(upstream: Upstream) -> str:
    host = f"[{upstream.host}]" if ":" in upstream.host else upstream.host
    return f"{host}:{upstream.port}"
