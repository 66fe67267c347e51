"""Hot reload (sidecar/rego/reloading.py, sidecar/runtime/policy_source.py): a new
revision is compiled and tested before it is swapped in; a bad one leaves the last
good revision active and is reported once."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings
from sidecar.core.caller import Caller
from sidecar.core.policy import policy_input
from sidecar.metrics import GateMetrics
from sidecar.rego.bundle import BundleError
from sidecar.rego.reloading import PolicyRevision, ReloadingPolicy
from sidecar.runtime import policy_source
from sidecar.runtime.policy_source import FileBundle, HttpBundle, PolicySource, load_bundle_policy
from tests.fixtures.bundles import blocking_files, make_bundle, rsa_pair
from tests.fixtures.records import chunk_record


def _write(path: Path, blob: bytes) -> None:
    # Written aside and renamed over, as deployment tools do: a reader never
    # sees half a file.
    partial = path.with_suffix(".partial")
    partial.write_bytes(blob)
    os.replace(partial, path)


class _Events:
    def __init__(self) -> None:
        self.activated: list[str] = []
        self.refused: list[str] = []


def _source(
    tmp_path: Path, blob: bytes, *, key: bytes | None = None, **config: object
) -> tuple[Path, GateMetrics, PolicySource]:
    bundle_file = tmp_path / "bundle.tar.gz"
    _write(bundle_file, blob)
    values: dict[str, object] = {"identity": "trusted-headers", "policy_bundle": str(bundle_file)}
    if key is not None:
        key_file = tmp_path / "bundle-key.pem"
        key_file.write_bytes(key)
        values["policy_bundle_public_key"] = str(key_file)
    values.update(config)
    metrics = GateMetrics()
    return bundle_file, metrics, load_bundle_policy(load_settings(None, values), metrics)


def _reasons(source_policy: ReloadingPolicy, chunk_id: str) -> list[str]:
    caller = Caller(tenant="acme", principals=frozenset({"group:support"}))
    document = policy_input(caller, [chunk_record(chunk_id)], datetime.now(UTC))
    source_policy.version  # noqa: B018 - pins the revision, as the gate does
    return list(source_policy.evaluate(document)[chunk_id])


def _sample(metrics: GateMetrics, name: str, labels: dict[str, str]) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_a_good_revision_is_swapped_in(tmp_path: Path) -> None:
    bundle_file, metrics, source = _source(tmp_path, make_bundle(blocking_files([]), revision="r1"))
    policy = source.policy
    assert policy.version.startswith("bundle:r1@sha256:")
    assert _reasons(policy, "8") == []
    assert _sample(metrics, "retrieval_gate_policy_info", {"revision": "r1"}) == 1

    _write(bundle_file, make_bundle(blocking_files(["8"]), revision="r2"))
    assert asyncio.run(source.poll_once()) is True
    assert policy.active.revision == "r2"
    assert policy.version.startswith("bundle:r2@sha256:")
    assert _reasons(policy, "8") == ["POLICY_DENY"]
    assert _reasons(policy, "1") == []
    assert _sample(metrics, "retrieval_gate_policy_info", {"revision": "r2"}) == 1
    assert _sample(metrics, "retrieval_gate_policy_info", {"revision": "r1"}) == 0
    # Unchanged file: nothing fetched, nothing swapped.
    assert asyncio.run(source.poll_once()) is False


def test_a_revision_whose_rego_tests_fail_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bundle_file, metrics, source = _source(tmp_path, make_bundle(blocking_files([]), revision="r1"))
    failing = b"package retrieval_gate.extra_test\n\nimport rego.v1\n\ntest_always_fails if false\n"
    bad = blocking_files(["8"], extra={"retrieval_gate/extra_test.rego": failing})
    _write(bundle_file, make_bundle(bad, revision="r2"))
    assert asyncio.run(source.poll_once()) is False
    assert source.policy.active.revision == "r1"
    assert _reasons(source.policy, "8") == []
    refused = {"reason": "tests"}
    assert _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", refused) == 1
    assert "test_always_fails" in caplog.text and "last good revision" in caplog.text
    # The same refused file is judged once, not once per poll.
    assert asyncio.run(source.poll_once()) is False
    assert _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", refused) == 1


def test_bundle_tests_see_the_bundle_data(tmp_path: Path) -> None:
    test = (
        b"package retrieval_gate.data_test\n\nimport rego.v1\n\n"
        b'test_blocked if "8" in data.retrieval_gate.blocked_chunks\n'
    )
    blob = make_bundle(blocking_files(["8"], extra={"retrieval_gate/data_test.rego": test}))
    _, _, source = _source(tmp_path, blob)
    first: PolicyRevision = source.policy.active
    assert first.tests_run > 50  # the bundled policies' own tests ran too


def test_a_revision_that_does_not_compile_is_refused(tmp_path: Path) -> None:
    bundle_file, metrics, source = _source(tmp_path, make_bundle(blocking_files([]), revision="r1"))
    broken = {
        **blocking_files([]),
        "retrieval_gate/chunks.rego": b"package retrieval_gate.chunks\n{",
    }
    _write(bundle_file, make_bundle(broken, revision="r2"))
    assert asyncio.run(source.poll_once()) is False
    assert source.policy.active.revision == "r1"
    assert (
        _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", {"reason": "compile"}) == 1
    )


def test_a_tampered_signed_revision_is_refused(tmp_path: Path) -> None:
    private, public = rsa_pair()
    first = make_bundle(blocking_files([]), revision="r1", private_key=private)
    bundle_file, metrics, source = _source(tmp_path, first, key=public)
    signed = make_bundle(blocking_files(["8"]), revision="r2", private_key=private)
    _write(bundle_file, make_bundle(blocking_files(["8"]), revision="r2"))  # unsigned
    assert asyncio.run(source.poll_once()) is False
    _write(
        bundle_file, make_bundle(blocking_files(["1"]), revision="r3", private_key=rsa_pair()[0])
    )
    assert asyncio.run(source.poll_once()) is False
    assert source.policy.active.revision == "r1"
    assert (
        _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", {"reason": "unsigned"}) == 1
    )
    assert (
        _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", {"reason": "signature"})
        == 1
    )
    _write(bundle_file, signed)
    assert asyncio.run(source.poll_once()) is True
    assert source.policy.active.revision == "r2"


def test_a_revision_that_changes_time_purity_is_refused(tmp_path: Path) -> None:
    bundle_file, metrics, source = _source(tmp_path, make_bundle(blocking_files([]), revision="r1"))
    files = blocking_files([])
    name = "retrieval_gate/chunks.rego"
    files[name] = files[name].replace(b"time_pure := true", b"", 1)
    test = "retrieval_gate/chunks_test.rego"
    files[test] = files[test].replace(b"test_declares_itself_time_pure if", b"x_time_pure if", 1)
    _write(bundle_file, make_bundle(files, revision="r2"))
    assert asyncio.run(source.poll_once()) is False
    assert (
        _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", {"reason": "time_purity"})
        == 1
    )


def test_a_missing_file_is_unavailable_and_keeps_the_revision(tmp_path: Path) -> None:
    bundle_file, metrics, source = _source(tmp_path, make_bundle(blocking_files([])))
    bundle_file.unlink()
    assert asyncio.run(source.poll_once()) is False
    assert source.policy.active.revision == "r1"
    assert (
        _sample(metrics, "retrieval_gate_policy_bundle_refusals_total", {"reason": "unavailable"})
        == 1
    )


def test_a_bad_first_bundle_stops_the_start(tmp_path: Path) -> None:
    _, public = rsa_pair()
    with pytest.raises(ConfigError, match="unsigned"):
        _source(tmp_path, make_bundle(blocking_files([])), key=public)


def test_file_bundle_fetches_only_changes(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    _write(path, b"one")
    fetcher = FileBundle(path)
    assert fetcher.fetch() == b"one"
    assert fetcher.fetch() is None
    _write(path, b"two!")
    assert fetcher.fetch() == b"two!"


def test_settings_refuse_a_bundle_with_opa_or_policy_data(tmp_path: Path) -> None:
    base = {"identity": "trusted-headers", "policy_bundle": str(tmp_path / "b.tar.gz")}
    with pytest.raises(ConfigError, match=r"policy\.engine 'opa'"):
        load_settings(None, {**base, "policy_engine": "opa", "opa_url": "http://127.0.0.1:8181"})
    with pytest.raises(ConfigError, match=r"data\.json"):
        load_settings(None, {**base, "policy_data": str(tmp_path / "d.json")})
    with pytest.raises(ConfigError, match=r"policy\.bundle_public_key needs policy\.bundle"):
        load_settings(None, {"identity": "trusted-headers", "policy_bundle_public_key": "/k"})


class _BundleServer:
    """A local bundle server: answers 304 to the ETag it last sent, counts requests."""

    def __init__(self) -> None:
        self.body = b"one"
        self.status = 200
        self.conditional: list[str | None] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                etag = '"' + hashlib.sha256(owner.body).hexdigest()[:16] + '"'
                owner.conditional.append(self.headers.get("If-None-Match"))
                if owner.status != 200:
                    self.send_response(owner.status)
                    self.end_headers()
                    return
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/bundle.tar.gz"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bundle_server() -> Iterator[_BundleServer]:
    server = _BundleServer()
    yield server
    server.close()


def test_http_bundle_is_polled_with_its_etag(bundle_server: _BundleServer) -> None:
    fetcher = HttpBundle(bundle_server.url)
    assert fetcher.fetch() == b"one"
    assert fetcher.fetch() is None  # 304: the revision stays
    bundle_server.body = b"two!"
    assert fetcher.fetch() == b"two!"
    first, second, third = bundle_server.conditional
    assert first is None and second is not None and third == second


def test_http_bundle_errors_are_unavailable_and_oversize_is_refused(
    bundle_server: _BundleServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetcher = HttpBundle(bundle_server.url)
    bundle_server.status = 503
    with pytest.raises(BundleError) as refused:
        fetcher.fetch()
    assert refused.value.reason == "unavailable"
    bundle_server.status = 200
    monkeypatch.setattr(policy_source, "MAX_BUNDLE_BYTES", 2)
    with pytest.raises(BundleError) as refused:
        fetcher.fetch()
    assert refused.value.reason == "too_large"
    with pytest.raises(BundleError) as refused:
        HttpBundle("http://127.0.0.1:1/bundle.tar.gz").fetch()
    assert refused.value.reason == "unavailable"
