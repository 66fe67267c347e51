"""The JWKS relay (envoy-jwt with a JWKS URL): Envoy gets only the keys `jwt` mode would use.

Unit level: what the relay publishes for a provider's set, how it answers
over HTTP, where it may listen and how the Envoy bootstrap points at it.
Through a real Envoy: tests/envoy/test_envoy_identity.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import ConfigError, IdentityMode, Settings
from sidecar.identity.keys import JwksFile, JwksUrl, VerificationKey, verification_key
from sidecar.identity.publish import public_jwks
from sidecar.runtime.addresses import HostPort, UnixSocket
from sidecar.runtime.bootstrap import Upstream, build_bootstrap
from sidecar.runtime.jwks_relay import (
    RELAY_PATH,
    JwksRelay,
    relay_address,
    serving_jwks_relay,
)
from sidecar.runtime.ports import free_port
from tests.fixtures.jwks_server import JwksServer
from tests.fixtures.settings import settings_of
from tests.fixtures.tokens import KeyPair, hmac_secret, jwks

# Envoy cannot take an RSA-1024 key from the sidecar unless a test signs with one.
pytestmark = pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")

STRONG = KeyPair.rsa("strong")
WEAK = KeyPair.rsa("weak", bits=1024)
IDP = "https://idp.example/.well-known/jwks.json"


@pytest.fixture
def provider() -> Iterator[JwksServer]:
    server = JwksServer(jwks(WEAK, STRONG))
    yield server
    server.stop()


def envoy_jwt(jwks_url: str = IDP, **options: Any) -> Settings:
    return settings_of(
        identity=IdentityMode.ENVOY_JWT,
        jwks=jwks_url,
        issuer="https://issuer.test",
        audience="gate",
        **options,
    )


def load(document: dict[str, Any], tmp_path: Path) -> tuple[VerificationKey, ...]:
    path = tmp_path / "published.json"
    path.write_text(json.dumps(document))
    return JwksFile(path).keys


# --- what is published ---------------------------------------------------------------------------


def test_the_relay_publishes_only_the_keys_the_loader_accepts(
    provider: JwksServer, caplog: pytest.LogCaptureFixture
) -> None:
    relay = JwksRelay(JwksUrl(provider.url), HostPort("127.0.0.1", 0))
    status, body = asyncio.run(relay.document())
    assert status == 200
    published = json.loads(body)["keys"]
    assert [jwk["kid"] for jwk in published] == ["strong"]
    assert published[0]["n"] == STRONG.public_jwk()["n"]
    # Dropped by kid and reason, key material never logged.
    assert "(kid 'weak') left out: RSA key of 1024 bits (at least 2048 required)" in caplog.text
    assert WEAK.public_jwk()["n"] not in caplog.text


def test_members_the_loader_does_not_read_are_not_relayed(provider: JwksServer) -> None:
    provider.document = jwks(STRONG.public_jwk(x5u="https://evil.test/cert", extra="x"))
    status, body = asyncio.run(
        JwksRelay(JwksUrl(provider.url), HostPort("127.0.0.1", 0)).document()
    )
    assert status == 200
    (published,) = json.loads(body)["keys"]
    assert set(published) <= {"kty", "n", "e", "kid", "key_ops"}


def test_without_any_fetched_set_the_relay_answers_503(provider: JwksServer) -> None:
    provider.status = 500
    relay = JwksRelay(JwksUrl(provider.url), HostPort("127.0.0.1", 0))
    assert asyncio.run(relay.document()) == (503, b'{"error":"jwks_unavailable"}')
    provider.status = 200
    provider.document = jwks(WEAK)  # reachable, but nothing jwt mode would use
    assert asyncio.run(relay.document())[0] == 503


def test_the_relay_follows_jwt_modes_cache_rules(provider: JwksServer) -> None:
    now = [1000.0]
    relay = JwksRelay(JwksUrl(provider.url, clock=lambda: now[0]), HostPort("127.0.0.1", 0))

    async def kids() -> list[str]:
        status, body = await relay.document()
        assert status == 200
        return [jwk["kid"] for jwk in json.loads(body)["keys"]]

    async def scenario() -> None:
        assert await kids() == ["strong"]
        provider.document = jwks(STRONG, KeyPair.ec("rotated"))
        now[0] += 299
        assert await kids() == ["strong"]  # cached (300 s)
        now[0] += 1
        assert await kids() == ["strong", "rotated"]
        provider.stop()
        now[0] += 3600
        assert await kids() == ["strong", "rotated"]  # the last good set is kept

    asyncio.run(scenario())
    assert provider.fetches == 2


def _hmac_key(size: int) -> VerificationKey:
    key = verification_key(hmac_secret(size), "h")
    assert key is not None
    return key


def test_an_hmac_secret_too_short_for_hs512_is_published_for_its_algorithms_only() -> None:
    published = public_jwks([_hmac_key(48)])["keys"]
    assert [jwk.get("alg") for jwk in published] == ["HS256", "HS384"]
    assert len({jwk["k"] for jwk in published}) == 1
    # Long enough for every HS algorithm: one entry, no alg (Envoy allows all three).
    assert [jwk.get("alg") for jwk in public_jwks([_hmac_key(64)])["keys"]] == [None]


@settings(max_examples=25, deadline=None)
@given(
    choice=st.sampled_from(
        [
            STRONG.public_jwk(),
            STRONG.public_jwk(alg="PS384"),
            KeyPair.ec("p384", curve="P-384").public_jwk(),
            KeyPair.ed25519().public_jwk(),
            {"kty": "oct", "kid": "h", "k": base64.urlsafe_b64encode(b"k" * 40).decode()},
        ]
    ),
)
def test_publishing_keeps_each_key_to_its_algorithms(choice: dict[str, Any]) -> None:
    """Loading the published set gives each key exactly the algorithms it had."""
    with tempfile.TemporaryDirectory() as tmp:
        original = load({"keys": [choice]}, Path(tmp))
        again = load(public_jwks(original), Path(tmp))
    merged: dict[str | None, set[str]] = {}
    for key in again:
        merged.setdefault(key.kid, set()).update(key.algorithms)
    assert merged == {key.kid: set(key.algorithms) for key in original}


# --- over HTTP -----------------------------------------------------------------------------------


async def _exchange(address: HostPort | UnixSocket, request: bytes) -> tuple[int, bytes]:
    if isinstance(address, UnixSocket):
        reader, writer = await asyncio.open_unix_connection(address.path)
    else:
        reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(request)
    await writer.drain()
    raw = await reader.read()
    writer.close()
    if not raw:
        return 0, b""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def _get(path: str = RELAY_PATH, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: jwks-relay\r\n\r\n".encode()


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_the_relay_serves_over_http(provider: JwksServer, tmp_path: Path, kind: str) -> None:
    address: HostPort | UnixSocket = (
        HostPort("127.0.0.1", free_port())
        if kind == "tcp"
        else UnixSocket(str(tmp_path / "j.sock"))
    )
    relay = JwksRelay(JwksUrl(provider.url), address)

    async def scenario() -> list[tuple[int, bytes]]:
        await relay.start()
        try:
            return [
                await _exchange(address, _get()),
                await _exchange(address, _get(RELAY_PATH + "?x=1")),
                await _exchange(address, _get("/other")),
                await _exchange(address, _get(method="POST")),
                await _exchange(address, b"nonsense\r\n\r\n"),
                await _exchange(address, b"GET /jwks.json HTTP/1.1\r\nx: " + b"a" * 9000),
            ]
        finally:
            await relay.stop()

    ok, query, other, post, garbage, oversized = asyncio.run(scenario())
    assert ok[0] == 200 and [k["kid"] for k in json.loads(ok[1])["keys"]] == ["strong"]
    assert query[0] == 200
    assert (other[0], post[0], garbage[0]) == (404, 405, 400)
    assert oversized == (0, b"")  # not Envoy's fetch: closed unanswered


def test_a_stale_unix_socket_is_replaced_but_no_other_file(
    provider: JwksServer, tmp_path: Path
) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as leftover:
        leftover.bind(str(stale))
    regular = tmp_path / "regular"
    regular.write_text("keep me")

    async def start(path: Path) -> None:
        relay = JwksRelay(JwksUrl(provider.url), UnixSocket(str(path)))
        await relay.start()
        await relay.stop()

    asyncio.run(start(stale))
    with pytest.raises(OSError, match="JWKS relay cannot listen"):
        asyncio.run(start(regular))
    assert regular.read_text() == "keep me"


def test_serving_needs_a_relay_only_for_envoy_jwt_with_a_url(provider: JwksServer) -> None:
    port = free_port()

    async def status(options: Settings) -> int:
        async with serving_jwks_relay(options):
            try:
                return (await _exchange(HostPort("127.0.0.1", port), _get()))[0]
            except OSError:
                return -1  # nothing listens

    assert asyncio.run(status(envoy_jwt(provider.url, jwks_relay=f"127.0.0.1:{port}"))) == 200
    jwt_mode = settings_of(
        identity=IdentityMode.JWT, jwks=provider.url, jwks_relay=f"127.0.0.1:{port}"
    )
    assert asyncio.run(status(jwt_mode)) == -1


# --- where it listens, and Envoy's configuration -------------------------------------------------


@pytest.mark.parametrize(
    ("relay", "expected"),
    [
        ("127.0.0.1:9902", HostPort("127.0.0.1", 9902)),
        ("127.8.0.1:1", HostPort("127.8.0.1", 1)),
        ("[::1]:9902", HostPort("::1", 9902)),
        ("unix:/run/gate/jwks.sock", UnixSocket("/run/gate/jwks.sock")),
    ],
)
def test_relay_addresses(relay: str, expected: HostPort | UnixSocket) -> None:
    assert relay_address(envoy_jwt(jwks_relay=relay)) == expected


@pytest.mark.parametrize(
    "relay", ["0.0.0.0:9902", "10.0.0.5:9902", "[::]:9902", "localhost:9902", "9902", "x:y"]
)
def test_the_relay_listens_on_loopback_only(relay: str) -> None:
    with pytest.raises(ConfigError, match="jwks_relay"):
        relay_address(envoy_jwt(jwks_relay=relay))


def test_no_relay_without_a_jwks_url(tmp_path: Path) -> None:
    assert relay_address(envoy_jwt(str(tmp_path / "jwks.json"))) is None
    assert relay_address(settings_of(identity=IdentityMode.JWT, jwks=IDP)) is None


@pytest.mark.parametrize(
    ("relay", "address", "host"),
    [
        ("127.0.0.1:9902", {"socket_address": {"address": "127.0.0.1", "port_value": 9902}}, None),
        ("unix:/run/j.sock", {"pipe": {"path": "/run/j.sock"}}, "jwks-relay"),
    ],
)
def test_envoy_fetches_a_jwks_url_through_the_relay_only(
    relay: str, address: dict[str, Any], host: str | None
) -> None:
    bootstrap = build_bootstrap(
        envoy_jwt(jwks_relay=relay),
        listen=("127.0.0.1", 16335),
        upstream=Upstream.parse("http://127.0.0.1:6333"),
    )
    hcm = bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    jwt_authn = hcm["typed_config"]["http_filters"][0]["typed_config"]
    remote = jwt_authn["providers"]["retrieval_gate"]["remote_jwks"]
    assert remote["http_uri"]["uri"] == f"http://{host or relay}{RELAY_PATH}"
    (cluster,) = [
        c
        for c in bootstrap["static_resources"]["clusters"]
        if c["name"] == remote["http_uri"]["cluster"]
    ]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"] == address
    assert "idp.example" not in json.dumps(bootstrap)  # Envoy never reaches the provider
