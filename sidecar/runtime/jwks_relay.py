"""The JWKS relay: with a JWKS URL, Envoy verifies only with keys the sidecar accepts.

In `envoy-jwt` mode Envoy's jwt_authn verifies the tokens. Pointed at the
identity provider's JWKS URL it would verify with whatever the URL publishes,
an RSA-1024 key included, which `jwt` mode refuses. So Envoy is pointed at the
sidecar instead: the relay fetches the URL with `jwt` mode's own code
(``JwksUrl``: 2 s timeout, 300 s refresh, the last good set kept while the
provider is unreachable, each key checked and a dropped one logged by kid and
reason) and serves the keys it accepted, rebuilt as a JWKS
(``sidecar.identity.publish``), to Envoy's ``remote_jwks`` over loopback HTTP
or a unix socket. While no fetch has ever succeeded it answers 503; Envoy
then records "Jwks remote fetch is failed" and the sidecar refuses the
request with 503 ``jwks_unavailable``, exactly as `jwt` mode does.

Why not a file that Envoy reloads: Envoy 1.40's jwt_authn reads
``local_jwks`` once when the configuration loads (a ``watched_directory`` is
accepted and ignored; measured) and refuses to start on a set without a
usable key, so neither a rotated key nor an unreachable provider could be
followed without restarting Envoy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson

from sidecar.config import ConfigError, IdentityMode, Settings
from sidecar.core.caller import IdentityError
from sidecar.identity.keys import JwksUrl, is_jwks_url
from sidecar.identity.publish import public_jwks
from sidecar.runtime.addresses import HostPort, UnixSocket, parse_socket_address
from sidecar.runtime.channel import ListenError

log = logging.getLogger(__name__)

RELAY_PATH = "/jwks.json"
# Envoy's JWKS fetch is a GET with a few headers; anything larger is not it.
_MAX_HEAD_BYTES = 8192
_READ_TIMEOUT_SECONDS = 5.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
_UNAVAILABLE = (503, orjson.dumps({"error": "jwks_unavailable"}))


def relay_address(settings: Settings) -> HostPort | UnixSocket | None:
    """Where the relay serves (``jwks_relay``), or None when Envoy needs no relay.

    Only `envoy-jwt` with a JWKS URL needs one. A TCP address must be a
    loopback IP: the set is for the Envoy next to the sidecar, and a name
    could resolve elsewhere. Raises ConfigError otherwise.
    """
    if settings.identity.mode is not IdentityMode.ENVOY_JWT or not is_jwks_url(
        settings.identity.jwks
    ):
        return None
    try:
        address = parse_socket_address(settings.identity.jwks_relay)
        if isinstance(address, HostPort) and not ipaddress.ip_address(address.host).is_loopback:
            raise ValueError(f"not a loopback address: {settings.identity.jwks_relay!r}")
    except ValueError as exc:
        raise ConfigError(f"setting 'jwks_relay' (loopback ip:port or unix:/path): {exc}") from None
    return address


def relay_url(address: HostPort | UnixSocket) -> str:
    """The URL Envoy fetches the relayed set from (over a unix socket the host is a name only)."""
    host = "jwks-relay" if isinstance(address, UnixSocket) else str(address)
    return f"http://{host}{RELAY_PATH}"


class JwksRelay:
    """Serves a JWKS URL's keys, as the sidecar's loader accepts them, at ``RELAY_PATH``."""

    def __init__(self, source: JwksUrl, address: HostPort | UnixSocket) -> None:
        self._source = source
        self._address = address
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; ListenError when the address is taken."""
        try:
            if isinstance(self._address, UnixSocket):
                _remove_stale_socket(self._address.path)
                self._server = await asyncio.start_unix_server(
                    self._respond, self._address.path, limit=_MAX_HEAD_BYTES
                )
            else:
                host, port = self._address
                self._server = await asyncio.start_server(
                    self._respond, host, port, limit=_MAX_HEAD_BYTES
                )
        except OSError as exc:
            raise ListenError(f"JWKS relay cannot listen on {self._address}: {exc}") from None
        log.info("JWKS relay for Envoy on %s", relay_url(self._address))

    async def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def document(self) -> tuple[int, bytes]:
        """The status and body Envoy gets: 200 and the accepted keys, or 503 without any."""
        try:
            keys = await self._source.keys()
        except IdentityError:
            return _UNAVAILABLE
        return 200, orjson.dumps(public_jwks(keys))

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_SECONDS)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            status, body = await self._answer(head.split(b"\r\n", 1)[0])
            writer.write(
                f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\ncache-control: no-store\r\n"
                "connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass  # Envoy gave up (its fetch timeout); it fetches again later.
        finally:
            writer.close()

    async def _answer(self, request_line: bytes) -> tuple[int, bytes]:
        parts = request_line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, b"{}"
        method, target, _ = parts
        if target.split(b"?", 1)[0] != RELAY_PATH.encode():
            return 404, b"{}"
        if method != b"GET":
            return 405, b"{}"
        return await self.document()


def _remove_stale_socket(path: str) -> None:
    """Remove a socket left by a previous run (never a file of another kind)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)


@contextlib.asynccontextmanager
async def serving_jwks_relay(settings: Settings) -> AsyncIterator[None]:
    """Run the relay (when the settings need one) for the duration of the block."""
    address = relay_address(settings)
    if address is None:
        yield
        return
    assert settings.identity.jwks is not None  # relay_address: a JWKS URL
    relay = JwksRelay(JwksUrl(settings.identity.jwks), address)
    await relay.start()
    try:
        yield
    finally:
        await relay.stop()


async def run_with_jwks_relay(settings: Settings, run: Callable[[Settings], Awaitable[int]]) -> int:
    """``run(settings)`` with the relay serving beside it (`serve`: once, for every worker)."""
    async with serving_jwks_relay(settings):
        return await run(settings)
