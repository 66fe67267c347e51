"""The request path, protocol-free: a plan at the request headers, then the body.

The twin of :class:`~sidecar.enforcement.response_filter.ResponseFilter`.
``plan`` admits the request (or reads the caller an ext_authz filter in front
established), then decides what the rest of the exchange needs: nothing
(``PassThrough``), its body's collections (``ReadCollections``), the names
its answer gives collection ids (``ReadNames``, ``learn_names``) or the
response filtered (``Filter``), refusing what the tenant condition could not
reach. ``read_body`` then pushes the tenant down into a search body, raises
its limits (over-fetch) and asks the request policy again with the
collections the body names. Every refusal is counted.
"""

from __future__ import annotations

import asyncio
import logging

from sidecar import refusals
from sidecar.core.caller import Caller, IdentityError
from sidecar.core.hits import Route, RouteKind
from sidecar.core.modes import Mode, RoutePolicies
from sidecar.core.outcome import Outcome
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    ResponseFormat,
    UnfilterableRequest,
)
from sidecar.formats.registry import FormatTable
from sidecar.identity import AuthRequest
from sidecar.metrics import NO_COLLECTION, GateMetrics
from sidecar.refusals import Refusal
from sidecar.request.admission import Admitted, RequestAdmission, RequestRefused, path_problem
from sidecar.request.plans import (
    Filter,
    PassThrough,
    Plan,
    ReadCollections,
    ReadNames,
    Refused,
)

log = logging.getLogger(__name__)

# Where an ext_authz filter in front (a mesh's, or the sidecar's own
# Authorization service) leaves the caller it established.
IDENTITY_NAMESPACE = "envoy.filters.http.ext_authz"
# The metrics' ``format`` of an exchange no format reads.
_NO_FORMAT = "none"
# A body up to this size is read for collection names on the event loop (about
# 20 collections; orjson reads it in tens of microseconds).
_READ_NAMES_IN_THREAD = 32 * 1024


class RequestPath:
    """Plans each exchange and reads its request body, for one sidecar process."""

    def __init__(
        self,
        admission: RequestAdmission,
        formats: FormatTable,
        policies: RoutePolicies,
        metrics: GateMetrics,
        *,
        overfetch_cap: int = 1000,
    ) -> None:
        """``overfetch_cap`` bounds a raised limit (``overfetch_factor`` is per route)."""
        self._admission = admission
        self._formats = formats
        self._policies = policies
        self._metrics = metrics
        self._overfetch_cap = overfetch_cap

    async def plan(
        self, request: AuthRequest, *, query_string: str, grpc: bool, has_body: bool
    ) -> Plan:
        """What the exchange that starts with ``request`` needs from the gate.

        ``grpc``: a gRPC call (its path names no collection); ``has_body``: a
        request body follows the headers.
        """
        try:
            admitted = await self._admitted(request)
        except RequestRefused as exc:
            return Refused(exc.refusal)
        caller, strip = admitted.caller, admitted.strip_headers
        if caller is None:
            # A probe that needs no caller (a gRPC health check): nothing to read.
            self.count_unread()
            return PassThrough(strip)
        route = Route(request.method, request.path)
        fmt = self._formats.response_format(route)
        if fmt is None:
            self.count_unread()
            reader = self._collections_reader(route) if has_body else None
            if reader is not None:
                return ReadCollections(strip, route, caller, reader, grpc)
            self._formats.forget_renamed(route)
            if not grpc and self._formats.names_collections(route):
                return ReadNames(strip, route)
            return PassThrough(strip)
        policy = self._policies.for_path(route.path)
        pushes_down = policy.tenant_key is not None
        problem = fmt.query_string_problem(route, query_string) if pushes_down else None
        if problem is not None:
            log.info("request refused: %s", problem)
            return self.refused(refusals.REQUEST_NOT_FILTERABLE)
        reads_body = fmt.rewrites_request(route)
        if reads_body and not has_body:
            if pushes_down:
                # Envoy cannot add a body to a request that has none, and a search
                # without one (GET /_search) is a search of every tenant's documents.
                log.info("request refused: a search without a body on a push-down route")
                return self.refused(refusals.REQUEST_NOT_FILTERABLE)
            reads_body = False
        return Filter(strip, route, caller, fmt, policy, query_string, reads_body)

    async def read_body(
        self, plan: ReadCollections | Filter, body: bytes
    ) -> Refused | RequestRewrite | None:
        """The request body as the database gets it: a rewrite, None for the body
        unchanged (``ReadCollections``), or a refusal."""
        if isinstance(plan, ReadCollections):
            return await self._read_collections(plan, body)
        try:
            rewrite = self._rewrite(plan, body)
        except UnfilterableRequest as exc:
            log.info("request refused: %s", exc.code)
            return self.refused(refusals.REQUEST_NOT_FILTERABLE.with_code(exc.code))
        except MalformedRequest:
            return self.refused(refusals.REQUEST_BODY_MALFORMED)
        except ValueError as exc:
            # Settings the format cannot use, e.g. a tenant_key that is no Milvus field name.
            log.error("requests on %s cannot be rewritten as configured: %s", plan.route.path, exc)
            return self.refused(refusals.GATE_MISCONFIGURED)
        try:
            await self._admission.check_collections(plan.caller, plan.route, rewrite.collections)
        except RequestRefused as exc:
            return Refused(exc.refusal)
        return rewrite

    async def learn_names(self, plan: ReadNames, body: bytes) -> None:
        """Remember which names a successful answer on ``plan``'s route gives collection
        ids. A large answer (a long list of collections) is read in a worker thread:
        it must not stall every other stream."""
        if len(body) > _READ_NAMES_IN_THREAD:
            await asyncio.to_thread(self._formats.learn_names, plan.route, body)
        else:
            self._formats.learn_names(plan.route, body)

    @property
    def admission(self) -> RequestAdmission:
        """The admission this path asks first (also what an ext_authz servicer asks)."""
        return self._admission

    def refused(self, refusal: Refusal) -> Refused:
        """``refusal`` as a plan, counted as a request refused before the database."""
        return Refused(self._admission.counted(refusal))

    async def _admitted(self, request: AuthRequest) -> Admitted:
        """The caller an ext_authz filter in front left, or the request admitted here."""
        document = request.metadata.get(IDENTITY_NAMESPACE)
        if document is None:
            # No ext_authz in front: the request is admitted here, before the upstream.
            return await self._admission.admit(request)
        if path_problem(request.path) is not None:
            # Admission refuses these too; an ext_authz in front should have.
            raise self._admission.refuse(refusals.PATH_NOT_CANONICAL)
        try:
            caller = Caller.from_document(document)
        except IdentityError as exc:
            # An ext_authz in front admitted the request but left no readable caller.
            log.warning("unreadable caller identity in metadata: %s", exc)
            raise self._admission.refuse(refusals.IDENTITY_MISSING) from exc
        return Admitted(caller, ())

    def _collections_reader(self, route: Route) -> ResponseFormat | None:
        """The format that reads the request bodies on ``route`` (the collections a
        gRPC call names, an Elasticsearch point in time's filter), for a route the
        gate does not filter; None when there is none."""
        found = self._formats.classify(route)
        if found is None or found[1] is RouteKind.FILTERED:
            return None
        return found[0] if found[0].rewrites_request(route) else None

    async def _read_collections(self, plan: ReadCollections, body: bytes) -> Refused | None:
        """None once the collections ``body`` names passed the request policy; a refusal
        for a body that holds what the tenant condition could not reach."""
        try:
            named = plan.fmt.request_collections(body, plan.route)
        except UnfilterableRequest as exc:
            log.info("request refused: %s", exc.code)
            return self.refused(refusals.REQUEST_NOT_FILTERABLE.with_code(exc.code))
        except MalformedRequest:
            return self.refused(refusals.REQUEST_BODY_MALFORMED)
        try:
            await self._admission.check_collections(plan.caller, plan.route, named)
        except RequestRefused as exc:
            return Refused(exc.refusal)
        return None

    def _rewrite(self, plan: Filter, body: bytes) -> RequestRewrite:
        """Push the caller's tenant down and over-fetch; raises MalformedRequest.

        URL parameters that make the database page differently from the body
        (``overfetch_problem``) turn over-fetch off, and so does any mode but
        ``enforce``: ``strict`` refuses a response with any rejected hit, so
        hits past the app's k could only block an answer whose k hits all
        pass; ``audit`` passes the database's answer unchanged, which a
        longer one trimmed back would not be.
        """
        fmt, route, policy = plan.fmt, plan.route, plan.policy
        factor = policy.overfetch_factor
        enforcing = policy.mode is Mode.ENFORCE
        if not enforcing or fmt.overfetch_problem(route, plan.query_string) is not None:
            factor = 1.0
        return fmt.rewrite_request(
            body,
            route,
            tenant=plan.caller.tenant,
            tenant_key=policy.tenant_key,
            overfetch_factor=factor,
            overfetch_cap=self._overfetch_cap,
        )

    def count_unread(self) -> None:
        """Count an exchange whose answer no format reads."""
        self._metrics.count_response(Outcome.PASSTHROUGH, _NO_FORMAT, NO_COLLECTION)
