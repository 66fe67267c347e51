"""How `retrieval-gate explain` prints its report: text for people, or ``--json`` for scripts.

The report is built once, as a JSON-ready document, and only rendered here, so
that the text and the JSON always say the same thing. Every value that came
from a record, a caller or an audit log is quoted (``quote_for_message``): none
can forge a line of the explanation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from sidecar.store.loader import quote_for_message


def emit(
    report: Mapping[str, Any], as_json: bool, render: Callable[[Mapping[str, Any]], list[str]]
) -> None:
    """Print ``report`` as indented JSON, or as the lines ``render`` makes of it."""
    if as_json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(render(report)))


def render_chunks(report: Mapping[str, Any]) -> list[str]:
    """The text of a report on chunks decided now for a caller."""
    caller = report["caller"]
    lines = [
        f"caller: tenant {quote_for_message(caller['tenant'])}, principals "
        f"{quoted_list(caller['principals'])}, "
        + ("may read drafts" if caller["drafts_allowed"] else "may not read drafts"),
        f"policy: {report['policy_version']} ({report['policy_source']})",
        f"decided at: {report['at']}",
    ]
    for chunk in report["chunks"]:
        lines.append("")
        lines.append(f"chunk {quote_for_message(chunk['chunk_id'])}: {chunk['decision'].upper()}")
        lines.extend(_reason_lines(chunk["reasons"], chunk["why"], chunk.get("detail")))
        lines.extend(_record_lines(chunk["record"]))
        lines.append(f"  hash: {chunk['hash']}")
    return lines


def render_decision(report: Mapping[str, Any]) -> list[str]:
    """The text of a report on an audited decision, and on the same chunks now."""
    chain = report["chain"]
    if chain["ok"]:
        chain_line = (
            f"chain: intact ({chain['records']} records, head sha256 {chain['head_sha256']})"
        )
    else:
        chain_line = (
            f"chain: BROKEN after {chain['records']} good records: {chain['problem']} "
            "(this record is before the break)"
        )
    if chain.get("first_seq", 1) != 1:
        chain_line += (
            f"; verified from seq {chain['first_seq']}, anchored at prev_sha256 "
            f"{chain['anchor_sha256']} (earlier segments deleted)"
        )
    lines = [
        f"decision {quote_for_message(report['decision_id'])}: {report['audit_log']} "
        f"line {report['line']}",
        chain_line,
    ]
    recorded = report["recorded"]
    lines.extend(f"  {name}: {_scalar(value)}" for name, value in recorded.items())
    lines.append(
        "  route: the request path is not recorded; format and mode are what it resolved to"
    )
    now = report["now"]
    if now["evaluated"]:
        changed = " (CHANGED since the decision)" if now["policy_changed"] else ""
        lines.append(
            f"now: re-evaluated at {now['at']} with policy {now['policy_version']}{changed}, "
            + ("drafts allowed" if now["drafts_allowed"] else "drafts not allowed (--drafts)")
            + " (the record does not keep the drafts scope)"
        )
        lines.append(f"  integrity: {now['integrity']}")
    else:
        lines.append(f"now: not re-evaluated: {now['why_not']}")
    if not report["chunks"]:
        lines.append("")
        lines.append("no chunks were decided in this response")
    for chunk in report["chunks"]:
        then = chunk["then"]
        lines.append("")
        went_out = "released" if then["released"] else "not released"
        lines.append(
            f"chunk {_quoted_id(chunk['chunk_id'])} (position {chunk['position']}): "
            f"then {then['decision'].upper()}, {went_out}"
        )
        lines.extend(_reason_lines(then["reasons"], then["why"], then.get("detail")))
        for name, value in then.items():
            if name not in ("decision", "reasons", "why", "detail", "released"):
                lines.append(f"  {name}: {_scalar(value)}")
        current = chunk.get("now")
        if current is None:
            if now["evaluated"]:
                lines.append("  now: not re-evaluated (the hit had no usable id or text)")
            continue
        verdict = "SAME as" if chunk["same"] else "DIFFERENT from"
        lines.append(f"  now: {current['decision'].upper()} ({verdict} then)")
        lines.extend("  " + line for line in _reason_lines(current["reasons"], current["why"]))
        lines.extend(f"    differs: {difference}" for difference in chunk["differences"])
        lines.extend("  " + line for line in _record_lines(current["record"]))
    return lines


def quoted_list(values: Sequence[str]) -> str:
    """``values`` quoted one by one, in brackets."""
    return "[" + ", ".join(quote_for_message(v) for v in values) + "]"


def _reason_lines(
    reasons: Sequence[str], why: Mapping[str, str], detail: str | None = None
) -> list[str]:
    lines = [f"  {reason}: {why[reason]}" for reason in reasons]
    if detail:
        lines.append(f"  detail: {detail}")
    return lines


def _record_lines(record: Mapping[str, Any] | None) -> list[str]:
    if record is None:
        return ["  record: none in the store"]
    q = quote_for_message
    return [
        f"  record: tenant_id {q(record['tenant_id'])}, allowed_principals "
        f"{quoted_list(record['allowed_principals'])}, status {record['status']}"
        + (f", superseded_by {q(record['superseded_by'])}" if record["superseded_by"] else ""),
        f"    valid from {record['effective_at']} until "
        + (record["expires_at"] or "no end")
        + f"; doc_id {q(record['doc_id'])} version {q(record['version'])}",
        f"    requires_signature {_scalar(record['requires_signature'])}, "
        f"signature_valid {_scalar(record['signature_valid'])}; sha256 {record['sha256']}; "
        f"payload_sha256 {record['payload_sha256'] or 'none'}; text in store: "
        + ("yes (not shown)" if record["text_in_store"] else "no"),
    ]


def _quoted_id(chunk_id: str | None) -> str:
    # A malformed hit is recorded without an id.
    return "(no id)" if chunk_id is None else quote_for_message(chunk_id)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return quote_for_message(value)
    return orjson.dumps(value).decode()
