"""Identity through a real Envoy: jwt_authn + ext_authz + ext_proc, and sidecar-verified JWTs.

Also the request path: forged identity headers, the request policy, tenant
push-down into the Qdrant query and over-fetch without short pages. Tokens
are minted in the tests (tests.fixtures.tokens); the upstream is the fixture
server (a fake Qdrant, sidecar.demo.upstream).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.core.caller import Caller
from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.ports import free_port
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures import tokens
from tests.fixtures.harness import (
    CLI,
    GateStack,
    HttpResult,
    http,
    search_ids,
    wait_until,
    write_records,
)
from tests.fixtures.jwks_server import JwksServer
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
RECORDS = [
    record_dict("1"),
    record_dict("2", allowed_principals=["user:alice"]),
    record_dict("3", status="draft"),
    record_dict("4", tenant_id="globex"),
    record_dict("5", allowed_principals=["group:hr"]),
]
POINTS = [qb.point(i, text_for(str(i))) for i in range(1, 6)]
DRAFTS_SCOPE = "drafts:read"


def alice(**overrides: Any) -> dict[str, Any]:
    return tokens.claims(groups=["qa"], **overrides)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def rsa_key() -> tokens.KeyPair:
    return tokens.KeyPair.rsa()


# An RSA key below 2048 bits, listed in the JWKS file beside the good one: `jwt`
# mode never verifies with it, so Envoy must not either.
WEAK_KEY = tokens.KeyPair.rsa(kid="weak", bits=1024)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, rsa_key: tokens.KeyPair) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("envoy-jwt")
    jwks = workdir / "jwks.json"
    jwks.write_text(json.dumps(tokens.jwks(rsa_key, WEAK_KEY)))
    data = workdir / "policy-data.json"
    data.write_text(
        json.dumps({"retrieval_gate": {"collections": {"hr": {"tenants": ["globex"]}}}})
    )
    gate = GateStack(
        workdir,
        RECORDS,
        config={
            "identity": "envoy-jwt",
            "jwks": str(jwks),
            "issuer": tokens.ISSUER,
            "audience": tokens.AUDIENCE,
            "drafts_scope": DRAFTS_SCOPE,
            "policy_data": str(data),
            "tenant_key": "tenant_id",
            "overfetch_factor": 2,
        },
    ).start()
    gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    yield gate
    gate.stop()


def search(gate: GateStack, token: str | None, **kwargs: Any) -> HttpResult:
    headers = {**(bearer(token) if token else {}), **kwargs.pop("headers", {})}
    return gate.search(
        kwargs.pop("path", SEARCH), tenant=None, principals=None, headers=headers, **kwargs
    )


def test_valid_token_gets_its_tenant_and_principals(
    stack: GateStack, rsa_key: tokens.KeyPair
) -> None:
    response = search(stack, tokens.token(rsa_key, alice()))
    assert response.status == 200, response.body
    assert search_ids(response) == [1, 2]  # 3 draft, 4 other tenant, 5 hr only
    record = next(
        r
        for r in stack.audit_records()
        if r["decision_id"] == response.headers["x-retrieval-gate-decision-id"]
    )
    assert record["tenant"] == "acme"
    expected = Caller("acme", frozenset({"user:alice", "group:qa"})).principals_digest()
    assert record["principals_sha256"] == expected
    reasons = {r["chunk_id"]: r["reasons"] for r in record["rejected"]}
    assert reasons["3"] == ["STATUS_DRAFT"]


def _bad_tokens(key: tokens.KeyPair) -> dict[str, str | None]:
    other = tokens.KeyPair.rsa(kid=key.kid)
    return {
        "expired": tokens.token(key, alice(exp=1_000_000_000, iat=999_999_000)),
        "wrong issuer": tokens.token(key, alice(iss="https://evil.test")),
        "wrong audience": tokens.token(key, alice(aud="someone-else")),
        "bad signature": tokens.token(other, alice()),
        "tampered": tokens.tamper(tokens.token(key, alice()), tenant="globex"),
        "alg none": tokens.unsigned_token(alice()),
        # Envoy takes a token without exp as never expiring; `jwt` mode refuses it.
        "no exp": tokens.token(key, alice(exp=None)),
        "weak key": tokens.token(WEAK_KEY, alice()),
        "missing": None,
    }


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("expired", "token_expired"),
        ("wrong issuer", "issuer_mismatch"),
        ("wrong audience", "audience_mismatch"),
        ("bad signature", "signature_invalid"),
        ("tampered", "signature_invalid"),
        ("alg none", None),
        ("no exp", "token_malformed"),
        ("weak key", "key_unknown"),
        ("missing", "token_missing"),
    ],
)
# Signing with WEAK_KEY is the point of one case: PyJWT's warning about it is expected.
@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_invalid_tokens_are_401_and_never_reach_the_db(
    stack: GateStack, rsa_key: tokens.KeyPair, case: str, code: str | None
) -> None:
    stack.upstream.requests.clear()
    response = search(stack, _bad_tokens(rsa_key)[case])
    assert response.status == 401, (case, response.status, response.body)
    if code is not None:
        assert response.json() == {"error": code}
    assert stack.upstream.requests == []


def test_drafts_scope_admits_drafts(stack: GateStack, rsa_key: tokens.KeyPair) -> None:
    with_scope = tokens.token(rsa_key, alice(scope=f"openid {DRAFTS_SCOPE}"))
    assert search_ids(search(stack, with_scope)) == [1, 2, 3]
    without = tokens.token(rsa_key, alice(scope="openid"))
    assert search_ids(search(stack, without)) == [1, 2]


def test_forged_identity_headers_are_ignored_and_stripped(
    stack: GateStack, rsa_key: tokens.KeyPair
) -> None:
    stack.upstream.requests.clear()
    response = search(
        stack,
        tokens.token(rsa_key, alice()),
        headers={"x-gate-tenant": "globex", "x-gate-principals": "group:hr", "x-gate-x": "1"},
    )
    assert search_ids(response) == [1, 2]  # still acme/alice: no globex or hr chunk
    seen = stack.upstream.requests[-1].headers
    assert not [name for name in seen if name.startswith("x-gate-")]
    assert "authorization" not in seen  # the caller's token is not the DB's business


def test_request_policy_refuses_a_collection_of_another_tenant(
    stack: GateStack, rsa_key: tokens.KeyPair
) -> None:
    stack.upstream.requests.clear()
    response = search(stack, tokens.token(rsa_key, alice()), path="/collections/hr/points/search")
    assert response.status == 403
    assert response.json() == {"error": "forbidden", "reasons": ["COLLECTION_FORBIDDEN"]}
    assert stack.upstream.requests == []


def test_tenant_filter_is_pushed_down_and_merged_with_the_apps(
    stack: GateStack, rsa_key: tokens.KeyPair
) -> None:
    app_filter = {"should": [{"key": "lang", "match": {"value": "en"}}]}
    body = orjson.dumps({"vector": [0.1, 0.2], "limit": 3, "filter": app_filter})
    stack.upstream.requests.clear()
    response = search(stack, tokens.token(rsa_key, alice()), body=body)
    assert response.status == 200
    sent = orjson.loads(stack.upstream.requests[-1].body)
    assert sent["filter"] == {
        "must": [{"key": "tenant_id", "match": {"value": "acme"}}, app_filter]
    }
    assert sent["limit"] == 6  # over-fetch factor 2
    assert int(stack.upstream.requests[-1].headers["content-length"]) == len(
        stack.upstream.requests[-1].body
    )


def test_overfetch_returns_k_admitted_hits_when_they_exist(tmp_path: Path) -> None:
    records = [record_dict(str(i)) for i in range(1, 11)]
    for i in (2, 3, 4):  # three of the first five are rejected
        records[i - 1] = record_dict(str(i), status="revoked")
    gate = GateStack(
        tmp_path, records, config={"overfetch_factor": 2, "tenant_key": "tenant_id"}
    ).start()
    try:
        ten = [qb.point(i, text_for(str(i)), score=1 - i / 100) for i in range(1, 11)]
        gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(ten))))
        response = gate.search(SEARCH, body=b'{"vector":[0.1],"limit":5}')
        assert search_ids(response) == [1, 5, 6, 7, 8]
        assert orjson.loads(gate.upstream.requests[-1].body)["limit"] == 10
        record = gate.audit_records()[-1]
        assert record["tenant_filter"] is True and record["overfetched"] is True
    finally:
        gate.stop()


@pytest.mark.parametrize("kind", ["RS256", "ES256", "HS256"])
def test_sidecar_verified_jwt(tmp_path: Path, kind: str) -> None:
    config: dict[str, Any] = {
        "identity": "jwt",
        "issuer": tokens.ISSUER,
        "audience": tokens.AUDIENCE,
    }
    signer: tokens.KeyPair | bytes
    if kind == "HS256":
        signer = tokens.hmac_secret()
        (tmp_path / "secret").write_bytes(signer)
        config["jwt_hmac_secret_file"] = str(tmp_path / "secret")
    else:
        signer = tokens.KeyPair.rsa() if kind == "RS256" else tokens.KeyPair.ec()
        (tmp_path / "jwks.json").write_text(json.dumps(tokens.jwks(signer)))
        config["jwks"] = str(tmp_path / "jwks.json")
    gate = GateStack(tmp_path, RECORDS, config=config).start()
    try:
        gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
        good = search(gate, tokens.token(signer, alice()))
        assert good.status == 200 and search_ids(good) == [1, 2]
        expired = search(gate, tokens.token(signer, alice(exp=1_000_000_000, iat=999_999_000)))
        assert expired.status == 401 and expired.json() == {"error": "token_expired"}
        assert search(gate, tokens.unsigned_token(alice())).json() == {
            "error": "algorithm_not_allowed"
        }
        assert search(gate, None).json() == {"error": "token_missing"}
    finally:
        gate.stop()


def test_overfetch_audit_record_names_only_what_was_released(tmp_path: Path) -> None:
    records = [record_dict(str(i)) for i in range(1, 11)]
    gate = GateStack(tmp_path, records, config={"overfetch_factor": 2}).start()
    try:
        ten = [qb.point(i, text_for(str(i)), score=1 - i / 100) for i in range(1, 11)]
        gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(ten))))
        response = gate.search(SEARCH, body=b'{"vector":[0.1],"limit":3}')
        assert search_ids(response) == [1, 2, 3]
        assert response.headers["x-retrieval-gate-admitted"] == "3"
        record = gate.audit_records()[-1]
        assert record["released"] == ["1", "2", "3"]
        assert len(record["admitted"]) == 10  # what the policy admitted, before trimming
    finally:
        gate.stop()


def _ext_authz_in_front(bootstrap: dict[str, Any]) -> None:
    """What a mesh that admits requests with ext_authz puts before the ext_proc filter."""
    listener = bootstrap["static_resources"]["listeners"][0]
    filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    ext_proc = next(f for f in filters if f["name"] == "envoy.filters.http.ext_proc")
    ext_authz = {
        "name": "envoy.filters.http.ext_authz",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
            "transport_api_version": "V3",
            "grpc_service": ext_proc["typed_config"]["grpc_service"],
            "failure_mode_allow": False,
            "status_on_error": {"code": "ServiceUnavailable"},
        },
    }
    filters.insert(filters.index(ext_proc), ext_authz)


@pytest.fixture(scope="module")
def authz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("ext-authz"), RECORDS, edit_bootstrap=_ext_authz_in_front
    ).start()
    yield gate
    gate.stop()


def test_a_mesh_ext_authz_in_front_admits_and_ext_proc_filters(authz_stack: GateStack) -> None:
    authz_stack.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    response = authz_stack.search(SEARCH, tenant="acme", principals="group:qa")
    assert response.status == 200, response.body
    assert [hit["id"] for hit in response.json()["result"]] == [1]
    assert authz_stack.envoy_stat("http.retrieval_gate.ext_authz.ok") == 1
    # ext_authz stripped the identity headers; the upstream never saw them.
    seen = authz_stack.upstream.requests[-1].headers
    assert "x-gate-tenant" not in seen and "x-gate-principals" not in seen


def test_a_mesh_ext_authz_in_front_refuses_before_the_stream(authz_stack: GateStack) -> None:
    before = len(authz_stack.upstream.requests)
    response = authz_stack.search(SEARCH, tenant=None)
    assert response.status == 401
    assert response.json() == {"error": "identity_missing"}
    assert authz_stack.envoy_stat("http.retrieval_gate.ext_authz.denied") == 1
    assert len(authz_stack.upstream.requests) == before


# --- A JWKS URL: Envoy verifies with the keys `jwt` mode accepts, and nothing else ---------------
#
# The provider publishes an RSA-1024 key beside an RSA-2048 one. In envoy-jwt mode
# Envoy fetches the set from the sidecar's relay, which fetches the URL with jwt
# mode's code and passes on only the keys that mode would use.

URL_STRONG = tokens.KeyPair.rsa(kid="url-strong")
URL_WEAK = tokens.KeyPair.rsa(kid="url-weak", bits=1024)


def _url_stack(workdir: Path, identity: str, jwks_url: str, **config: Any) -> GateStack:
    return GateStack(
        workdir,
        RECORDS,
        config={
            "identity": identity,
            "jwks": jwks_url,
            "jwks_relay": f"127.0.0.1:{free_port()}",
            "issuer": tokens.ISSUER,
            "audience": tokens.AUDIENCE,
            "tenant_key": "tenant_id",
            **config,
        },
    ).start()


@pytest.fixture(scope="module")
def url_stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, GateStack]]:
    provider = JwksServer(tokens.jwks(URL_WEAK, URL_STRONG))
    stacks: dict[str, GateStack] = {}
    try:
        for identity in ("envoy-jwt", "jwt"):
            stacks[identity] = _url_stack(
                tmp_path_factory.mktemp(f"url-{identity}"), identity, provider.url
            )
            stacks[identity].upstream.respond(
                "POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS)))
            )
        yield stacks
    finally:
        for gate in stacks.values():
            gate.stop()
        provider.stop()


def _outcome(gate: GateStack, token: str) -> tuple[int, Any]:
    gate.upstream.requests.clear()
    response = search(gate, token)
    assert (response.status == 200) == bool(gate.upstream.requests)  # refused: DB never called
    return response.status, response.json()


@pytest.mark.parametrize(
    ("case", "status", "answer"),
    [
        ("RSA-2048 key", 200, [1, 2]),
        ("RSA-1024 key", 401, {"error": "key_unknown"}),
        ("RSA-1024 key under the 2048 key's kid", 401, {"error": "signature_invalid"}),
    ],
)
@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_a_jwks_url_key_below_2048_bits_is_refused_in_both_modes(
    url_stacks: dict[str, GateStack], case: str, status: int, answer: Any
) -> None:
    signed = {
        "RSA-2048 key": tokens.token(URL_STRONG, alice()),
        "RSA-1024 key": tokens.token(URL_WEAK, alice()),
        "RSA-1024 key under the 2048 key's kid": tokens.token(
            URL_WEAK, alice(), headers={"kid": URL_STRONG.kid}
        ),
    }[case]
    outcomes = {identity: _outcome(gate, signed) for identity, gate in url_stacks.items()}
    if status == 200:
        outcomes = {
            k: (code, [hit["id"] for hit in body["result"]]) for k, (code, body) in outcomes.items()
        }
    assert outcomes == {"envoy-jwt": (status, answer), "jwt": (status, answer)}


def test_the_relay_logs_the_dropped_key_by_kid_and_reason_never_the_key(
    url_stacks: dict[str, GateStack],
) -> None:
    log = (url_stacks["envoy-jwt"].workdir / "sidecar.log").read_text()
    assert "(kid 'url-weak') left out: RSA key of 1024 bits (at least 2048 required)" in log
    assert URL_WEAK.public_jwk()["n"] not in log and URL_STRONG.public_jwk()["n"] not in log


def test_a_jwks_url_unreachable_at_start_fails_closed_in_both_modes(tmp_path: Path) -> None:
    port = free_port()
    jwks_url = f"http://127.0.0.1:{port}/jwks.json"
    stacks: dict[str, GateStack] = {}
    provider: JwksServer | None = None
    try:
        for identity, workers in (("envoy-jwt", 2), ("jwt", 1)):
            # envoy-jwt with two workers: the relay runs once, in the parent.
            workdir = tmp_path / identity
            workdir.mkdir()
            stacks[identity] = _url_stack(workdir, identity, jwks_url, workers=workers)
        for gate in stacks.values():
            gate.upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
        signed = tokens.token(URL_STRONG, alice())
        unavailable = (503, {"error": "jwks_unavailable"})
        assert {k: _outcome(g, signed) for k, g in stacks.items()} == {
            "envoy-jwt": unavailable,
            "jwt": unavailable,
        }
        # Once the provider answers, both modes admit the token: no failure was cached.
        provider = JwksServer(tokens.jwks(URL_WEAK, URL_STRONG), port=port)
        assert {k: _outcome(g, signed)[0] for k, g in stacks.items()} == {
            "envoy-jwt": 200,
            "jwt": 200,
        }
    finally:
        for gate in stacks.values():
            gate.stop()
        if provider is not None:
            provider.stop()


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_proxy_relays_a_jwks_url_to_its_envoy(tmp_path: Path) -> None:
    """`retrieval-gate proxy` serves the relay on a private unix socket to the Envoy it runs."""
    provider = JwksServer(tokens.jwks(URL_WEAK, URL_STRONG))
    store = new_sqlite_url(tmp_path / "gate.db")
    chunks = write_records(tmp_path / "chunks.jsonl", RECORDS)
    subprocess.run([*CLI, "store", "load", "--store", store, str(chunks)], check=True)
    upstream = FixtureUpstream().start()
    upstream.respond("POST", SEARCH, CannedResponse(qb.encode(qb.search_body(POINTS))))
    port = free_port()
    log_path = tmp_path / "proxy.log"
    with log_path.open("wb") as log:
        proxy = subprocess.Popen(
            [
                *CLI,
                "proxy",
                *("--upstream", upstream.url, "--listen", f"127.0.0.1:{port}"),
                *("--store", store, "--identity", "envoy-jwt", "--jwks", provider.url),
                *("--issuer", tokens.ISSUER, "--audience", tokens.AUDIENCE),
                *("--tenant-key", "tenant_id"),
            ],
            stdout=log,
            stderr=log,
        )
    try:
        assert wait_until(
            lambda: b"proxy ready" in log_path.read_bytes() or proxy.poll() is not None
        )
        assert proxy.poll() is None, log_path.read_text()
        url = f"http://127.0.0.1:{port}{SEARCH}"
        body = b'{"vector":[0.1],"limit":10}'

        def status(key: tokens.KeyPair) -> int:
            return http("POST", url, body, bearer(tokens.token(key, alice()))).status

        assert (status(URL_STRONG), status(URL_WEAK)) == (200, 401)
        assert "jwks-relay" in log_path.read_text()  # the relay's unix socket, not a port
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(timeout=20)
        upstream.stop()
        provider.stop()
