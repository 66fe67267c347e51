"""Signed checkpoints of an audit chain: what one says, how it is signed, where it is kept.

The chain (``sidecar.audit.chain``) has no key: whoever can write the log or
the table can recompute it from any record on. A checkpoint is the gate's
Ed25519 signature over its chain's head at one moment (chain id, seq, that
record's sha256, the time, the key id, and how often the gate promises to
sign: every ``every_records`` records and ``every_seconds`` seconds). A record
rewritten after a checkpoint covered it no longer matches that checkpoint's
digest, and the promise bounds how long a record may stay uncovered.

Checkpoints live in a JSON Lines file beside the log, ``<log>.checkpoints.jsonl``,
one per line, never rotated: a line is a few hundred bytes per N records or
T seconds, so the file outlives every segment it covers, and deleting
segments (retention, shipping) never deletes a signature. With a PostgreSQL
audit store the file is the spool of the ``audit_checkpoints`` table
(``sidecar.audit.checkpoint_store``).

The signature covers :data:`SIGNING_CONTEXT` followed by the canonical JSON
of every field but ``signature`` (sorted keys, compact, as records are
hashed), so a signature made for a checkpoint can never pass for another
kind of message signed with the same key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import orjson
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from sidecar.audit.chain import canonical_json
from sidecar.audit.sink import AuditError

SIGNING_CONTEXT: Final = b"retrieval-gate audit checkpoint v1\n"


class CheckpointError(AuditError):
    """A checkpoint line cannot be read, or the checkpoints cannot be continued."""


def checkpoints_path(log: Path) -> Path:
    """Where the checkpoints of the audit log ``log`` are kept: ``<log>.checkpoints.jsonl``."""
    return log.with_name(f"{log.name}.checkpoints.jsonl")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One signed statement: record ``seq`` of chain ``chain_id`` has digest ``sha256``."""

    chain_id: str
    seq: int
    sha256: str
    time: str  # ISO 8601 with offset, when it was signed
    key_id: str
    every_records: int  # the gate signs at least every this many records...
    every_seconds: float  # ...and this long after a record was written
    signature: str = ""  # base64url Ed25519 signature, without padding

    def signed_bytes(self) -> bytes:
        """What the signature covers: the context string, then the canonical body."""
        body = {k: v for k, v in asdict(self).items() if k != "signature"}
        return SIGNING_CONTEXT + canonical_json(body)

    def line(self) -> bytes:
        """The checkpoint as one JSON line (no newline)."""
        return canonical_json(asdict(self))

    @classmethod
    def parse(cls, line: bytes | str) -> Checkpoint:
        """A checkpoint from its line; CheckpointError names what is wrong with it."""
        try:
            fields = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise CheckpointError("not valid JSON") from None
        if not isinstance(fields, dict) or set(fields) != _FIELDS:
            raise CheckpointError("not a checkpoint (its fields differ)")
        types: Mapping[str, tuple[type, ...]] = {
            "seq": (int,),
            "every_records": (int,),
            "every_seconds": (int, float),
        }
        for name, value in fields.items():
            if not isinstance(value, types.get(name, (str,))) or isinstance(value, bool):
                raise CheckpointError(f"{name} has the wrong type")
        return cls(**fields)


_FIELDS: Final = frozenset(Checkpoint.__dataclass_fields__)


def sign(checkpoint: Checkpoint, key: Ed25519PrivateKey) -> Checkpoint:
    """``checkpoint`` with its signature by ``key``."""
    signature = key.sign(checkpoint.signed_bytes())
    encoded = base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
    return Checkpoint(**{**asdict(checkpoint), "signature": encoded})


def signature_problem(checkpoint: Checkpoint, keys: Mapping[str, Ed25519PublicKey]) -> str | None:
    """Why ``checkpoint`` is not validly signed by the key its ``key_id`` names, or None."""
    key = keys.get(checkpoint.key_id)
    if key is None:
        known = ", ".join(sorted(keys)) or "none"
        return f"signed by unknown key id {checkpoint.key_id!r} (known: {known})"
    try:
        signature = base64.urlsafe_b64decode(
            checkpoint.signature + "=" * (-len(checkpoint.signature) % 4)
        )
        key.verify(signature, checkpoint.signed_bytes())
    except (binascii.Error, ValueError, InvalidSignature):
        return f"signature does not verify with key {checkpoint.key_id!r} (forged or edited)"
    return None


def key_fingerprint(key: Ed25519PublicKey) -> str:
    """The default key id: ``ed25519:`` and the first 16 hex digits of the raw key's SHA-256."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file ``path`` (unencrypted PKCS#8, as
    ``openssl genpkey -algorithm ed25519`` writes it).

    Raises ValueError with a message naming the file and the problem, never
    its contents.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(
            f"{path}: not an unencrypted PEM private key "
            "(make one with `openssl genpkey -algorithm ed25519`)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 key ({type(key).__name__.removeprefix('_')})")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file ``path``; ValueError names the problem."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError(
            f"{path}: not a PEM public key (`openssl pkey -in KEY -pubout` writes one)"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def read_checkpoints(path: Path) -> list[Checkpoint]:
    """Every checkpoint in the file ``path``, in file order.

    Raises CheckpointError naming the line that is not a checkpoint, and
    OSError when the file cannot be read.
    """
    found: list[Checkpoint] = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                found.append(Checkpoint.parse(raw))
            except CheckpointError as exc:
                raise CheckpointError(f"{path.name} line {number}: {exc}") from None
    return found


def last_checkpoint(path: Path) -> Checkpoint | None:
    """The last checkpoint of the file ``path``, once an unterminated last line
    (a write cut short by a crash: never acknowledged) is cut off; None when empty.
    """
    with path.open("r+b") as handle:
        data = handle.read()
        end = data.rfind(b"\n") + 1
        if end != len(data):
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    lines = data[:end].splitlines()
    if not lines:
        return None
    try:
        return Checkpoint.parse(lines[-1])
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: last line: {exc}") from None
