"""Weaviate GraphQL requests: tenant push-down on the syntax tree, over-fetch, refusals.

Rewritten queries are validated with graphql-core against ``SCHEMA``, a
restatement of the GraphQL types Weaviate builds for a class (type names as
``adapters/handlers/graphql/local`` makes them: the ``where`` argument is a
``GetObjects<Class>WhereInpObj``, its ``operands`` items a different
``...WhereOperandsInpObj``), so a rewrite that breaks the query's typing
(a variable moved where its type does not fit) fails here.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from graphql import build_schema, parse, print_ast, validate
from graphql.language import ast
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.weaviate.rest import WeaviateFormat
from tests.fixtures.format_strategies import PROPERTIES

TENANT = "acme"
KEY = "tenant"
CONDITION = f'{{path: ["{KEY}"], operator: Equal, valueText: "{TENANT}"}}'

_WHERE_FIELDS = """
  operator: WhereOperatorEnum
  path: [String]
  valueText: String
  valueString: String
  valueInt: Int
  valueNumber: Float
  valueBoolean: Boolean
  valueDate: String
"""
SCHEMA = build_schema(
    f"""
    enum WhereOperatorEnum {{
      And Or Equal NotEqual GreaterThan GreaterThanEqual LessThan LessThanEqual Like IsNull
    }}
    input GetObjectsChunkWhereInpObj {{
      {_WHERE_FIELDS}
      operands: [GetObjectsChunkWhereOperandsInpObj]
    }}
    input GetObjectsChunkWhereOperandsInpObj {{
      {_WHERE_FIELDS}
      operands: [GetObjectsChunkWhereOperandsInpObj]
    }}
    input NearVectorInpObj {{ vector: [Float] distance: Float }}
    input NearObjectInpObj {{ id: String beacon: String }}
    input MoveObjectsInpObj {{ id: String beacon: String }}
    input MoveInpObj {{ concepts: [String] objects: [MoveObjectsInpObj] force: Float }}
    input NearTextInpObj {{ concepts: [String] moveTo: MoveInpObj moveAwayFrom: MoveInpObj }}
    input HybridSearchesInpObj {{ nearText: NearTextInpObj nearVector: NearVectorInpObj }}
    input HybridInpObj {{ query: String alpha: Float searches: HybridSearchesInpObj }}
    input GroupByInpObj {{ path: [String] groups: Int objectsPerGroup: Int }}
    type ChunkAdditional {{ id: String distance: Float }}
    type Doc {{ title: String _additional: ChunkAdditional }}
    union ChunkOfDocumentObj = Doc
    type Chunk {{
      text: String
      tenant: String
      ofDocument: [ChunkOfDocumentObj]
      _additional: ChunkAdditional
    }}
    type GetObjectsObj {{
      Chunk(
        where: GetObjectsChunkWhereInpObj
        limit: Int
        offset: Int
        after: String
        autocut: Int
        tenant: String
        nearVector: NearVectorInpObj
        nearObject: NearObjectInpObj
        nearText: NearTextInpObj
        hybrid: HybridInpObj
        groupBy: GroupByInpObj
      ): [Chunk]
      Doc(where: GetObjectsChunkWhereInpObj, limit: Int): [Doc]
    }}
    type ChunkMeta {{ count: Int }}
    type AggregateChunk {{ meta: ChunkMeta }}
    type AggregateObjectsObj {{ Chunk(where: GetObjectsChunkWhereInpObj): [AggregateChunk] }}
    type ExploreObj {{ beacon: String }}
    type WeaviateObj {{
      Get: GetObjectsObj
      Aggregate: AggregateObjectsObj
      Explore(nearText: NearTextInpObj): [ExploreObj]
    }}
    schema {{ query: WeaviateObj }}
    """
)


def rewrite(
    request: dict[str, Any] | list[Any] | bytes,
    *,
    batched: bool = False,
    tenant: str = TENANT,
    tenant_key: str | None = KEY,
    factor: float = 1.0,
    cap: int = 1000,
) -> RequestRewrite:
    body = request if isinstance(request, bytes) else orjson.dumps(request)
    path = "/v1/graphql/batch" if batched else "/v1/graphql"
    return WeaviateFormat().rewrite_request(
        body,
        Route("POST", path),
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def query_of(out: RequestRewrite, variables: dict[str, Any] | None = None) -> str:
    """The rewritten query, checked valid against the schema."""
    query: str = orjson.loads(out.body)["query"]
    assert validate(SCHEMA, parse(query)) == [], query
    return query


def same(query: str) -> str:
    """``query`` as graphql-core prints it (the gate sends printed queries)."""
    return print_ast(parse(query))


def arguments(query: str, key: str) -> dict[str, str]:
    """The arguments of the class field with response key ``key``, printed."""
    for definition in parse(query).definitions:
        assert isinstance(definition, ast.OperationDefinitionNode)
        for get in definition.selection_set.selections:
            assert isinstance(get, ast.FieldNode) and get.selection_set is not None
            for field in get.selection_set.selections:
                assert isinstance(field, ast.FieldNode)
                if (field.alias or field.name).value == key:
                    return {a.name.value: print_ast(a.value) for a in field.arguments}
    raise AssertionError(f"no class field {key}")


def rewritten(query: str, **options: Any) -> str:
    assert validate(SCHEMA, parse(query)) == [], "the app's query itself is valid"
    return query_of(rewrite({"query": query}, **options))


# -- which requests ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "rewrites"),
    [
        ("POST", "/v1/graphql", True),
        ("POST", "/v1/graphql/", True),
        ("post", "/v1/graphql/batch", True),
        ("GET", "/v1/graphql", False),
        ("POST", "/v1/graphql/other", False),
        ("POST", "/v1/objects", False),
        ("POST", "/v1/batch/objects", False),
    ],
)
def test_rewrites_the_graphql_endpoints_only(method: str, path: str, rewrites: bool) -> None:
    fmt = WeaviateFormat()
    assert fmt.rewrites_request(Route(method, path)) is rewrites
    assert (fmt.route_kind(Route(method, path)) is RouteKind.FILTERED) is rewrites


def test_other_routes_come_back_unchanged() -> None:
    out = WeaviateFormat().rewrite_request(
        b"SECRET",
        Route("POST", "/v1/objects"),
        tenant=TENANT,
        tenant_key=KEY,
        overfetch_factor=2.0,
        overfetch_cap=10,
    )
    assert out == RequestRewrite(b"SECRET", (), tenant_filter=False, overfetched=False)


# -- push-down --------------------------------------------------------------------------


def test_without_a_where_the_condition_stands_alone() -> None:
    out = rewrite({"query": "{ Get { Chunk { text } } }"})
    assert query_of(out) == same(f"{{ Get {{ Chunk(where: {CONDITION}) {{ text }} }} }}")
    assert out.tenant_filter and not out.overfetched and out.limits == ()
    assert out.collections == ("Chunk",)


def test_a_null_where_is_no_where() -> None:
    query = "{ Get { Chunk(where: null, limit: 2) { text } } }"
    assert rewritten(query) == same(
        f"{{ Get {{ Chunk(where: {CONDITION}, limit: 2) {{ text }} }} }}"
    )


APP_WHERES = [
    '{path: ["rank"], operator: GreaterThan, valueInt: 3}',
    '{operator: Or, operands: [{path: ["tenant"], operator: Equal, valueText: "globex"},'
    ' {path: ["tenant"], operator: NotEqual, valueText: "acme"}]}',
    '{path: ["text"], operator: Like, valueText: "*\\"}) { x } } #"}',
    '{path: ["id"], operator: IsNull, valueBoolean: false}',
]


@pytest.mark.parametrize("app_where", APP_WHERES)
def test_the_app_where_is_the_second_operand_untouched(app_where: str) -> None:
    query = f"{{ Get {{ Chunk(limit: 3, where: {app_where}) {{ text _additional {{ id }} }} }} }}"
    wrapped = f"{{operator: And, operands: [{CONDITION}, {app_where}]}}"
    expected = f"{{ Get {{ Chunk(limit: 3, where: {wrapped}) {{ text _additional {{ id }} }} }} }}"
    assert rewritten(query) == same(expected)


def test_variables_inside_the_where_keep_working() -> None:
    query = (
        "query Q($v: String, $n: Int) { Get { Chunk(where: {operator: And, operands: ["
        '{path: ["text"], operator: Like, valueText: $v}, {path: ["rank"], operator: '
        "GreaterThan, valueInt: $n}]}) { text } } }"
    )
    variables = {"v": "x*", "n": 2}
    out = rewrite({"query": query, "variables": variables, "operationName": "Q"})
    request = orjson.loads(out.body)
    assert request["variables"] == variables and request["operationName"] == "Q"
    assert "valueText: $v" in arguments(query_of(out), "Chunk")["where"]


def test_every_class_field_of_every_get_and_operation_is_restricted() -> None:
    query = (
        "query A { __typename Get { __typename Chunk { text } recent: Chunk(limit: 1) { text }"
        " Doc { title } } Get { other: Chunk { text } } }"
        ' query B { Get { Chunk(where: {path: ["rank"], operator: Equal, valueInt: 1}) { text } } }'
    )
    document = parse(rewritten(query))
    fields = [
        field
        for operation in document.definitions
        if isinstance(operation, ast.OperationDefinitionNode)
        for get in operation.selection_set.selections
        if isinstance(get, ast.FieldNode) and get.name.value == "Get"
        for field in get.selection_set.selections  # type: ignore[union-attr]
        if isinstance(field, ast.FieldNode) and field.name.value != "__typename"
    ]
    assert len(fields) == 5
    for field in fields:
        (where,) = [a for a in field.arguments if a.name.value == "where"]
        printed = print_ast(where.value)
        assert printed.startswith((CONDITION, f"{{operator: And, operands: [{CONDITION}"))


def test_collections_are_the_classes_read() -> None:
    query = (
        "{ Get { Chunk { text ofDocument { ... on Doc { title } } } d: Doc { title }"
        " x: Chunk { ofDocument { ...F } } } } fragment F on Doc { title }"
    )
    out = rewrite({"query": query})
    assert out.collections == ("Chunk", "Doc")


@PROPERTIES
@given(tenant=st.text(), key=st.text(min_size=1))
def test_property_any_tenant_is_one_string_literal(tenant: str, key: str) -> None:
    """Quotes, backslashes, braces, newlines, block-string quotes: the tenant and key
    come back as exactly one string each, in the condition's place."""
    out = rewrite({"query": "{ Get { Chunk { text } } }"}, tenant=tenant, tenant_key=key)
    document = parse(orjson.loads(out.body)["query"])
    operation = document.definitions[0]
    assert isinstance(operation, ast.OperationDefinitionNode)
    (get,) = operation.selection_set.selections
    assert isinstance(get, ast.FieldNode) and get.selection_set is not None
    (field,) = get.selection_set.selections
    assert isinstance(field, ast.FieldNode)
    (where,) = field.arguments
    assert isinstance(where.value, ast.ObjectValueNode)
    values = {f.name.value: f.value for f in where.value.fields}
    assert set(values) == {"path", "operator", "valueText"}
    assert isinstance(values["valueText"], ast.StringValueNode)
    assert values["valueText"].value == tenant
    path = values["path"]
    assert isinstance(path, ast.ListValueNode)
    assert [v.value for v in path.values if isinstance(v, ast.StringValueNode)] == [key]


# -- what is refused ---------------------------------------------------------------------

REFUSED = [
    ("{ Aggregate { Chunk { meta { count } } } }", "'Aggregate'"),
    ('{ Explore(nearText: {concepts: ["x"]}) { beacon } }', "'Explore'"),
    ("{ g: Get { Chunk { text } } }", "aliased root field"),
    ("{ Get: Aggregate { Chunk { meta { count } } } }", "aliased root field"),
    ("{ ...R } fragment R on WeaviateObj { Get { Chunk { text } } }", "fragment at the root"),
    ("{ ... on WeaviateObj { Get { Chunk { text } } } }", "fragment at the root"),
    ("{ Get { ...G } } fragment G on GetObjectsObj { Chunk { text } }", "fragment in Get"),
    ("{ Get { ... on GetObjectsObj { Chunk { text } } } }", "fragment in Get"),
    ("{ Get @include(if: true) { Chunk { text } } }", "directive on Get"),
    ("{ Get { Chunk @skip(if: false) { text } } }", "directive on a Get class field"),
    ("{ Get { Chunk { text } Chunk { _additional { id } } } }", "one response key"),
    ("{ Get { a: Chunk { text } a: Doc { title } } }", "one response key"),
    ("{ Get { Chunk(limit: 1, limit: 2) { text } } }", "'limit' given twice"),
    ('{ Get { Chunk(nearObject: {id: "x"}) { text } } }', "'nearObject'"),
    (
        '{ Get { Chunk(nearText: {concepts: ["a"], moveTo: {objects: [{id: "x"}], force: 1}})'
        " { text } } }",
        "'objects'",
    ),
    (
        '{ Get { Chunk(hybrid: {query: "q", searches: {nearText: {concepts: ["a"],'
        ' moveAwayFrom: {objects: [{beacon: "b"}]}}}}) { text } } }',
        "'objects'",
    ),
    ("query Q($w: GetObjectsChunkWhereInpObj) { Get { Chunk(where: $w) { text } } }", "variable"),
    ('{ Get { Chunk(where: "SECRET") { text } } }', "not an object"),
    ('{ Get { Chunk(tenant: "globex") { text } } }', "tenant argument"),
    ("{ Get { Chunk(tenant: null) { text } } }", "tenant argument"),
    ("query Q($t: String) { Get { Chunk(tenant: $t) { text } } }", "tenant argument"),
    ("mutation { Get { Chunk { text } } }", "other than a query"),
    ("subscription { Get { Chunk { text } } }", "other than a query"),
    ("type Extra { a: Int } { Get { Chunk { text } } }", "definition other than"),
    ("{ Unknown { Chunk { text } } }", "'Unknown'"),
]


@pytest.mark.parametrize(("query", "named"), REFUSED)
def test_what_the_condition_cannot_reach_is_refused(query: str, named: str) -> None:
    with pytest.raises(UnfilterableRequest, match=named) as raised:
        rewrite({"query": query, "variables": {"t": "globex"}})
    assert raised.value.code == "request_not_filterable"
    assert "SECRET" not in str(raised.value) and "globex" not in str(raised.value)


@pytest.mark.parametrize(
    ("query", "variables"),
    [
        ('{ Get { Chunk(tenant: "acme") { text } } }', None),
        ("query Q($t: String) { Get { Chunk(tenant: $t) { text } } }", {"t": "acme"}),
        ("{ __typename __schema { queryType { name } } Get { __typename } }", None),
    ],
)
def test_what_is_allowed(query: str, variables: dict[str, Any] | None) -> None:
    out = rewrite({"query": query, "variables": variables})
    assert parse(orjson.loads(out.body)["query"])


def test_without_push_down_only_over_fetch_applies_and_other_roots_pass() -> None:
    query = "{ Aggregate { Chunk { meta { count } } } Get { Chunk(limit: 2) { text } } }"
    out = rewrite({"query": query}, tenant_key=None, factor=2.0)
    assert query_of(out) == same(query.replace("limit: 2", "limit: 4"))
    assert not out.tenant_filter and out.limits == (2,)


def test_with_nothing_to_apply_the_body_is_unchanged_and_the_classes_are_named() -> None:
    body = b'{"query": "{ Get { Chunk(limit: 2) { text } } }", "variables": null}'
    out = rewrite(body, tenant_key=None)
    assert out == RequestRewrite(
        body, (), tenant_filter=False, overfetched=False, collections=("Chunk",)
    )


# -- over-fetch ----------------------------------------------------------------------------


def test_literal_limits_are_raised_and_remembered_by_response_key() -> None:
    query = "{ Get { recent: Chunk(limit: 4) { text } Chunk(limit: 10) { text } Doc { title } } }"
    out = rewrite({"query": query}, factor=1.5)
    printed = query_of(out)
    assert arguments(printed, "recent")["limit"] == "6"
    assert arguments(printed, "Chunk")["limit"] == "15"
    assert "limit" not in arguments(printed, "Doc")
    # Sorted keys: Chunk, Doc, recent.
    assert out.limits == (10, None, 4) and out.overfetched


@pytest.mark.parametrize(
    "arguments_",
    [
        "limit: 4, offset: 4",
        "limit: 4, offset: 0",
        'limit: 4, after: "00000000-0000-4000-8000-000000000000"',
        "limit: 4, autocut: 1",
        'limit: 4, groupBy: {path: ["doc"], groups: 2, objectsPerGroup: 2}',
        "limit: $k",
    ],
)
def test_limits_that_are_not_raised(arguments_: str) -> None:
    header = "query Q($k: Int)" if "$k" in arguments_ else "query Q"
    query = f"{header} {{ Get {{ Chunk({arguments_}) {{ text }} }} }}"
    out = rewrite({"query": query, "variables": {"k": 4}}, factor=2.0)
    expected = query.replace(f"Chunk({arguments_})", f"Chunk({arguments_}, where: {CONDITION})")
    assert query_of(out) == same(expected)
    assert out.limits == () and not out.overfetched


def test_a_missing_limit_is_left_to_the_server_default() -> None:
    out = rewrite({"query": "{ Get { Chunk { text } } }"}, factor=2.0)
    assert "limit" not in arguments(query_of(out), "Chunk") and out.limits == ()


@pytest.mark.parametrize(
    ("factor", "cap", "asked", "sent", "limits"),
    [(1.1, 1000, 10, 11, (10,)), (3.0, 7, 4, 7, (4,)), (3.0, 3, 4, 4, ()), (2.0, 100, 0, 0, ())],
)
def test_over_fetch_arithmetic(
    factor: float, cap: int, asked: int, sent: int, limits: tuple[int, ...]
) -> None:
    query = f"{{ Get {{ Chunk(limit: {asked}) {{ text }} }} }}"
    out = rewrite({"query": query}, factor=factor, cap=cap)
    assert arguments(query_of(out), "Chunk")["limit"] == str(sent)
    assert out.limits == limits


def test_several_operations_are_never_over_fetched() -> None:
    query = (
        "query A { Get { Chunk(limit: 2) { text } } } query B { Get { Doc(limit: 2) { title } } }"
    )
    out = rewrite({"query": query, "operationName": "A"}, factor=2.0)
    assert query_of(out).count("limit: 2") == 2 and out.limits == ()


# -- batch ----------------------------------------------------------------------------------


def test_a_batch_is_pushed_down_query_by_query_and_never_over_fetched() -> None:
    requests = [
        {"query": "{ Get { Chunk(limit: 2) { text } } }"},
        {"query": "{ Get { Doc { title } } }", "variables": {}},
    ]
    out = rewrite(requests, batched=True, factor=2.0)
    sent = orjson.loads(out.body)
    assert [same(r["query"]) for r in sent] == [
        same(f"{{ Get {{ Chunk(limit: 2, where: {CONDITION}) {{ text }} }} }}"),
        same(f"{{ Get {{ Doc(where: {CONDITION}) {{ title }} }} }}"),
    ]
    assert out.limits == () and out.collections == ("Chunk", "Doc")


def test_a_refused_query_refuses_the_batch() -> None:
    requests = [
        {"query": "{ Get { Chunk { text } } }"},
        {"query": "{ Aggregate { Chunk { meta { count } } } }"},
    ]
    with pytest.raises(UnfilterableRequest):
        rewrite(requests, batched=True)


# -- bodies that cannot be read ------------------------------------------------------------


@pytest.mark.parametrize(
    ("batched", "body"),
    [
        (False, b""),
        (False, b"{not json"),
        (False, b'"SECRET"'),
        (False, b"null"),
        (False, b"[]"),
        (False, b"{}"),
        (False, b'{"query": 1}'),
        (False, b'{"query": "{ Get { Chunk { text } } }", "variables": ["SECRET"]}'),
        (False, b'{"query": "{ Get { Chunk(where: {path: [\\"SECRET\\"]}) { text } "}'),
        (False, b'{"query": "SECRET"}'),
        (
            False,
            orjson.dumps(
                {"query": "{ Get { Chunk(where: " + "[" * 5000 + "]" * 5000 + ") { text } } }"}
            ),
        ),
        (True, b'{"query": "{ Get { Chunk { text } } }"}'),
        (True, b'["SECRET"]'),
    ],
)
def test_unreadable_bodies(batched: bool, body: bytes) -> None:
    with pytest.raises(MalformedRequest) as raised:
        rewrite(body, batched=batched)
    assert "SECRET" not in str(raised.value)
    assert raised.value.__cause__ is None and raised.value.__context__ is None
