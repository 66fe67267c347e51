"""Admission: who is calling, and may they call this route? Protocol-free.

Refuses what the gate could not police whoever asks (a path that is not
canonical, a probe of a route that returns chunks, a header choosing data
the request policy never sees), establishes the caller with the configured
identity provider, then asks the request policy (``policies/request.rego``)
with every collection the path names (a collection named by id under its
learned name too, or as unnamed). Identity failures are 401 (503 for an
identity provider that cannot be reached), policy refusals 403; a policy that
cannot be evaluated refuses too. Every refusal is counted here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from sidecar import refusals
from sidecar.core.caller import Caller, IdentityError
from sidecar.core.hits import Route, RouteKind
from sidecar.core.policy import RequestPolicyEngine
from sidecar.formats.registry import path_collections
from sidecar.identity import AuthRequest, IdentityProvider
from sidecar.refusals import Refusal
from sidecar.request.answers import RequestAnswers
from sidecar.request.policy_check import RequestPolicyCheck

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

# The standard gRPC health check: database clients call it at connect time
# without credentials (the Weaviate v4 client does), and its answer is a
# serving status, no data of any tenant.
OPEN_PROBES = frozenset({Route("POST", "/grpc.health.v1.Health/Check")})


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


class RequestRefused(Exception):
    """The request must not reach the vector DB; ``refusal`` says how it is answered."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.code)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class Admitted:
    """An admitted request: its caller (None for an ``OPEN_PROBES`` call, which needs
    none and whose answer the gate does not read), and the headers to strip."""

    caller: Caller | None
    strip_headers: tuple[str, ...]


class RequestAdmission:
    """Identity, then the request policy, for one request."""

    def __init__(
        self,
        identity: IdentityProvider,
        request_policy: RequestPolicyEngine | None,
        *,
        route_kind: Callable[[Route], RouteKind | None],
        collections: Callable[[Route], Sequence[str]] = path_collections,
        id_names: Callable[[Route], Mapping[str, str | None]] = lambda route: {},
        answers: RequestAnswers | None = None,
        count_refusal: Callable[[int], None] = lambda status: None,
    ) -> None:
        """``route_kind`` says what a route does (the format adapters know; None: unknown),
        ``collections`` which collections (names or patterns) its path names, and
        ``id_names`` the name learned for each of them that is a collection's id
        (None: unknown).

        ``answers`` keeps the request policy's denials while the policy declares
        itself time-pure; None evaluates every request. ``count_refusal``
        counts each refusal by its HTTP status (the metrics).
        """
        self._identity = identity
        self._route_kind = route_kind
        self._collections = collections
        self._id_names = id_names
        self._count_refusal = count_refusal
        self._policy = (
            None
            if request_policy is None
            else RequestPolicyCheck(request_policy, route_kind, answers)
        )

    def counted(self, refusal: Refusal) -> Refusal:
        """``refusal``, counted as a request refused before the database was asked."""
        self._count_refusal(refusal.http_status)
        return refusal

    def refuse(self, refusal: Refusal) -> RequestRefused:
        """``refusal``, counted, as the exception that refuses the request."""
        return RequestRefused(self.counted(refusal))

    async def admit(self, request: AuthRequest) -> Admitted:
        """Return the caller and the headers to strip, or raise RequestRefused."""
        refusal = self._refusal_whoever_asks(request)
        if refusal is not None:
            raise self.refuse(refusal)
        if Route(request.method.upper(), request.path) in OPEN_PROBES:
            return Admitted(None, self._strip_headers(request))
        try:
            caller = await self._identity.identify(request)
        except IdentityError as exc:
            raise self.refuse(refusals.identity_refusal(exc.code, outage=exc.outage)) from exc
        route = Route(request.method, request.path)
        await self._check_policy(caller, route, self._collections(route))
        return Admitted(caller, self._strip_headers(request))

    async def check_collections(self, caller: Caller, route: Route, named: Collection[str]) -> None:
        """Ask the request policy with the collections ``route``'s path names and ``named``.

        A body can name collections beyond its path (a lookup collection, a
        GraphQL class, a multi-search line's index); each must pass the same
        ownership check; a body naming none needs no second answer. Raises
        RequestRefused.
        """
        if not named:
            return
        path = list(self._collections(route))
        await self._check_policy(caller, route, [*path, *(n for n in named if n not in path)])

    async def _check_policy(self, caller: Caller, route: Route, collections: Sequence[str]) -> None:
        """Ask the request policy; a collection named by id is checked under its learned
        name too, and one whose name is unknown goes to the policy as unnamed."""
        if self._policy is None:
            return
        names = self._id_names(route)
        learned = [name for name in names.values() if name is not None and name not in collections]
        unnamed = [id_ for id_, name in names.items() if name is None]
        refusal = await self._policy.check(caller, route, [*collections, *learned], unnamed)
        if refusal is not None:
            raise self.refuse(refusal)

    def _refusal_whoever_asks(self, request: AuthRequest) -> Refusal | None:
        """What is refused before anyone is identified: the gate could not police it."""
        problem = path_problem(request.path)
        if problem is not None:
            log.info("request refused: %s", problem)
            return refusals.PATH_NOT_CANONICAL
        if self._probes_content(request.method.upper(), request.path):
            log.info("request refused: %s on a route that returns chunks", request.method)
            return refusals.METHOD_NOT_ALLOWED
        scoped = [
            name
            for name, harmless in SCOPE_HEADERS.items()
            if name in request.headers and request.headers[name].strip() not in harmless
        ]
        if scoped:
            log.info(
                "request refused: header %s chooses data the request policy cannot see", scoped[0]
            )
            return refusals.REQUEST_NOT_FILTERABLE
        return None

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
