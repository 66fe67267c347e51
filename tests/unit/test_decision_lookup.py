"""Finding decisions in the audit trail (sidecar/audit/decisions.py): memory, every segment."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from sidecar.audit.decisions import JsonlDecisions, RecentDecisions, released_chunks, scan_log
from sidecar.audit.jsonl import JsonlAuditSink, SpoolLimits


def _record(decision_id: str, released: list[str], **extra: object) -> dict[str, object]:
    return {
        "decision_id": decision_id,
        "tenant": "acme",
        "principals_sha256": "p" * 64,
        "released": released,
        "admitted": released,
        "released_sha256": [f"{c}-sha" for c in released],
        **extra,
    }


def test_a_decision_is_found_in_any_segment_and_an_edited_line_is_not(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SpoolLimits(segment_bytes=400))
    for n in range(20):
        sink.write(_record(f"d{n}", [f"c{n}"]))
    sink.write({**_record("v1", ["c1"]), "kind": "answer_verification"})
    sink.close()
    assert len(list(tmp_path.glob("decisions.jsonl.*.jsonl"))) > 3
    found = scan_log(log, ["d0", "d19", "v1", "nope"])
    assert set(found) == {"d0", "d19"}
    assert found["d0"].released == {"c0": "c0-sha"}

    oldest = sorted(tmp_path.glob("decisions.jsonl.*.jsonl"))[0]
    oldest.write_bytes(oldest.read_bytes().replace(b'"c0-sha"', b'"cX-sha"'))
    assert "d0" not in scan_log(log, ["d0"])


def test_released_but_not_admitted_has_no_hash_and_memory_is_bounded(tmp_path: Path) -> None:
    record = _record("d", ["a", "b"])
    record["admitted"] = ["a"]
    chunks = released_chunks(orjson.loads(orjson.dumps(record)))
    assert chunks is not None and chunks.released == {"a": "a-sha", "b": None}
    recent = RecentDecisions(2)
    for n in range(3):
        recent.add(_record(f"d{n}", ["a"]))
    assert recent.get("d0") is None and recent.get("d2") is not None and len(recent) == 2
    source = JsonlDecisions(tmp_path / "empty.jsonl", recent)
    assert set(asyncio.run(source.find(["d1", "d2", "d0"]))) == {"d1", "d2"}
