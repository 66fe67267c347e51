"""Chroma collections by name, through a real Envoy in front of a real Chroma server.

Chroma's record routes name a collection by its UUID; policy data and the
metrics' allowlist here name ``docs-acme`` and ``docs-globex`` by name only.
The application is the unchanged ``chromadb.HttpClient`` pointed at Envoy: it
opens a collection by name (``get_collection``), which the gate reads as it
passes to learn the id, then queries it by id. The owner gets its records;
another tenant is refused before Chroma is asked, whether it names the
collection (by name) or only its id, and so is anyone querying an id the gate
has not yet seen named: it could be any described collection. The list of
collections, larger than Envoy's buffer limit here, still reaches the client
whole (the gate reads only what fits). Metrics count the query under the
collection's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import chromadb
import orjson
import pytest
from chromadb.api import ClientAPI
from chromadb.api.types import PyEmbeddings
from chromadb.config import Settings

# The module-scoped fixture `chroma_server`, used by name.
from tests.fixtures.chroma_server import ChromaServer, chroma_server_fixture  # noqa: F401
from tests.fixtures.harness import GateStack
from tests.fixtures.records import record_dict, text_for

pytestmark = [pytest.mark.envoy, pytest.mark.chroma]

OWNERS = {"docs-acme": "acme", "docs-globex": "globex"}
POLICY_DATA = {
    "retrieval_gate": {
        "collections": {name: {"tenants": [tenant]} for name, tenant in OWNERS.items()}
    }
}
EMBEDDING: PyEmbeddings = [[0.1, 0.2]]
# Enough other collections that the list of them is larger than Envoy's buffer
# limit (MAX_BODY_BYTES); Chroma describes each in about 1.6 KB.
FILLER = 60
MAX_BODY_BYTES = 64 * 1024
FORBIDDEN = {"error": "forbidden", "reasons": ["COLLECTION_FORBIDDEN"]}


def _client(port: int, tenant: str | None = None) -> ClientAPI:
    headers = None if tenant is None else {"x-gate-tenant": tenant, "x-gate-principals": "group:qa"}
    return chromadb.HttpClient(
        host="127.0.0.1", port=port, headers=headers, settings=Settings(anonymized_telemetry=False)
    )


@pytest.fixture(scope="module")
def ids(chroma_server: ChromaServer) -> dict[str, str]:
    """The two described collections, each with one record of its tenant: name -> id."""
    client = _client(chroma_server.port)
    found = {}
    for name, tenant in OWNERS.items():
        collection = client.create_collection(name, embedding_function=None)
        collection.add(
            ids=[f"{tenant}-1"],
            embeddings=EMBEDDING,
            documents=[text_for(f"{tenant}-1")],
            metadatas=[{"tenant": tenant}],
        )
        found[name] = str(collection.id)
    for n in range(FILLER):
        client.create_collection(f"filler-{n:03d}", embedding_function=None)
    return found


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, chroma_server: ChromaServer, ids: dict[str, str]
) -> Iterator[GateStack]:
    records = [record_dict(f"{tenant}-1", tenant_id=tenant) for tenant in OWNERS.values()]
    gate = GateStack(
        tmp_path_factory.mktemp("chroma-names"),
        records,
        upstream_url=chroma_server.url,
        policy_data=POLICY_DATA,
        max_body_bytes=MAX_BODY_BYTES,
        config={"metric_collections": ["docs-acme"]},
    ).start()
    yield gate
    gate.stop()


def query_path(collection_id: str) -> str:
    return (
        "/api/v2/tenants/default_tenant/databases/default_database/collections/"
        f"{collection_id}/query"
    )


QUERY = orjson.dumps({"query_embeddings": EMBEDDING, "n_results": 1, "include": ["documents"]})


def responses_counted(stack: GateStack, collection: str) -> float:
    labels = f'collection="{collection}",format="chroma",outcome="filtered"'
    return stack.metric(f"retrieval_gate_responses_total{{{labels}}}")


def test_an_id_the_gate_has_not_seen_named_is_refused_to_everyone(
    stack: GateStack, ids: dict[str, str]
) -> None:
    # Known only by its UUID, docs-globex could be docs-acme as far as the gate
    # knows, and docs-acme is not globex's: refused before Chroma is asked.
    for tenant in OWNERS.values():
        refused = stack.search(query_path(ids["docs-globex"]), tenant=tenant, body=QUERY)
        assert refused.status == 403, refused.body
        assert refused.json() == FORBIDDEN


def test_opened_by_name_a_collection_is_its_owners_by_id_too(
    stack: GateStack, ids: dict[str, str]
) -> None:
    before = responses_counted(stack, "docs-acme")
    acme = _client(stack.listen_port, "acme")
    collection = acme.get_collection("docs-acme", embedding_function=None)
    assert str(collection.id) == ids["docs-acme"]
    result = collection.query(query_embeddings=EMBEDDING, n_results=1, include=["documents"])
    assert result["ids"] == [["acme-1"]]
    # Counted under its name, which only the gate's reading of Chroma's answer gave it.
    assert responses_counted(stack, "docs-acme") == before + 1

    # Another tenant cannot open it by name, nor query it by the id it learned elsewhere.
    globex = _client(stack.listen_port, "globex")
    # chromadb raises the gate's refusal as an Exception holding the body.
    with pytest.raises(Exception, match="COLLECTION_FORBIDDEN"):
        globex.get_collection("docs-acme", embedding_function=None)
    refused = stack.search(query_path(ids["docs-acme"]), tenant="globex", body=QUERY)
    assert refused.status == 403, refused.body
    assert refused.json() == FORBIDDEN


def test_each_tenant_reads_its_own_collection_and_not_the_others(
    stack: GateStack, ids: dict[str, str]
) -> None:
    for name, tenant in OWNERS.items():
        _client(stack.listen_port, tenant).get_collection(name, embedding_function=None)
    for name, owner in OWNERS.items():
        for tenant in OWNERS.values():
            answer = stack.search(query_path(ids[name]), tenant=tenant, body=QUERY)
            if tenant == owner:
                assert answer.status == 200, answer.body
                assert answer.json()["ids"] == [[f"{owner}-1"]]
            else:
                assert answer.status == 403, answer.body


def test_a_list_larger_than_the_buffer_limit_reaches_the_client_whole(stack: GateStack) -> None:
    listed: Any = _client(stack.listen_port, "acme").list_collections()
    assert {c.name for c in listed} >= {"docs-acme", "docs-globex"}
    assert len(listed) == len(OWNERS) + FILLER
