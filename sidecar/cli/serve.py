"""`retrieval-gate serve` and `retrieval-gate proxy`: run the sidecar."""

from __future__ import annotations

import argparse

from sidecar.cli.flags import add_setting_flags, settings_from_flags
from sidecar.config import ConfigError, ListenSettings, Settings
from sidecar.runtime import event_loop
from sidecar.runtime.addresses import (
    HostPort,
    UnixSocket,
    parse_host_port,
    parse_http_url,
    parse_socket_address,
    reachable_from_elsewhere,
)
from sidecar.runtime.bootstrap import Upstream, check_upstream_credential
from sidecar.runtime.envoy_process import DEFAULT_DRAIN_SECONDS
from sidecar.runtime.jwks_relay import run_with_jwks_relay
from sidecar.runtime.proxy import run_proxy
from sidecar.runtime.server import load_checkpoint_key, serve_until_signalled
from sidecar.runtime.workers import serve_workers_until_signalled
from sidecar.store.open import require_created

# Named in the error that refuses a TCP listen.grpc: the fix most deployments want.
DEFAULT_GRPC_LISTEN = ListenSettings().grpc


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and ``proxy`` to the top-level ``commands``."""
    serving = commands.add_parser("serve", help="run the sidecar for an Envoy you configure")
    add_setting_flags(serving)
    serving.set_defaults(func=serve)

    proxying = commands.add_parser("proxy", help="run the sidecar plus an Envoy in front of a DB")
    add_setting_flags(proxying)
    proxying.add_argument(
        "--upstream", required=True, help="vector DB URL, e.g. http://127.0.0.1:6333"
    )
    proxying.add_argument(
        "--grpc-upstream",
        help="the DB's gRPC endpoint when it is not --upstream's port, e.g. http://127.0.0.1:6334",
    )
    proxying.add_argument("--listen", required=True, help="host:port for applications to call")
    proxying.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    proxying.add_argument(
        "--drain-seconds",
        type=float,
        default=DEFAULT_DRAIN_SECONDS,
        help="on SIGTERM, how long Envoy may take to answer the requests in flight before it "
        "stops (it stops as soon as none is left)",
    )
    proxying.set_defaults(func=proxy)


def check_exposure(settings: Settings) -> None:
    """ConfigError for a ``listen.grpc`` that a process other than Envoy may reach.

    Envoy's ext_proc and ext_authz streams carry no credential of their own: the
    sidecar believes the caller that Envoy's metadata names, so whoever opens a
    stream is believed as Envoy. A unix socket admits the sidecar's user and the
    socket's group (sidecar.runtime.channel); a TCP port, loopback included (every
    process of the host reaches it), needs mTLS with a pinned client identity, or
    ``listen.expose_grpc``.
    """
    address = _address("listen.grpc", settings.listen.grpc)
    listen = settings.listen
    if isinstance(address, UnixSocket) or listen.grpc_mtls or listen.expose_grpc:
        return
    who = "other hosts" if reachable_from_elsewhere(address) else "every process of this host"
    raise ConfigError(
        f"listen.grpc {listen.grpc} is a TCP port {who} can reach, and whoever reaches it "
        f"is believed as Envoy: listen on a unix socket ({DEFAULT_GRPC_LISTEN}, the "
        "default), require Envoy's client certificate (listen.grpc_client_ca_file, "
        "listen.grpc_client_id), or set listen.expose_grpc (--expose-grpc-listen) where "
        "nothing but Envoy can connect"
    )


def check_gate_listener(settings: Settings) -> None:
    """ConfigError for a ``listen.gate`` that cannot be checked or is ``listen.grpc``.

    The Gate service's callers are applications, which must never reach Envoy's
    listener: there a stream names its own caller.
    """
    if settings.listen.gate is None:
        return
    gate = _address("listen.gate", settings.listen.gate)
    if gate == _address("listen.grpc", settings.listen.grpc):
        raise ConfigError(
            f"listen.gate {settings.listen.gate} is listen.grpc: applications that call "
            "Gate/Filter must not reach Envoy's listener, give the Gate service an address "
            "of its own (--gate-listen)"
        )


def _address(name: str, value: str) -> HostPort | UnixSocket:
    try:
        return parse_socket_address(value)
    except ValueError:
        # gRPC binds spellings this parser does not read ("0.0.0.0", "0.0.0.0:+9001",
        # "0.0.0.0: 9001"), on every interface: what cannot be checked is refused.
        raise ConfigError(
            f"{name} {value!r} is not an address the gate can check: "
            "write host:port ([v6]:port) or unix:/path"
        ) from None


def check_proxy_channel(settings: Settings) -> None:
    """ConfigError for mTLS settings of ``listen.grpc`` given to `proxy`: its own Envoy
    reaches the sidecar over a private unix socket and holds no client certificate."""
    if settings.listen.grpc_mtls:
        raise ConfigError(
            "listen.grpc_client_ca_file is for serve: proxy's own Envoy reaches the sidecar "
            "over a private unix socket and holds no client certificate; remove the "
            "listen.grpc_* TLS settings"
        )


def check_plain_http(settings: Settings) -> None:
    """ConfigError for a JWKS, bundle or OPA URL over plain ``http://`` to another host,
    unless ``policy.allow_plain_http`` is set. Loopback is this host: an OPA or a relay
    beside the sidecar needs no TLS."""
    if settings.policy.allow_plain_http:
        return
    fetched = {
        "identity.jwks": (settings.identity.jwks, "the token keys"),
        "policy.bundle": (settings.policy.bundle, "the policy"),
        "policy.opa_url": (settings.policy.opa_url, "policy decisions"),
    }
    for name, (url, what) in fetched.items():
        if url is None or not url.lower().startswith("http://"):
            continue
        try:
            endpoint = parse_http_url(url)
        except ValueError:
            continue  # named where the URL is used
        if reachable_from_elsewhere(HostPort(endpoint.host, endpoint.port)):
            raise ConfigError(
                f"{name} fetches {what} over plain http from another host: whoever "
                "is on the path can replace them. Use https://, or set "
                "policy.allow_plain_http (--allow-plain-http) where the network itself is "
                "trusted"
            )


def check_no_upstream_credential(settings: Settings) -> None:
    """ConfigError for an upstream credential given to `serve`, which would not use it.

    With `serve` the Envoy is the operator's: its credential_injector adds the
    database's credential (deploy/envoy/envoy.yaml), and the sidecar never
    reads it.
    """
    if settings.upstream.credential_file is not None:
        raise ConfigError(
            "upstream.credential_file is used by `proxy` only: with `serve`, configure your "
            "Envoy's credential_injector to add it (deploy/envoy/envoy.yaml)"
        )


def serve(args: argparse.Namespace) -> int:
    """Serve ext_proc and ext_authz until SIGINT or SIGTERM; 1 when a worker died."""
    settings = settings_from_flags(args)
    check_exposure(settings)
    check_gate_listener(settings)
    check_plain_http(settings)
    check_no_upstream_credential(settings)
    # Before any worker starts: a bad key is a start-up error, not a worker's death.
    load_checkpoint_key(settings)
    # Here, not in each worker: one line and exit 2 rather than every worker dying.
    require_created(settings.store.url)
    run = serve_until_signalled if settings.listen.workers == 1 else serve_workers_until_signalled
    # The relay runs here, once, not in each worker.
    return event_loop.run(run_with_jwks_relay(settings, run), settings.listen.event_loop)


def proxy(args: argparse.Namespace) -> int:
    """Run the sidecar and an Envoy in front of ``--upstream``; 1 when either died.

    Without ``--grpc-listen`` Envoy reaches the sidecar over a private unix
    socket (a ``listen.grpc`` in the file does not count: no one else needs it).
    """
    settings = settings_from_flags(args)
    if args.grpc_listen is not None:  # otherwise a private unix socket
        check_exposure(settings)
    check_gate_listener(settings)
    check_proxy_channel(settings)
    check_plain_http(settings)
    # Before anything starts: Envoy would refuse a missing file only once the sidecar runs.
    check_upstream_credential(settings)
    load_checkpoint_key(settings)
    try:
        listen = parse_host_port(args.listen)
        upstream = Upstream.parse(args.upstream)
        grpc_upstream = None if args.grpc_upstream is None else Upstream.parse(args.grpc_upstream)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    require_created(settings.store.url)
    return event_loop.run(
        run_proxy(
            settings,
            listen=listen,
            upstream=upstream,
            grpc_upstream=grpc_upstream,
            envoy_concurrency=args.envoy_concurrency,
            private_socket=args.grpc_listen is None,
            drain_seconds=args.drain_seconds,
        ),
        settings.listen.event_loop,
    )
