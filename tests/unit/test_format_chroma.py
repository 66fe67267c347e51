"""The Chroma adapter: what its answers repeat of the request comes from the request.

The rest of the adapter's behaviour is the shared property suite's
(tests/unit/test_format_contract.py) and, against a real ``chroma run``,
tests/envoy/test_envoy_chroma.py. Bodies are built by
``tests.fixtures.chroma_bodies`` in the server's shapes and validated with the
OpenAPI document's schemas.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from sidecar.formats.base import MalformedBody
from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.chroma.rest_request import ChromaEcho
from tests.fixtures.chroma_bodies import (
    RESPONSE_SCHEMAS,
    encode,
    get_body,
    query_body,
    route,
    row,
    search_body,
)

PLANTED = "text of another tenant's chunk"
ROWS = [row("a", "doc a"), row("b", "doc b")]


def released(endpoint: str, body: dict[str, Any], keep: set[int], echo: object = None) -> Any:
    out = ChromaFormat().parse(encode(body), route(endpoint), echo).render(keep)
    document = orjson.loads(out)
    jsonschema.validate(document, RESPONSE_SCHEMAS[endpoint])
    return document


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [("get", get_body(ROWS)), ("query", query_body([ROWS]))],
)
def test_include_is_the_requests_whatever_the_database_wrote(
    endpoint: str, body: dict[str, Any]
) -> None:
    asked = tuple(body["include"])
    body = {**body, "include": [*body["include"], PLANTED]}
    for keep in ({0, 1}, {1}, set()):
        out = released(endpoint, body, keep, ChromaEcho(include=asked))
        assert out["include"] == list(asked)
    assert PLANTED.encode() not in orjson.dumps(out)


def test_include_repeats_the_request_as_sent() -> None:
    # Duplicates and order are the request's (chroma run echoes them so).
    asked = ("documents", "documents", "uris")
    body = get_body(ROWS, include=("uris", "documents"))
    assert released("get", body, {0}, ChromaEcho(include=asked))["include"] == list(asked)


def test_without_the_request_include_must_name_chromas_columns() -> None:
    body = get_body(ROWS)
    assert released("get", body, {0})["include"] == body["include"]
    with pytest.raises(MalformedBody):
        ChromaFormat().parse(encode({**body, "include": [PLANTED]}), route("get"))


def test_a_search_keeps_of_each_searchs_select_the_keys_it_selected() -> None:
    body = search_body([ROWS, ROWS], selects=[["#document", "title"], ["#score"]])
    body["select"][0].append(PLANTED)
    body["select"][1].append("#embedding")  # not selected by that search
    echo = ChromaEcho(selects=(("#document", "title"), ("#score",)))
    out = released("search", body, {0, 2}, echo)
    assert out["select"] == [["#document", "title"], ["#score"]]


def test_without_the_request_a_search_keeps_only_chromas_own_select_keys() -> None:
    body = search_body([ROWS], selects=[["#document", "title"]])
    body["select"][0].append(PLANTED)
    assert released("search", body, {0})["select"] == [["#document"]]
    # A search whose select the gate could not read counts as unknown too.
    echo = ChromaEcho(selects=(None,))
    assert released("search", body, {0}, echo)["select"] == [["#document"]]


def test_a_select_of_another_number_of_searches_than_the_request_is_malformed() -> None:
    body = search_body([ROWS])
    echo = ChromaEcho(selects=((), ()))
    with pytest.raises(MalformedBody):
        ChromaFormat().parse(encode(body), route("search"), echo)
