"""The `retrieval-gate` command as a user runs it: store load, proxy, demo."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.ports import free_port
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, http, write_records
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_store_load_reports_every_bad_record_and_loads_nothing(tmp_path: Path) -> None:
    chunks = write_records(
        tmp_path / "chunks.jsonl",
        [
            record_dict("good"),
            record_dict("no-zone", effective_at="2025-01-01T00:00:00"),
            record_dict("no-tenant", tenant_id=""),
        ],
    )
    store = new_sqlite_url(tmp_path / "gate.db")
    done = run_cli("store", "load", "--store", store, str(chunks))
    assert done.returncode == 1
    assert 'line 2 (chunk "no-zone"), field "effective_at"' in done.stderr
    assert 'line 3 (chunk "no-tenant"), field "tenant_id"' in done.stderr
    assert "nothing was loaded" in done.stderr

    good = write_records(tmp_path / "good.jsonl", [record_dict("good")])
    done = run_cli("store", "load", "--store", store, str(good))
    assert done.returncode == 0, done.stderr
    assert "loaded 1 records" in done.stdout


def test_policy_test_command_runs_the_rego_unit_tests() -> None:
    done = run_cli("policy", "test")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout.splitlines()[-1]


def test_missing_identity_flag_is_a_clear_error(tmp_path: Path) -> None:
    done = run_cli("serve", "--store", new_sqlite_url(tmp_path / "g.db"))
    assert done.returncode == 2
    assert "identity.mode is required" in done.stderr


@pytest.mark.envoy
def test_proxy_filters_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    store = new_sqlite_url(tmp_path / "gate.db")
    chunks = write_records(
        tmp_path / "chunks.jsonl", [record_dict("1"), record_dict("2", status="revoked")]
    )
    assert run_cli("store", "load", "--store", store, str(chunks)).returncode == 0
    upstream = FixtureUpstream().start()
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
    upstream.respond("POST", "/collections/docs/points/search", CannedResponse(body))
    port, metrics = free_port(), free_port()
    audit = tmp_path / "decisions.jsonl"
    log = (tmp_path / "proxy.log").open("wb")
    proxy = subprocess.Popen(
        [
            *CLI,
            "proxy",
            "--upstream",
            upstream.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--store",
            store,
            "--identity",
            "trusted-headers",
            "--metrics",
            f"127.0.0.1:{metrics}",
            "--audit-log",
            str(audit),
        ],
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while b"proxy ready" not in (tmp_path / "proxy.log").read_bytes():
            assert proxy.poll() is None, (tmp_path / "proxy.log").read_text()
            assert time.monotonic() < deadline, "proxy did not become ready"
            time.sleep(0.1)
        response = http(
            "POST",
            f"http://127.0.0.1:{port}/collections/docs/points/search",
            b'{"vector":[0.1],"limit":2}',
            {"x-gate-tenant": "acme", "x-gate-principals": "group:qa"},
        )
        assert response.status == 200
        assert [hit["id"] for hit in response.json()["result"]] == [1]
        envoy_pid = int(
            (tmp_path / "proxy.log").read_text().split("envoy pid ", 1)[1].split(")")[0]
        )
        proxy.send_signal(signal.SIGTERM)
        assert proxy.wait(timeout=20) == 0
        with pytest.raises(ProcessLookupError):
            os.kill(envoy_pid, 0)
        assert "trusted-headers" in (tmp_path / "proxy.log").read_text()  # the loud warning
        records = [orjson.loads(line) for line in audit.read_bytes().splitlines()]
        assert len(records) == 1 and records[0]["admitted"] == ["1"]
    finally:
        if proxy.poll() is None:
            proxy.kill()
        upstream.stop()


@pytest.mark.envoy
def test_demo_runs_end_to_end() -> None:
    done = run_cli("demo")
    assert done.returncode == 0, done.stdout + done.stderr
    for reason in (
        "STATUS_SUPERSEDED",
        "TENANT_MISMATCH",
        "PRINCIPAL_MISMATCH",
        "STATUS_DRAFT",
        "STATUS_REVOKED",
        "STATUS_QUARANTINED",
        "NOT_YET_EFFECTIVE",
        "EXPIRED",
        "HASH_MISMATCH",
        "MISSING_METADATA",
    ):
        assert reason in done.stdout, reason
    assert "admitted (2): sop-7-v3, sales-faq" in done.stdout
    assert "hash chain intact" in done.stdout
