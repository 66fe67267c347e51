"""GatePostprocessor (retrieval-gate[llamaindex]) with real llama-index-core and a real gate.

Nodes are real ``TextNode`` objects with scores; the gate is `retrieval-gate
serve` (tests/fixtures/harness.py), called over gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

from sidecar.integrations.client import DECISION_ID_KEY, AnswerNotSupported, GateClient, GateError
from sidecar.integrations.llamaindex import GatePostprocessor, verify_nodes
from tests.fixtures.gate_service import (
    ADMITTED_IDS,
    COLLECTION,
    INDEX,
    gate_client,
    jwt,
    start_gate,
)
from tests.fixtures.harness import GateStack


def nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=text, metadata={"chunk_id": cid}), score=1.0 - n / 10)
        for n, (cid, text) in enumerate(INDEX)
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    yield from start_gate(Path(tmp_path_factory.mktemp("llamaindex")))


@pytest.fixture(scope="module")
def gate(stack: GateStack) -> Iterator[GateClient]:
    client = gate_client(stack)
    yield client
    client.close()


def test_only_admitted_nodes_in_order(gate: GateClient) -> None:
    processor = GatePostprocessor(gate=gate, credential=jwt(), collection=COLLECTION)
    kept = processor.postprocess_nodes(nodes(), query_str="pump reset")
    assert [n.node.metadata["chunk_id"] for n in kept] == ADMITTED_IDS
    assert [n.score for n in kept] == [1.0, 0.7]


def test_async_postprocess(gate: GateClient) -> None:
    processor = GatePostprocessor(gate=gate, credential=jwt())
    kept = asyncio.run(processor.apostprocess_nodes(nodes(), query_str="q"))
    assert [n.node.metadata["chunk_id"] for n in kept] == ADMITTED_IDS


def test_node_ids_can_be_the_chunk_ids(gate: GateClient) -> None:
    own = [NodeWithScore(node=TextNode(id_=cid, text=text)) for cid, text in INDEX]
    processor = GatePostprocessor(gate=gate, credential=jwt(), id_key=None)
    assert [n.node.node_id for n in processor.postprocess_nodes(own)] == ADMITTED_IDS


def test_metadata_is_not_part_of_the_hashed_text(gate: GateClient) -> None:
    """The text sent is the node's content without its metadata: what was ingested."""
    node = TextNode(text=INDEX[0][1], metadata={"chunk_id": "ok-1", "title": "Pumps"})
    processor = GatePostprocessor(gate=gate, credential=jwt())
    assert len(processor.postprocess_nodes([NodeWithScore(node=node)])) == 1


def test_decisions_are_audited(stack: GateStack, gate: GateClient) -> None:
    before = len(stack.audit_records())
    GatePostprocessor(gate=gate, credential=jwt()).postprocess_nodes(nodes())
    records = stack.audit_records()
    assert len(records) == before + 1
    assert records[-1]["format"] == "gate"
    assert records[-1]["released"] == ADMITTED_IDS
    assert {e["chunk_id"] for e in records[-1]["rejected"]} == {
        "other-tenant",
        "tampered",
        "draft",
    }


@pytest.mark.parametrize("credential", ["", "not-a-jwt", "expired"])
def test_a_bad_or_missing_credential_raises(gate: GateClient, credential: str) -> None:
    token = jwt(exp=1) if credential == "expired" else credential
    with pytest.raises(GateError):
        GatePostprocessor(gate=gate, credential=token).postprocess_nodes(nodes())


def test_an_unreachable_gate_raises(stack: GateStack) -> None:
    down = GateClient(f"unix:{stack.workdir / 'no-such.sock'}", timeout_seconds=2)
    with pytest.raises(GateError):
        GatePostprocessor(gate=down, credential=jwt()).postprocess_nodes(nodes())
    down.close()


# -- verifying the answer made from the admitted nodes -------------------------------------


def test_admitted_nodes_carry_their_decision_out_of_the_prompt(gate: GateClient) -> None:
    given = nodes()
    kept = GatePostprocessor(gate=gate, credential=jwt()).postprocess_nodes(given, query_str="q")
    for scored in kept:
        decision_id = scored.node.metadata[DECISION_ID_KEY]
        assert decision_id
        # Neither the model nor the embedding sees it; the index's node is untouched.
        assert decision_id not in scored.node.get_content(metadata_mode=MetadataMode.LLM)
        assert decision_id not in scored.node.get_content(metadata_mode=MetadataMode.EMBED)
    assert all(DECISION_ID_KEY not in n.node.metadata for n in given)


def test_an_answer_is_verified_against_the_nodes_decisions(gate: GateClient) -> None:
    kept = GatePostprocessor(gate=gate, credential=jwt()).postprocess_nodes(nodes(), query_str="q")
    supported = [{"chunk_ids": ["ok-1"], "quotes": ["handle with care."]}]
    assert verify_nodes(gate, jwt(), kept, supported).supported
    with pytest.raises(AnswerNotSupported):
        verify_nodes(gate, jwt(), kept, [{"chunk_ids": ["ok-1"], "quotes": ["not in it"]}])
    with pytest.raises(GateError, match="not admitted"):
        verify_nodes(gate, jwt(), nodes()[:1], supported)
