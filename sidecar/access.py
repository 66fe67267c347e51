"""The request path, protocol-free: who is calling, and may they call this route?

Establishes the caller with the configured identity provider, then asks the
request policy (``policies/request.rego``) whether that caller may use the
route. Identity failures are 401, policy refusals 403; a policy that cannot be
evaluated refuses too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sidecar import refusals
from sidecar.core.caller import Caller, IdentityError
from sidecar.core.hits import Route, RouteKind
from sidecar.core.policy import PolicyError
from sidecar.formats.registry import path_collections
from sidecar.identity import AuthRequest, IdentityProvider

log = logging.getLogger(__name__)

# Client-sent identity claims are never believed beyond trusted-headers mode,
# and never reach the upstream in any mode.
GATE_HEADER_PREFIX = "x-gate-"

# Methods without a request body that ask about a resource rather than use it:
# HEAD answers with the length and existence of what GET would return, OPTIONS
# with what a route allows. On routes that return chunks, either is an oracle.
# The methods whose answers each one probes.
_PROBES: dict[str, tuple[str, ...]] = {"HEAD": ("GET",), "OPTIONS": ("GET", "POST")}
_CONTENT_KINDS = frozenset({RouteKind.FILTERED, RouteKind.CONTENT})
# Headers some servers and frameworks take as the request's real method. The
# gate decides on the method Envoy saw, so the upstream must not see another.
METHOD_OVERRIDE_HEADERS = ("x-http-method", "x-http-method-override", "x-method-override")
# Headers that choose which data a request reads but that the request policy
# does not see (Milvus' DB-Name picks the database of a body's collectionName,
# pymilvus' dbname metadata that of a gRPC call's collection_name): the request
# must say it where the gate reads it (Milvus: dbName or db_name in the body).
# Each with the values that choose nothing (pymilvus always sends dbname).
SCOPE_HEADERS: dict[str, frozenset[str]] = {
    "db-name": frozenset(),
    "dbname": frozenset({"", "default"}),
}


def path_problem(path: str) -> str | None:
    """Why a request path is not canonical, or None when it is.

    Routes, collections and modes are matched on the path as written, while
    the vector DB decodes it (Qdrant's router decodes %XX): ``/points/%73earch``
    would be a search to the DB and an unknown route to the gate. So any path
    that does not say what it means literally is refused rather than guessed.
    """
    if "%" in path:
        return "percent-encoded path"
    if "\\" in path:
        return "backslash in path"
    if "//" in path:
        return "empty path segment"
    if any(segment in (".", "..") for segment in path.split("/")):
        return "dot segment in path"
    return None


class RequestPolicyEvaluator(Protocol):
    @property
    def version(self) -> str:
        """Changes whenever the policy's answers may change (sources, data, revision)."""
        ...

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        """Reasons to refuse the request (empty: allowed); raises PolicyError."""
        ...


class AccessDenied(Exception):
    """The request must not reach the vector DB."""

    def __init__(self, status: int, code: str, reasons: tuple[str, ...] = ()) -> None:
        super().__init__(code)
        self.status = status
        self.code = code
        self.reasons = reasons

    def body(self) -> bytes:
        """The JSON error body the client gets: the code, and the policy's reasons if any."""
        return refusals.error_body(self.code, reasons=self.reasons)


# The standard gRPC health check: database clients call it at connect time
# without credentials (the Weaviate v4 client does), and its answer is a
# serving status, no data of any tenant.
OPEN_PROBES = frozenset({Route("POST", "/grpc.health.v1.Health/Check")})


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted request: its caller (None for an ``OPEN_PROBES`` call, which needs
    none and whose answer the gate does not read), and the headers to strip."""

    caller: Caller | None
    strip_headers: tuple[str, ...]


# (policy version, caller, method, path, collections): everything the request
# policy's input holds but the route kind, which the route decides.
_AnswerKey = tuple[str, Caller, str, str, tuple[str, ...]]


class RequestAnswers:
    """The request policy's denials per input, for a policy that declares itself
    time-pure (``time_pure := true`` in its package, policies/README.md).

    Such a policy's answer depends only on its input and the policy (sources
    and data), so the same input under the same policy version gets the same
    answer. The version is part of the key, and a new version empties the
    cache. Failed evaluations are never kept. Bounded: the least recently used
    entries make room.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("request cache size must be at least 1")
        self.maxsize = maxsize
        self._entries: OrderedDict[_AnswerKey, tuple[str, ...]] = OrderedDict()
        self._version = ""
        # The Gate service and remote evaluations run off the event loop.
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: _AnswerKey) -> tuple[str, ...] | None:
        """The denials kept for ``key``; None when none are."""
        with self._lock:
            denials = self._entries.get(key)
            if denials is not None:
                self._entries.move_to_end(key)
            return denials

    def put(self, key: _AnswerKey, denials: tuple[str, ...]) -> None:
        """Keep ``denials`` for ``key``, forgetting every answer of another policy version."""
        entries = self._entries
        with self._lock:
            if key[0] != self._version:
                entries.clear()
                self._version = key[0]
            entries[key] = denials
            if len(entries) > self.maxsize:
                entries.popitem(last=False)


class RequestAccess:
    """Identity, then the request policy, for one request."""

    def __init__(
        self,
        identity: IdentityProvider,
        request_policy: RequestPolicyEvaluator | None,
        *,
        route_kind: Callable[[Route], RouteKind | None],
        collections: Callable[[Route], Sequence[str]] = path_collections,
        answers: RequestAnswers | None = None,
    ) -> None:
        """``route_kind`` says what a route does (the format adapters know; None: unknown),
        ``collections`` which collections (names or patterns) its path names.

        ``answers`` keeps the request policy's denials when the policy declares
        itself time-pure (``request_policy.time_pure``); None evaluates every request.
        """
        self._identity = identity
        self._request_policy = request_policy
        self._route_kind = route_kind
        self._collections = collections
        self._answers = answers

    async def admit(self, request: AuthRequest) -> Admission:
        """Return the caller and the headers to strip, or raise AccessDenied."""
        problem = path_problem(request.path)
        if problem is not None:
            log.info("request refused: %s", problem)
            raise AccessDenied(400, refusals.PATH_NOT_CANONICAL)
        if self._probes_content(request.method.upper(), request.path):
            log.info("request refused: %s on a route that returns chunks", request.method)
            raise AccessDenied(405, refusals.METHOD_NOT_ALLOWED)
        scoped = [
            name
            for name, harmless in SCOPE_HEADERS.items()
            if name in request.headers and request.headers[name].strip() not in harmless
        ]
        if scoped:
            log.info(
                "request refused: header %s chooses data the request policy cannot see", scoped[0]
            )
            raise AccessDenied(400, refusals.REQUEST_NOT_FILTERABLE)
        if Route(request.method.upper(), request.path) in OPEN_PROBES:
            return Admission(None, self._strip_headers(request))
        try:
            caller = await self._identity.identify(request)
        except IdentityError as exc:
            # The identity provider being unreachable is an outage, not the caller's fault.
            status = 503 if exc.code == "jwks_unavailable" else 401
            raise AccessDenied(status, exc.code) from exc
        if self._request_policy is not None:
            route = Route(request.method, request.path)
            collections = self._collections(route)
            if getattr(self._request_policy, "remote", False) is True:
                # An OPA round trip: other streams go on while it waits.
                await asyncio.to_thread(self._check_policy, caller, route, collections)
            else:
                self._check_policy(caller, route, collections)
        return Admission(caller, self._strip_headers(request))

    def _strip_headers(self, request: AuthRequest) -> tuple[str, ...]:
        """Client-sent identity and method-override headers: never the database's business."""
        strip = {h for h in request.headers if h.startswith(GATE_HEADER_PREFIX)}
        strip.update(self._identity.strip_headers)
        strip.update(h for h in METHOD_OVERRIDE_HEADERS if h in request.headers)
        return tuple(sorted(strip))

    def _probes_content(self, method: str, path: str) -> bool:
        """True for HEAD where GET on ``path`` returns chunks (filtered or not), and for
        OPTIONS where GET or POST does."""
        probed = _PROBES.get(method, ())
        return any(self._route_kind(Route(m, path)) in _CONTENT_KINDS for m in probed)

    def check_body_collections(self, caller: Caller, route: Route, named: Collection[str]) -> None:
        """Ask the request policy again, now that the body names ``named`` collections too.

        A body can name collections beyond its path (a lookup collection, a
        GraphQL class, a multi-search line's index); each must pass the same
        ownership check. Raises AccessDenied.
        """
        if self._request_policy is None or not named:
            return
        path = list(self._collections(route))
        self._check_policy(caller, route, [*path, *(n for n in named if n not in path)])

    def _check_policy(self, caller: Caller, route: Route, collections: Sequence[str]) -> None:
        policy = self._request_policy
        assert policy is not None
        answers = self._answers
        key: _AnswerKey | None = None
        if answers is not None and getattr(policy, "time_pure", False) is True:
            key = (policy.version, caller, route.method, route.path, tuple(collections))
            denials = answers.get(key)
            if denials is not None:
                if denials:
                    raise AccessDenied(403, refusals.FORBIDDEN, denials)
                return
        document = {
            "caller": caller.to_document(),
            "method": route.method,
            "path": route.path,
            "collections": list(collections),
            "route_kind": self._route_kind(route),
        }
        try:
            reasons = tuple(policy.evaluate(document))
        except PolicyError:
            log.error("request policy could not be evaluated; refusing the request")
            raise AccessDenied(403, refusals.POLICY_ERROR) from None
        if key is not None:
            assert answers is not None
            answers.put(key, reasons)
        if reasons:
            raise AccessDenied(403, refusals.FORBIDDEN, reasons)
