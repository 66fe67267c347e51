"""Small helpers to read and build Envoy wire messages."""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.wire import envoy_core_pb2 as core
from sidecar.wire import envoy_http_status_pb2 as http_status
from sidecar.wire import ext_proc_pb2 as ext_proc


def header_dict(header_map: core.HeaderMap) -> dict[str, str]:
    """Headers as a dict of lowercase names; repeated headers joined with ", " (RFC 9110).

    Joining matters for list headers the gate acts on: two content-encoding
    lines mean two codings, and reading only one would misdecode the body.
    """
    headers: dict[str, str] = {}
    for h in header_map.headers:
        # Envoy fills raw_value (bytes) and leaves value empty in recent versions.
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        name = h.key.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def set_headers(headers: Mapping[str, str]) -> list[core.HeaderValueOption]:
    """Header options that overwrite (never append to) existing values."""
    return [
        core.HeaderValueOption(
            header=core.HeaderValue(key=name, raw_value=value.encode()),
            append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for name, value in headers.items()
    ]


def immediate(status: int, body: bytes, details: str) -> ext_proc.ProcessingResponse:
    """Answer the client directly; Envoy never forwards the upstream body."""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status.HttpStatus(code=status),  # type: ignore[arg-type]
            headers=ext_proc.HeaderMutation(
                set_headers=set_headers({"content-type": "application/json"})
            ),
            body=body,
            details=details,
        )
    )
