"""Chroma collections by name: ids learned from Chroma's own answers, per process, bounded.

Chroma's record routes name a collection by its id; users, policy data and the
metrics' allowlist know its name. The gate reads the answers of Chroma's
collection routes for which name each id stands for (``FormatTable.names``),
adds the name to what the request policy checks, and tells the policy which
ids it could not name (``input.unnamed_collections``), which the shipped
policy lets pass only when no collection described by name is another
tenant's. Bodies here follow what ``chroma run`` answers (measured with
chromadb 1.5; the real server is behind tests/envoy/test_envoy_chroma_names.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.config import IdentityMode
from sidecar.core.hits import Route
from sidecar.formats.base import CollectionId
from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.collection_names import CollectionNames
from sidecar.formats.registry import build_format_table
from sidecar.runtime.server import Sidecar
from sidecar.store.loader import parse_record
from tests.fixtures.ext_proc_stream import (
    request_body,
    request_headers,
    response_body,
    response_headers,
    run_stream,
)
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.settings import settings_of, with_values
from tests.fixtures.stores import new_sqlite_url

DOCS_ID = "45af66b2-2ca0-476a-b6a3-926b26ba75d1"
OTHER_ID = "0b8e5c1e-93a4-4b7a-9d3e-2f6c1a7b8c9d"
DB = "/api/v2/tenants/default_tenant/databases/default_database"
SCOPE = ("default_tenant", "default_database")
CHROMA = ChromaFormat()


def described(
    identifier: str = DOCS_ID,
    name: str = "docs",
    tenant: str = "default_tenant",
    database: str = "default_database",
) -> dict[str, Any]:
    """A collection as Chroma describes it (``Collection``; configuration left out)."""
    return {
        "id": identifier,
        "name": name,
        "metadata": None,
        "dimension": 2,
        "tenant": tenant,
        "database": database,
        "log_position": 0,
        "version": 0,
    }


def learned(route: Route, body: Any) -> list[tuple[CollectionId, str]]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return CHROMA.collection_names(route, raw)


# -- which answers describe collections, and what they say ----------------------------


@pytest.mark.parametrize(
    "route",
    [
        Route("GET", f"{DB}/collections/docs"),  # by name: chromadb's get_collection
        Route("GET", f"{DB}/collections"),  # the list
        Route("POST", f"{DB}/collections"),  # create, get_or_create
        Route("GET", f"{DB}/collections/by-id/{DOCS_ID}"),
        Route("POST", f"{DB}/collections/{DOCS_ID}/fork"),
        Route("GET", "/api/v2/collections/default_tenant:default_database:docs"),  # by CRN
    ],
)
def test_the_collection_routes_describe_collections(route: Route) -> None:
    assert CHROMA.names_collections(route)
    body = [described()] if route == Route("GET", f"{DB}/collections") else described()
    assert learned(route, body) == [(CollectionId(SCOPE, DOCS_ID), "docs")]


@pytest.mark.parametrize(
    "route",
    [
        Route("POST", f"{DB}/collections/{DOCS_ID}/query"),
        Route("POST", f"{DB}/collections/{DOCS_ID}/get"),
        Route("HEAD", f"{DB}/collections/docs"),  # no body
        Route("DELETE", f"{DB}/collections/docs"),
        Route("PUT", f"{DB}/collections/{DOCS_ID}"),  # answers {}
        Route("GET", f"{DB}/collections_count"),
        Route("GET", "/api/v2/heartbeat"),
    ],
)
def test_other_routes_are_not_read_for_names(route: Route) -> None:
    assert not CHROMA.names_collections(route)
    assert learned(route, described()) == []


def test_a_list_teaches_every_collection_it_describes() -> None:
    body = [described(), described(OTHER_ID, "sops")]
    assert learned(Route("GET", f"{DB}/collections"), body) == [
        (CollectionId(SCOPE, DOCS_ID), "docs"),
        (CollectionId(SCOPE, OTHER_ID), "sops"),
    ]


@pytest.mark.parametrize(
    "body",
    [
        # Another tenant's or database's collection says nothing about this path's.
        described(tenant="other_tenant"),
        described(database="other_database"),
        described(identifier="not-a-uuid"),
        described(name=""),
        {**described(), "name": 7},
        {**described(), "id": None},
        {"error": "NotFoundError", "message": "Collection [docs] does not exist"},
        "docs",
        b"not json",
        # Read twice, a key repeated could be another name to a client.
        b'{"id":"' + DOCS_ID.encode() + b'","name":"docs","name":"sops",'
        b'"tenant":"default_tenant","database":"default_database"}',
    ],
)
def test_an_answer_that_does_not_describe_a_collection_here_teaches_nothing(body: Any) -> None:
    assert learned(Route("GET", f"{DB}/collections/docs"), body) == []


def test_an_id_is_learned_in_the_spelling_paths_are_read_in() -> None:
    body = described(identifier=DOCS_ID.upper())
    assert learned(Route("GET", f"{DB}/collections/docs"), body) == [
        (CollectionId(SCOPE, DOCS_ID), "docs")
    ]


def test_record_routes_name_their_collection_by_id_in_its_tenant_and_database() -> None:
    query = Route("POST", f"{DB}/collections/{DOCS_ID.upper()}/query")
    assert CHROMA.id_collections(query) == (CollectionId(SCOPE, DOCS_ID),)
    # The routes that take a name name no id.
    assert CHROMA.id_collections(Route("GET", f"{DB}/collections/docs")) == ()
    assert CHROMA.renamed_collections(Route("PUT", f"{DB}/collections/{DOCS_ID}")) == (
        CollectionId(SCOPE, DOCS_ID),
    )
    assert CHROMA.renamed_collections(query) == ()


# -- what a process remembers ---------------------------------------------------------


def test_names_are_bounded_least_recently_used_first() -> None:
    names = CollectionNames(maxsize=2)
    first, second, third = (CollectionId(SCOPE, str(i)) for i in range(3))
    names.learn("chroma", [(first, "a"), (second, "b")])
    assert names.name("chroma", first) == "a"  # used: second is now the oldest
    names.learn("chroma", [(third, "c")])
    assert (names.name("chroma", first), names.name("chroma", second)) == ("a", None)
    assert len(names) == 2
    # Keyed by format too.
    assert names.name("qdrant", first) is None
    with pytest.raises(ValueError):
        CollectionNames(maxsize=0)


def test_the_table_names_an_id_once_an_answer_did_and_forgets_it_on_a_rename() -> None:
    table = build_format_table({}, {}, text_field="text", id_field=None)
    query = Route("POST", f"{DB}/collections/{DOCS_ID}/query")
    assert table.id_names(query) == {DOCS_ID: None}
    table.learn_names(Route("GET", f"{DB}/collections/docs"), orjson.dumps(described()))
    assert table.id_names(query) == {DOCS_ID: "docs"}
    # The same id in another database's path is another question.
    elsewhere = Route("POST", f"/api/v2/tenants/t/databases/d/collections/{DOCS_ID}/query")
    assert table.id_names(elsewhere) == {DOCS_ID: None}
    table.forget_renamed(Route("PUT", f"{DB}/collections/{DOCS_ID}"))
    assert table.id_names(query) == {DOCS_ID: None}
    # Routes that name collections by name have no id to name.
    assert table.id_names(Route("POST", "/collections/docs/points/search")) == {}


def test_the_adapters_of_every_route_share_what_was_learned() -> None:
    # A route prefix with options of its own is served by adapters of its own.
    prefix = f"{DB}/collections/{DOCS_ID}/"
    table = build_format_table(
        {}, {}, text_field="text", id_field=None, route_options={prefix: {"releasable_fields": []}}
    )
    table.learn_names(Route("GET", f"{DB}/collections/docs"), orjson.dumps(described()))
    assert table.id_names(Route("POST", f"{prefix}query")) == {DOCS_ID: "docs"}


# -- through the servicer: read as it passes, then checked by name ----------------------

QUERY = f"{DB}/collections/{DOCS_ID}/query"
BY_NAME = f"{DB}/collections/docs"
QUERY_BODY = orjson.dumps({"query_embeddings": [[0.1, 0.2]], "n_results": 2})
ANSWER = orjson.dumps(
    {
        "ids": [["1"]],
        "documents": [[text_for("1")]],
        "metadatas": [[None]],
        "distances": [[0.1]],
        "include": ["documents", "metadatas", "distances"],
    }
)


def gate(tmp_path: Path, collections: dict[str, Any], **values: Any) -> Sidecar:
    data = tmp_path / "data.json"
    data.write_bytes(orjson.dumps({"retrieval_gate": {"collections": collections}}))
    settings = with_values(
        settings_of(identity=IdentityMode.TRUSTED_HEADERS),
        store=new_sqlite_url(tmp_path / "gate.db"),
        policy_data=data,
        **values,
    )
    built = Sidecar.from_settings(settings)
    built.store.upsert([parse_record(record_dict("1"))])
    return built


def open_by_name(
    sidecar: Sidecar, status: str = "200", end: bool = True, tenant: str = "globex"
) -> list[Any]:
    """``client.get_collection("docs")`` by ``tenant`` through the servicer, Chroma
    answering ``status``."""
    body = orjson.dumps(described()) if status == "200" else b'{"error":"NotFoundError"}'
    headers = request_headers(
        BY_NAME,
        method="GET",
        identity=False,
        x_gate_tenant=tenant,
        x_gate_principals="group:qa",
        accept_encoding="gzip",
    )
    return run_stream(sidecar, [headers, response_headers(status), response_body(body, end=end)])


def query(sidecar: Sidecar, tenant: str = "acme") -> int:
    """The status a query by id gets (200: it went to Chroma and came back filtered)."""
    headers = request_headers(
        QUERY, identity=False, x_gate_tenant=tenant, x_gate_principals="group:qa"
    )
    (admitted,) = run_stream(sidecar, [headers])
    if admitted.HasField("immediate_response"):
        return admitted.immediate_response.status.code
    answers = run_stream(
        sidecar, [headers, request_body(QUERY_BODY), response_headers(), response_body(ANSWER)]
    )
    assert not any(a.HasField("immediate_response") for a in answers)
    return 200


def test_a_collection_route_answer_is_read_as_it_passes_and_never_changed(
    tmp_path: Path,
) -> None:
    sidecar = gate(tmp_path, {})
    answers = open_by_name(sidecar)
    mode = answers[0].mode_override
    assert mode.response_header_mode == mode.SEND
    assert (mode.request_body_mode, mode.response_body_mode) == (mode.NONE, mode.BUFFERED_PARTIAL)
    removed = answers[0].request_headers.response.header_mutation.remove_headers
    assert "accept-encoding" in removed  # read as it comes: asked uncompressed
    assert not answers[1].HasField("mode_override")  # the body is wanted
    assert answers[2].response_body == type(answers[2].response_body)()  # unchanged


def test_a_query_by_id_is_checked_under_the_name_learned_for_it(tmp_path: Path) -> None:
    # docs is globex's. Before the gate has read docs by name, its id could be any
    # collection described by name: refused to acme and to globex alike (sops is
    # acme's), then checked as docs. Only its owner may read docs by name.
    sidecar = gate(tmp_path, {"docs": {"tenants": ["globex"]}, "sops": {"tenants": ["acme"]}})
    assert (query(sidecar, "acme"), query(sidecar, "globex")) == (403, 403)
    (refused,) = open_by_name(sidecar, tenant="acme")
    assert refused.immediate_response.status.code == 403
    assert query(sidecar, "globex") == 403
    open_by_name(sidecar)
    assert (query(sidecar, "acme"), query(sidecar, "globex")) == (403, 200)


@pytest.mark.parametrize(("status", "end"), [("404", True), ("200", False)])
def test_an_error_or_a_part_of_an_answer_teaches_nothing(
    tmp_path: Path, status: str, end: bool
) -> None:
    sidecar = gate(tmp_path, {"docs": {"tenants": ["globex"]}, "sops": {"tenants": ["acme"]}})
    answers = open_by_name(sidecar, status, end)
    if status != "200":
        assert answers[1].mode_override.response_body_mode == answers[1].mode_override.NONE
    assert query(sidecar, "globex") == 403


def test_without_names_described_an_unknown_id_passes(tmp_path: Path) -> None:
    # Policy data by id, as before names: nothing changes for it.
    sidecar = gate(tmp_path, {OTHER_ID: {"tenants": ["globex"]}})
    assert query(sidecar, "acme") == 200


def test_the_metrics_count_a_collection_by_its_learned_name(tmp_path: Path) -> None:
    sidecar = gate(tmp_path, {}, metric_collections=("docs",))
    labels = {"outcome": "filtered", "format": "chroma"}

    def responses(collection: str) -> float:
        sample = sidecar.metrics.registry.get_sample_value(
            "retrieval_gate_responses_total", {**labels, "collection": collection}
        )
        return sample or 0.0

    assert query(sidecar) == 200
    assert (responses("other"), responses("docs")) == (1, 0)
    open_by_name(sidecar)
    assert query(sidecar) == 200
    assert (responses("other"), responses("docs")) == (1, 1)
