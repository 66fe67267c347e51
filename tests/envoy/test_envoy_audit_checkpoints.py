"""Signed audit checkpoints written by a real `serve` behind a real Envoy: every N records
and at shutdown, into the checkpoints file and, with a PostgreSQL audit store, the table."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from sidecar.audit.checkpoints import checkpoints_path, read_checkpoints
from sidecar.cli import main
from tests.fixtures.checkpoint_keys import write_key_pair
from tests.fixtures.harness import GateStack, wait_until
from tests.fixtures.postgres import fresh_database
from tests.fixtures.records import record_dict
from tests.fixtures.servers import stop_process

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"


def signing_config(tmp_path: Path) -> tuple[dict[str, object], Path]:
    private, public = write_key_pair(tmp_path, "checkpoint")
    config: dict[str, object] = {
        "checkpoint_key_file": str(private),
        "checkpoint_key_id": "gate-2025",
        "checkpoint_every_records": 3,
        "checkpoint_every_seconds": 3600,
    }
    return config, public


def gate_dir(tmp_path: Path) -> Path:
    workdir = tmp_path / "gate"
    workdir.mkdir()
    return workdir


def search(stack: GateStack, count: int) -> None:
    for _ in range(count):
        # Every response the gate decides is one audit record, whatever its status.
        assert "x-retrieval-gate-decision-id" in stack.search(SEARCH).headers


def test_serve_signs_every_n_records_and_at_shutdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, public = signing_config(tmp_path)
    stack = GateStack(gate_dir(tmp_path), [record_dict("1")], config=config).start()
    try:
        search(stack, 4)
        assert stack.metric("retrieval_gate_audit_checkpoints_total") == 1
        assert stack.metric("retrieval_gate_audit_last_checkpoint_timestamp_seconds") > 0
        assert [c.seq for c in read_checkpoints(checkpoints_path(stack.audit_log))] == [3]
        stop_process(stack.sidecar, timeout=20)
        assert stack.sidecar is not None and stack.sidecar.returncode == 0
    finally:
        stack.stop()
    signed = read_checkpoints(checkpoints_path(stack.audit_log))
    assert [(c.seq, c.key_id) for c in signed] == [(3, "gate-2025"), (4, "gate-2025")]
    capsys.readouterr()
    assert (
        main(["audit", "verify", str(stack.audit_log), "--public-key", f"gate-2025={public}"]) == 0
    )
    assert "signed: 2 checkpoints by gate-2025, the last at seq 4" in capsys.readouterr().out


@pytest.mark.postgres
def test_checkpoints_ship_to_postgres_and_verify_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, public = signing_config(tmp_path)
    with fresh_database() as url:
        config |= {"audit_store": url, "audit_chain_id": "gate-ckpt"}
        stack = GateStack(gate_dir(tmp_path), [record_dict("1")], config=config).start()
        try:
            search(stack, 4)
            stop_process(stack.sidecar, timeout=20)
        finally:
            stack.stop()
        with psycopg.connect(url) as connection:
            shipped = connection.execute(
                "SELECT seq, key_id FROM audit_checkpoints WHERE chain_id = 'gate-ckpt' "
                "ORDER BY seq"
            ).fetchall()
        assert shipped == [(3, "gate-2025"), (4, "gate-2025")]
        capsys.readouterr()
        key = f"gate-2025={public}"
        assert main(["audit", "verify", "--store", url, "--public-key", key]) == 0
        assert "chain gate-ckpt: 4 records" in capsys.readouterr().out
        # The table and the spool together, and an unknown key refused.
        assert wait_until(lambda: stack.audit_log.exists())
        assert (
            main(
                [
                    "audit",
                    "verify",
                    "--store",
                    url,
                    "--chain",
                    "gate-ckpt",
                    str(stack.audit_log),
                    "--public-key",
                    key,
                ]
            )
            == 0
        )
        other = write_key_pair(tmp_path, "other")[1]
        assert main(["audit", "verify", "--store", url, "--public-key", str(other)]) == 1
        assert "signed by unknown key id 'gate-2025'" in capsys.readouterr().err
