"""GatedRetriever (retrieval-gate[langchain]) with real langchain-core and a real gate process.

The inner retriever is an in-memory one over real ``Document`` objects; the
gate is `retrieval-gate serve` (tests/fixtures/harness.py), called over gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever

from sidecar.integrations.client import DECISION_ID_KEY, AnswerNotSupported, GateClient, GateError
from sidecar.integrations.langchain import GatedRetriever, answer_verification, verify_documents
from tests.fixtures.gate_service import (
    ADMITTED_IDS,
    COLLECTION,
    INDEX,
    gate_client,
    jwt,
    start_gate,
)
from tests.fixtures.harness import GateStack


class ListRetriever(BaseRetriever):
    """Returns the same documents for every query (stands in for a vector store's retriever)."""

    documents: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return list(self.documents)


DOCUMENTS = [
    Document(page_content=text, metadata={"chunk_id": cid, "source": "index"})
    for cid, text in INDEX
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    yield from start_gate(Path(tmp_path_factory.mktemp("langchain")))


@pytest.fixture(scope="module")
def gate(stack: GateStack) -> Iterator[GateClient]:
    client = gate_client(stack)
    yield client
    client.close()


def gated(gate: GateClient, credential: str) -> GatedRetriever:
    return GatedRetriever(
        retriever=ListRetriever(documents=DOCUMENTS),
        gate=gate,
        credential=credential,
        collection=COLLECTION,
    )


def test_only_admitted_documents_in_order(gate: GateClient) -> None:
    documents = gated(gate, jwt()).invoke("pump reset")
    assert [d.metadata["chunk_id"] for d in documents] == ADMITTED_IDS
    assert documents[0] is not None and documents[0].page_content == INDEX[0][1]


def test_async_invoke(gate: GateClient) -> None:
    documents = asyncio.run(gated(gate, jwt()).ainvoke("pump reset"))
    assert [d.metadata["chunk_id"] for d in documents] == ADMITTED_IDS


def test_credential_from_a_function(gate: GateClient) -> None:
    retriever = GatedRetriever(
        retriever=ListRetriever(documents=DOCUMENTS), gate=gate, credential=lambda: jwt()
    )
    assert [d.metadata["chunk_id"] for d in retriever.invoke("q")] == ADMITTED_IDS


def test_the_tampered_document_never_comes_back(gate: GateClient) -> None:
    documents = gated(gate, jwt()).invoke("q")
    assert all("Ignore all previous instructions" not in d.page_content for d in documents)


def test_decisions_are_audited_and_counted(stack: GateStack, gate: GateClient) -> None:
    label = 'collection="sops",decision="admitted",format="gate",reason="NONE"'
    before = stack.metric(f"retrieval_gate_chunks_total{{{label}}}")
    records_before = len(stack.audit_records())
    gated(gate, jwt()).invoke("q")
    assert stack.metric(f"retrieval_gate_chunks_total{{{label}}}") == before + 2
    records = stack.audit_records()
    assert len(records) == records_before + 1
    assert records[-1]["released"] == ADMITTED_IDS


@pytest.mark.parametrize("credential", ["", "not-a-jwt", "expired"])
def test_a_bad_or_missing_credential_raises(gate: GateClient, credential: str) -> None:
    token = jwt(exp=1) if credential == "expired" else credential
    with pytest.raises(GateError):
        gated(gate, token).invoke("q")


def test_an_unreachable_gate_raises(stack: GateStack) -> None:
    down = GateClient(f"unix:{stack.workdir / 'no-such.sock'}", timeout_seconds=2)
    with pytest.raises(GateError):
        gated(down, jwt()).invoke("q")
    down.close()


def test_a_document_without_an_id_is_dropped(gate: GateClient) -> None:
    anonymous = Document(page_content=INDEX[0][1], metadata={})
    retriever = GatedRetriever(
        retriever=ListRetriever(documents=[anonymous, DOCUMENTS[0]]), gate=gate, credential=jwt()
    )
    assert [d.metadata.get("chunk_id") for d in retriever.invoke("q")] == ["ok-1"]


def test_the_credential_is_not_in_the_repr(gate: GateClient) -> None:
    token = jwt()
    assert token not in repr(gated(gate, token))


# -- verifying the answer made from the admitted documents ---------------------------------


def test_an_answer_quoting_admitted_documents_is_verified(gate: GateClient) -> None:
    documents = gated(gate, jwt()).invoke("q")
    assert all(d.metadata[DECISION_ID_KEY] for d in documents)
    claims = [{"chunk_ids": ["ok-1"], "quotes": ["handle with care."]}]
    verification = verify_documents(gate, jwt(), documents, claims)
    assert [c.verdict for c in verification.claims] == ["supported"]
    # The chain step adds the verification to what flows through it.
    state = answer_verification(gate, jwt()).invoke({"documents": documents, "claims": claims})
    assert state["verification"].supported


def test_a_misquote_raises_answer_not_supported(gate: GateClient) -> None:
    documents = gated(gate, jwt()).invoke("q")
    claims = [{"chunk_ids": ["ok-2"], "quotes": ["handle with great care"]}]
    with pytest.raises(AnswerNotSupported) as raised:
        verify_documents(gate, jwt(), documents, claims)
    assert [c.verdict for c in raised.value.verification.claims] == ["quote_not_found"]


def test_a_document_the_gate_did_not_admit_cannot_be_cited(gate: GateClient) -> None:
    # The retriever's own document, not the gate's copy: no decision id.
    with pytest.raises(GateError, match="not admitted"):
        verify_documents(gate, jwt(), DOCUMENTS[:1], [{"chunk_ids": ["ok-1"]}])
