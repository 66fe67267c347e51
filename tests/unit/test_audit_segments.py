"""The audit log in segments: rotation, restart, retention, the spool bound, verifying
a set of segments (`audit verify FILE...`) and the settings that shape them."""

from __future__ import annotations

import types
from pathlib import Path

import orjson
import pytest

from sidecar.audit import jsonl
from sidecar.audit.jsonl import JsonlAuditSink, SpoolLimits
from sidecar.audit.segments import in_chain_order, log_files, sealed_path, sealed_segments
from sidecar.audit.sink import AuditError
from sidecar.audit.verify import verify_chain, verify_segments
from sidecar.cli import main
from sidecar.config import ConfigError, load_settings
from sidecar.metrics import GateMetrics
from sidecar.runtime.server import build_audit
from tests.fixtures.settings import settings_of

SMALL = SpoolLimits(segment_bytes=4096)


class Clock:
    """Wall time the sink reads, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now


class Observer:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.deleted: list[str] = []

    def spool_size(self, total_bytes: int) -> None:
        self.sizes.append(total_bytes)

    def segment_deleted(self, reason: str) -> None:
        self.deleted.append(reason)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(jsonl, "time", types.SimpleNamespace(time=fake.time))
    return fake


def record(i: int) -> dict[str, object]:
    # ~400 bytes once chained: ten records fill a 4 KiB segment.
    return {"decision_id": f"d{i}", "admitted": [f"chunk-{i}-{n}" for n in range(12)]}


def fill(sink: JsonlAuditSink, start: int, n: int) -> None:
    for i in range(start, start + n):
        sink.write(record(i))


def seqs(path: Path) -> list[int]:
    return [orjson.loads(line)["seq"] for line in path.read_bytes().splitlines()]


def spool_size(log: Path) -> int:
    return sum(path.stat().st_size for path in log_files(log))


def test_the_log_rotates_by_size_into_segments_named_by_their_first_seq(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 40)
    sink.close()
    sealed = sealed_segments(log)
    assert len(sealed) >= 3
    for first, path in sealed:
        assert path.name == f"decisions.jsonl.{first:020d}.jsonl"
        assert seqs(path)[0] == first
        assert path.stat().st_size <= 4096
    assert log.exists() and seqs(log)[-1] == 40  # the configured path is the newest segment
    report = verify_segments(log_files(log))
    assert report.ok and report.records == 40 and not report.anchored


def test_the_log_rotates_by_age_at_the_next_write(tmp_path: Path, clock: Clock) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SpoolLimits(segment_seconds=60))
    fill(sink, 0, 2)
    clock.now += 59
    fill(sink, 2, 1)
    assert sealed_segments(log) == []
    clock.now += 1
    fill(sink, 3, 1)
    sink.close()
    assert [first for first, _ in sealed_segments(log)] == [1]
    assert seqs(log) == [4]


def test_a_restart_continues_the_chain_from_the_newest_segment(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 25)
    sink.close()
    sink = JsonlAuditSink(log, SMALL)
    assert sink.head[0] == 25
    fill(sink, 25, 25)
    sink.close()
    assert verify_segments(log_files(log)).records == 50


def test_a_crash_between_sealing_and_the_next_write_continues_from_the_sealed_segment(
    tmp_path: Path,
) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 5)
    sink.close()
    log.rename(sealed_path(log, 1))  # sealed, and killed before the next file was made
    sink = JsonlAuditSink(log, SMALL)
    assert sink.head[0] == 5
    fill(sink, 5, 1)
    sink.close()
    assert seqs(log) == [6]
    assert verify_segments(log_files(log)).ok


def test_a_torn_tail_in_the_newest_segment_is_set_aside(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 15)
    sink.close()
    assert sealed_segments(log)
    with log.open("ab") as handle:
        handle.write(b'{"decision_id":"d99","half a rec')  # killed mid-write
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 15, 10)
    sink.close()
    assert (tmp_path / "decisions.jsonl.torn").read_bytes() == b'{"decision_id":"d99","half a rec\n'
    assert verify_segments(log_files(log)).records == 25


def test_a_torn_first_record_of_a_new_segment_leaves_it_empty_and_the_chain_whole(
    tmp_path: Path,
) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 5)
    sink.close()
    log.rename(sealed_path(log, 1))
    log.write_bytes(b'{"decision_id":"d5","seq":6')  # the new segment's first write, cut short
    sink = JsonlAuditSink(log, SMALL)
    assert sink.head[0] == 5
    fill(sink, 5, 1)
    sink.close()
    assert verify_segments(log_files(log)).records == 6


def test_retention_by_bytes_deletes_the_oldest_segments(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    observer = Observer()
    limits = SpoolLimits(segment_bytes=4096, max_spool_bytes=3 * 4096)
    sink = JsonlAuditSink(log, limits, observer=observer)
    for i in range(200):
        sink.write(record(i))
        assert spool_size(log) <= 3 * 4096
    sink.close()
    assert observer.deleted and set(observer.deleted) == {"retention"}
    assert observer.sizes[-1] == spool_size(log) == sink.spool_bytes
    first = sealed_segments(log)[0][0]
    assert first > 1
    # What is left is a chain that starts mid-way: verified only as anchored, and said so.
    plain = verify_segments(log_files(log))
    assert not plain.ok and plain.problem is not None and "--anchored" in plain.problem
    anchored = verify_segments(log_files(log), anchored=True)
    assert anchored.ok and anchored.first_seq == first and anchored.anchored
    assert anchored.records == 200 - first + 1
    assert (
        anchored.anchor_sha256
        == orjson.loads(sealed_path(log, first).read_bytes().split(b"\n")[0])["prev_sha256"]
    )


def test_retention_by_age_deletes_segments_sealed_long_enough_ago(
    tmp_path: Path, clock: Clock
) -> None:
    log = tmp_path / "decisions.jsonl"
    limits = SpoolLimits(segment_bytes=4096, segment_seconds=10**9, retention_seconds=3600)
    sink = JsonlAuditSink(log, limits)
    fill(sink, 0, 30)
    before = [first for first, _ in sealed_segments(log)]
    assert len(before) >= 2
    clock.now += 3599
    fill(sink, 30, 1)
    assert [first for first, _ in sealed_segments(log)] == before
    clock.now += 2
    fill(sink, 31, 1)
    sink.close()
    assert sealed_segments(log) == []  # every sealed segment expired; the active file stays
    assert seqs(log)[-1] == 32


def test_a_spool_kept_until_shipped_refuses_records_at_its_bound_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    log = tmp_path / "spool.jsonl"
    limits = SpoolLimits(segment_bytes=4096, max_spool_bytes=2 * 4096)
    sink = JsonlAuditSink(log, limits, keep_until_shipped=True)
    with pytest.raises(AuditError, match="audit spool full"):
        fill(sink, 0, 100)
    head = sink.head
    files = {path: path.read_bytes() for path in log_files(log)}
    with pytest.raises(AuditError, match="unshipped records are never deleted"):
        sink.write(record(999))
    assert sink.head == head
    assert {path: path.read_bytes() for path in log_files(log)} == files
    assert spool_size(log) <= 2 * 4096
    # The shipper deletes the oldest sealed segment once confirmed: then records fit again.
    starts = sink.segments()
    assert not sink.delete_shipped(starts[1])  # only the oldest
    assert not sink.delete_shipped(starts[-1])  # never the active file
    assert sink.delete_shipped(starts[0])
    sink.write(record(1000))
    sink.close()
    assert verify_segments(log_files(log), anchored=True).ok


def test_logs_of_other_workers_beside_are_not_its_segments(tmp_path: Path) -> None:
    for name in ("decisions.jsonl", "decisions.1.jsonl"):
        sink = JsonlAuditSink(tmp_path / name, SMALL)
        fill(sink, 0, 20)
        sink.close()
    own = sealed_segments(tmp_path / "decisions.jsonl")
    assert own and all(path.name.startswith("decisions.jsonl.") for _, path in own)
    assert verify_segments(log_files(tmp_path / "decisions.1.jsonl")).records == 20


@pytest.fixture
def segmented(tmp_path: Path) -> Path:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 0, 40)
    sink.close()
    assert len(sealed_segments(log)) >= 3
    return log


def test_verify_finds_a_removed_middle_segment(segmented: Path) -> None:
    _, middle = sealed_segments(segmented)[1]
    middle.unlink()
    report = verify_segments(log_files(segmented))
    assert not report.ok and report.problem is not None
    assert "records removed or reordered" in report.problem


def test_verify_finds_an_edited_record_in_a_segment(segmented: Path) -> None:
    _, middle = sealed_segments(segmented)[1]
    middle.write_bytes(middle.read_bytes().replace(b"chunk-", b"chunk_", 1))
    report = verify_segments(log_files(segmented))
    assert not report.ok and report.problem is not None
    assert report.problem.startswith(f"{middle.name} line 1: seq ")
    assert "(edited)" in report.problem


def test_segments_are_ordered_by_their_content_not_their_names(segmented: Path) -> None:
    files = log_files(segmented)
    renamed = [
        path.rename(path.with_name(f"copy-{n}.jsonl")) for n, path in enumerate(reversed(files))
    ]
    assert verify_segments(in_chain_order(renamed)).records == 40


def test_verify_command_takes_the_log_path_or_its_segments(
    segmented: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", str(segmented)]) == 0
    assert "ok: 40 records, chain intact" in capsys.readouterr().out
    # The segments after the first, the active file by its own name only (not as the log).
    later = [str(path) for _, path in sealed_segments(segmented)[1:]]
    assert main(["audit", "verify", *later]) == 1
    assert "verify with --anchored" in capsys.readouterr().err
    assert main(["audit", "verify", "--anchored", *reversed(later)]) == 0
    out = capsys.readouterr().out
    first = sealed_segments(segmented)[1][0]
    assert f"anchored: starts at seq {first}, whose prev_sha256" in out


def test_a_single_file_log_from_before_segments_is_the_active_segment(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    old = JsonlAuditSink(log)  # the defaults: 16 MiB segments, as a log written before
    fill(old, 0, 12)
    old.close()
    sink = JsonlAuditSink(log, SMALL)
    fill(sink, 12, 1)
    sink.close()
    assert [first for first, _ in sealed_segments(log)] == [1]
    assert seqs(log) == [13]
    assert verify_chain(sealed_path(log, 1)).records == 12


def load(tmp_path: Path, audit: str) -> object:
    config = tmp_path / "gate.toml"
    config.write_text('[identity]\nmode = "trusted-headers"\n[audit]\nlog = "a.jsonl"\n' + audit)
    return load_settings(config).audit


def test_spool_settings_are_checked(tmp_path: Path) -> None:
    settings = load(tmp_path, "segment_bytes = 65536\nmax_spool_bytes = 131072\n")
    assert settings == load(tmp_path, "segment_bytes = 65536\nmax_spool_bytes = 131072\n")
    with pytest.raises(ConfigError, match=r"at least twice audit\.segment_bytes"):
        load(tmp_path, "segment_bytes = 65536\nmax_spool_bytes = 100000\n")
    with pytest.raises(ConfigError, match=r"audit\.segment_bytes: must be >= 4096"):
        load(tmp_path, "segment_bytes = 100\n")
    with pytest.raises(ConfigError, match=r"audit\.retention_seconds applies without audit\.store"):
        load(tmp_path, 'store = "postgresql://db/a"\nretention_seconds = 60\n')
    with pytest.raises(ConfigError, match=r"audit\.segment_size"):
        load(tmp_path, "segment_size = 65536\n")


def test_explain_finds_a_decision_in_a_sealed_segment_of_a_pruned_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "decisions.jsonl"
    sink = JsonlAuditSink(log, SpoolLimits(segment_bytes=4096, max_spool_bytes=3 * 4096))
    fill(sink, 0, 60)
    sink.close()
    first, oldest = sealed_segments(log)[0]
    assert first > 1
    decision = orjson.loads(oldest.read_bytes().splitlines()[1])["decision_id"]
    assert main(["explain", "--audit-log", str(log), decision, "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["audit_log"] == str(oldest) and report["line"] == 2
    assert report["chain"]["ok"] and report["chain"]["first_seq"] == first


def test_the_server_reports_the_spool_in_its_metrics(tmp_path: Path) -> None:
    metrics = GateMetrics()
    settings = settings_of(
        audit_log=tmp_path / "decisions.jsonl", segment_bytes=4096, max_spool_bytes=3 * 4096
    )
    sink = build_audit(settings, metrics)
    for i in range(100):
        sink.write(record(i))
    sink.close()

    def sample(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert sample("retrieval_gate_audit_spool_limit_bytes") == 3 * 4096
    assert sample("retrieval_gate_audit_spool_bytes") == spool_size(tmp_path / "decisions.jsonl")
    assert sample("retrieval_gate_audit_oldest_unshipped_timestamp_seconds") == 0
    assert sample("retrieval_gate_audit_segments_deleted_total", reason="shipped") == 0
    deleted = sample("retrieval_gate_audit_segments_deleted_total", reason="retention")
    assert deleted is not None and deleted > 0


def test_a_segment_deleted_while_verifying_is_an_error_not_a_crash(
    segmented: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def deleted(*_: object, **__: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", "gone.jsonl")

    monkeypatch.setattr("sidecar.cli.audit.verify_segments", deleted)
    assert main(["audit", "verify", str(segmented)]) == 1
    assert "cannot read gone.jsonl: No such file or directory" in capsys.readouterr().err
