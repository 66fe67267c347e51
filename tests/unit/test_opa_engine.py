"""OpaEngine and OpaRequestPolicy against a FAKE OPA (tests/fixtures/fake_opa.py).

No OPA binary runs here: these tests check the HTTP path to OPA's Data API
(one batched call, the token, the timeout, no retry once a request was sent)
and that every failure is a PolicyError, never an answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import ConfigError, PolicyEngineName, default_policy_dir, load_settings
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.integrity import canonical_sha256
from sidecar.core.policy import PolicyEngine, PolicyError
from sidecar.core.reasons import Reason
from sidecar.rego.opa_engine import OpaEngine, OpaRequestPolicy, OpaServer, read_token_file
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.request_policy import RequestPolicy
from sidecar.runtime.ports import free_port
from sidecar.runtime.server import build_policies
from tests.fixtures.fake_opa import FakeOpa, Misbehaviour
from tests.fixtures.policy_inputs import CALLER, HOUR, NOW, make_chunk, make_input
from tests.fixtures.records import chunk_record, text_for

SECRET_TENANT = "tenant-that-must-not-be-logged"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpa]:
    opa = FakeOpa().start()
    yield opa
    opa.stop()


@pytest.fixture(autouse=True)
def well_behaved(fake: FakeOpa) -> Iterator[None]:
    fake.behave()
    fake.calls.clear()
    yield
    fake.behave()


@pytest.fixture
def opa(fake: FakeOpa) -> OpaEngine:
    return OpaEngine(OpaServer(fake.url, timeout_seconds=0.3))


@pytest.fixture(scope="module")
def regorus_engine() -> RegorusEngine:
    return RegorusEngine.from_directory(default_policy_dir())


MIXED = make_input(
    make_chunk("ok"),
    make_chunk("other-tenant", tenant_id="globex"),
    make_chunk("draft", status="draft"),
    make_chunk("expired", expires_at_ns=NOW - HOUR, effective_at_ns=NOW - 2 * HOUR),
    make_chunk("early", effective_at_ns=NOW + 1),
    make_chunk("nobody", allowed_principals=[]),
)


def test_satisfies_the_policy_engine_protocol(opa: OpaEngine) -> None:
    engine: PolicyEngine = opa
    assert engine.version.startswith("opa:http://127.0.0.1:")
    assert engine.version.endswith("#data.retrieval_gate.chunks.reasons")
    # The gate cannot see OPA's policy change: no verdict may be cached.
    assert opa.time_pure is False


def test_a_batch_is_one_call_with_the_whole_input(
    opa: OpaEngine, fake: FakeOpa, regorus_engine: RegorusEngine
) -> None:
    assert opa.evaluate(MIXED) == regorus_engine.evaluate(MIXED)
    assert len(fake.calls) == 1
    call = fake.calls[0]
    assert call.path == "retrieval_gate/chunks/reasons"
    # Nanosecond integers arrive exactly (beyond 2^53).
    assert call.input == MIXED


def test_the_gate_over_opa_decides_like_the_gate_over_regorus(
    opa: OpaEngine, fake: FakeOpa, regorus_engine: RegorusEngine
) -> None:
    records = {
        "a": chunk_record("a", allowed_principals=("group:qa",)),
        "b": chunk_record("b", allowed_principals=("group:hr",)),
        "c": chunk_record("c", tenant_id="globex", allowed_principals=("group:qa",)),
    }
    records = {k: _with_text_hash(r) for k, r in records.items()}
    candidates = [Candidate(i, cid, text_for(cid)) for i, cid in enumerate(records)]
    caller = Caller("acme", frozenset({"group:qa"}))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    over_opa = DecisionCore(opa).decide(caller, candidates, records, (), now)
    over_regorus = DecisionCore(regorus_engine, verdict_cache_size=0).decide(
        caller, candidates, records, (), now
    )
    assert [d.reasons for d in over_opa.decisions] == [d.reasons for d in over_regorus.decisions]
    assert over_opa.decisions[0].admitted
    assert not over_opa.policy_failed
    assert len(fake.calls) == 1


def test_the_request_policy_asks_opa_for_denials(fake: FakeOpa) -> None:
    request_policy = OpaRequestPolicy(OpaServer(fake.url, timeout_seconds=0.3))
    local = RequestPolicy.from_directory(default_policy_dir())
    for route_kind in ("filtered", "write", None, "bogus"):
        document = {
            "caller": CALLER,
            "method": "POST",
            "path": "/collections/sops/points",
            "collections": ["sops"],
            "route_kind": route_kind,
        }
        assert request_policy.evaluate(document) == local.evaluate(document)
    assert {c.path for c in fake.calls} == {"retrieval_gate/request/denials"}


@pytest.mark.parametrize("how", [m for m in Misbehaviour if m is not Misbehaviour.SLOW])
def test_garbage_from_opa_is_a_policy_error_sent_once(
    opa: OpaEngine, fake: FakeOpa, how: Misbehaviour
) -> None:
    fake.misbehave(how)
    with pytest.raises(PolicyError):
        opa.evaluate(MIXED)
    # Only connection errors are retried: a request OPA received is never sent twice.
    assert len(fake.calls) == 1


@pytest.mark.parametrize("how", [m for m in Misbehaviour if m is not Misbehaviour.SLOW])
def test_garbage_for_the_request_policy_never_allows(fake: FakeOpa, how: Misbehaviour) -> None:
    request_policy = OpaRequestPolicy(OpaServer(fake.url, timeout_seconds=0.3))
    document = {"caller": CALLER, "method": "GET", "path": "/", "collections": []}
    document["route_kind"] = "read"
    assert request_policy.evaluate(document) == []  # allowed when OPA behaves
    fake.misbehave(how)
    try:
        denials = request_policy.evaluate(document)
    except PolicyError:
        return
    # An array of strings is a well-formed answer: its strings are the denials.
    assert how is Misbehaviour.WRONG_SHAPE
    assert denials == ["not", "an", "object"]


def test_an_empty_batch_needs_no_entries_but_a_full_one_does(opa: OpaEngine, fake: FakeOpa) -> None:
    fake.misbehave(Misbehaviour.NO_ENTRIES)
    assert opa.evaluate(make_input()) == {}
    with pytest.raises(PolicyError, match="1 chunk ids missing"):
        opa.evaluate(make_input(make_chunk("c1")))


def test_a_slow_opa_is_a_policy_error_within_the_timeout(opa: OpaEngine, fake: FakeOpa) -> None:
    fake.misbehave(Misbehaviour.SLOW, delay_seconds=3.0)
    started = time.monotonic()
    with pytest.raises(PolicyError, match="in time"):
        opa.evaluate(MIXED)
    # 0.3 s timeout, not retried: far less than the 3 s OPA takes.
    assert time.monotonic() - started < 2.0
    assert len(fake.calls) == 1


def test_slowness_within_the_timeout_is_an_answer(opa: OpaEngine, fake: FakeOpa) -> None:
    fake.misbehave(Misbehaviour.SLOW, delay_seconds=0.05)
    assert opa.evaluate(MIXED)["ok"] == []


def test_a_down_opa_is_a_policy_error_and_recovery_needs_no_restart(
    fake: FakeOpa, regorus_engine: RegorusEngine
) -> None:
    engine = OpaEngine(OpaServer(fake.url, timeout_seconds=0.3))
    fake.down()
    try:
        with pytest.raises(PolicyError, match="unreachable"):
            engine.evaluate(MIXED)
    finally:
        fake.start()
    assert engine.evaluate(MIXED) == regorus_engine.evaluate(MIXED)


def test_a_gate_over_a_failing_opa_admits_nothing(opa: OpaEngine, fake: FakeOpa) -> None:
    fake.misbehave(Misbehaviour.NOT_JSON)
    records = {"a": _with_text_hash(chunk_record("a", allowed_principals=("group:qa",)))}
    verdict = DecisionCore(opa).decide(
        Caller("acme", frozenset({"group:qa"})),
        [Candidate(0, "a", text_for("a"))],
        records,
        (),
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert verdict.policy_failed
    assert [d.reasons for d in verdict.decisions] == [(Reason.POLICY_ERROR,)]


def test_errors_never_quote_the_input(opa: OpaEngine, fake: FakeOpa) -> None:
    document = make_input(make_chunk("c1", tenant_id=SECRET_TENANT))
    for how in Misbehaviour:
        fake.misbehave(how, delay_seconds=1.0)
        with pytest.raises(PolicyError) as caught:
            opa.evaluate(document)
        assert SECRET_TENANT not in str(caught.value)
    fake.behave()


def test_the_token_is_sent_as_a_bearer_token() -> None:
    guarded = FakeOpa(token="s3cret-token").start()
    try:
        with_token = OpaEngine(OpaServer(guarded.url, token="s3cret-token"))
        assert with_token.evaluate(MIXED)["ok"] == []
        assert guarded.calls[-1].authorization == "Bearer s3cret-token"
        for token in (None, "wrong"):
            engine = OpaEngine(OpaServer(guarded.url, token=token))
            with pytest.raises(PolicyError, match="HTTP 401") as caught:
                engine.evaluate(MIXED)
            assert "s3cret" not in str(caught.value)
    finally:
        guarded.stop()


def test_an_unserialisable_input_is_a_policy_error(opa: OpaEngine) -> None:
    with pytest.raises(PolicyError, match="not JSON-serialisable"):
        opa.evaluate(make_input(make_chunk("c1", status=object())))


def test_an_input_without_unique_string_ids_is_refused_before_calling(
    opa: OpaEngine, fake: FakeOpa
) -> None:
    with pytest.raises(PolicyError, match="unique string id"):
        opa.evaluate(make_input(make_chunk("c1"), make_chunk("c1")))
    assert fake.calls == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://opa:8181", "http://host"),
        ("opa:8181", "http://host"),
        ("http://user:pw@opa:8181", "credentials"),
        ("http://opa:8181/?pretty=true", "query"),
        ("http://opa:notaport", "port"),
    ],
)
def test_a_bad_url_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        OpaServer(url)


def test_a_ca_file_needs_https(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="https"):
        OpaServer("http://opa:8181", ca_file=tmp_path / "ca.pem")
    server = OpaServer("https://opa.example:8443/opa", ca_file=tmp_path / "ca.pem")
    assert server.display_url == "https://opa.example:8443/opa"


def test_a_path_prefix_reaches_opa_behind_a_reverse_proxy(fake: FakeOpa) -> None:
    # The fake serves /v1/data only, so a prefix is visible as a 400.
    engine = OpaEngine(OpaServer(fake.url + "/opa"))
    with pytest.raises(PolicyError, match="HTTP 400"):
        engine.evaluate(MIXED)


def test_the_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc.def\n")
    assert read_token_file(path) == "abc.def"
    path.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        read_token_file(path)
    with pytest.raises(ValueError, match="FileNotFoundError"):
        read_token_file(tmp_path / "missing")


# Settings and engine selection (sidecar/config/, sidecar/runtime/server.py).


def _settings(**values: Any) -> Any:
    return load_settings(None, {"identity": "trusted-headers", **values})


def test_regorus_is_the_default_engine() -> None:
    settings = _settings()
    assert settings.policy.engine is PolicyEngineName.REGORUS
    policy, request_policy, _ = build_policies(settings)
    assert isinstance(policy, RegorusEngine)
    assert isinstance(request_policy, RequestPolicy)


def test_opa_serves_both_policies(fake: FakeOpa, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    settings = _settings(policy_engine="opa", opa_url=fake.url, opa_token_file=str(token))
    policy, request_policy, source = build_policies(settings)
    assert isinstance(policy, OpaEngine)
    assert isinstance(request_policy, OpaRequestPolicy)
    assert source == fake.url
    # The start-up probe evaluated an empty batch, with the token.
    assert fake.calls[-1].input["chunks"] == []
    assert fake.calls[-1].authorization == "Bearer t0k3n"


def test_a_down_opa_at_start_is_logged_and_fails_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING):
        policy, _, _ = build_policies(_settings(policy_engine="opa", opa_url=url))
    assert "failing closed" in caplog.text
    with pytest.raises(PolicyError):
        policy.evaluate(MIXED)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"policy_engine": "opa", "opa_url": "opa:8181"}, "http://host"),
        ({"policy_engine": "opa", "opa_url": "http://o:1", "opa_token_file": "/nope"}, "token"),
    ],
)
def test_opa_settings_are_checked_when_the_engine_is_built(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_policies(_settings(**values))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"policy_engine": "opa", "policy_data": "d.json"}, "load the data into OPA"),
        ({"policy_engine": "opa"}, r"needs policy\.opa_url \(--opa-url\)"),
        (
            {"policy_engine": "opa", "opa_url": "http://o:1", "opa_timeout_ms": 2000},
            r"below listen\.message_timeout_ms",
        ),
        ({"policy_engine": "rego"}, r"policy\.engine \(--policy-engine\): 'rego' is not one of"),
        ({"opa_timeout_ms": 0}, r"policy\.opa_timeout_ms"),
    ],
)
def test_opa_settings_are_checked_at_load(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(**values)


def _with_text_hash(record: ChunkRecord) -> ChunkRecord:
    return replace(record, sha256=canonical_sha256(text_for(record.chunk_id)))
