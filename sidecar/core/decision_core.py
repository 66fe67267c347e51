"""The decision core: caller + candidates + records + clock -> one decision per chunk.

Pure: no I/O, no Envoy, no HTTP. The caller of :meth:`DecisionCore.decide` has already
looked the candidates up in the metadata store; the gate runs the checks that
need no policy (shape, presence, integrity of the text and of the hashed payload
fields), evaluates the Rego policy once for the whole batch, and merges
everything into reasons in canonical order. A text that does not match a record
holding the authoritative text gets its drift class (``sidecar.core.drift``).

When the policy declares itself time-pure, the policy's reasons per (caller,
record, policy version) are kept in a VerdictCache until the record's next
validity boundary, and Rego runs only for the records of a batch without a
valid entry (policies/README.md, "Verdict cache"). The integrity and signature
checks run for every candidate of every response.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from hashlib import sha256

from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.decision import ChunkDecision, Verdict
from sidecar.core.drift import classify
from sidecar.core.hits import Candidate
from sidecar.core.integrity import canonical_sha256, fields_sha256
from sidecar.core.policy import PolicyEngine, PolicyError, policy_input, to_epoch_ns
from sidecar.core.reasons import Reason, ReasonOrder, may_read
from sidecar.core.verdict_cache import CallerKey, VerdictCache

# Verdict cache entries by default: one per (caller, chunk record) pair.
DEFAULT_VERDICT_CACHE_SIZE = 20_000


def _text_matches(text: str, expected_sha256: str) -> bool:
    try:
        return canonical_sha256(text) == expected_sha256
    except UnicodeEncodeError:
        # Lone surrogates have no canonical hash, so they cannot match any record.
        return False


def _fields_match(fields: str, expected_sha256: str | None) -> bool:
    # A record without payload_sha256 vouches for no payload field, so hashed
    # fields on a hit cannot be verified against it.
    if expected_sha256 is None:
        return False
    try:
        return fields_sha256(fields) == expected_sha256
    except UnicodeEncodeError:
        # canonical_fields never returns lone surrogates; a Candidate built
        # otherwise cannot match any record.
        return False


class DecisionCore:
    """Decides, per candidate chunk, whether this caller may use it now."""

    def __init__(
        self,
        policy: PolicyEngine,
        order: ReasonOrder | None = None,
        *,
        verdict_cache_size: int = DEFAULT_VERDICT_CACHE_SIZE,
    ) -> None:
        """``verdict_cache_size`` bounds the verdict cache (entries); 0 turns it off.

        Verdicts are cached only when the policy declares itself time-pure
        (``policy.time_pure``); see VerdictCache and policies/README.md.
        """
        if verdict_cache_size < 0:
            raise ValueError("verdict_cache_size must not be negative")
        self._policy = policy
        self._order = order or ReasonOrder()
        self._canonical_reasons: dict[tuple[str, ...], tuple[str, ...]] = {}
        # The policy's reasons with the integrity checks' results folded in, per
        # distinct (reasons, text intact, fields intact, signed): a handful.
        self._reasons_with_integrity: dict[_IntegrityKey, tuple[str, ...]] = {}
        cacheable = policy.time_pure
        self._verdicts = (
            VerdictCache(verdict_cache_size) if cacheable and verdict_cache_size else None
        )

    @property
    def evaluates_remotely(self) -> bool:
        """True when the policy engine waits on the network (``policy.remote``): then
        ``decide`` belongs off the event loop."""
        return self._policy.remote

    @property
    def verdict_cache(self) -> VerdictCache | None:
        """The verdict cache; None when the policy is not time-pure or caching is off."""
        return self._verdicts

    def clear_verdict_cache(self) -> None:
        """Forget every cached verdict (e.g. for a benchmark of the uncached path)."""
        if self._verdicts is not None:
            self._verdicts.clear()

    def decide(
        self,
        caller: Caller,
        candidates: Sequence[Candidate],
        records: Mapping[str, ChunkRecord],
        unavailable: Collection[str],
        now: datetime,
    ) -> Verdict:
        """Return one decision per candidate, in candidate order.

        ``records`` holds the store's answer for the candidates' ids; an id in
        ``unavailable`` could not be looked up. ``now`` must be timezone-aware.
        """
        if now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        version = self._policy.version

        # Policy input is per unique record: batch responses repeat chunks. An id
        # without a record is evaluated and hashed against a decoy, so that the
        # time a decision takes does not say whether a record the caller may not
        # read exists (Gate/Filter answers both as an unknown id).
        to_evaluate: dict[str, ChunkRecord] = {}
        for candidate in candidates:
            chunk_id = candidate.chunk_id
            if chunk_id is not None and candidate.text is not None and chunk_id not in unavailable:
                record = records.get(chunk_id)
                to_evaluate[chunk_id] = _decoy(chunk_id) if record is None else record

        # Reasons from the policy per chunk id, in canonical order; None: the policy failed.
        policy_reasons: dict[str, tuple[str, ...]] | None = {}
        cached = 0
        if to_evaluate:
            policy_reasons, cached = self._policy_reasons(caller, to_evaluate, version, now)

        with_integrity = self._reasons_with_integrity
        decisions = []
        for candidate in candidates:
            position = candidate.position
            chunk_id = candidate.chunk_id
            if chunk_id is None or candidate.text is None:
                detail = candidate.problem or "hit has no id or no text"
                decisions.append(
                    ChunkDecision(position, chunk_id, (Reason.MALFORMED_CHUNK,), detail)
                )
                continue
            if chunk_id in unavailable:
                decisions.append(ChunkDecision(position, chunk_id, _UNAVAILABLE))
                continue
            record = to_evaluate[chunk_id]
            reasons = _POLICY_ERROR if policy_reasons is None else policy_reasons[chunk_id]
            # Integrity and signature depend on the returned hit and the
            # store's answer: checked for every candidate, never cached.
            text = candidate.text
            if text.isascii() and "\r" not in text:
                # Already canonical (integrity.canonical_text): hash it as it is.
                intact = sha256(text.encode()).hexdigest() == record.sha256
            else:
                intact = _text_matches(text, record.sha256)
            fields = candidate.fields
            fields_intact = fields is None or _fields_match(fields, record.payload_sha256)
            signed = record.signature_valid or not record.requires_signature
            # One dict lookup whatever failed: sorting the reasons only for a
            # mismatching text took long enough to tell a caller whether its
            # guess of a record it may not read was that record's text.
            key = (reasons, intact, fields_intact, signed)
            combined = with_integrity.get(key)
            if combined is None:
                combined = self._with_integrity(key)
            unvouched = not fields_intact and record.payload_sha256 is None
            # The record's text, when it holds one, says what kind of change
            # the index made (bounded work, only for mismatching chunks). Not
            # for a record the caller may not read: the time it takes would
            # tell that caller the record exists and its text differs.
            authoritative = record.text
            drift = (
                None
                if intact or authoritative is None or not may_read(reasons)
                else classify(authoritative, text)
            )
            if chunk_id not in records:  # the work above was done against a decoy
                decisions.append(ChunkDecision(position, chunk_id, _MISSING))
            else:
                note = _NO_PAYLOAD_HASH if unvouched else None
                decisions.append(ChunkDecision(position, chunk_id, combined, note, drift))
        return Verdict(
            decisions=tuple(decisions),
            policy_version=version,
            policy_failed=policy_reasons is None,
            verdicts_cached=cached,
            verdicts_evaluated=len(to_evaluate) - cached,
        )

    def _policy_reasons(
        self,
        caller: Caller,
        records: Mapping[str, ChunkRecord],
        version: str,
        now: datetime,
    ) -> tuple[dict[str, tuple[str, ...]] | None, int]:
        """The policy's reasons for each record, from the verdict cache where it
        holds them, else from one evaluation for the rest (None when that
        fails); and how many came from the cache."""
        verdicts = self._verdicts
        now_ns = to_epoch_ns(now)
        caller_key: CallerKey = (version, caller.tenant, caller.principals, caller.drafts_allowed)
        if verdicts is None:
            found: dict[str, tuple[str, ...]] = {}
            missing: Mapping[str, ChunkRecord] = records
        else:
            found, missing = verdicts.lookup(caller_key, records, now_ns)
        if not missing:
            return found, len(found)
        document = policy_input(caller, list(missing.values()), now)
        try:
            answer = self._policy.evaluate(document)
        except PolicyError:
            # Fail the whole response as an uncached gate would: no chunk gets
            # a verdict from an evaluation that did not complete.
            return None, len(found)
        for chunk_id, chunk in zip(missing, document["chunks"], strict=True):
            raw = answer.get(chunk_id)
            if raw is None:
                # A policy that says nothing about a chunk has not admitted it.
                found[chunk_id] = _POLICY_ERROR
                continue
            reasons = self._canonical(raw)
            found[chunk_id] = reasons
            if verdicts is not None:
                boundaries = (chunk["effective_at_ns"], chunk["expires_at_ns"])
                verdicts.put(caller_key, missing[chunk_id], now_ns, boundaries, reasons)
        return found, len(records) - len(missing)

    def _with_integrity(self, key: _IntegrityKey) -> tuple[str, ...]:
        """The reasons of ``key`` with those of its failed integrity checks, remembered."""
        reasons, intact, fields_intact, signed = key
        extra = [] if intact else [Reason.HASH_MISMATCH]
        if not fields_intact:
            extra.append(Reason.PAYLOAD_HASH_MISMATCH)
        if not signed:
            extra.append(Reason.SIGNATURE_MISSING)
        combined = self._order.sort([*reasons, *extra]) if extra else reasons
        kept = self._reasons_with_integrity
        if len(kept) >= _CANONICAL_KEPT:
            kept.clear()
        kept[key] = combined
        return combined

    def _canonical(self, raw: Sequence[str]) -> tuple[str, ...]:
        """The policy's reasons for one chunk in canonical order, undeclared ones
        as POLICY_DENY; remembered per distinct answer (a handful in practice)."""
        key = tuple(raw)
        reasons = self._canonical_reasons.get(key)
        if reasons is None:
            order = self._order
            reasons = order.sort(r if order.known(r) else Reason.POLICY_DENY for r in key)
            if len(self._canonical_reasons) >= _CANONICAL_KEPT:
                self._canonical_reasons.clear()
            self._canonical_reasons[key] = reasons
        return reasons


# (policy reasons, text intact, payload fields intact, signature present or not needed)
_IntegrityKey = tuple[tuple[str, ...], bool, bool, bool]
# Distinct policy answers remembered with their canonical form.
_CANONICAL_KEPT = 1024

_UNAVAILABLE: tuple[str, ...] = (Reason.METADATA_UNAVAILABLE,)
_MISSING: tuple[str, ...] = (Reason.MISSING_METADATA,)
_POLICY_ERROR: tuple[str, ...] = (Reason.POLICY_ERROR,)
# The tenant of a decoy. Whatever the policy answers for a decoy, the id is
# answered as missing: this value only has to look like any other tenant.
_DECOY_TENANT = "no record"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@lru_cache(maxsize=DEFAULT_VERDICT_CACHE_SIZE)
def _decoy(chunk_id: str) -> ChunkRecord:
    """What an id without a record is evaluated and hashed against, then answered as missing.

    The same object per id while it is remembered, as the metadata cache hands
    out the same record: the verdict cache then finds both alike.
    """
    return ChunkRecord(
        chunk_id=chunk_id,
        doc_id=chunk_id,
        version="",
        tenant_id=_DECOY_TENANT,
        allowed_principals=(),
        status=Status.APPROVED,
        effective_at=_EPOCH,
        expires_at=None,
        sha256="0" * 64,
    )


# The audit detail of PAYLOAD_HASH_MISMATCH when the record has no payload hash.
_NO_PAYLOAD_HASH = "record has no payload_sha256"
