"""Envoy external authorization servicer: the request path.

Establishes who the caller is and hands that to the response path as Envoy
dynamic metadata (namespace ``envoy.filters.http.ext_authz``), which Envoy
forwards to ext_proc. Headers are never the carrier: a client could set them.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf import struct_pb2

from sidecar.identity import IdentityError, IdentityProvider
from sidecar.wire import envoy_http_status_pb2 as http_status
from sidecar.wire import ext_authz_pb2 as authz
from sidecar.wire import ext_authz_pb2_grpc as authz_grpc

log = logging.getLogger(__name__)

# gRPC status codes Envoy reads from CheckResponse.status.
_OK = 0
_UNAUTHENTICATED = 16


class AuthorizationServicer(authz_grpc.AuthorizationServicer):
    def __init__(self, identity: IdentityProvider) -> None:
        self._identity = identity

    async def Check(
        self, request: authz.CheckRequest, context: grpc.aio.ServicerContext
    ) -> authz.CheckResponse:
        headers = {k.lower(): v for k, v in request.attributes.request.http.headers.items()}
        try:
            caller = self._identity.identify(headers)
        except IdentityError as exc:
            log.info("request refused: %s", exc.code)
            return authz.CheckResponse(
                status=authz.RpcStatus(code=_UNAUTHENTICATED, message=exc.code),
                denied_response=authz.DeniedHttpResponse(
                    status=http_status.HttpStatus(code=http_status.Unauthorized),
                    body=f'{{"error":"{exc.code}"}}',
                ),
            )
        metadata = struct_pb2.Struct()
        metadata.update(caller.to_metadata())
        return authz.CheckResponse(
            status=authz.RpcStatus(code=_OK),
            ok_response=authz.OkHttpResponse(headers_to_remove=list(self._identity.strip_headers)),
            dynamic_metadata=metadata,
        )
