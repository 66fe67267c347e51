"""The audit record: what the gate decided for one response, typed.

One record per response the gate inspected (docs/architecture.md, "Audit
record"). It names chunks by id and never carries chunk text; the caller's
principals appear only as a digest. Sinks write :meth:`AuditRecord.to_dict`
and chain it (``sidecar.audit.chain``); the optional fields are left out of
that form when they are None, so a reader can tell "not applicable" (a body
that could not be parsed has no candidates) from "empty".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sidecar.core.decision import Verdict
from sidecar.core.modes import Mode
from sidecar.core.outcome import Outcome

# How much of an upstream error body an audit record keeps.
UPSTREAM_TEXT_BYTES: Final = 1024


def upstream_text(body: bytes) -> str:
    """The first :data:`UPSTREAM_TEXT_BYTES` of an upstream error body, as text.

    Bounded because every response writes a record that is hash-chained and
    kept forever in an append-only store: an upstream (or a caller whose query
    the upstream echoes in its error) must not be able to grow the audit trail
    by megabytes per request, nor copy whole documents into it; the first KiB
    says what went wrong. Bytes that are not UTF-8 (or a character cut at the
    bound) become U+FFFD, so the record stays valid JSON.
    """
    return body[:UPSTREAM_TEXT_BYTES].decode("utf-8", "replace")


@dataclass(slots=True)
class UpstreamError:
    """An error the upstream answered on a filtered route: its HTTP status, its own
    code for the error, and its bounded text.

    ``code`` is ``source:value``: ``http:<status>`` for a non-2xx answer,
    ``grpc:<status>`` for a gRPC status, or the database's own code for an
    error inside a successful answer (``milvus:1100``, ``weaviate:graphql``,
    ``elasticsearch:<type>``; ``formats.base.ReportedError``).
    """

    status: int
    code: str
    text: str  # upstream_text() of its body or message: never more than the first KiB

    @classmethod
    def from_body(cls, status: int, body: bytes, code: str | None = None) -> UpstreamError:
        """The record of an upstream answer with ``status`` and ``body`` (bounded here);
        ``code`` defaults to ``http:<status>``."""
        return cls(status, f"http:{status}" if code is None else code, upstream_text(body))

    @classmethod
    def from_text(cls, status: int, code: str, text: str) -> UpstreamError:
        """The record of an error whose message is ``text`` (bounded here, as UTF-8)."""
        return cls(status, code, upstream_text(text.encode("utf-8", "replace")))


@dataclass(slots=True)
class Substitution:
    """A superseded chunk whose admitted successor took its place in the body."""

    position: int
    chunk_id: str | None
    substitute: str

    def to_dict(self) -> dict[str, object]:
        """The JSON form."""
        return {"position": self.position, "chunk_id": self.chunk_id, "substitute": self.substitute}


# Not frozen, and holding lists: built for every response on the hot path,
# where a frozen dataclass costs about five times as much to construct and
# copying into tuples adds up. Never changed once built.
@dataclass(slots=True)
class Release:
    """What went out to the client, for a body that was parsed and decided."""

    released: list[str | None]  # chunk ids the client got, in body order
    tenant_filter: bool  # the request carried the caller's tenant filter upstream
    overfetched: bool  # the request asked for more than the client did
    # Set when substitutes went out: ``admitted`` then names them in place of
    # the chunks they replaced.
    admitted: list[str | None] | None = None
    substituted: list[Substitution] = field(default_factory=list)
    refusal: str | None = None  # the error code when the client got no body
    # Beside ``released``: the SHA-256 of the canonical text admitted for each
    # released chunk (None for one released unadmitted, in audit mode). What
    # answer verification checks an application's chunk texts against.
    sha256: list[str | None] | None = None


@dataclass(slots=True)
class AuditRecord:
    """One response's decision record (not frozen, like Release).

    ``verdict`` and ``release`` are None for a body the gate could not read
    (or did not decide: an upstream error); ``error`` then says why, and
    ``upstream`` holds the upstream's status, code and error text. A decided
    body that also reported an error (a multi-search error item beside other
    results) has both. The verdict's
    decisions become the record's ``candidates``, ``rejected`` (every reason,
    the malformed hit's detail, and the drift class of a HASH_MISMATCH when the
    store held the authoritative text) and ``admitted``.
    """

    decision_id: str
    request_id: str  # Envoy's x-request-id: a client may set it; decision_id is the key
    time: datetime
    tenant: str
    principals_sha256: str
    format: str
    mode: Mode
    outcome: Outcome
    latency_ms: float
    verdict: Verdict | None = None
    release: Release | None = None
    error: str | None = None
    upstream: UpstreamError | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON object a sink writes (field names are part of the interface)."""
        record: dict[str, object] = {
            "decision_id": self.decision_id,
            "request_id": self.request_id,
            "time": self.time.isoformat(timespec="microseconds"),
            "tenant": self.tenant,
            "principals_sha256": self.principals_sha256,
            "format": self.format,
            "mode": self.mode,  # a StrEnum: serialises as its value
        }
        verdict, release = self.verdict, self.release
        if verdict is not None:
            record["policy_version"] = verdict.policy_version
            _add_decisions(record, verdict)
        record["latency_ms"] = self.latency_ms
        if release is not None:
            record["tenant_filter"] = release.tenant_filter
            record["overfetched"] = release.overfetched
            if release.refusal is not None:
                record["refusal"] = release.refusal
            record["released"] = release.released
            if release.sha256 is not None:
                record["released_sha256"] = release.sha256
            if release.admitted is not None:
                record["admitted"] = release.admitted
            if release.substituted:
                record["substituted"] = [entry.to_dict() for entry in release.substituted]
        record["outcome"] = self.outcome
        if self.error is not None:
            record["error"] = self.error
        if self.upstream is not None:
            record["upstream_status"] = self.upstream.status
            record["upstream_code"] = self.upstream.code
            record["upstream_text"] = self.upstream.text
        return record


def _add_decisions(record: dict[str, object], verdict: Verdict) -> None:
    """``candidates``, ``rejected`` and ``admitted``, in one pass over the decisions."""
    candidates: list[str | None] = []
    rejected: list[dict[str, object]] = []
    admitted: list[str | None] = []
    for d in verdict.decisions:
        candidates.append(d.chunk_id)
        if d.reasons:
            entry: dict[str, object] = {
                "position": d.position,
                "chunk_id": d.chunk_id,
                "reasons": d.reasons,  # a tuple: orjson writes it as an array
            }
            if d.detail:
                entry["detail"] = d.detail
            if d.drift is not None:
                entry["drift"] = d.drift  # a StrEnum: serialises as its value
            rejected.append(entry)
        else:
            admitted.append(d.chunk_id)
    record["candidates"] = candidates
    record["rejected"] = rejected
    record["admitted"] = admitted
