"""The one INFO line a starting sidecar logs: what it enforces, and no secret.

Logged where ``serve`` and ``proxy`` assemble the sidecar (``Sidecar.from_settings``),
once per sidecar process.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from sidecar.config import IdentityMode, RouteOptions, Settings
from sidecar.core.modes import Mode
from sidecar.demo.run import demo_corpus, write_demo_store
from sidecar.runtime.server import Sidecar
from tests.fixtures.bundles import make_bundle, policy_files
from tests.fixtures.settings import settings_of

SUMMARY = "retrieval-gate starting: "
HMAC_SECRET = "never-log-this-hmac-secret-0123456789"
PASSWORD = "never-log-this-db-password"


def summaries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.getMessage().startswith(SUMMARY) and record.levelno == logging.INFO
    ]


def assemble(settings: Settings) -> None:
    sidecar = Sidecar.from_settings(settings)
    asyncio.run(sidecar.aclose())


def test_one_line_says_what_the_gate_enforces(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store_url = write_demo_store(tmp_path, demo_corpus())
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS,
        store=store_url,
        tenant_key="org",
        overfetch_factor=2.0,
        overfetch_cap=500,
        formats={"pinecone": {"enabled": False}, "pinecone_grpc": {"enabled": False}},
    )
    caplog.set_level(logging.INFO)

    assemble(settings)

    [line] = summaries(caplog)
    pairs = dict(pair.split("=", 1) for pair in line.removeprefix(SUMMARY).split(" "))
    assert pairs["identity"] == "trusted-headers"
    assert pairs["store"] == store_url
    assert pairs["records"] == "11"
    assert pairs["policy"].startswith("sha256:")
    assert pairs["policy_source"].endswith("policies")
    assert pairs["tenant_key"] == "org"
    assert pairs["push_down"] == "on"
    assert pairs["overfetch"] == "2x,cap=500"
    formats = pairs["formats"].split(",")
    assert "qdrant" in formats and "milvus_grpc" in formats
    assert "pinecone" not in formats and "pinecone_grpc" not in formats


def test_route_overrides_are_in_the_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS,
        store=write_demo_store(tmp_path, demo_corpus()),
        overfetch_factor=1.0,  # off, whatever the default
        routes={
            "/collections/shared/": RouteOptions(push_down=False, mode=Mode.STRICT),
            "/collections/hr/": RouteOptions(tenant_key="org_id", overfetch_factor=3.0),
        },
    )
    caplog.set_level(logging.INFO)

    assemble(settings)

    [line] = summaries(caplog)
    assert " tenant_key=tenant(/collections/hr/:org_id) " in line
    assert " push_down=on(off:/collections/shared/) " in line
    assert " overfetch=off(/collections/hr/:3) " in line


def test_no_secret_reaches_the_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = tmp_path / "hmac.secret"
    secret.write_text(HMAC_SECRET)
    # Port 1: nothing listens, so the store is an outage the sidecar waits out.
    store_url = f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate?connect_timeout=1"
    settings = settings_of(
        identity=IdentityMode.JWT,
        jwt_hmac_secret_file=secret,
        issuer="https://idp.example/",
        audience="gate",
        store=store_url,
    )
    caplog.set_level(logging.INFO)

    assemble(settings)

    [line] = summaries(caplog)
    assert "identity=jwt " in line
    assert " store=postgresql://gate:***@127.0.0.1:1/gate?connect_timeout=1 " in line
    assert " records=unknown " in line
    everything = "\n".join(record.getMessage() for record in caplog.records)
    assert PASSWORD not in everything
    assert HMAC_SECRET not in everything


def test_a_bundles_revision_is_the_policy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bundle = tmp_path / "policy bundle.tar.gz"
    bundle.write_bytes(make_bundle(policy_files(), revision="2026-12-05"))
    settings = settings_of(
        identity=IdentityMode.TRUSTED_HEADERS,
        store=write_demo_store(tmp_path, demo_corpus()),
        policy_bundle=str(bundle),
    )
    caplog.set_level(logging.INFO)

    assemble(settings)

    [line] = summaries(caplog)
    assert " policy=bundle:2026-12-05@sha256:" in line
    assert f' policy_source="bundle {bundle}" ' in line
