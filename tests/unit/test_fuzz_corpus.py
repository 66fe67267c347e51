"""The fuzz corpus (tests/corpus/<target>/), replayed through the fuzzer's own oracle.

``bench/fuzz.py`` fuzzes the response adapters, the request rewriters and the
record and bundle loaders with atheris and keeps the inputs that reached new
coverage here (minimised), together with the inputs of every failure it
found. Each one runs through ``fuzz_targets.judge``, the oracle the fuzzer
applies: only the target's documented exceptions escape, no input takes
longer than the hang bound, no rejected chunk is released, no search goes
on without the tenant condition, no invalid record or unsigned bundle
content is accepted. The oracle is shown to catch what it is for by
breaking the gate on purpose (the last tests).

The oracle passes an input refused as well as accepted, so each input's
outcome is also held to the one recorded from a correct build
(``tests/corpus_outcomes/<target>.json``, written by
``tests/fixtures/corpus_outcomes.py``, which says how to regenerate them):
a build that refuses what it used to accept fails the replay.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.hits import Route
from sidecar.formats.base import ParsedBody
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.rego import bundle_signature
from sidecar.store import loader

# The fuzz targets and their oracle live with the fuzzer (bench/ holds scripts).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from fuzz_targets import (
    ACCEPTED,
    CORPUS,
    ORACLE,
    REFUSED,
    Target,
    all_targets,
    judge,
)

from tests.fixtures import corpus_outcomes

TARGETS = all_targets()


def test_every_target_has_a_corpus_and_every_corpus_a_target() -> None:
    kept = {path.name for path in CORPUS.iterdir() if path.is_dir()}
    assert kept == set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_corpus_replays_without_a_crash_hang_or_oracle_failure(name: str) -> None:
    inputs = sorted((CORPUS / name).iterdir())
    assert inputs
    failed = []
    for path in inputs:
        verdict = judge(TARGETS[name], path.read_bytes())
        if verdict.outcome not in (ACCEPTED, REFUSED):
            failed.append(f"{path.name}: {verdict.outcome} {verdict.detail}")
    assert failed == []


def test_every_target_has_a_recorded_outcome_manifest_and_no_other() -> None:
    kept = {path.stem for path in corpus_outcomes.OUTCOMES.glob("*.json")}
    assert kept == set(TARGETS)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_input_gets_its_recorded_outcome(name: str) -> None:
    # The oracle takes refused as well as accepted: a build refusing every body
    # (an adapter that raises) passes it. Each input's outcome is recorded from a
    # correct build, so refusing what was accepted (or accepting what was
    # refused) fails here. Regenerate: see tests/fixtures/corpus_outcomes.py.
    expected = corpus_outcomes.recorded(name)
    actual = corpus_outcomes.replayed(TARGETS[name], CORPUS / name)
    assert set(actual) == set(expected), (
        f"inputs without a recorded outcome, or recorded ones gone: {corpus_outcomes.REGENERATE}"
    )
    assert set(expected.values()) <= {ACCEPTED, REFUSED}
    changed = {k: (expected[k], v) for k, v in actual.items() if v != expected[k]}
    assert changed == {}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_recorded_outcomes_hold_both_kinds(name: str) -> None:
    # A manifest recorded from a build that refuses (or accepts) everything would
    # hold one kind only: every corpus holds inputs of both.
    assert set(corpus_outcomes.recorded(name).values()) == {ACCEPTED, REFUSED}


# -- regressions: inputs the fuzzer found, named ---------------------------------------


def _nested_request(depth: int) -> bytes:
    """A search batch nested ``depth`` lists deep, with a string that makes the
    duplicate-key check decode the body a second time (with the json module)."""
    return b'{"searches":' + b"[" * depth + b'{"a\\":":1}' + b"]" * depth + b"}"


def test_a_request_nested_past_the_json_modules_depth_is_malformed() -> None:
    # orjson reads up to 1024 levels, the json module's decoder fewer (RecursionError).
    data = bytes([1, 0, 0]) + _nested_request(1010)
    assert judge(TARGETS["request-qdrant"], data).outcome == REFUSED


def test_a_records_line_nested_past_the_json_modules_depth_is_refused() -> None:
    assert judge(TARGETS["record-loader"], b"[" * 1010 + b"\n").outcome == REFUSED


def test_a_tenant_that_is_no_unicode_string_is_refused_by_the_weaviate_grpc_push_down() -> None:
    target = TARGETS["request-weaviate_grpc"]
    seed = target.seeds()[0]
    surrogate = 8  # fuzz_requests.TENANTS[8] is a lone surrogate, as a JWT claim can be
    assert judge(target, seed[:1] + bytes([surrogate]) + seed[2:]).outcome == REFUSED


# -- the oracle catches what it is there for ------------------------------------------


def _corpus(name: str) -> Iterator[bytes]:
    for path in sorted((CORPUS / name).iterdir()):
        yield path.read_bytes()


def _outcomes(target: Target, inputs: Iterator[bytes]) -> set[str]:
    return {judge(target, data).outcome for data in inputs}


def test_a_render_that_releases_rejected_hits_fails_the_oracle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = QdrantFormat.parse

    def leaky(self: QdrantFormat, body: bytes, route: Route) -> ParsedBody:
        parsed: Any = original(self, body, route)
        render = parsed.render
        parsed.render = lambda keep, *rest: render(range(len(parsed.candidates)), *rest)
        return parsed  # type: ignore[no-any-return]

    monkeypatch.setattr(QdrantFormat, "parse", leaky)
    assert ORACLE in _outcomes(TARGETS["response-qdrant"], _corpus("response-qdrant"))


def test_a_push_down_that_adds_nothing_fails_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    import sidecar.formats.qdrant.grpc_request as grpc_request

    monkeypatch.setattr(grpc_request, "_add_condition", lambda holder, condition: None)
    target = TARGETS["request-qdrant_grpc"]
    assert ORACLE in _outcomes(target, iter(target.seeds()))


def test_a_bundle_reader_that_trusts_any_hash_fails_the_oracle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bundle_signature, "_digest_matches", lambda *_: True)
    target = TARGETS["bundle-loader"]
    assert ORACLE in _outcomes(target, iter(target.seeds()))


def test_a_loader_that_skips_the_text_hash_fails_the_oracle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loader, "canonical_sha256", lambda text: "0" * 64)
    target = TARGETS["record-loader"]
    wrong = b'{"chunk_id": "c", "doc_id": "d", "tenant_id": "t", "allowed_principals": ["p"], '
    wrong += b'"status": "approved", "effective_at": "2025-01-01T00:00:00Z", '
    wrong += b'"sha256": "' + b"0" * 64 + b'", "text": "not the hashed text"}\n'
    assert judge(target, wrong).outcome == ORACLE
