"""Who may open a stream on the sidecar's gRPC listeners, and how they are bound.

Envoy's ext_proc and ext_authz streams carry no credential of their own: the
sidecar believes the caller that Envoy's metadata names. So the listener
Envoy uses (``listen.grpc``) must admit Envoy alone:

- a unix socket, the default: bound mode 0660 (:data:`SOCKET_MODE`), so only
  the sidecar's user and the socket's group may connect. The group is the
  sidecar's own, or the directory's when the directory is setgid (a
  Kubernetes ``emptyDir`` with an ``fsGroup``); a process that cannot reach
  the directory cannot reach the socket either;
- TCP with mutual TLS: Envoy's client certificate must chain to
  ``listen.grpc_client_ca_file`` (the handshake) and name
  ``listen.grpc_client_id`` in a SAN, checked on every call (:class:`PinnedPeer`);
- TCP without it only when ``listen.expose_grpc`` says so
  (``sidecar.cli.serve.check_exposure``).

The Gate service's listener (``listen.gate``) is bound the same way, without
TLS: its callers bring their own credential in each call.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sidecar.config import ConfigError
from sidecar.config.groups import ListenSettings
from sidecar.runtime.addresses import UnixSocket, parse_socket_address

log = logging.getLogger(__name__)

# Owner and group read and write: connecting to a unix socket needs write permission.
SOCKET_MODE = 0o660
# The TLS peer's SANs as gRPC reports them (URIs, DNS names, e-mail addresses, IPs).
_SAN_PROPERTY = "x509_subject_alternative_name"


class ListenError(OSError):
    """The sidecar cannot listen on one of its addresses (taken, no such directory, ...)."""


def add_listener(
    server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None = None
) -> None:
    """Bind ``server`` to ``address`` (``unix:/path`` or ``host:port``), over TLS with
    ``credentials``; ListenError naming the address when it cannot.

    A unix socket is created with :data:`SOCKET_MODE` by the bind itself (gRPC
    binds here, not at start): there is no moment at which it has a wider mode.
    """
    try:
        parsed = parse_socket_address(address)
    except ValueError as exc:
        raise ListenError(f"cannot listen on {address}: {exc}") from None
    if not isinstance(parsed, UnixSocket):
        port = _bind(server, address, credentials)
        if port == 0:
            raise ListenError(f"cannot listen on {address}")
        return
    directory = Path(parsed.path).parent
    if not directory.is_dir():
        raise ListenError(
            f"cannot listen on {address}: there is no directory {directory}; create it, "
            "writable by the sidecar's user alone and searchable by Envoy's group, or "
            "choose another path"
        )
    # The umask is the process's: nothing else of this process creates files
    # while it binds (start-up, before any stream is served).
    previous = os.umask(0o777 & ~SOCKET_MODE)
    try:
        _bind(server, address, credentials)
    finally:
        os.umask(previous)


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    try:
        port: int = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError as exc:  # grpc's way of saying it cannot bind
        raise ListenError(f"cannot listen on {address}: {exc}") from None
    return port


def server_credentials(listen: ListenSettings) -> grpc.ServerCredentials | None:
    """mTLS for ``listen.grpc`` (None without it): the files read and checked now, so
    that a missing or malformed one is a ConfigError at start, not a failed handshake."""
    if not listen.grpc_mtls:
        return None
    assert listen.grpc_cert_file and listen.grpc_key_file and listen.grpc_client_ca_file
    chain = _read_pem("listen.grpc_cert_file", listen.grpc_cert_file)
    key = _read_pem("listen.grpc_key_file", listen.grpc_key_file)
    authority = _read_pem("listen.grpc_client_ca_file", listen.grpc_client_ca_file)
    for name, path, data in (
        ("listen.grpc_cert_file", listen.grpc_cert_file, chain),
        ("listen.grpc_client_ca_file", listen.grpc_client_ca_file, authority),
    ):
        try:
            x509.load_pem_x509_certificates(data)
        except ValueError:
            raise ConfigError(f"{name} {path}: not a PEM certificate") from None
    try:
        serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError):
        raise ConfigError(
            f"listen.grpc_key_file {listen.grpc_key_file}: not an unencrypted PEM private key"
        ) from None
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=authority, require_client_auth=True
    )


def _read_pem(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name} {path}: {exc.strerror or exc}") from None


Behavior = Callable[..., Any]


class PinnedPeer(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call whose TLS peer's certificate does not name ``identity`` in a SAN.

    The handshake has already required a certificate of the configured CA;
    this holds the listener to the one identity among everything that CA
    issues. Every call is checked, the health service's included.
    """

    def __init__(self, identity: str) -> None:
        self._identity = identity.encode()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _checked(handler, self._check)

    async def _check(self, context: grpc.aio.ServicerContext) -> None:
        if self._identity in context.auth_context().get(_SAN_PROPERTY, ()):
            return
        # The names a certificate of the operator's CA carries are not secrets.
        log.warning(
            "refused a call on listen.grpc: the peer's certificate names %s, not "
            "listen.grpc_client_id",
            b", ".join(context.auth_context().get(_SAN_PROPERTY, ())).decode(errors="replace")
            or "no SAN",
        )
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            "the peer is not the Envoy this sidecar serves (listen.grpc_client_id)",
        )


def _checked(
    handler: grpc.RpcMethodHandler,
    check: Callable[[grpc.aio.ServicerContext], Awaitable[None]],
) -> grpc.RpcMethodHandler:
    """``handler`` with ``check`` awaited before its behaviour runs."""

    def guard(behavior: Behavior) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(context)
                async for response in behavior(request, context):
                    yield response

            return streaming

        async def single(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            result = behavior(request, context)
            return await result if inspect.isawaitable(result) else result

        return single

    make = {
        (False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream),
        (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream),
    }
    build, behavior = make[(handler.request_streaming, handler.response_streaming)]
    return build(
        guard(behavior),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
