"""Envoy external authorization servicer: the request path, for meshes that use ext_authz.

The generated Envoy configuration admits requests in the ext_proc stream (one
gRPC stream per request instead of two). This service is for platforms whose
mesh speaks ext_authz (e.g. an Istio extension provider) in front of the
ext_proc filter. Translates a CheckRequest into an :class:`~sidecar.identity.AuthRequest`, lets
:class:`~sidecar.request.admission.RequestAdmission` decide, and answers with the caller as
Envoy dynamic metadata (namespace ``envoy.filters.http.ext_authz``, which Envoy
forwards to ext_proc) or with a 401/403. Headers are never the carrier: a
client could set them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
from google.protobuf import json_format, struct_pb2

from sidecar.identity import AuthRequest
from sidecar.refusals import METADATA_UNAVAILABLE, Refusal
from sidecar.request.admission import RequestAdmission, RequestRefused
from sidecar.wire import envoy_core_pb2 as core
from sidecar.wire import envoy_http_status_pb2 as http_status
from sidecar.wire import ext_authz_pb2 as authz
from sidecar.wire import ext_authz_pb2_grpc as authz_grpc

log = logging.getLogger(__name__)

# The gRPC status Envoy reads from CheckResponse.status for an admitted request.
_OK = 0


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


def _denied(refusal: Refusal) -> authz.CheckResponse:
    return authz.CheckResponse(
        status=authz.RpcStatus(code=int(refusal.grpc_status), message=refusal.code),
        denied_response=authz.DeniedHttpResponse(
            status=http_status.HttpStatus(code=refusal.http_status),  # type: ignore[arg-type]
            headers=[
                core.HeaderValueOption(
                    header=core.HeaderValue(key="content-type", raw_value=b"application/json")
                )
            ],
            body=refusal.body().decode(),
        ),
    )


class AuthorizationServicer(authz_grpc.AuthorizationServicer):
    def __init__(
        self, admission: RequestAdmission, *, ready: Callable[[], bool] | None = None
    ) -> None:
        """While ``ready()`` is false every request is denied: 503 ``metadata_unavailable``."""
        self._admission = admission
        self._ready = ready

    async def Check(
        self, request: authz.CheckRequest, context: grpc.aio.ServicerContext
    ) -> authz.CheckResponse:
        if self._ready is not None and not self._ready():
            return _denied(METADATA_UNAVAILABLE)
        try:
            admitted = await self._admission.admit(auth_request(request))
        except RequestRefused as exc:
            log.info("request refused: %s", exc.refusal.code)
            return _denied(exc.refusal)
        metadata = struct_pb2.Struct()
        if admitted.caller is not None:  # an open probe leaves no caller
            metadata.update(admitted.caller.to_document())
        return authz.CheckResponse(
            status=authz.RpcStatus(code=_OK),
            ok_response=authz.OkHttpResponse(headers_to_remove=list(admitted.strip_headers)),
            dynamic_metadata=metadata,
        )
