"""Identity from the peer's verified client certificate (identity mode ``mesh-mtls``).

The caller is the workload whose certificate Envoy verified on the
downstream connection: its SPIFFE id, the certificate's URI SAN, mapped to a
tenant and principals by the workload table (``sidecar.identity.spiffe``).

The id comes from Envoy's ext_proc ``request_attributes``
(``connection.uri_san_peer_certificate``), which Envoy computes from the TLS
connection itself: no header, no client and no upstream can write it. A
header such as ``x-forwarded-client-cert`` is only as good as every hop's
``forward_client_cert_details`` (Istio's sidecars append to a client's own),
and ext_authz's ``source.principal`` needs a second gRPC call per request and
falls back to a DNS SAN or the subject; neither is read.

Envoy must verify the certificate (a ``validation_context`` that trusts only
the mesh's CA): the attributes say that a certificate was presented, not
that it was verified. ``retrieval-gate proxy`` and Istio's mTLS both verify.
Envoy reports the certificate's first URI SAN; an X.509-SVID has exactly one.
"""

from __future__ import annotations

import logging

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest
from sidecar.identity.spiffe import WorkloadMap, parse_spiffe_id

log = logging.getLogger(__name__)

# Envoy attributes the ext_proc filter must send (its `request_attributes`).
MTLS_ATTRIBUTE = "connection.mtls"  # true: TLS with a peer certificate presented
URI_SAN_ATTRIBUTE = "connection.uri_san_peer_certificate"  # the certificate's first URI SAN
REQUEST_ATTRIBUTES = (MTLS_ATTRIBUTE, URI_SAN_ATTRIBUTE)

CERTIFICATE_MISSING = "client_certificate_missing"
SPIFFE_ID_MALFORMED = "spiffe_id_malformed"
WORKLOAD_UNMAPPED = "workload_unmapped"
# Envoy adds it for the upstream in some configurations (Istio's sidecars);
# the vector DB never needs it.
XFCC_HEADER = "x-forwarded-client-cert"


class MeshMtls:
    """The caller from the verified peer certificate's SPIFFE id and the workload table."""

    strip_headers: tuple[str, ...] = (XFCC_HEADER,)

    def __init__(self, workloads: WorkloadMap) -> None:
        self._workloads = workloads

    async def identify(self, request: AuthRequest) -> Caller:
        """The mapped caller; IdentityError without a certificate, id or mapping."""
        attributes = request.attributes
        if MTLS_ATTRIBUTE not in attributes:
            # Envoy sends connection.mtls (false without a certificate) when asked,
            # to the ext_proc filter only: the ext_authz service gets no attributes.
            log.warning(
                "no %s attribute from Envoy: admit in the ext_proc filter, with "
                "request_attributes %s",
                MTLS_ATTRIBUTE,
                list(REQUEST_ATTRIBUTES),
            )
            raise IdentityError(CERTIFICATE_MISSING, "Envoy sent no connection attributes")
        if attributes[MTLS_ATTRIBUTE] is not True:
            raise IdentityError(CERTIFICATE_MISSING, "the connection has no client certificate")
        uri_san = attributes.get(URI_SAN_ATTRIBUTE)
        if not isinstance(uri_san, str):
            raise IdentityError(SPIFFE_ID_MALFORMED, "the client certificate has no URI SAN")
        try:
            spiffe_id = parse_spiffe_id(uri_san)
        except ValueError as exc:
            raise IdentityError(
                SPIFFE_ID_MALFORMED, f"the URI SAN is no SPIFFE id: {exc}"
            ) from None
        caller = self._workloads.lookup(spiffe_id)
        if caller is None:
            # A SPIFFE id names a workload, not a person: the operator needs it to add a mapping.
            raise IdentityError(WORKLOAD_UNMAPPED, f"no workloads entry matches {spiffe_id}")
        return caller
