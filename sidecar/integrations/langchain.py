"""LangChain: a retriever that lets only the gate's admitted documents through.

Needs the ``retrieval-gate[langchain]`` extra (``langchain-core``)::

    gated = GatedRetriever(
        retriever=vector_store.as_retriever(),
        gate=GateClient("127.0.0.1:50051"),
        credential=user_jwt,             # or a function returning the current user's
    )
    docs = gated.invoke("how do I reset the pump?")

Each admitted document carries the decision's id in
``metadata["retrieval_gate_decision_id"]``; :func:`answer_verification` is a
chain step that checks an answer's claims against those decisions before the
answer is shown (docs/verify-answer.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from pydantic import Field

from sidecar.integrations.client import (
    DECISION_ID_KEY,
    ClaimToVerify,
    Credential,
    GateClient,
    GateError,
    Verification,
    verify_cited,
)


class GatedRetriever(BaseRetriever):
    """Wraps any retriever: its documents go to ``Gate/Filter``, only admitted ones come back.

    Each document is sent with its id (``metadata[id_key]``, or ``Document.id``
    when ``id_key`` is None) and its ``page_content``, exactly the text that
    will reach the prompt. Order is kept. Any failure raises ``GateError``:
    never the unfiltered documents.
    """

    retriever: BaseRetriever
    gate: GateClient
    # Never in a repr, a log line or a serialised config: it is the user's token.
    credential: Credential = Field(repr=False, exclude=True)
    id_key: str | None = "chunk_id"
    collection: str = ""

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        documents = self.retriever.invoke(query, config={"callbacks": run_manager.get_child()})
        return self._admitted(documents)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        documents = await self.retriever.ainvoke(
            query, config={"callbacks": run_manager.get_child()}
        )
        # The client is synchronous: its call waits in a thread, not on the loop.
        return await asyncio.to_thread(self._admitted, documents)

    def _admitted(self, documents: Sequence[Document]) -> list[Document]:
        """The documents the gate admits for the credential's user, in order."""
        if not documents:
            return []
        candidates = [(self._id_of(doc), doc.page_content) for doc in documents]
        decisions = self.gate.filter(candidates, self.credential, collection=self.collection)
        return [
            # A copy: the wrapped retriever's documents are its own.
            doc.model_copy(
                update={"metadata": {**doc.metadata, DECISION_ID_KEY: decisions.decision_id}}
            )
            for doc, ok in zip(documents, decisions.admitted, strict=True)
            if ok
        ]

    def _id_of(self, document: Document) -> str:
        """The chunk id the gate knows ``document`` by; "" (rejected by the gate) if none."""
        value = document.id if self.id_key is None else document.metadata.get(self.id_key)
        if value is None:
            return ""
        if not isinstance(value, str | int):
            raise GateError(f"document id of type {type(value).__name__} is not a chunk id")
        return str(value)


def verify_documents(
    gate: GateClient,
    credential: Credential,
    documents: Sequence[Document],
    claims: Sequence[ClaimToVerify | Mapping[str, Any]],
    *,
    id_key: str | None = "chunk_id",
) -> Verification:
    """Check ``claims`` against the decisions that admitted ``documents`` (from a
    :class:`GatedRetriever`); raises AnswerNotSupported unless every claim is supported.

    A claim is a :class:`ClaimToVerify` or a mapping with ``chunk_ids`` and
    ``quotes``. The texts sent are the documents' ``page_content``, as the
    model saw them.
    """
    cited = [
        (
            document.metadata.get(DECISION_ID_KEY),
            _chunk_id(document.id if id_key is None else document.metadata.get(id_key)),
            document.page_content,
        )
        for document in documents
    ]
    return verify_cited(gate, credential, cited, claims)


def answer_verification(
    gate: GateClient, credential: Credential, *, id_key: str | None = "chunk_id"
) -> RunnableLambda[dict[str, Any], dict[str, Any]]:
    """A chain step: ``{"documents": [...], "claims": [...], ...}`` in, the same with
    ``"verification"`` added out; raises AnswerNotSupported (see :func:`verify_documents`)."""

    def verify(state: dict[str, Any]) -> dict[str, Any]:
        verification = verify_documents(
            gate, credential, state["documents"], state["claims"], id_key=id_key
        )
        return {**state, "verification": verification}

    return RunnableLambda(verify)


def _chunk_id(value: object) -> str:
    return "" if value is None else str(value)
