"""Envoy external authorization servicer: the request path, for meshes that use ext_authz.

The generated Envoy configuration admits requests in the ext_proc stream (one
gRPC stream per request instead of two). This service is for platforms whose
mesh speaks ext_authz (e.g. an Istio extension provider) in front of the
ext_proc filter. Translates a CheckRequest into an :class:`~sidecar.identity.AuthRequest`, lets
:class:`~sidecar.access.RequestAccess` decide, and answers with the caller as
Envoy dynamic metadata (namespace ``envoy.filters.http.ext_authz``, which Envoy
forwards to ext_proc) or with a 401/403. Headers are never the carrier: a
client could set them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from google.protobuf import json_format, struct_pb2

from sidecar.access import AccessDenied, RequestAccess
from sidecar.identity import AuthRequest
from sidecar.wire import envoy_core_pb2 as core
from sidecar.wire import envoy_http_status_pb2 as http_status
from sidecar.wire import ext_authz_pb2 as authz
from sidecar.wire import ext_authz_pb2_grpc as authz_grpc

log = logging.getLogger(__name__)

# gRPC status codes Envoy reads from CheckResponse.status.
_OK = 0
_INVALID_ARGUMENT = 3
_PERMISSION_DENIED = 7
_UNAVAILABLE = 14
_UNAUTHENTICATED = 16
_GRPC_CODE = {400: _INVALID_ARGUMENT, 401: _UNAUTHENTICATED, 403: _PERMISSION_DENIED}


def auth_request(request: authz.CheckRequest) -> AuthRequest:
    """The protocol-free view of a CheckRequest."""
    http = request.attributes.request.http
    metadata = {
        namespace: json_format.MessageToDict(value)
        for namespace, value in request.attributes.metadata_context.filter_metadata.items()
    }
    return AuthRequest(
        method=http.method,
        path=http.path.split("?", 1)[0],
        headers={k.lower(): v for k, v in http.headers.items()},
        metadata=metadata,
    )


def _denied(exc: AccessDenied) -> authz.CheckResponse:
    return authz.CheckResponse(
        status=authz.RpcStatus(code=_GRPC_CODE.get(exc.status, _UNAVAILABLE), message=exc.code),
        denied_response=authz.DeniedHttpResponse(
            status=http_status.HttpStatus(code=exc.status),  # type: ignore[arg-type]
            headers=[
                core.HeaderValueOption(
                    header=core.HeaderValue(key="content-type", raw_value=b"application/json")
                )
            ],
            body=exc.body().decode(),
        ),
    )


class AuthorizationServicer(authz_grpc.AuthorizationServicer):
    def __init__(
        self, access: RequestAccess, count_refusal: Callable[[int], None] = lambda status: None
    ) -> None:
        """``count_refusal`` counts a refused request by its HTTP status (the metrics)."""
        self._access = access
        self._count_refusal = count_refusal

    async def Check(
        self, request: authz.CheckRequest, context: grpc.aio.ServicerContext
    ) -> authz.CheckResponse:
        try:
            admission = await self._access.admit(auth_request(request))
        except AccessDenied as exc:
            log.info("request refused: %s %s", exc.status, exc.code)
            self._count_refusal(exc.status)
            return _denied(exc)
        metadata = struct_pb2.Struct()
        if admission.caller is not None:  # an open probe leaves no caller
            metadata.update(admission.caller.to_document())
        return authz.CheckResponse(
            status=authz.RpcStatus(code=_OK),
            ok_response=authz.OkHttpResponse(headers_to_remove=list(admission.strip_headers)),
            dynamic_metadata=metadata,
        )
