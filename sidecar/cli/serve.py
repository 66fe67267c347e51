"""`retrieval-gate serve` and `retrieval-gate proxy`: run the sidecar."""

from __future__ import annotations

import argparse

from sidecar.cli.flags import add_setting_flags, settings_from_flags
from sidecar.config import ConfigError, Settings
from sidecar.runtime import event_loop
from sidecar.runtime.addresses import (
    HostPort,
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
    """ConfigError for a ``listen.grpc`` other hosts can reach without ``listen.expose_grpc``.

    Envoy's ext_proc and ext_authz streams carry no credential of their own: the
    sidecar believes the caller that Envoy's ext_authz metadata names, so any peer
    that reaches the listener is believed as Envoy.
    """
    try:
        address = parse_socket_address(settings.listen.grpc)
    except ValueError:
        # gRPC binds spellings this parser does not read ("0.0.0.0", "0.0.0.0:+9001",
        # "0.0.0.0: 9001"), on every interface: what cannot be checked is refused.
        raise ConfigError(
            f"listen.grpc {settings.listen.grpc!r} is not an address the gate can check: "
            "write host:port ([v6]:port) or unix:/path"
        ) from None
    if reachable_from_elsewhere(address) and not settings.listen.expose_grpc:
        raise ConfigError(
            f"listen.grpc {settings.listen.grpc} can be reached from other hosts, and whoever "
            "reaches it is believed as Envoy: listen on loopback or a unix socket, or set "
            "listen.expose_grpc (--expose-grpc-listen) where a network policy admits Envoy alone"
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
    check_plain_http(settings)
    check_no_upstream_credential(settings)
    # Before any worker starts: a bad key is a start-up error, not a worker's death.
    load_checkpoint_key(settings)
    run = serve_until_signalled if settings.listen.workers == 1 else serve_workers_until_signalled
    # The relay runs here, once, not in each worker.
    return event_loop.run(run_with_jwks_relay(settings, run), settings.listen.event_loop)


def proxy(args: argparse.Namespace) -> int:
    """Run the sidecar and an Envoy in front of ``--upstream``; 1 when either died.

    Without ``--grpc-listen`` Envoy reaches the sidecar over a private unix
    socket (a ``listen.grpc`` in the file does not count: no one else needs it).
    """
    settings = settings_from_flags(args)
    check_exposure(settings)
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
