"""The caller: who is asking, as established from verified identity.

Providers turn what the sidecar sees of a request's headers (headers, the
filter metadata of earlier filters, such as ``jwt_authn``, and Envoy's
attributes of the connection, such as the peer certificate's URI SAN) into a
:class:`Caller`. The caller stays with the request's ext_proc stream (or, when
a mesh's ext_authz filter admits requests, travels as Envoy dynamic metadata),
never as a header a client or upstream could set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sidecar.core.caller import Caller


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What the sidecar knows about a request before it is sent upstream, protocol-free."""

    method: str
    path: str
    headers: Mapping[str, str]  # lowercase names
    # Filter metadata set by earlier Envoy filters, by namespace (e.g. jwt_authn's payload).
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Envoy's own attributes of the request and its connection, by attribute name
    # (e.g. connection.uri_san_peer_certificate): what the filter was asked to send.
    attributes: Mapping[str, Any] = field(default_factory=dict)


class IdentityProvider(Protocol):
    """Turns a request, as the sidecar sees its headers, into a Caller."""

    @property
    def strip_headers(self) -> tuple[str, ...]:
        """Headers to remove before the request goes upstream."""
        ...

    async def identify(self, request: AuthRequest) -> Caller:
        """Return the caller, or raise IdentityError (the request is refused with 401)."""
        ...
