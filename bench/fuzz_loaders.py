"""Fuzz targets for the loaders of operator files: chunk records (JSON Lines) and policy bundles.

``record-loader``: an input is a JSON Lines file for ``sidecar.store.loader.load_jsonl``.
It is refused with RecordsInvalid, or every record it returns holds the
record contract: unique chunk ids, aware timestamps with ``expires_at`` after
``effective_at``, a text matching its canonical SHA-256, no chunk superseding
itself, and the record written out by ``record_to_json`` reads back the same.

``bundle-loader``: an input describes a bundle for ``sidecar.rego.bundle.read_bundle``:
byte 0 holds flags (bit 0: signed with the harness's Ed25519 key and read
with its public key; bit 1: one member's content changed after signing;
bit 2: the rest of the input is the ``.tar.gz`` itself), the rest the
members, separated by 0x1e, each a type byte (regular file, directory,
symbolic link, hard link, FIFO), its name up to 0x1f, and its content. The
harness builds a real archive from them (checksums right, so the reader's
checks are reached). It is refused with BundleError, or: the bundle holds
Rego, its revision is printable and short, no member was a link, FIFO or an
unsupported file kind (data.yaml, policy.wasm ...) and no member path climbs;
read with the public key, every Rego file's text is one the harness signed
for that name, and a changed member never comes back.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fuzz_targets import ACCEPTED, REFUSED, OracleFailure, Target, header

from sidecar.core.integrity import canonical_sha256
from sidecar.rego.bundle import BundleError, read_bundle
from sidecar.rego.bundle_signature import SignatureError, Verification, file_digest
from sidecar.store.loader import RecordsInvalid, load_jsonl, parse_record, record_to_json
from tests.fixtures.records import record_dict, text_for

# -- records ---------------------------------------------------------------------------

# One file per process: two test runs (or fuzzers) at once would read each other's input.
_RECORDS_FILE: Final = (
    Path(tempfile.gettempdir()) / f"retrieval-gate-fuzz-records-{os.getpid()}.jsonl"
)


def check_records(data: bytes) -> str:
    """Load ``data`` as a records file; see the module docstring."""
    _RECORDS_FILE.write_bytes(data)
    try:
        records = load_jsonl(_RECORDS_FILE)
    except RecordsInvalid:
        return REFUSED
    ids = [record.chunk_id for record in records]
    if len(set(ids)) != len(ids):
        raise OracleFailure("two records with one chunk id were loaded")
    for record in records:
        for moment in (record.effective_at, record.expires_at):
            if moment is not None and moment.utcoffset() != timedelta(0):
                raise OracleFailure("a loaded timestamp is not in UTC")
        if record.expires_at is not None and record.expires_at <= record.effective_at:
            raise OracleFailure("a record expiring before it takes effect was loaded")
        if record.text is not None and canonical_sha256(record.text) != record.sha256:
            raise OracleFailure("a record whose text does not match its sha256 was loaded")
        if record.superseded_by == record.chunk_id:
            raise OracleFailure("a chunk superseding itself was loaded")
        if parse_record(record_to_json(record)) != record:
            raise OracleFailure("a loaded record does not read back as itself")
    return ACCEPTED


def _records_seeds() -> list[bytes]:
    lines = [
        record_dict("c-1"),
        record_dict("c-2", text=text_for("c-2"), payload={"lang": "en", "year": 2024}),
        record_dict("c-3", status="revoked", expires_at="2026-01-01T00:00:00+02:00"),
        record_dict("c-4", superseded_by="c-1", version="2", doc_id="doc-c-1"),
        record_dict("c-5", allowed_principals=["group:qa", "user:ann"], requires_signature=True),
    ]
    out = [b"\n".join(orjson.dumps(line) for line in lines) + b"\n"]
    out += [orjson.dumps(line) + b"\n" for line in lines]
    return out


# -- bundles -----------------------------------------------------------------------------

_SIGNED, _TAMPERED, _RAW = 1, 2, 4
_MEMBER, _NAME_END = b"\x1e", b"\x1f"
_TYPES: Final = (
    tarfile.REGTYPE,
    tarfile.REGTYPE,
    tarfile.DIRTYPE,
    tarfile.SYMTYPE,
    tarfile.LNKTYPE,
    tarfile.FIFOTYPE,
)
_UNSUPPORTED: Final = frozenset({"data.yaml", "data.yml", "patch.json", "policy.wasm"})
_KEY: Final = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
_PRIVATE_PEM: Final = _KEY.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
)
_PUBLIC_PEM: Final = _KEY.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)


@dataclass(frozen=True)
class _Member:
    kind: bytes
    name: str
    content: bytes


def _members(body: bytes) -> list[_Member]:
    out = []
    for part in body.split(_MEMBER):
        if not part:
            continue
        kind = _TYPES[part[0] % len(_TYPES)]
        name, _, content = part[1:].partition(_NAME_END)
        out.append(_Member(kind, name.decode("utf-8", "replace"), content))
    return out


def _archive(members: Sequence[_Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.type = member.kind
            if member.kind == tarfile.REGTYPE:
                info.size = len(member.content)
                archive.addfile(info, io.BytesIO(member.content))
            else:
                info.linkname = member.content.decode("utf-8", "replace")
                archive.addfile(info)
    return gzip.compress(buffer.getvalue(), compresslevel=1, mtime=0)


def _digest(member: _Member) -> str:
    """The digest ``opa sign`` lists: data.json and .manifest over their JSON structure."""
    try:
        return file_digest(member.name.lstrip("/"), member.content, "SHA-256")
    except SignatureError:
        return hashlib.sha256(member.content).hexdigest()  # not JSON: the reader refuses it


def _signed(members: list[_Member], tamper: bool) -> tuple[list[_Member], dict[str, str], str]:
    """The members with a ``.signatures.json`` over them, the hashes signed by name,
    and the name of the member changed after signing ("" for none)."""
    files = [m for m in members if m.kind == tarfile.REGTYPE and m.name != ".signatures.json"]
    listed = [{"name": m.name, "hash": _digest(m), "algorithm": "SHA-256"} for m in files]
    token = jwt.encode({"files": listed}, _PRIVATE_PEM, algorithm="EdDSA")
    signature = _Member(tarfile.REGTYPE, ".signatures.json", orjson.dumps({"signatures": [token]}))
    hashes = {entry["name"].lstrip("/"): entry["hash"] for entry in listed}
    changed = ""
    if tamper and files:
        target = next((m for m in files if m.name.endswith(".rego")), files[0])
        changed = target.name
        members = [
            _Member(m.kind, m.name, m.content + b"\n# changed\n") if m is target else m
            for m in members
        ]
    return [*members, signature], hashes, changed


def check_bundle(data: bytes) -> str:
    """Read the bundle ``data`` describes; see the module docstring."""
    (flags,), body = header(data, 1)
    members = _members(body)
    hashes: dict[str, str] = {}
    changed = ""
    if flags & _RAW:
        blob = body
    else:
        if flags & _SIGNED:
            members, hashes, changed = _signed(members, bool(flags & _TAMPERED))
        try:
            blob = _archive(members)
        except (ValueError, UnicodeError, tarfile.TarError):
            return REFUSED  # the harness cannot write such an archive
    key = _PUBLIC_PEM if flags & _SIGNED else None
    try:
        verification = None if key is None else Verification(key, algorithm="EdDSA")
        bundle = read_bundle(blob, verification=verification)
    except BundleError:
        return REFUSED
    if not bundle.rego:
        raise OracleFailure("a bundle without Rego was accepted")
    if len(bundle.revision) > 128 or not bundle.revision.isprintable():
        raise OracleFailure("a bundle with an unprintable or long revision was accepted")
    if not isinstance(bundle.data, dict):
        raise OracleFailure("a bundle's data is not an object")
    if flags & _RAW:
        return ACCEPTED
    for member in members:
        parts = member.name.lstrip("/").split("/")
        if member.kind not in (tarfile.REGTYPE, tarfile.DIRTYPE):
            raise OracleFailure("a bundle with a link or a FIFO was accepted")
        if ".." in parts:
            raise OracleFailure("a bundle with a climbing path was accepted")
        if member.kind == tarfile.REGTYPE and posixpath.basename(member.name) in _UNSUPPORTED:
            raise OracleFailure("a bundle with an unsupported file kind was accepted")
    if key is not None:
        for name, text in bundle.rego.items():
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest not in (hashes.get(name), hashes.get(f"./{name}")):
                raise OracleFailure("a signed bundle returned a Rego file that was not signed")
        if changed and changed.lstrip("/").removeprefix("./") in bundle.rego:
            raise OracleFailure("a member changed after signing was accepted")
    return ACCEPTED


_POLICY: Final = b"package retrieval_gate.extra\n\nimport rego.v1\n\nallow if input.x == 1\n"
_TEST: Final = b"package retrieval_gate.extra_test\n\nimport rego.v1\n\ntest_x if data.x\n"


def _bundle_input(flags: int, *members: tuple[int, str, bytes]) -> bytes:
    parts = [bytes([kind]) + name.encode() + _NAME_END + content for kind, name, content in members]
    return bytes([flags]) + _MEMBER.join(parts)


def _bundle_seeds() -> list[bytes]:
    manifest = orjson.dumps({"revision": "r1", "roots": ["retrieval_gate"]})
    data = orjson.dumps({"limits": {"max": 3}})
    usual = (
        (0, "/.manifest", manifest),
        (0, "/retrieval_gate/extra.rego", _POLICY),
        (0, "/retrieval_gate/extra_test.rego", _TEST),
        (0, "/retrieval_gate/data.json", data),
    )
    plain = ((0, "x.rego", _POLICY), (0, "a/b/data.json", b"[1, 2]"), (2, "a", b""))
    odd = ((0, "x.rego", _POLICY), (3, "link.rego", b"x.rego"), (4, "hard.rego", b"x.rego"))
    return [
        _bundle_input(0, *usual),
        _bundle_input(_SIGNED, *usual),
        _bundle_input(_SIGNED | _TAMPERED, *usual),
        _bundle_input(0, *plain),
        _bundle_input(_SIGNED, *plain),
        _bundle_input(0, *odd),
        bytes([_RAW]) + _archive(_members(_bundle_input(0, *usual)[1:])),
    ]


def targets() -> list[Target]:
    """The record loader and bundle loader targets."""
    return [
        Target("record-loader", check_records, _records_seeds, "ndjson", 0),
        Target("bundle-loader", check_bundle, _bundle_seeds, "raw", 1),
    ]
