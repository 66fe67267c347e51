"""The request path on its own, no Envoy: the plan at the request headers, then the body.

Every format the gate ships is enabled (``build_format_table`` with no
options), the request policy is the shipped one or a recording stand-in, and
the caller comes from trusted headers or from an ext_authz filter's metadata.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from qdrant_client import grpc as q

from sidecar.core.caller import Caller
from sidecar.core.hits import Route
from sidecar.core.modes import Mode, RoutePolicies, RoutePolicy
from sidecar.formats.base import RequestRewrite
from sidecar.formats.grpc_frames import frame
from sidecar.formats.registry import build_format_table
from sidecar.identity import AuthRequest
from sidecar.identity.headers import TrustedHeaders
from sidecar.metrics import GateMetrics
from sidecar.request.admission import RequestAdmission
from sidecar.request.plans import Filter, PassThrough, Plan, ReadCollections, ReadNames, Refused
from sidecar.request.request_path import IDENTITY_NAMESPACE, RequestPath

FORMATS = build_format_table({}, {}, text_field="text", id_field=None)
SEARCH = "/collections/docs/points/search"
ES_SEARCH = "/docs/_search"
GRPC_UPSERT = "/qdrant.Points/Upsert"
ALICE = {"x-gate-tenant": "acme", "x-gate-principals": "user:alice"}
PUSH_DOWN = RoutePolicy(Mode.ENFORCE, "tenant", 1.0, substitute_superseded=False)
NO_PUSH_DOWN = RoutePolicy(Mode.ENFORCE, None, 1.0, substitute_superseded=False)


class DenyingCollections:
    """A request policy refusing the collection ``secret``, recording where it ran."""

    version = "v1"
    time_pure = False

    def __init__(self, *, remote: bool = False) -> None:
        self.remote = remote
        self.inputs: list[Mapping[str, Any]] = []
        self.threads: list[threading.Thread] = []

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        self.inputs.append(request_input)
        self.threads.append(threading.current_thread())
        return ["COLLECTION_FORBIDDEN"] if "secret" in request_input["collections"] else []


def request_path(
    policy: DenyingCollections | None = None, route_policy: RoutePolicy = PUSH_DOWN
) -> tuple[RequestPath, GateMetrics]:
    metrics = GateMetrics(CollectorRegistry())
    admission = RequestAdmission(
        TrustedHeaders(),
        policy,
        route_kind=FORMATS.route_kind,
        collections=FORMATS.collections,
        count_refusal=metrics.count_request_refusal,
    )
    path = RequestPath(admission, FORMATS, RoutePolicies(lambda _: route_policy), metrics)
    return path, metrics


def plan(
    path: RequestPath,
    route: str,
    *,
    method: str = "POST",
    headers: Mapping[str, str] = ALICE,
    metadata: Mapping[str, Mapping[str, Any]] | None = None,
    query_string: str = "",
    grpc: bool = False,
    has_body: bool = True,
) -> Plan:
    request = AuthRequest(method, route, dict(headers), metadata or {})
    return asyncio.run(path.plan(request, query_string=query_string, grpc=grpc, has_body=has_body))


def refusals_counted(metrics: GateMetrics, status: str) -> float:
    value = metrics.registry.get_sample_value(
        "retrieval_gate_request_refusals_total", {"status": status}
    )
    return value or 0.0


def test_a_search_route_is_filtered_with_its_body_read() -> None:
    path, _ = request_path()
    planned = plan(path, SEARCH)
    assert isinstance(planned, Filter)
    assert (planned.route, planned.caller.tenant, planned.fmt.name) == (
        Route("POST", SEARCH),
        "acme",
        "qdrant",
    )
    assert planned.reads_body
    assert set(planned.strip_headers) == {"x-gate-tenant", "x-gate-principals"}


CHROMA_DB = "/api/v2/tenants/default_tenant/databases/default_database"
CHROMA_ID = "45af66b2-2ca0-476a-b6a3-926b26ba75d1"


def test_an_answer_that_names_collections_is_read_and_a_rename_forgets_the_name() -> None:
    path, _ = request_path()
    by_name = f"{CHROMA_DB}/collections/docs"
    assert plan(path, by_name, method="GET") == ReadNames(
        ("x-gate-principals", "x-gate-tenant"), Route("GET", by_name)
    )
    assert isinstance(plan(path, by_name, method="HEAD"), PassThrough)  # no body to read
    described = {
        "id": CHROMA_ID,
        "name": "docs",
        "tenant": "default_tenant",
        "database": "default_database",
    }
    read = plan(path, by_name, method="GET")
    assert isinstance(read, ReadNames)
    asyncio.run(path.learn_names(read, orjson.dumps(described)))
    query = Route("POST", f"{CHROMA_DB}/collections/{CHROMA_ID}/query")
    assert FORMATS.id_names(query) == {CHROMA_ID: "docs"}
    # A PUT of the collection may rename it: the name no longer holds.
    assert isinstance(plan(path, f"{CHROMA_DB}/collections/{CHROMA_ID}", method="PUT"), PassThrough)
    assert FORMATS.id_names(query) == {CHROMA_ID: None}


def test_a_long_list_of_collections_is_read_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = request_path()
    listed = f"{CHROMA_DB}/collections"
    read = plan(path, listed, method="GET")
    assert isinstance(read, ReadNames)
    ids = [f"{n:08x}-0000-4000-8000-000000000000" for n in range(40)]
    body = orjson.dumps(
        [
            {
                "id": id_,
                "name": f"c-{n}",
                "metadata": {"about": "x" * 1000},
                "tenant": "default_tenant",
                "database": "default_database",
            }
            for n, id_ in enumerate(ids)
        ]
    )
    assert len(body) > 32 * 1024
    loop_thread: list[threading.Thread] = []

    async def learn() -> None:
        loop_thread.append(threading.current_thread())
        await path.learn_names(read, body)

    reading: list[threading.Thread] = []
    learn_in = FORMATS.learn_names

    def recorded(route: Route, answer: bytes) -> None:
        reading.append(threading.current_thread())
        learn_in(route, answer)

    monkeypatch.setattr(FORMATS, "learn_names", recorded)
    asyncio.run(learn())
    assert reading and reading[0] is not loop_thread[0]
    last = Route("POST", f"{CHROMA_DB}/collections/{ids[-1]}/query")
    assert FORMATS.id_names(last) == {ids[-1]: "c-39"}


def test_a_route_no_format_reads_passes_and_is_counted_unread() -> None:
    path, metrics = request_path()
    assert plan(path, "/healthz", method="GET") == PassThrough(
        ("x-gate-principals", "x-gate-tenant")
    )
    labels = {"outcome": "passthrough", "format": "none", "collection": "none"}
    assert metrics.registry.get_sample_value("retrieval_gate_responses_total", labels) == 1


def test_a_path_that_is_not_canonical_is_refused_and_counted() -> None:
    path, metrics = request_path()
    planned = plan(path, "/collections/docs/points/%73earch")
    assert isinstance(planned, Refused)
    assert (planned.refusal.code, planned.refusal.http_status) == ("path_not_canonical", 400)
    assert refusals_counted(metrics, "400") == 1


def test_the_caller_an_ext_authz_in_front_left_is_believed_without_headers() -> None:
    path, _ = request_path()
    caller = Caller("globex", frozenset({"user:bob"}))
    metadata = {IDENTITY_NAMESPACE: caller.to_document()}
    planned = plan(path, SEARCH, headers={}, metadata=metadata)
    assert isinstance(planned, Filter)
    assert planned.caller == caller
    assert planned.strip_headers == ()


def test_unreadable_ext_authz_metadata_is_refused_401() -> None:
    path, metrics = request_path()
    planned = plan(path, SEARCH, metadata={IDENTITY_NAMESPACE: {"tenant": 7}})
    assert isinstance(planned, Refused)
    assert (planned.refusal.code, planned.refusal.http_status) == ("identity_missing", 401)
    assert refusals_counted(metrics, "401") == 1


def test_a_non_canonical_path_is_refused_under_ext_authz_too() -> None:
    path, _ = request_path()
    metadata = {IDENTITY_NAMESPACE: Caller("acme", frozenset({"u"})).to_document()}
    planned = plan(path, "/collections/docs/../x/points/search", metadata=metadata)
    assert isinstance(planned, Refused)
    assert planned.refusal.code == "path_not_canonical"


def test_a_push_down_search_without_a_body_is_refused() -> None:
    path, _ = request_path()
    planned = plan(path, ES_SEARCH, method="GET", has_body=False)
    assert isinstance(planned, Refused)
    assert (planned.refusal.code, planned.refusal.http_status) == ("request_not_filterable", 400)


def test_without_push_down_a_search_without_a_body_is_filtered_unread() -> None:
    path, _ = request_path(route_policy=NO_PUSH_DOWN)
    planned = plan(path, ES_SEARCH, method="GET", has_body=False)
    assert isinstance(planned, Filter)
    assert not planned.reads_body


def test_url_parameters_that_bypass_the_push_down_are_refused() -> None:
    path, _ = request_path()
    planned = plan(path, ES_SEARCH, query_string="q=title:secret")
    assert isinstance(planned, Refused)
    assert planned.refusal.code == "request_not_filterable"
    # Without push-down the same URL is the route's business.
    assert isinstance(plan(request_path(route_policy=NO_PUSH_DOWN)[0], ES_SEARCH), Filter)


def test_the_tenant_is_pushed_down_into_the_search_body() -> None:
    path, _ = request_path()
    planned = plan(path, SEARCH)
    assert isinstance(planned, Filter)
    rewrite = asyncio.run(path.read_body(planned, b'{"vector": [0.1], "limit": 3}'))
    assert isinstance(rewrite, RequestRewrite)
    assert rewrite.tenant_filter
    sent = orjson.loads(rewrite.body)
    assert {"key": "tenant", "match": {"value": "acme"}} in sent["filter"]["must"]


@pytest.mark.parametrize(
    ("mode", "sent_limit", "limits"),
    [
        (Mode.ENFORCE, 6, (3,)),
        # Strict refuses a response with any rejected hit: hits past k could only block it.
        (Mode.STRICT, 3, ()),
        # Audit passes the database's answer as it came.
        (Mode.AUDIT, 3, ()),
    ],
)
def test_over_fetch_is_for_enforce_mode_only(
    mode: Mode, sent_limit: int, limits: tuple[int, ...]
) -> None:
    route_policy = RoutePolicy(mode, "tenant", 2.0, substitute_superseded=False)
    path, _ = request_path(route_policy=route_policy)
    planned = plan(path, SEARCH)
    assert isinstance(planned, Filter)
    rewrite = asyncio.run(path.read_body(planned, b'{"vector": [0.1], "limit": 3}'))
    assert isinstance(rewrite, RequestRewrite)
    assert orjson.loads(rewrite.body)["limit"] == sent_limit
    assert (rewrite.limits, rewrite.overfetched) == (limits, bool(limits))


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "request_body_malformed"),
        # A search by a stored point's id: the tenant condition cannot reach it.
        (b'{"query": {"recommend": {"positive": [1]}}}', "request_not_filterable"),
    ],
)
def test_a_body_the_tenant_cannot_be_pushed_into_is_refused(body: bytes, code: str) -> None:
    path, metrics = request_path()
    planned = plan(path, "/collections/docs/points/query")
    assert isinstance(planned, Filter)
    read = asyncio.run(path.read_body(planned, body))
    assert isinstance(read, Refused)
    assert (read.refusal.code, read.refusal.http_status) == (code, 400)
    assert refusals_counted(metrics, "400") == 1


def test_a_collection_the_body_names_is_asked_of_the_request_policy() -> None:
    policy = DenyingCollections()
    # Without push-down: a recommendation by a stored point's id is the route's business.
    path, _ = request_path(policy, NO_PUSH_DOWN)
    planned = plan(path, "/collections/docs/points/recommend")
    assert isinstance(planned, Filter)
    body = b'{"positive": [1], "lookup_from": {"collection": "secret"}}'
    read = asyncio.run(path.read_body(planned, body))
    assert isinstance(read, Refused)
    assert (read.refusal.code, read.refusal.reasons) == ("forbidden", ("COLLECTION_FORBIDDEN",))
    assert [i["collections"] for i in policy.inputs] == [["docs"], ["docs", "secret"]]


def test_a_grpc_call_the_gate_does_not_filter_has_its_collections_read() -> None:
    policy = DenyingCollections()
    path, _ = request_path(policy)
    planned = plan(path, GRPC_UPSERT, grpc=True)
    assert isinstance(planned, ReadCollections)
    allowed = frame(q.UpsertPoints(collection_name="docs").SerializeToString())
    assert asyncio.run(path.read_body(planned, allowed)) is None
    forbidden = frame(q.UpsertPoints(collection_name="secret").SerializeToString())
    read = asyncio.run(path.read_body(planned, forbidden))
    assert isinstance(read, Refused)
    assert read.refusal.code == "forbidden"
    # A gRPC call without a body has nothing to read: it passes on its path's answer.
    assert isinstance(plan(path, GRPC_UPSERT, grpc=True, has_body=False), PassThrough)


@pytest.mark.parametrize("route_policy", [PUSH_DOWN, NO_PUSH_DOWN])
def test_a_point_in_times_index_filter_is_refused_and_its_opening_passes(
    route_policy: RoutePolicy,
) -> None:
    # Elasticsearch decides an index_filter per shard, over every tenant's
    # values: no push-down confines it, so push_down = false does not let it through.
    path, metrics = request_path(route_policy=route_policy)
    planned = plan(path, "/docs/_pit")
    assert isinstance(planned, ReadCollections)
    assert not planned.grpc
    body = b'{"index_filter": {"range": {"salary": {"gte": 100000}}}}'
    read = asyncio.run(path.read_body(planned, body))
    assert isinstance(read, Refused)
    assert (read.refusal.code, read.refusal.http_status) == ("request_not_filterable", 400)
    assert refusals_counted(metrics, "400") == 1
    # Control: the same opening without a filter (empty, {}) or without a body passes.
    assert asyncio.run(path.read_body(planned, b"")) is None
    assert asyncio.run(path.read_body(planned, b"{}")) is None
    assert isinstance(plan(path, "/docs/_pit", has_body=False), PassThrough)
    unreadable = asyncio.run(path.read_body(planned, b"{not json"))
    assert isinstance(unreadable, Refused)
    assert unreadable.refusal.code == "request_body_malformed"


@pytest.mark.parametrize("remote", [False, True])
def test_a_remote_policy_is_asked_off_the_event_loop_at_headers_and_body(remote: bool) -> None:
    policy = DenyingCollections(remote=remote)
    path, _ = request_path(policy)

    async def both() -> tuple[Plan, Refused | RequestRewrite | None]:
        planned = await path.plan(
            AuthRequest("POST", GRPC_UPSERT, dict(ALICE)),
            query_string="",
            grpc=True,
            has_body=True,
        )
        assert isinstance(planned, ReadCollections)
        body = frame(q.UpsertPoints(collection_name="docs").SerializeToString())
        return planned, await path.read_body(planned, body)

    _, read = asyncio.run(both())
    assert read is None
    assert len(policy.threads) == 2
    # asyncio.run runs the loop on this thread: a remote policy must never run here.
    on_loop = [thread is threading.current_thread() for thread in policy.threads]
    assert on_loop == [not remote, not remote]
