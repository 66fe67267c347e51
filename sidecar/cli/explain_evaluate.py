"""What the gate decides now, for `retrieval-gate explain`: its policy, its store, its decision.

Kept apart from the command's arguments and its output so that both questions
explain answers (chunks for a caller, an audited decision re-evaluated) decide
with the same code, and that code is the sidecar's own: the policy is built by
``build_policies`` and records are fetched through the store interface.

Problems are raised as ``CannotExplain``, carrying the exit code, so that the
command prints them in one place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from sidecar.cli.exit_codes import ExitCode
from sidecar.config import Settings
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision import ChunkDecision
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.policy import PolicyError
from sidecar.core.reasons import ReasonOrder
from sidecar.runtime.server import build_policies
from sidecar.store.open import open_store
from sidecar.store.store import StoreNotCreated, StoreUnavailable

# A chunk asked about by id has no returned text. It is decided with this text
# and a copy of its record whose sha256 is this text's, so that the integrity
# check passes and every other check (policy, signature) runs as in the sidecar.
_STAND_IN_TEXT = ""
_STAND_IN_SHA256 = hashlib.sha256(_STAND_IN_TEXT.encode()).hexdigest()


class CannotExplain(Exception):
    """Why an explanation cannot be given, and the exit code that says so."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def misuse(message: str) -> CannotExplain:
    """The command was used wrongly: exit 2."""
    return CannotExplain(message, ExitCode.CANNOT_RUN)


def failure(message: str) -> CannotExplain:
    """The store, the policy or the audit log failed: exit 1."""
    return CannotExplain(message, ExitCode.FAILED)


def build_gate(settings: Settings) -> tuple[DecisionCore, str, str]:
    """The decision core with the sidecar's chunk policy (built as the sidecar builds
    it), the policy's version and where it comes from."""
    try:
        policy, _, source = build_policies(settings)
    except PolicyError as exc:
        raise failure(f"policy: {exc}") from exc
    # No verdict cache: every chunk is evaluated, once.
    gate = DecisionCore(policy, ReasonOrder(settings.policy.custom_reasons), verdict_cache_size=0)
    return gate, policy.version, source


def lookup(url: str, chunk_ids: Collection[str]) -> dict[str, ChunkRecord]:
    """The store's records for ``chunk_ids``, fetched as the sidecar fetches them."""
    try:
        store = open_store(url)
    except (ValueError, StoreNotCreated) as exc:  # messages carry the URL redacted
        raise misuse(str(exc)) from exc
    except StoreUnavailable as exc:
        raise failure(str(exc)) from exc

    async def fetch() -> dict[str, ChunkRecord]:
        try:
            return dict(await store.fetch(chunk_ids)) if chunk_ids else {}
        finally:
            await store.aclose()

    try:
        return asyncio.run(fetch())
    except StoreUnavailable as exc:
        raise failure(str(exc)) from exc


def decide(
    gate: DecisionCore,
    caller: Caller,
    chunk_ids: Sequence[str],
    records: Mapping[str, ChunkRecord],
    texts: Mapping[str, str],
    now: datetime,
) -> tuple[ChunkDecision, ...]:
    """The gate's decision per chunk id; the integrity check passes for ids without a text."""
    candidates = []
    shown: dict[str, ChunkRecord] = {}
    for position, chunk_id in enumerate(chunk_ids):
        text = texts.get(chunk_id)
        record = records.get(chunk_id)
        if text is None:
            text = _STAND_IN_TEXT
            if record is not None:
                record = dataclasses.replace(record, sha256=_STAND_IN_SHA256)
        if record is not None:
            shown[chunk_id] = record
        candidates.append(Candidate(position, chunk_id, text))
    return gate.decide(caller, candidates, shown, (), now).decisions
