"""An audited decision, for `retrieval-gate explain --audit-log`: what was decided then, and now.

The audit record is read as the JSON it is, not as the typed record: a log
written by a newer gate may carry fields this one does not know, and they are
shown rather than refused. Re-deciding now uses the same gate and store as a
chunk asked about by id (``explain_evaluate``), with the caller the record
names: its tenant, and principals checked against the record's digest.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from sidecar.audit.verify import ChainReport
from sidecar.cli.explain_evaluate import build_gate, decide, lookup, misuse
from sidecar.cli.explain_reasons import record_fields, why
from sidecar.config import Settings
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision import ChunkDecision
from sidecar.core.reasons import Reason, ReasonOrder
from sidecar.store.loader import format_timestamp

# What an audit record keeps of a hit's text: only whether it matched (the reasons).
_INTEGRITY_CARRIED = (
    "the audit record keeps no copy or hash of the returned text, so the text is not "
    "re-checked: HASH_MISMATCH and PAYLOAD_HASH_MISMATCH are carried over from the record, "
    "and a text that matched then is taken to match now (it would not if the record's "
    "sha256 changed since)"
)
_INTEGRITY_REASONS = frozenset({Reason.HASH_MISMATCH, Reason.PAYLOAD_HASH_MISMATCH})
# Audit fields shown as the decision's context; upstream_text is left out on purpose
# (it can quote a document or the query).
_RECORD_FIELDS = (
    "time",
    "request_id",
    "tenant",
    "principals_sha256",
    "format",
    "mode",
    "outcome",
    "policy_version",
    "tenant_filter",
    "overfetched",
    "refusal",
    "error",
    "upstream_status",
    "upstream_code",
)
# Shown per chunk, in the chain line, or (upstream_text) never.
_NOT_IN_CONTEXT = frozenset(
    {"candidates", "rejected", "admitted", "released", "substituted", "upstream_text"}
    | {"decision_id", "seq", "sha256", "prev_sha256"}
)


def find_record(
    files: Sequence[Path], decision_id: str
) -> tuple[Path, int, int, dict[str, Any]] | None:
    """Where ``decision_id`` is in a log's files (the first, if repeated): the file,
    the line in it, the line counted across all files, and the record."""
    position = 0
    for path in files:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                position += 1
                try:
                    record = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue  # the chain report names it
                if isinstance(record, dict) and record.get("decision_id") == decision_id:
                    return path, number, position, record
    return None


def chain_report(chain: ChainReport) -> dict[str, Any]:
    """The chain's verification, as the report shows it."""
    return {
        "ok": chain.ok,
        "records": chain.records,
        "head_sha256": chain.head_sha256,
        "problem": chain.problem,
        # Where verification started: seq 1 after GENESIS, or an anchor (earlier
        # segments deleted by retention or after shipping).
        "first_seq": chain.first_seq,
        "anchor_sha256": chain.anchor_sha256,
    }


def recorded_context(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's fields about the request, in a fixed order, then any other scalar
    field (a newer gate may add some), never ``upstream_text``."""
    shown = {name: record[name] for name in _RECORD_FIELDS if name in record}
    for name, value in record.items():
        if name in shown or name in _NOT_IN_CONTEXT:
            continue
        if value is None or isinstance(value, str | int | float | bool):
            shown[name] = value
    if "upstream_text" in record:
        shown["upstream_text"] = f"{len(str(record['upstream_text']))} characters, not shown"
    return shown


def recorded_chunks(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per recorded candidate: what was decided then, and what went out."""
    candidates = record.get("candidates")
    if not isinstance(candidates, list):
        return []
    rejected = {
        entry.get("position"): entry
        for entry in record.get("rejected") or []
        if isinstance(entry, dict)
    }
    substituted = {
        entry.get("position"): entry.get("substitute")
        for entry in record.get("substituted") or []
        if isinstance(entry, dict)
    }
    released = set(record.get("released") or [])
    chunks = []
    # A candidate's position is its index in ``candidates`` (both count hits in body order).
    for position, chunk_id in enumerate(candidates):
        entry = rejected.get(position)
        reasons = [str(r) for r in entry.get("reasons", [])] if entry else []
        then: dict[str, Any] = {
            "decision": "reject" if reasons else "admit",
            "reasons": reasons,
            "why": {reason: why(reason, None, None, None) for reason in reasons},
        }
        if entry:
            # Every other field of the entry as recorded: detail, and whatever a
            # newer gate adds next to the reasons (e.g. a drift class).
            then.update(
                {k: v for k, v in entry.items() if k not in ("position", "chunk_id", "reasons")}
            )
        substitute = substituted.get(position)
        if substitute is not None:
            then["substituted_by"] = substitute
        then["released"] = (substitute or chunk_id) in released
        chunks.append({"position": position, "chunk_id": chunk_id, "then": then})
    return chunks


def redecide(
    settings: Settings | None,
    principals: Collection[str] | None,
    drafts: bool,
    record: Mapping[str, Any],
    chunks: list[dict[str, Any]],
) -> dict[str, Any]:
    """Re-decide the recorded chunks now (filling each chunk's ``now``), or say why not.

    Raises ``CannotExplain`` when ``principals`` are another caller's, or the
    policy or the store fails.
    """
    if settings is None:
        return {"evaluated": False, "why_not": "no store given (--store URL or --config)"}
    tenant = record.get("tenant")
    if principals is None or not isinstance(tenant, str):
        return {
            "evaluated": False,
            "why_not": "the record keeps only a digest of the caller's principals: give "
            "--principals P1,P2 (checked against it) to re-evaluate",
        }
    caller = Caller(tenant, frozenset(principals), drafts_allowed=drafts)
    if caller.principals_digest() != record.get("principals_sha256"):
        raise misuse(
            "--principals do not match the record's principals_sha256: that is another caller"
        )
    gate, policy_version, _ = build_gate(settings)
    # Malformed hits had no usable id or text: nothing in the store or the policy changes that.
    redecided_chunks = [
        c
        for c in chunks
        if isinstance(c["chunk_id"], str) and Reason.MALFORMED_CHUNK not in c["then"]["reasons"]
    ]
    chunk_ids = list(dict.fromkeys(c["chunk_id"] for c in redecided_chunks))
    records = lookup(settings.store.url, chunk_ids)
    now = datetime.now(UTC)
    decided = dict(zip(chunk_ids, decide(gate, caller, chunk_ids, records, {}, now), strict=True))
    order = ReasonOrder(settings.policy.custom_reasons)
    redecided = {id(c) for c in redecided_chunks}
    for chunk in chunks:
        if id(chunk) in redecided:
            chunk["now"] = _compare(
                chunk,
                decided[chunk["chunk_id"]],
                records.get(chunk["chunk_id"]),
                caller,
                now,
                order,
            )
        else:
            chunk["now"] = None
            chunk["same"] = None
    then_version = record.get("policy_version")
    return {
        "evaluated": True,
        "at": format_timestamp(now),
        "policy_version": policy_version,
        "policy_changed": then_version is not None and then_version != policy_version,
        "drafts_allowed": drafts,
        "integrity": _INTEGRITY_CARRIED,
    }


def _compare(
    chunk: dict[str, Any],
    decision: ChunkDecision,
    record: ChunkRecord | None,
    caller: Caller,
    now: datetime,
    order: ReasonOrder,
) -> dict[str, Any]:
    """The chunk's decision now, with the integrity reasons of then carried over; sets
    the chunk's ``same`` and ``differences``."""
    then_reasons: list[str] = chunk["then"]["reasons"]
    carried = [r for r in then_reasons if r in _INTEGRITY_REASONS]
    reasons = [str(r) for r in order.sort([*decision.reasons, *carried])]
    whys = {reason: why(reason, record, caller, now) for reason in reasons}
    for reason in carried:
        whys[reason] = "carried over from the record (the returned text is not kept)"
    added = [r for r in reasons if r not in then_reasons]
    gone = [r for r in then_reasons if r not in reasons]
    chunk["same"] = not added and not gone
    chunk["differences"] = [f"now {r}: {whys[r]}" for r in added] + [f"no longer {r}" for r in gone]
    return {
        "decision": "reject" if reasons else "admit",
        "reasons": reasons,
        "why": whys,
        "record": None if record is None else record_fields(record),
    }
