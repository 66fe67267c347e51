"""A small synchronous client of ``retrieval_gate.v1.Gate`` (Filter, VerifyAnswer),
shared by the adapters.

Fail closed: any error (the gate refuses, is down, answers something that
does not match the request) raises :class:`GateError`; an adapter never
falls back to the unfiltered candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from sidecar.wire import gate_pb2, gate_pb2_grpc

# Where an adapter's admitted document or node carries the id of the decision
# that admitted it, for the answer's verification (docs/verify-answer.md).
DECISION_ID_KEY = "retrieval_gate_decision_id"

# What the adapters accept as the end user's credential: the token itself, or
# a function that returns the current user's (e.g. from a context variable).
Credential = str | Callable[[], str]


class GateError(RuntimeError):
    """The gate did not decide the candidates; nothing may be used.

    ``code`` is the gRPC status (None when the answer did not match the request).
    """

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Decisions:
    """The gate's answer: which candidates may be used, and the audit record's id."""

    decision_id: str
    admitted: tuple[bool, ...]  # one per candidate, in request order
    reasons: tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class ClaimToVerify:
    """One claim of an answer: the chunk ids it cites and the spans it quotes from them."""

    chunk_ids: tuple[str, ...]
    quotes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The gate's verdict on one claim (``supported``, ``not_released``, ...: see
    docs/verify-answer.md), with the cited chunk or the quote index it is about."""

    verdict: str
    chunk_id: str | None = None
    quote: int | None = None


@dataclass(frozen=True, slots=True)
class Verification:
    """The gate's answer to VerifyAnswer; ``supported`` only when every claim is."""

    verification_id: str
    supported: bool
    claims: tuple[ClaimResult, ...]  # one per claim, in request order
    unknown_decision_ids: tuple[str, ...]


class AnswerNotSupported(GateError):
    """The gate did not find every claim of an answer supported: do not show it as is.

    ``verification`` holds the verdict on each claim.
    """

    def __init__(self, verification: Verification) -> None:
        failed = sorted({c.verdict for c in verification.claims if c.verdict != "supported"})
        if verification.unknown_decision_ids:
            failed.append("unknown_decision")
        super().__init__(f"answer not supported ({', '.join(failed)})")
        self.verification = verification


def token_of(credential: Credential) -> str:
    """The bearer token ``credential`` gives now; GateError when it gives none."""
    token = credential() if callable(credential) else credential
    if not isinstance(token, str) or not token:
        raise GateError("no credential for the end user")
    return token


class GateClient:
    """Calls ``Gate/Filter`` on ``target`` (``host:port`` or ``unix:/path``)."""

    def __init__(
        self,
        target: str,
        *,
        timeout_seconds: float = 5.0,
        channel_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """``channel_credentials``: TLS to a gate behind a TLS terminator; None: plaintext
        (a gate on the same host or pod, over loopback or a Unix socket)."""
        if channel_credentials is None:
            self._channel = grpc.insecure_channel(target)
        else:
            self._channel = grpc.secure_channel(target, channel_credentials)
        stub = gate_pb2_grpc.GateStub(self._channel)
        self._filter = stub.Filter
        self._verify = stub.VerifyAnswer
        self._timeout = timeout_seconds

    def filter(
        self,
        candidates: Sequence[tuple[str, str]],
        credential: Credential,
        *,
        collection: str = "",
    ) -> Decisions:
        """The gate's decisions on ``(id, text)`` candidates for the user of ``credential``."""
        request = gate_pb2.FilterRequest(
            candidates=[gate_pb2.Candidate(id=cid, text=text) for cid, text in candidates],
            collection=collection,
        )
        metadata = (("authorization", f"Bearer {token_of(credential)}"),)
        try:
            response = self._filter(request, timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise GateError(f"the gate refused or failed: {code}: {details}", code) from exc
        return _checked(response, candidates)

    def verify_answer(
        self,
        decision_ids: Sequence[str],
        claims: Sequence[ClaimToVerify],
        chunks: Sequence[tuple[str, str]],
        credential: Credential,
    ) -> Verification:
        """The gate's verdict on each claim of an answer, for the user of ``credential``.

        ``decision_ids``: of the retrievals the answer was made from;
        ``chunks``: ``(id, text)`` of the cited chunks as the application holds them.
        Raises GateError when the gate refuses or fails; an unsupported answer
        is not an error (``Verification.supported`` is False).
        """
        request = gate_pb2.VerifyAnswerRequest(
            decision_ids=list(decision_ids),
            claims=[
                gate_pb2.ClaimToVerify(chunk_ids=list(c.chunk_ids), quotes=list(c.quotes))
                for c in claims
            ],
            chunks=[gate_pb2.Candidate(id=cid, text=text) for cid, text in chunks],
        )
        metadata = (("authorization", f"Bearer {token_of(credential)}"),)
        try:
            response = self._verify(request, timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise GateError(f"the gate refused or failed: {code}: {details}", code) from exc
        verdicts = list(response.claims)
        if not response.verification_id or len(verdicts) != len(claims):
            raise GateError("the gate's answer does not match the claims")
        if any(v.position != position for position, v in enumerate(verdicts)):
            raise GateError("the gate's answer does not match the claims")
        results = tuple(
            ClaimResult(v.verdict, v.chunk_id or None, v.quote if v.HasField("quote") else None)
            for v in verdicts
        )
        # Supported is never taken on the gate's word alone: every claim must say so.
        supported = response.supported and all(r.verdict == "supported" for r in results)
        return Verification(
            response.verification_id,
            supported,
            results,
            tuple(response.unknown_decision_ids),
        )

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _checked(response: gate_pb2.FilterResponse, candidates: Sequence[tuple[str, str]]) -> Decisions:
    """The decisions of ``response``, if it answers exactly ``candidates``; else GateError."""
    decisions = list(response.decisions)
    if not response.decision_id or len(decisions) != len(candidates):
        raise GateError("the gate's answer does not match the candidates")
    for position, (decision, (cid, _text)) in enumerate(zip(decisions, candidates, strict=True)):
        if decision.position != position or decision.id != cid:
            raise GateError("the gate's answer does not match the candidates")
    return Decisions(
        response.decision_id,
        tuple(d.admitted for d in decisions),
        tuple(tuple(d.reasons) for d in decisions),
    )


def as_claim(claim: ClaimToVerify | Mapping[str, Any]) -> ClaimToVerify:
    """``claim`` as a ClaimToVerify; a mapping gives ``chunk_ids`` and ``quotes``."""
    if isinstance(claim, ClaimToVerify):
        return claim
    return ClaimToVerify(
        tuple(str(i) for i in claim.get("chunk_ids", ())),
        tuple(str(q) for q in claim.get("quotes", ())),
    )


def verify_cited(
    gate: GateClient,
    credential: Credential,
    cited: Sequence[tuple[object, str, str]],
    claims: Sequence[ClaimToVerify | Mapping[str, Any]],
) -> Verification:
    """Check ``claims`` against the decisions that admitted the ``cited`` chunks; raises
    AnswerNotSupported unless every claim is supported.

    ``cited``: ``(decision id, chunk id, text)`` of each chunk the answer was
    made from, as an adapter's admitted documents or nodes carry them; one
    without a decision id was not admitted by the gate, and raises GateError.
    """
    decision_ids: list[str] = []
    chunks: list[tuple[str, str]] = []
    for decision_id, chunk_id, text in cited:
        if not isinstance(decision_id, str) or not decision_id:
            raise GateError("a chunk was not admitted by the gate (no decision id)")
        decision_ids.append(decision_id)
        chunks.append((chunk_id, text))
    verification = gate.verify_answer(
        list(dict.fromkeys(decision_ids)), [as_claim(c) for c in claims], chunks, credential
    )
    if not verification.supported:
        raise AnswerNotSupported(verification)
    return verification
