"""What a reason means, for `retrieval-gate explain`: the words, and the record fields behind it.

One place for the meaning of every reason and for the fields a record shows,
so that a chunk asked about now, a chunk decided then and the same chunk
re-evaluated are explained in the same words. Only hashes and whether the store
holds a text are shown of a record, never the text itself: explanations are
pasted into support tickets.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sidecar.cli.explain_output import quoted_list
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision import ChunkDecision
from sidecar.core.reasons import Reason
from sidecar.store.loader import format_timestamp, quote_for_message

_HASH_NOT_CHECKED = (
    "not checked, decided as if the text matched (no returned text: give --text-file "
    "ID=FILE, or explain the decision from the audit log)"
)

_MEANING: dict[str, str] = {
    Reason.MALFORMED_CHUNK: "the hit had no usable id or text",
    Reason.MISSING_METADATA: "no record with this chunk id in the store",
    Reason.METADATA_UNAVAILABLE: "the store could not answer",
    Reason.TENANT_MISMATCH: "the record belongs to another tenant",
    Reason.PRINCIPAL_MISMATCH: "no principal of the caller is in allowed_principals",
    Reason.STATUS_DRAFT: "the record is a draft and the caller may not read drafts",
    Reason.STATUS_SUPERSEDED: "the record is superseded",
    Reason.STATUS_REVOKED: "status is revoked: never admitted again",
    Reason.STATUS_QUARANTINED: "status is quarantined: withheld pending review",
    Reason.NOT_YET_EFFECTIVE: "effective_at was after the time of the decision",
    Reason.EXPIRED: "expires_at was not after the time of the decision",
    Reason.HASH_MISMATCH: "the SHA-256 of the returned text was not the record's sha256",
    Reason.PAYLOAD_HASH_MISMATCH: (
        "the hashed payload fields did not match the record's payload_sha256"
    ),
    Reason.SIGNATURE_MISSING: "the record requires a signature and none is valid",
    Reason.POLICY_DENY: (
        "the policy refused for a reason it does not declare (a rule of your own policy, "
        "an undeclared custom reason, or an unknown status)"
    ),
    Reason.POLICY_ERROR: "the policy could not be evaluated, or said nothing about the chunk",
}


def why(
    reason: str, record: ChunkRecord | None, caller: Caller | None, now: datetime | None
) -> str:
    """What ``reason`` means, with the record's and caller's values when known.

    The values are the fields the bundled policy reads for the reason; a policy
    of your own may reason otherwise.
    """
    meaning = _MEANING.get(reason, "a reason your policy declares (custom_reasons)")
    if record is None or caller is None or now is None:
        return meaning
    q = quote_for_message
    if reason == Reason.TENANT_MISMATCH:
        return f"record tenant_id {q(record.tenant_id)} is not the caller's {q(caller.tenant)}"
    if reason == Reason.PRINCIPAL_MISMATCH:
        return (
            f"none of the caller's principals {quoted_list(sorted(caller.principals))} is in "
            f"allowed_principals {quoted_list(record.allowed_principals)}"
        )
    if reason == Reason.STATUS_DRAFT:
        return "status is draft and the caller may not read drafts (--drafts: the drafts scope)"
    if reason == Reason.STATUS_SUPERSEDED:
        successor = "no successor" if record.superseded_by is None else q(record.superseded_by)
        return f"status is superseded, superseded_by {successor}"
    if reason == Reason.NOT_YET_EFFECTIVE:
        return f"effective_at {format_timestamp(record.effective_at)} is after now"
    if reason == Reason.EXPIRED and record.expires_at is not None:
        return f"expires_at {format_timestamp(record.expires_at)} is not after now"
    if reason == Reason.SIGNATURE_MISSING:
        return (
            f"requires_signature is set and no valid signature exists for doc_id "
            f"{q(record.doc_id)} version {q(record.version)}"
        )
    return meaning


def record_fields(record: ChunkRecord) -> dict[str, Any]:
    """The record's fields behind the reasons; hashes, never the text."""
    # Not record_to_json: that form is for reloading (no signature_valid, the
    # text itself); this one is for reading next to the reasons, in this order.
    return {
        "tenant_id": record.tenant_id,
        "allowed_principals": list(record.allowed_principals),
        "status": record.status.value,
        "superseded_by": record.superseded_by,
        "effective_at": format_timestamp(record.effective_at),
        "expires_at": None if record.expires_at is None else format_timestamp(record.expires_at),
        "doc_id": record.doc_id,
        "version": record.version,
        "source_uri": record.source_uri,
        "requires_signature": record.requires_signature,
        "signature_valid": record.signature_valid,
        "sha256": record.sha256,
        "payload_sha256": record.payload_sha256,
        "text_in_store": record.text is not None,
    }


def chunk_report(
    decision: ChunkDecision,
    record: ChunkRecord | None,
    caller: Caller,
    now: datetime,
    text_given: bool,
) -> dict[str, Any]:
    """One chunk decided now: the decision, each reason and why, the record, the hash check."""
    entry: dict[str, Any] = {
        "chunk_id": decision.chunk_id,
        "decision": "admit" if decision.admitted else "reject",
        "reasons": [str(reason) for reason in decision.reasons],
        "why": {str(reason): why(reason, record, caller, now) for reason in decision.reasons},
    }
    if decision.detail:
        entry["detail"] = decision.detail
    entry["record"] = None if record is None else record_fields(record)
    if record is None:
        entry["hash"] = "no record to check against"
    elif text_given:
        matches = Reason.HASH_MISMATCH not in decision.reasons
        entry["hash"] = (
            "checked: the given text matches the record's sha256"
            if matches
            else ("checked: the given text does NOT match the record's sha256")
        )
    else:
        entry["hash"] = _HASH_NOT_CHECKED
    return entry
