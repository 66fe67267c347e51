"""The format table: built-in adapters, options from the `formats` settings table,
generic adapters, and route prefixes pinned to one format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.config import ConfigError, format_table, load_settings
from sidecar.core.hits import Route, RouteKind
from sidecar.formats.registry import BUILT_IN, FormatTable, build_format_table

SEARCHES = {
    "qdrant": Route("POST", "/collections/docs/points/search"),
    "chroma": Route("POST", "/api/v2/tenants/t/databases/d/collections/c1/query"),
    "weaviate": Route("POST", "/v1/graphql"),
    "milvus": Route("POST", "/v2/vectordb/entities/search"),
    "pinecone": Route("POST", "/query"),
    "elasticsearch": Route("POST", "/docs/_search"),
    "qdrant_grpc": Route("POST", "/qdrant.Points/Query"),
    "weaviate_grpc": Route("POST", "/weaviate.v1.Weaviate/Search"),
    "pinecone_grpc": Route("POST", "/VectorService/Query"),
    "milvus_grpc": Route("POST", "/milvus.proto.milvus.MilvusService/Search"),
}


def table(**options: dict[str, object]) -> FormatTable:
    return build_format_table(options, {}, text_field="text", id_field=None)


def test_every_built_in_format_is_detected_on_its_standard_search_route() -> None:
    formats = table()
    assert sorted(SEARCHES) == sorted(BUILT_IN)
    for name, route in SEARCHES.items():
        found = formats.response_format(route)
        assert found is not None and found.name == name, route


def test_no_standard_search_route_is_claimed_by_two_formats() -> None:
    for name, route in SEARCHES.items():
        claims = [f.name for f in table().formats if f.route_kind(route) is not None]
        assert claims == [name], (route, claims)


def test_a_route_no_adapter_knows_is_unclassified() -> None:
    assert table().classify(Route("GET", "/healthz")) is None
    assert table().response_format(Route("POST", "/healthz")) is None


def test_a_disabled_format_is_not_detected() -> None:
    formats = table(qdrant={"enabled": False})
    assert formats.response_format(SEARCHES["qdrant"]) is None
    assert "qdrant" not in [f.name for f in formats.formats]


def test_format_options_reach_the_adapter() -> None:
    formats = build_format_table(
        {"qdrant": {"text_field": "body"}}, {}, text_field="text", id_field="chunk"
    )
    qdrant = next(f for f in formats.formats if f.name == "qdrant")
    assert qdrant.text_field == "body"  # type: ignore[attr-defined]
    assert qdrant.id_field == "chunk"  # type: ignore[attr-defined]


def test_a_generic_format_comes_first_and_owns_its_routes() -> None:
    formats = table(
        inhouse={
            "adapter": "generic",
            "routes": ["POST /api/retrieve"],
            "hits": "$.results[*]",
            "id": "doc_id",
            "text": "content",
        }
    )
    assert formats.formats[0].name == "inhouse"
    found = formats.response_format(Route("POST", "/api/retrieve"))
    assert found is not None and found.name == "inhouse"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"qdrant": {"colour": "red"}}, "formats.qdrant: unknown option 'colour'"),
        ({"qdrant": {"enabled": "no"}}, "formats.qdrant: option 'enabled' must be true or false"),
        ({"mine": {"routes": ["POST /x"]}}, "formats.mine: not a built-in format"),
        ({"mine": {"adapter": "qdrant"}}, "formats.mine: not a built-in format"),
    ],
)
def test_bad_format_options_are_named(options: dict[str, dict[str, object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_format_table(options, {}, text_field="text", id_field=None)


def test_a_pinned_prefix_consults_only_its_format() -> None:
    # An Elasticsearch index named "collections" would otherwise look like Qdrant.
    path = "/collections/_search"
    pinned = build_format_table(
        {}, {"/collections/": "elasticsearch"}, text_field="t", id_field=None
    )
    found = pinned.response_format(Route("POST", path))
    assert found is not None and found.name == "elasticsearch"
    # Qdrant's own search route under the pinned prefix is no longer Qdrant's.
    assert pinned.response_format(SEARCHES["qdrant"]) is None


def test_pinning_an_unknown_format_is_an_error() -> None:
    with pytest.raises(ValueError, match="no enabled format is named 'solr'"):
        build_format_table({}, {"/solr/": "solr"}, text_field="t", id_field=None)


def test_formats_and_pinned_routes_from_a_config_file(tmp_path: Path) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n'
        "[formats.elasticsearch]\n"
        'text_field = "body"\n'
        "[formats.inhouse]\n"
        'adapter = "generic"\n'
        'routes = ["POST /api/retrieve"]\n'
        'hits = "$.results[*]"\n'
        'id = "doc_id"\n'
        'text = "content"\n'
        '[routes."/search/"]\n'
        'format = "inhouse"\n'
    )
    formats = format_table(load_settings(config))
    assert formats.route_kind(Route("POST", "/api/retrieve")) is RouteKind.FILTERED


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[formats.qdrant]\ncolour = 1\n", "formats.qdrant: unknown option 'colour'"),
        ('[routes."/x/"]\nformat = "solr"\n', "no enabled format is named 'solr'"),
        ("formats = 3\n", "formats: must be a table"),
        ('[routes."/x/"]\nformat = 3\n', 'routes."/x/".format: must be a string'),
    ],
)
def test_bad_format_settings_are_config_errors(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(text + '[identity]\nmode = "trusted-headers"\n')
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


@pytest.mark.parametrize("name", sorted(BUILT_IN))
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("text_field", "", "text_field must be a non-empty string"),
        ("text_field", 3, "text_field must be a non-empty string"),
        ("id_field", "", "id_field must be a non-empty string"),
    ],
)
def test_every_built_in_format_checks_its_field_options(
    name: str, option: str, value: object, message: str
) -> None:
    if option in BUILT_IN[name].options_not_taken:
        # Chroma keeps its text in a column of its own: it takes no text_field.
        message = f"unknown option '{option}'"
    with pytest.raises(ValueError, match=f"formats.{name}: {message}"):
        table(**{name: {option: value}})


def test_field_defaults_reach_only_the_formats_that_take_them() -> None:
    formats = {
        f.name: f for f in build_format_table({}, {}, text_field="body", id_field="chunk").formats
    }
    for name in ("qdrant", "weaviate", "milvus", "pinecone"):
        fmt = formats[name]
        assert (fmt.text_field, fmt.id_field) == ("body", "chunk")  # type: ignore[attr-defined]
    assert formats["chroma"].id_field == "chunk"  # type: ignore[attr-defined]
    assert not hasattr(formats["chroma"], "text_field")


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        # An Elasticsearch index named like another database's routes.
        ("GET", "/collections/_search", ("elasticsearch", RouteKind.FILTERED)),
        ("GET", "/collections/_doc/1", ("qdrant", RouteKind.CONTENT)),  # content either way
        ("GET", "/namespaces/_search", ("elasticsearch", RouteKind.FILTERED)),
        ("PUT", "/namespace-aliases/_count", ("elasticsearch", RouteKind.CONTENT)),
        # Only Qdrant knows this one.
        ("GET", "/collections/docs", ("qdrant", RouteKind.FILTERED)),  # collection info
    ],
)
def test_every_format_is_asked_and_the_strictest_answer_wins(
    method: str, path: str, expected: tuple[str, RouteKind]
) -> None:
    found = table().classify(Route(method, path))
    assert found is not None
    assert (found[0].name, found[1]) == expected


def test_a_route_two_formats_would_filter_is_content() -> None:
    twice = build_format_table(
        {
            "one": {
                "adapter": "generic",
                "routes": ["POST /x"],
                "hits": "$[*]",
                "id": "i",
                "text": "t",
            },
            "two": {
                "adapter": "generic",
                "routes": ["POST /x"],
                "hits": "$[*]",
                "id": "i",
                "text": "t",
            },
        },
        {},
        text_field="text",
        id_field=None,
    )
    assert twice.route_kind(Route("POST", "/x")) is RouteKind.CONTENT
    assert twice.response_format(Route("POST", "/x")) is None


def test_under_a_pinned_prefix_an_unknown_route_is_content() -> None:
    pinned = build_format_table({}, {"/es": "elasticsearch"}, text_field="t", id_field=None)
    # Elasticsearch mounted under /es: the prefix is not stripped, so its
    # search is not recognised, and it must not pass as an unknown read.
    assert pinned.route_kind(Route("GET", "/es/docs/_search")) is RouteKind.CONTENT
    # The prefix matches whole segments only.
    assert pinned.route_kind(Route("GET", "/es-other/x")) is None
    assert pinned.route_kind(Route("GET", "/es")) is RouteKind.CONTENT


# -- fields released per route ---------------------------------------------------


def _released_payload(table: FormatTable, path: str) -> Any:
    body = orjson.dumps(
        {"result": [{"id": 1, "score": 0.5, "payload": {"text": "t", "title": "T", "page": 2}}]}
    )
    fmt = table.response_format(Route("POST", path))
    assert fmt is not None
    parsed = fmt.parse(body, Route("POST", path))
    return orjson.loads(parsed.render({0}))["result"][0]["payload"]


def test_a_route_releases_its_own_fields() -> None:
    table = build_format_table(
        {"qdrant": {"releasable_fields": ["page"]}, "pinecone": {"enabled": False}},
        {},
        text_field="text",
        id_field=None,
        route_options={"/collections/titled": {"releasable_fields": ["title"]}},
    )
    assert _released_payload(table, "/collections/docs/points/search") == {"text": "t", "page": 2}
    assert _released_payload(table, "/collections/titled/points/search") == {
        "text": "t",
        "title": "T",
    }


def test_an_adapter_switched_off_stays_off_on_a_route_with_its_own_fields() -> None:
    options: dict[str, dict[str, Any]] = {"pinecone": {"enabled": False}}
    everywhere = {"/": {"releasable_fields": ["title"]}}
    table = build_format_table(
        options, {}, text_field="text", id_field=None, route_options=everywhere
    )
    assert table.classify(Route("POST", "/query")) is None
    table = build_format_table({}, {}, text_field="text", id_field=None, route_options=everywhere)
    found = table.classify(Route("POST", "/query"))
    assert found is not None and found[0].name == "pinecone"
