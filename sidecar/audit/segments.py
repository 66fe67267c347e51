"""The audit log on disk: the file being written and the sealed segments rotated out of it.

The configured ``audit.log`` path (``decisions.jsonl``) is always the segment
being written, the *active* one. Rotation renames it to a *sealed* segment
named after the seq of its first record, ``decisions.jsonl.<seq, 20 digits>.jsonl``,
and starts a new, empty file under the configured name. So a log written
before segments existed is simply the active segment, tools that read the
configured path keep working, and the name of a sealed segment says where
in the chain it starts without reading it. The chain runs on from one
segment into the next (``seq`` and ``prev_sha256`` carry over), so the
segments in seq order, the active one last, are one chain.

This module knows names and how to read lines; when to rotate and what to
delete is the sink's (``sidecar.audit.jsonl``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from sidecar.audit.sink import AuditError

_SEQ_DIGITS = 20  # a bigint seq, zero-padded: names sort in chain order


def sealed_path(log: Path, first_seq: int) -> Path:
    """The name a segment of ``log`` whose first record is ``first_seq`` gets when sealed."""
    return log.with_name(f"{log.name}.{first_seq:0{_SEQ_DIGITS}d}.jsonl")


def log_of(path: Path) -> Path:
    """The log ``path`` belongs to: itself, or the log a sealed segment was rotated from."""
    sealed = re.fullmatch(rf"(.+)\.\d{{{_SEQ_DIGITS}}}\.jsonl", path.name)
    return path.with_name(sealed[1]) if sealed else path


def sealed_segments(log: Path) -> list[tuple[int, Path]]:
    """(first seq, path) of each sealed segment of ``log``, oldest first.

    Only names ``log`` itself produced match: the logs of other workers
    (``decisions.1.jsonl``) beside it have segments of their own.
    """
    pattern = re.compile(re.escape(log.name) + rf"\.(\d{{{_SEQ_DIGITS}}})\.jsonl")
    try:
        names = os.listdir(log.parent)
    except FileNotFoundError:
        return []
    found = [(int(m[1]), log.parent / name) for name in names if (m := pattern.fullmatch(name))]
    return sorted(found)


def log_files(log: Path) -> list[Path]:
    """Every file of ``log`` in chain order: its sealed segments, then ``log`` if it exists."""
    files = [path for _, path in sealed_segments(log)]
    if log.exists():
        files.append(log)
    return files


def lines_from_end(
    handle: BinaryIO, *, terminated_only: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) for each non-empty line, newest first, read in blocks from the end.

    Logs grow large; finding the tail or the resume point must not read the whole file.
    With ``terminated_only``, bytes after the last newline are skipped: a reader
    in another thread may see a line the writer has only partly written.
    """
    position = handle.seek(0, os.SEEK_END)
    partial = b""  # the start of a line that begins before ``position``
    tail = True  # the first piece met is what follows the file's last newline
    block = 64 * 1024
    while position > 0:
        step = min(block, position)
        position -= step
        handle.seek(position)
        chunk = handle.read(step) + partial
        pieces = chunk.split(b"\n")
        partial = pieces.pop(0)
        end = position + len(chunk)
        for piece in reversed(pieces):
            start = end - len(piece)
            if piece and not (tail and terminated_only):
                yield start, piece
            tail = False
            end = start - 1
    if partial and not (tail and terminated_only):
        yield 0, partial


def last_line(path: Path) -> bytes | None:
    """The last non-empty line of a file."""
    with path.open("rb") as handle:
        return next((line for _, line in lines_from_end(handle)), None)


def first_record(handle: BinaryIO) -> dict[str, Any] | None:
    """The record on the first complete line of an open segment, or None when it has none.

    Raises AuditError when that line is not a JSON object.
    """
    handle.seek(0)
    line = handle.readline()
    if not line.endswith(b"\n"):
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        raise AuditError(f"{handle.name}: first line is not an audit record")
    return record


def offset_in(handle: BinaryIO, seq: int) -> tuple[int, dict[str, Any]]:
    """Where the record after ``seq`` (> 0) starts in an open audit file, and record ``seq``.

    Reads from the end, so finding a recent ``seq`` costs only the lines after
    it, and safe while another thread appends (a line without its newline is
    skipped). Raises AuditError when the file holds no record ``seq`` or a
    line cannot be parsed.
    """
    for start, line in lines_from_end(handle, terminated_only=True):
        try:
            record = orjson.loads(line)
            found = int(record["seq"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise AuditError(f"{handle.name}: unreadable line at byte {start}") from exc
        if found == seq:
            return start + len(line) + 1, record
        if found < seq:
            break
    raise AuditError(f"{handle.name}: no record with seq {seq}")


def in_chain_order(paths: Iterable[Path]) -> list[Path]:
    """Audit files ordered by the seq of their first record, each once.

    Content, not names, decides: a renamed or copied segment still lands in
    its place. A file whose first line is not a record goes first, where the
    verifier reports it; empty files are left out (they hold no link).
    """
    keyed: dict[Path, tuple[int, Path]] = {}
    for path in paths:
        if path.resolve() in keyed:
            continue
        with path.open("rb") as handle:
            if handle.seek(0, os.SEEK_END) == 0:
                continue
            try:
                record = first_record(handle)
                seq = int(record["seq"]) if record is not None else 0
            except (AuditError, KeyError, TypeError, ValueError):
                seq = 0
        keyed[path.resolve()] = (seq, path)
    return [path for _, path in sorted(keyed.values(), key=lambda item: item[0])]
