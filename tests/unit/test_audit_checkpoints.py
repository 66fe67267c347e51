"""Signed checkpoints of the audit chain: written every N records, every T seconds and at
close; ``audit verify --public-key`` requires them to cover the chain."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from sidecar.audit.chain import link
from sidecar.audit.checkpointing import CheckpointingSink, SigningKey
from sidecar.audit.checkpoints import (
    CheckpointError,
    checkpoints_path,
    key_fingerprint,
    load_signing_key,
    read_checkpoints,
)
from sidecar.audit.jsonl import JsonlAuditSink
from sidecar.cli import main
from sidecar.config import ConfigError
from sidecar.config.load import load_settings
from sidecar.runtime.server import load_checkpoint_key
from tests.fixtures.checkpoint_keys import write_key_pair, write_rsa_key

START = 1_700_000_000.0


class Clock:
    """The time the sink and the records are dated with, moved by the test."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds")


def open_sink(
    log: Path,
    key: Path,
    *,
    key_id: str | None = None,
    every_records: int = 3,
    every_seconds: float = 60.0,
    clock: Clock | None = None,
) -> CheckpointingSink:
    private = load_signing_key(key)
    return CheckpointingSink(
        JsonlAuditSink(log),
        checkpoints_path(log),
        chain_id="gate-0",
        signing=SigningKey(private, key_id or key_fingerprint(private.public_key())),
        every_records=every_records,
        every_seconds=every_seconds,
        clock=clock or time.time,
    )


def write(sink: CheckpointingSink, count: int, clock: Clock, step: float = 1.0) -> None:
    for _ in range(count):
        sink.write({"decision_id": f"d{sink.head[0] + 1}", "time": iso(clock.now)})
        clock.now += step


def verify(log: Path, *keys: Path | str) -> int:
    argv = ["audit", "verify", str(log)]
    for key in keys:
        argv += ["--public-key", str(key)]
    return main(argv)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return write_key_pair(tmp_path, "old")


def test_a_checkpoint_every_n_records_and_one_at_close(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 7, clock)
    assert [c.seq for c in read_checkpoints(checkpoints_path(log))] == [3, 6]
    sink.close()
    signed = read_checkpoints(checkpoints_path(log))
    assert [c.seq for c in signed] == [3, 6, 7]
    heads = [orjson.loads(line)["sha256"] for line in log.read_bytes().splitlines()]
    assert [c.sha256 for c in signed] == [heads[2], heads[5], heads[6]]
    assert verify(log, keys[1]) == 0
    out = capsys.readouterr().out
    assert "ok: 7 records, chain intact" in out
    assert "signed: 3 checkpoints by ed25519:" in out
    # Nothing written since: a restart and a close add no checkpoint.
    open_sink(log, keys[0], clock=clock).close()
    assert len(read_checkpoints(checkpoints_path(log))) == 3


def test_without_a_key_the_chain_is_said_to_be_unsigned(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 2, clock)
    sink.close()
    assert verify(log) == 0
    assert "unsigned: no --public-key given" in capsys.readouterr().out


def test_a_chain_recomputed_from_the_middle_after_a_checkpoint_fails(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 6, clock)
    sink.close()
    records = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    # Whoever can write the log edits record 2 and recomputes every link after it.
    records[1]["decision_id"] = "forged"
    lines = [log.read_bytes().splitlines()[0]]
    prev = records[0]["sha256"]
    for seq, record in enumerate(records[1:], start=2):
        prev, line = link({k: v for k, v in record.items()}, seq, prev)
        lines.append(line)
    log.write_bytes(b"\n".join(lines) + b"\n")
    assert verify(log) == 0  # the chain alone is intact
    capsys.readouterr()
    assert verify(log, keys[1]) == 1
    err = capsys.readouterr().err
    assert "seq 3: sha256 differs from the checkpoint signed at" in err
    assert "rewritten after it was signed" in err


def test_rotation_to_a_second_key_verifies_with_both_and_not_with_one(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    new_private, new_public = write_key_pair(tmp_path, "new")
    sink = open_sink(log, keys[0], key_id="gate-2024", clock=clock)
    write(sink, 4, clock)
    sink.close()
    sink = open_sink(log, new_private, key_id="gate-2025", clock=clock)
    write(sink, 4, clock)
    sink.close()
    assert {c.key_id for c in read_checkpoints(checkpoints_path(log))} == {
        "gate-2024",
        "gate-2025",
    }
    assert verify(log, f"gate-2024={keys[1]}", f"gate-2025={new_public}") == 0
    assert "by gate-2024, gate-2025" in capsys.readouterr().out
    assert verify(log, f"gate-2025={new_public}") == 1
    assert "signed by unknown key id 'gate-2024'" in capsys.readouterr().err
    # The right key under the wrong id does not verify either.
    assert verify(log, f"gate-2024={new_public}", f"gate-2025={new_public}") == 1
    assert "signature does not verify with key 'gate-2024'" in capsys.readouterr().err


def test_records_left_unsigned_beyond_t_fail(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], every_records=1000, every_seconds=60, clock=clock)
    sink._stopping.set()  # no timer: the checkpoints due every 60 s never come
    sink._thread.join()
    write(sink, 3, clock, step=100.0)
    sink.close()  # one checkpoint, at close, 300 s after the first record
    assert verify(log, keys[1]) == 1
    err = capsys.readouterr().err
    assert "seq 1: first signed by the checkpoint at seq 3, 300.0s after it was written" in err
    # Without that checkpoint the records are a tail older than T: one is missing.
    checkpoints_path(log).write_bytes(b"")
    assert verify(log, keys[1]) == 1
    assert "no checkpoint signs any of these records" in capsys.readouterr().err


def test_a_tail_within_t_is_accepted_and_one_beyond_t_is_not(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], every_records=3, every_seconds=60, clock=clock)
    write(sink, 3, clock)  # signed at seq 3
    write(sink, 2, clock, step=30.0)  # seq 4, 5: 30 s apart, not yet due
    assert verify(log, keys[1]) == 0
    assert "the last at seq 3; 2 records after it" in capsys.readouterr().out
    write(sink, 1, clock, step=60.0)  # seq 6 is the third: signed at once
    sink.write({"decision_id": "late", "time": iso(clock.now + 100)})  # seq 7, 100 s later
    sink.write({"decision_id": "later", "time": iso(clock.now + 200)})  # seq 8
    assert verify(log, keys[1]) == 1
    assert "seq 7-8: not signed, and seq 7 was written 100.0s before" in capsys.readouterr().err
    sink.close()


def test_a_removed_tail_after_a_checkpoint_fails(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 6, clock)
    sink.close()
    log.write_bytes(b"\n".join(log.read_bytes().splitlines()[:5]) + b"\n")
    assert verify(log, keys[1]) == 1
    assert "checkpoint at seq 6 signs a record the chain does not hold" in capsys.readouterr().err


def test_the_timer_signs_t_after_the_first_unsigned_record(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    log = tmp_path / "audit.jsonl"
    sink = open_sink(log, keys[0], every_records=1000, every_seconds=0.2)
    sink.write({"decision_id": "d1", "time": iso(time.time())})
    deadline = time.monotonic() + 10
    while sink.signed_seq != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sink.signed_seq == 1
    sink.close()
    assert [c.seq for c in read_checkpoints(checkpoints_path(log))] == [1]


def test_checkpoints_of_another_log_refuse_to_open(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 3, clock)
    sink.close()
    log.unlink()  # a new, empty log beside the old checkpoints
    with pytest.raises(CheckpointError, match="signs seq 3 but the audit log ends at seq 0"):
        open_sink(log, keys[0], clock=clock)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        (b"not a key", "not an unencrypted PEM private key"),
        ("rsa", "not an Ed25519 key"),
    ],
)
def test_a_bad_key_file_is_a_configuration_error_naming_the_file(
    tmp_path: Path, content: bytes | str | None, message: str
) -> None:
    key = tmp_path / "checkpoint.pem"
    if content == "rsa":
        write_rsa_key(key)
    elif isinstance(content, bytes):
        key.write_bytes(content)
    settings = load_settings(
        overrides={
            "identity": "trusted-headers",
            "audit_log": str(tmp_path / "audit.jsonl"),
            "checkpoint_key_file": str(key),
        }
    )
    with pytest.raises(ConfigError) as raised:
        load_checkpoint_key(settings)
    text = str(raised.value)
    assert text.startswith(f"audit.checkpoint_key_file {key}: {message}")
    assert "\n" not in text
    if content == "rsa":
        assert "PRIVATE KEY" not in text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"checkpoint_every_records": 0}, "audit.checkpoint_every_records"),
        ({"checkpoint_every_seconds": 0.5}, "audit.checkpoint_every_seconds"),
        ({"checkpoint_key_id": "k1"}, "audit.checkpoint_key_id needs audit.checkpoint_key_file"),
    ],
)
def test_impossible_checkpoint_settings_are_refused(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(overrides={"identity": "trusted-headers", **overrides})


def test_a_key_file_without_an_audit_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"audit\.checkpoint_key_file needs audit\.log"):
        load_settings(
            overrides={"identity": "trusted-headers", "checkpoint_key_file": str(tmp_path / "k")}
        )


def test_serve_exits_2_with_one_line_on_an_unreadable_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "serve",
            "--identity",
            "trusted-headers",
            "--store",
            str(tmp_path / "m.db"),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--checkpoint-key-file",
            str(tmp_path / "missing.pem"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "audit.checkpoint_key_file" in err and "missing.pem: cannot read" in err


def test_verify_refuses_a_public_key_it_cannot_use(
    tmp_path: Path, keys: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, clock = tmp_path / "audit.jsonl", Clock()
    sink = open_sink(log, keys[0], clock=clock)
    write(sink, 1, clock)
    sink.close()
    assert verify(log, keys[0]) == 2  # the private key is not a public key
    assert "not a PEM public key" in capsys.readouterr().err
    assert verify(log, keys[1], keys[1]) == 2
    assert "given twice" in capsys.readouterr().err
