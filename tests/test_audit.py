"""The hash-chained JSON Lines audit sink and `audit verify`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sidecar.audit import GENESIS, AuditError, JsonlAuditSink, record_digest, verify_chain
from sidecar.cli import main


def write(path: Path, n: int) -> None:
    sink = JsonlAuditSink(path)
    for i in range(n):
        sink.write({"decision_id": f"d{i}", "admitted": [f"c{i}"]})
    sink.close()


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_records_are_chained_and_verify(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 3)
    records = [orjson.loads(line) for line in lines(log)]
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert records[0]["prev_sha256"] == GENESIS
    assert records[1]["prev_sha256"] == records[0]["sha256"] == record_digest(records[0])
    report = verify_chain(log)
    assert report.ok and report.records == 3 and report.head_sha256 == records[2]["sha256"]


def test_chain_continues_across_restarts(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    write(log, 2)
    assert [orjson.loads(line)["seq"] for line in lines(log)] == [1, 2, 3, 4]
    assert verify_chain(log).ok


def test_edited_line_is_named(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 4)
    content = lines(log)
    content[1] = content[1].replace(b'"c1"', b'"c9"')
    log.write_bytes(b"\n".join(content) + b"\n")
    report = verify_chain(log)
    assert not report.ok and report.records == 1
    assert report.problem is not None and report.problem.startswith("line 2:")


def test_edited_last_line_is_detected(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 3)
    content = lines(log)
    content[2] = content[2].replace(b'"c2"', b'"c7"')
    log.write_bytes(b"\n".join(content) + b"\n")
    assert verify_chain(log).problem == "line 3: content does not match its sha256 (edited)"


def test_deleted_line_is_named(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 4)
    content = lines(log)
    del content[1]
    log.write_bytes(b"\n".join(content) + b"\n")
    report = verify_chain(log)
    assert not report.ok and report.problem is not None
    assert report.problem.startswith("line 2: seq is 3, expected 2")


def test_rewritten_chain_with_recomputed_digest_still_breaks_the_link(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 3)
    content = [orjson.loads(line) for line in lines(log)]
    content[0]["admitted"] = ["forged"]
    content[0]["sha256"] = record_digest(content[0])
    log.write_bytes(b"".join(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) + b"\n" for r in content))
    report = verify_chain(log)
    assert report.problem is not None and report.problem.startswith("line 2: prev_sha256")


def test_sink_refuses_to_append_after_a_damaged_tail(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    with log.open("ab") as handle:
        handle.write(b'{"half a rec')
    with pytest.raises(AuditError, match="last line is not an intact audit record"):
        JsonlAuditSink(log)


def test_cli_verify_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    assert main(["audit", "verify", str(log)]) == 0
    assert "2 records, chain intact" in capsys.readouterr().out
    content = lines(log)
    log.write_bytes(content[1] + b"\n")
    assert main(["audit", "verify", str(log)]) == 1
    assert "line 1" in capsys.readouterr().err
