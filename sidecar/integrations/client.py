"""A small synchronous client of ``retrieval_gate.v1.Gate/Filter``, shared by the adapters.

Fail closed: any error (the gate refuses, is down, answers something that
does not match the request) raises :class:`GateError`; an adapter never
falls back to the unfiltered candidates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from sidecar.wire import gate_pb2, gate_pb2_grpc

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
        self._filter = gate_pb2_grpc.GateStub(self._channel).Filter
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
