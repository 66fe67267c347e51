"""`retrieval-gate proxy`: the sidecar plus an Envoy it configures and supervises."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from sidecar.config import IdentityMode, Settings
from sidecar.runtime.addresses import HostPort
from sidecar.runtime.bootstrap import Upstream, build_bootstrap, downstream_tls
from sidecar.runtime.envoy_process import DEFAULT_DRAIN_SECONDS, EnvoyProcess
from sidecar.runtime.jwks_relay import serving_jwks_relay
from sidecar.runtime.jwt_authn import needs_generated_jwks, write_generated_jwks
from sidecar.runtime.server import Sidecar, SidecarServer
from sidecar.runtime.signals import STOPPED, StopSignals
from sidecar.runtime.workers import WorkerPool

log = logging.getLogger(__name__)


async def run_proxy(
    settings: Settings,
    *,
    listen: tuple[str, int],
    upstream: Upstream,
    grpc_upstream: Upstream | None = None,
    envoy_concurrency: int = 1,
    private_socket: bool = True,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> int:
    """Run until ``stop`` is set, SIGINT/SIGTERM arrives, or Envoy exits.

    A requested stop drains Envoy first (every client told to close, at most
    ``drain_seconds`` for the requests in flight to be answered), then stops
    Envoy, then the sidecar (whose streams have ended with their requests):
    no request in flight is reset. Envoy is tied to this process: if it is
    killed, the kernel stops Envoy too.

    gRPC calls go to ``grpc_upstream``, by default ``upstream``'s port too.
    ``ready`` is set once Envoy reports LIVE and the sidecar is serving.
    With ``private_socket`` Envoy reaches the sidecar over a unix socket in a
    private temporary directory instead of ``settings.listen.grpc``. Returns 0
    after a requested stop, 1 when Envoy or a sidecar worker died on its own.
    Both are always stopped before returning.
    """
    # Settings the listener cannot serve are refused before anything starts.
    scheme = "http" if downstream_tls(settings) is None else "https"
    with StopSignals(stop) as signals, tempfile.TemporaryDirectory(prefix="retrieval-gate-") as tmp:
        workdir = Path(tmp)
        if private_socket:
            private = replace(settings.listen, grpc=f"unix:{workdir / 'gate.sock'}")
            settings = replace(settings, listen=private)
        # Only this Envoy fetches the relayed JWKS: no port to pick, none to collide.
        identity = replace(settings.identity, jwks_relay=f"unix:{workdir / 'jwks.sock'}")
        settings = replace(settings, identity=identity)
        generated_jwks = None
        if settings.identity.mode is IdentityMode.ENVOY_JWT and needs_generated_jwks(settings):
            generated_jwks = workdir / "jwks.json"
            write_generated_jwks(settings, generated_jwks)
        async with serving_jwks_relay(settings):
            server: SidecarServer | WorkerPool = (
                SidecarServer(Sidecar.from_settings(settings))
                if settings.listen.workers == 1
                else WorkerPool(settings)
            )
            try:
                await server.start()
            except BaseException:
                await server.stop()
                raise
            envoy = EnvoyProcess(
                build_bootstrap(
                    settings,
                    listen=listen,
                    upstream=upstream,
                    grpc_upstream=grpc_upstream,
                    generated_jwks=generated_jwks,
                ),
                workdir,
                concurrency=envoy_concurrency,
                drain_seconds=drain_seconds,
            )
            stopped = False
            try:
                await envoy.start()
                log.info(
                    "proxy ready: %s://%s -> %s://%s (envoy pid %s)",
                    scheme,
                    HostPort(*listen),
                    "https" if upstream.tls else "http",
                    HostPort(upstream.host, upstream.port),
                    envoy.pid,
                )
                if ready is not None:
                    ready.set()
                exits = {"envoy": envoy.wait()}
                if isinstance(server, WorkerPool):
                    exits["a sidecar worker"] = server.wait()
                else:
                    exits["the metadata store"] = server.failure()
                code = await signals.wait(exits)
                stopped = code == STOPPED
                return code
            finally:
                if stopped:
                    log.info("draining envoy (at most %g s)", drain_seconds)
                    await envoy.drain()
                await envoy.stop()
                await server.stop()
