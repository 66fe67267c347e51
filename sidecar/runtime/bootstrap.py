"""The Envoy configuration that `retrieval-gate proxy` runs.

Also the reference for operators who bring their own Envoy: the filter chain
(jwt_authn for envoy-jwt identity, then ext_proc, then credential_injector
when the database requires a credential, then the router), the overload
manager and caps, and every fail-closed setting here are what a mesh
configuration must reproduce. The
sidecar admits each request in its ext_proc stream, so one gRPC stream serves
the whole request; a mesh may put an ext_authz filter (the sidecar serves that
API too) in front of ext_proc instead, at the cost of a second stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.config import ConfigError, IdentityMode, Settings
from sidecar.identity.envoy_jwt import JWT_AUTHN_NAMESPACE
from sidecar.identity.mesh import REQUEST_ATTRIBUTES
from sidecar.request.request_path import IDENTITY_NAMESPACE
from sidecar.runtime.addresses import HostPort, UnixSocket, parse_http_url, parse_socket_address
from sidecar.runtime.jwks_relay import relay_address
from sidecar.runtime.jwt_authn import JWKS_RELAY_CLUSTER, jwt_authn_filter
from sidecar.runtime.workers import worker_addresses


@dataclass(frozen=True, slots=True)
class Upstream:
    """The vector database the proxy's Envoy forwards to."""

    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """Parse ``http://host:port`` or ``https://host[:port]``."""
        try:
            endpoint = parse_http_url(url)
        except ValueError:
            raise ValueError(
                f"upstream must be http://host:port or https://host:port, got {url!r}"
            ) from None
        if endpoint.path not in ("", "/"):
            raise ValueError(f"upstream must not have a path, got {url!r}")
        return cls(endpoint.host, endpoint.port, endpoint.tls)


_TYPE = "type.googleapis.com/"
SIDECAR_CLUSTER = "retrieval_gate_sidecar"
UPSTREAM_CLUSTER = "vector_db"
# gRPC calls (Milvus, Weaviate, Qdrant and Pinecone clients) need HTTP/2 to the
# database; REST stays on HTTP/1.1, which every database's REST API speaks.
GRPC_UPSTREAM_CLUSTER = "vector_db_grpc"
INJECTED_CREDENTIAL = "upstream_credential"

# Envoy runtime values the gate's Envoy needs, whoever runs it (deploy/envoy,
# the gateway overlay, Istio's runtimeValues in the istio overlay).
#
# Without graceful close, Envoy ends every ext_proc stream by half-closing it
# and resetting it at once. A reset that overtakes the sidecar's final status
# fails grpcio's status batch, and grpcio's asyncio server never frees a failed
# batch's op array (grpc/grpc#43360): 80 bytes in about 4 streams of 10, the
# sidecar's memory climb in the soak (docs/reliability.md). With it (opt-in
# since Envoy 1.34) Envoy half-closes and waits for the sidecar's status, for
# at most 1 s, before resetting.
ENVOY_RUNTIME: dict[str, bool] = {"envoy.reloadable_features.ext_proc_graceful_grpc_close": True}


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _envoy_address(address: HostPort | UnixSocket) -> dict[str, Any]:
    if isinstance(address, UnixSocket):
        return {"pipe": {"path": address.path}}
    return _address(address.host, address.port)


def _jwks_relay_clusters(settings: Settings) -> list[dict[str, Any]]:
    """The cluster Envoy fetches a JWKS URL's keys through: the sidecar's relay, if needed."""
    relay = relay_address(settings)
    if relay is None:
        return []
    endpoint = {"endpoint": {"address": _envoy_address(relay)}}
    return [
        {
            "name": JWKS_RELAY_CLUSTER,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": JWKS_RELAY_CLUSTER,
                "endpoints": [{"lb_endpoints": [endpoint]}],
            },
        }
    ]


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}s"


def _http_filters(settings: Settings, generated_jwks: Path | None) -> list[dict[str, Any]]:
    grpc_service = {
        "envoy_grpc": {"cluster_name": SIDECAR_CLUSTER},
        "timeout": _seconds(settings.listen.message_timeout_ms),
    }
    verify_jwt = (
        [jwt_authn_filter(settings, generated_jwks)]
        if settings.identity.mode is IdentityMode.ENVOY_JWT
        else []
    )
    return [
        *verify_jwt,
        {
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": grpc_service,
                # Stream failure: refuse (503 before the upstream is called, 500
                # after); true would let requests through unadmitted and hand the
                # client unfiltered bodies.
                "failure_mode_allow": False,
                "status_on_error": {"code": "ServiceUnavailable"},
                "message_timeout": _seconds(settings.listen.message_timeout_ms),
                "allow_mode_override": True,
                "processing_mode": {
                    "request_header_mode": "SEND",
                    "response_header_mode": "SEND",
                    "request_body_mode": "NONE",
                    "response_body_mode": "BUFFERED",
                    "request_trailer_mode": "SKIP",
                    "response_trailer_mode": "SKIP",
                },
                # The verified token payload from jwt_authn (envoy-jwt identity),
                # and the caller from an ext_authz filter if a mesh puts one first.
                "metadata_options": {
                    "forwarding_namespaces": {"untyped": [JWT_AUTHN_NAMESPACE, IDENTITY_NAMESPACE]}
                },
                # mesh-mtls: the verified client certificate's URI SAN, from the
                # connection itself (never a header).
                **(
                    {"request_attributes": list(REQUEST_ATTRIBUTES)}
                    if settings.identity.mode is IdentityMode.MESH_MTLS
                    else {}
                ),
            },
        },
        *_credential_injector(settings),
        {
            "name": "envoy.filters.http.router",
            "typed_config": {
                "@type": _TYPE + "envoy.extensions.filters.http.router.v3.Router",
                # x-envoy-upstream-service-time would tell the client how long the
                # database took, which grows with what it matched for every tenant.
                "suppress_envoy_headers": True,
            },
        },
    ]


def _credential_injector(settings: Settings) -> list[dict[str, Any]]:
    """Envoy's credential_injector, adding the database's credential, if one is configured.

    It runs after ext_proc, so after the sidecar has stripped the client's
    identity headers, and overwrites every value of its header that the client
    sent: the database sees the gate's credential or none. Without the secret
    Envoy answers 401 rather than forward a request without it.
    """
    upstream = settings.upstream
    if upstream.credential_file is None or upstream.credential_header is None:
        return []
    generic: dict[str, Any] = {
        "@type": _TYPE + "envoy.extensions.http.injected_credentials.generic.v3.Generic",
        "credential": {"name": INJECTED_CREDENTIAL},
        "header": upstream.credential_header,
    }
    if upstream.credential_prefix:
        generic["header_value_prefix"] = upstream.credential_prefix
    return [
        {
            "name": "envoy.filters.http.credential_injector",
            "typed_config": {
                "@type": _TYPE
                + "envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
                "overwrite": True,
                "allow_request_without_credential": False,
                "credential": {
                    "name": "envoy.http.injected_credentials.generic",
                    "typed_config": generic,
                },
            },
        }
    ]


def _credential_secrets(settings: Settings) -> list[dict[str, Any]]:
    """The generic secret the credential_injector reads: a reference to the file, not its value."""
    path = settings.upstream.credential_file
    if path is None:
        return []
    return [
        {
            "name": INJECTED_CREDENTIAL,
            # absolute(), not resolve(): a Kubernetes secret volume's file is a
            # link that the kubelet re-points when the Secret changes.
            "generic_secret": {"secret": {"filename": str(path.absolute())}},
        }
    ]


def check_upstream_credential(settings: Settings) -> None:
    """ConfigError unless ``upstream.credential_file`` (if set) is a readable, non-empty file.

    The value is read only to be checked and is never repeated: the error
    names the file, never what is in it.
    """
    path = settings.upstream.credential_file
    if path is None:
        return
    name = "upstream.credential_file"
    try:
        value = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
    text = value.strip()
    if not text:
        raise ConfigError(f"{name}: {path} is empty")
    if any(byte < 0x20 or byte > 0x7E for byte in text):
        raise ConfigError(f"{name}: {path} must hold one line of printable ASCII (a header value)")


def overload_manager(settings: Settings) -> dict[str, Any]:
    """Envoy's overload manager: a cap on client connections and a heap budget.

    Above ``listen.max_connections`` Envoy closes new connections at accept;
    at 90% of ``listen.max_heap_bytes`` it returns free memory to the system,
    at 95% it answers new requests 503 until usage falls. Without it Envoy
    accepts connections and buffers bodies until the kernel kills it.
    """
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": _TYPE
                    + "envoy.extensions.resource_monitors.downstream_connections.v3"
                    + ".DownstreamConnectionsConfig",
                    "max_active_downstream_connections": settings.listen.max_connections,
                },
            },
            {
                "name": "envoy.resource_monitors.fixed_heap",
                "typed_config": {
                    "@type": _TYPE
                    + "envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": settings.listen.max_heap_bytes,
                },
            },
        ],
        "actions": [
            {
                "name": "envoy.overload_actions.shrink_heap",
                "triggers": [
                    {"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": 0.90}}
                ],
            },
            {
                "name": "envoy.overload_actions.stop_accepting_requests",
                "triggers": [
                    {"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": 0.95}}
                ],
            },
        ],
    }


def _upstream_cluster(upstream: Upstream, name: str = UPSTREAM_CLUSTER) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "5s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": _address(upstream.host, upstream.port)}}
                    ]
                }
            ],
        },
    }
    if upstream.tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": upstream.host,
                **(
                    {"common_tls_context": {"alpn_protocols": ["h2"]}}
                    if name != UPSTREAM_CLUSTER
                    else {}
                ),
            },
        }
    if name == GRPC_UPSTREAM_CLUSTER:
        cluster["typed_extension_protocol_options"] = _HTTP2_ONLY
    return cluster


_HTTP2_ONLY = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": _TYPE + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}


def downstream_tls(settings: Settings) -> dict[str, Any] | None:
    """The listener's mTLS transport socket, or None for plain HTTP.

    Envoy requires a client certificate and verifies it against
    ``tls_client_ca_file`` before any request is read; a client without one,
    or with one of another CA, fails the handshake. Key material stays in its
    files (not in the configuration, so not in Envoy's config dump). Raises
    ConfigError for identity ``mesh-mtls`` without the files: its caller is the
    client certificate, which only a TLS listener sees.
    """
    listen = settings.listen
    files = {
        "listen.tls_cert_file": listen.tls_cert_file,
        "listen.tls_key_file": listen.tls_key_file,
        "listen.tls_client_ca_file": listen.tls_client_ca_file,
    }
    given = {name: path for name, path in files.items() if path is not None}
    if not given:
        if settings.identity.mode is IdentityMode.MESH_MTLS:
            raise ConfigError(
                "identity.mode 'mesh-mtls' with proxy needs listen.tls_cert_file, "
                "listen.tls_key_file and listen.tls_client_ca_file (--tls-cert-file ...): "
                "Envoy must terminate mTLS"
            )
        return None
    if len(given) != len(files):
        raise ConfigError(
            "listen.tls_cert_file, listen.tls_key_file and listen.tls_client_ca_file go together "
            f"(mTLS on the proxy's listener); only {', '.join(map(repr, given))} given"
        )
    for name, path in given.items():
        if not path.is_file():
            raise ConfigError(f"{name}: {path} is not a file")
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": _TYPE + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": {
                "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
                "tls_certificates": [
                    {
                        "certificate_chain": {
                            "filename": str(given["listen.tls_cert_file"].resolve())
                        },
                        "private_key": {"filename": str(given["listen.tls_key_file"].resolve())},
                    }
                ],
                "validation_context": {
                    "trusted_ca": {"filename": str(given["listen.tls_client_ca_file"].resolve())}
                },
                # gRPC clients (Milvus) need h2; the connection manager picks by ALPN.
                "alpn_protocols": ["h2", "http/1.1"],
            },
        },
    }


def build_bootstrap(
    settings: Settings,
    *,
    listen: tuple[str, int],
    upstream: Upstream,
    grpc_upstream: Upstream | None = None,
    generated_jwks: Path | None = None,
) -> dict[str, Any]:
    """An Envoy bootstrap (JSON-able) for the proxy: listener -> gate filters -> upstream.

    Requests with a gRPC content type go to ``grpc_upstream`` over HTTP/2
    (default: ``upstream``'s address; Milvus serves both on one port).

    ``generated_jwks`` is the JWKS file written from a PEM key or HMAC secret
    (``jwt_authn.write_generated_jwks``) for `envoy-jwt` identity.
    """
    host, port = listen
    tls = downstream_tls(settings)
    connection_manager = {
        "@type": _TYPE
        + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "retrieval_gate",
        # One spelling per path: the gate matches routes on the path it sees, and
        # the vector DB must receive that same path (the sidecar also refuses
        # any %XX, // or dot segment that survives this).
        "normalize_path": True,
        "merge_slashes": True,
        "path_with_escaped_slashes_action": "REJECT_REQUEST",
        # A header spelt with underscores may be read as its dashed twin by the
        # database's framework (x_gate_tenant as x-gate-tenant): it is dropped.
        "common_http_protocol_options": {
            "headers_with_underscores_action": "DROP_HEADER",
            "idle_timeout": "300s",
            # Long-lived client connections are closed (HTTP/2: GOAWAY, then a
            # drain) so that clients spread again over replicas after a rollout.
            "max_connection_duration": "900s",
        },
        # A client must send its headers within 10 s (slow-header clients hold
        # connections and nothing else).
        "request_headers_timeout": "10s",
        "http2_protocol_options": {
            "max_concurrent_streams": settings.listen.max_concurrent_streams,
            "initial_stream_window_size": 65536,
            "initial_connection_window_size": 1048576,
        },
        "route_config": {
            "name": "vector_db",
            "virtual_hosts": [
                {
                    "name": "vector_db",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {
                                "prefix": "/",
                                "headers": [
                                    {
                                        "name": "content-type",
                                        "string_match": {"prefix": "application/grpc"},
                                    }
                                ],
                            },
                            "route": {"cluster": GRPC_UPSTREAM_CLUSTER, "timeout": "60s"},
                        },
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": UPSTREAM_CLUSTER, "timeout": "60s"},
                        },
                    ],
                }
            ],
        },
        "http_filters": _http_filters(settings, generated_jwks),
    }
    return {
        "admin": {"address": _address("127.0.0.1", 0)},
        "layered_runtime": {"layers": [{"name": "gate", "static_layer": dict(ENVOY_RUNTIME)}]},
        "overload_manager": overload_manager(settings),
        "static_resources": {
            **({"secrets": secrets} if (secrets := _credential_secrets(settings)) else {}),
            "listeners": [
                {
                    "name": "retrieval_gate",
                    "address": _address(host, port),
                    # Envoy buffers the whole response body for ext_proc; a body
                    # over this limit is answered with an error, never passed.
                    "per_connection_buffer_limit_bytes": settings.listen.max_body_bytes,
                    "filter_chains": [
                        {
                            **({"transport_socket": tls} if tls is not None else {}),
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": connection_manager,
                                }
                            ],
                        }
                    ],
                }
            ],
            "clusters": [
                _upstream_cluster(upstream),
                _upstream_cluster(grpc_upstream or upstream, GRPC_UPSTREAM_CLUSTER),
                *_jwks_relay_clusters(settings),
                {
                    "name": SIDECAR_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    # gRPC needs HTTP/2 to the sidecar; HTTP/1.1 fails every request.
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": _TYPE
                            + "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    # One endpoint per worker process; each stream goes to the least busy.
                    "lb_policy": "LEAST_REQUEST",
                    "load_assignment": {
                        "cluster_name": SIDECAR_CLUSTER,
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": _envoy_address(parse_socket_address(address))
                                        }
                                    }
                                    for address in worker_addresses(
                                        settings.listen.grpc, settings.listen.workers
                                    )
                                ]
                            }
                        ],
                    },
                },
            ],
        },
    }
