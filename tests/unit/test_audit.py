"""The hash-chained JSON Lines audit sink and `audit verify FILE`."""

from __future__ import annotations

import argparse
import resource
from pathlib import Path

import orjson
import pytest

from sidecar.audit.chain import GENESIS, BrokenChain, ChainWalk, link, record_digest
from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.audit.segments import offset_in
from sidecar.audit.sink import AuditError
from sidecar.audit.verify import verify_chain
from sidecar.cli import main
from sidecar.cli.audit import add_verify_arguments, verify


def offset_after(path: Path, seq: int) -> tuple[int, dict[str, object] | None]:
    """Where the record after ``seq`` starts in ``path``, and record ``seq`` (0: the start)."""
    if seq == 0:
        return 0, None
    with path.open("rb") as handle:
        return offset_in(handle, seq)


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


def test_sink_refuses_to_append_after_a_damaged_last_line(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    with log.open("ab") as handle:
        handle.write(b'{"not": "a record"}\n')
    with pytest.raises(AuditError, match="last line is not an intact audit record"):
        JsonlAuditSink(log)


def test_torn_tail_from_a_crash_is_set_aside_and_the_chain_continues(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    with log.open("ab") as handle:
        handle.write(b'{"decision_id":"d9","half a rec')  # killed mid-write: no newline
    write(log, 1)
    assert [orjson.loads(line)["seq"] for line in lines(log)] == [1, 2, 3]
    assert verify_chain(log).ok
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == b'{"decision_id":"d9","half a rec\n'


def test_cli_verify_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    assert main(["audit", "verify", str(log)]) == 0
    assert "2 records, chain intact" in capsys.readouterr().out
    content = lines(log)
    log.write_bytes(content[1] + b"\n")
    assert main(["audit", "verify", str(log)]) == 1
    assert "line 1" in capsys.readouterr().err


def test_offset_after_finds_the_resume_point_across_blocks(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(log)
    for i in range(3000):
        sink.write({"decision_id": f"d{i}", "padding": "x" * 100})  # ~0.5 MB: many blocks
    sink.close()
    content = log.read_bytes()
    assert offset_after(log, 0) == (0, None)
    for seq in (1, 1500, 2999):
        offset, found = offset_after(log, seq)
        assert found is not None and found["seq"] == seq
        assert orjson.loads(content[offset:].split(b"\n", 1)[0])["seq"] == seq + 1
    assert offset_after(log, 3000)[0] == len(content)
    with pytest.raises(AuditError, match="no record with seq 3001"):
        offset_after(log, 3001)


def test_a_last_line_longer_than_a_block_is_found(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(log)
    sink.write({"decision_id": "d0"})
    sink.write({"decision_id": "d1", "admitted": ["c" * 100] * 2000})  # ~200 KB
    sink.close()
    assert JsonlAuditSink(log).head == (2, orjson.loads(lines(log)[1])["sha256"])


def run_verify(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_verify_arguments(parser)
    return verify(parser.parse_args(argv))


def test_verify_command_on_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    assert run_verify(str(log)) == 0
    assert "ok: 2 records, chain intact" in capsys.readouterr().out
    log.write_bytes(lines(log)[1] + b"\n")
    assert run_verify(str(log)) == 1
    assert "BROKEN after 0 good records: line 1: seq is 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give audit log FILEs, --store URL, or both"),
        (("audit.jsonl", "--store", "postgresql://db/a"), "name the files' chain with --chain"),
        (("audit.jsonl", "--store", "postgresql://db/a", "--anchored"), "FILEs alone"),
        ((".",), "is a directory"),
        (("audit.jsonl", "--chain", "a"), "--chain applies to --store only"),
        (("missing.jsonl",), "no such audit log"),
    ],
)
def test_verify_command_usage_errors(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "audit.jsonl", 1)
    assert run_verify(*argv) == 2
    assert message in capsys.readouterr().err


def test_offset_after_ignores_a_line_still_being_written(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    size = log.stat().st_size
    with log.open("ab") as handle:
        handle.write(b'{"decision_id":"d2","seq":3,"pre')  # another thread's write in flight
    offset, found = offset_after(log, 2)
    assert offset == size and found is not None and found["seq"] == 2


def test_a_line_is_the_canonical_json_of_the_record_and_its_digest(tmp_path: Path) -> None:
    # The sink serialises once without and once with the digest; the line must
    # be exactly what the chain contract defines, key order and all.
    log = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(log)
    record = {"decision_id": "d1", "rejected": [{"reasons": ["EXPIRED"], "chunk_id": "c1"}]}
    sink.write(record)
    sink.close()
    chained = {**record, "seq": 1, "prev_sha256": GENESIS}
    expected = {**chained, "sha256": record_digest(chained)}
    assert lines(log) == [orjson.dumps(expected, option=orjson.OPT_SORT_KEYS)]
    assert record == {"decision_id": "d1", "rejected": [{"reasons": ["EXPIRED"], "chunk_id": "c1"}]}


def test_a_sha256_field_in_the_record_does_not_forge_the_digest(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    sink = JsonlAuditSink(log)
    sink.write({"decision_id": "d1", "sha256": "f" * 64})
    sink.write({"decision_id": "d2"})
    sink.close()
    first = orjson.loads(lines(log)[0])
    assert first["sha256"] == record_digest(first) != "f" * 64
    assert verify_chain(log).ok


# The chain itself (sidecar.audit.chain), which every sink and verifier shares


def test_link_sets_the_chain_fields_and_ignores_forged_ones() -> None:
    record = {"decision_id": "d1", "seq": 99, "prev_sha256": "f" * 64, "sha256": "e" * 64}
    digest, line = link(record, 1, GENESIS)
    linked = orjson.loads(line)
    assert linked == {"decision_id": "d1", "seq": 1, "prev_sha256": GENESIS, "sha256": digest}
    assert digest == record_digest(linked)
    assert record["seq"] == 99  # the caller's record is not changed


def test_a_walk_accepts_only_a_checked_record_and_stays_put_on_a_broken_link() -> None:
    first_digest, first = link({"decision_id": "d1"}, 1, GENESIS)
    _, second = link({"decision_id": "d2"}, 2, first_digest)
    walk = ChainWalk()
    assert walk.check(first)["decision_id"] == "d1"
    assert (walk.seq, walk.head) == (0, GENESIS)  # checked, not yet accepted
    with pytest.raises(BrokenChain, match=r"^seq 1: seq is 2, expected 1"):
        walk.follow(second)
    assert (walk.seq, walk.head) == (0, GENESIS)
    walk.follow(first)
    assert walk.follow(second)["decision_id"] == "d2"
    assert walk.seq == 2


def test_a_walk_can_start_after_a_known_record_and_names_records_its_own_way() -> None:
    first_digest, _ = link({"decision_id": "d1"}, 1, GENESIS)
    _, second = link({"decision_id": "d2"}, 2, first_digest)
    assert ChainWalk(seq=1, head=first_digest).follow(second)["seq"] == 2
    with pytest.raises(BrokenChain, match=r"^line 2: prev_sha256 does not match line 1's"):
        ChainWalk("line {}".format, seq=1, head="0" * 63 + "1").follow(second)
    with pytest.raises(BrokenChain, match=r"^line 1: not valid JSON$"):
        ChainWalk("line {}".format).follow(b"{")
    with pytest.raises(BrokenChain, match=r"^seq 1: not a JSON object$"):
        ChainWalk().follow(b"[]")


def test_a_full_disk_refuses_records_and_leaves_no_fragment(tmp_path: Path) -> None:
    # A file size limit fails writes the way a full disk does: a short write,
    # then an error. Found by bench/faults.py (audit_disk_full): the second
    # refused record used to cut the file back to a stale position past its
    # end, leaving zeros and a fragment the chain could not get past.
    path = tmp_path / "d.jsonl"
    sink = JsonlAuditSink(path)
    padding = "p" * 1000
    sink.write({"decision_id": "d0", "padding": padding})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 1500, hard))
    written, refused = [], 0
    try:
        for i in range(1, 6):
            try:
                sink.write({"decision_id": f"d{i}", "padding": padding})
                written.append(f"d{i}")
            except AuditError:
                refused += 1
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    sink.write({"decision_id": "d99", "padding": padding})  # space again
    sink.close()
    assert refused >= 2
    assert verify_chain(path).ok
    assert [orjson.loads(line)["decision_id"] for line in lines(path)] == ["d0", *written, "d99"]
