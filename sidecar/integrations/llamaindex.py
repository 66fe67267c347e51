"""LlamaIndex: a node postprocessor that keeps only the nodes the gate admits.

Needs the ``retrieval-gate[llamaindex]`` extra (``llama-index-core``)::

    engine = index.as_query_engine(
        node_postprocessors=[GatePostprocessor(gate=GateClient("unix:/run/gate.sock"),
                                               credential=user_jwt)],
    )

Each admitted node carries the id of the decision that admitted it in
``metadata["retrieval_gate_decision_id"]``; :func:`verify_nodes` checks an
answer's claims against those decisions before the answer is shown
(docs/verify-answer.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle

from sidecar.integrations.client import (
    DECISION_ID_KEY,
    ClaimToVerify,
    Credential,
    GateClient,
    GateError,
    Verification,
    verify_cited,
)


class GatePostprocessor(BaseNodePostprocessor):
    """Sends each node's id and text to ``Gate/Filter``; returns the admitted nodes, in order.

    The id is ``node.metadata[id_key]``, or the node's own id when ``id_key``
    is None; the text is the node's content without metadata, what the gate
    hashes. Any failure raises ``GateError``: never the unfiltered nodes.
    """

    gate: GateClient
    # Never in a repr, a log line or a serialised config: it is the user's token.
    credential: Credential = Field(repr=False, exclude=True)
    id_key: str | None = "chunk_id"
    collection: str = ""

    @classmethod
    def class_name(cls) -> str:
        return "GatePostprocessor"

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        if not nodes:
            return []
        candidates = [
            (self._id_of(scored), scored.node.get_content(metadata_mode=MetadataMode.NONE))
            for scored in nodes
        ]
        decisions = self.gate.filter(candidates, self.credential, collection=self.collection)
        return [
            NodeWithScore(
                node=_with_decision(scored.node, decisions.decision_id), score=scored.score
            )
            for scored, ok in zip(nodes, decisions.admitted, strict=True)
            if ok
        ]

    def _id_of(self, scored: NodeWithScore) -> str:
        """The chunk id the gate knows the node by; "" (rejected by the gate) if none."""
        node = scored.node
        value = node.node_id if self.id_key is None else node.metadata.get(self.id_key)
        if value is None:
            return ""
        if not isinstance(value, str | int):
            raise GateError(f"node id of type {type(value).__name__} is not a chunk id")
        return str(value)


def _with_decision(node: BaseNode, decision_id: str) -> BaseNode:
    """A copy of ``node`` (the index's nodes are its own) carrying ``decision_id``, kept
    out of what the model and the embedding see: the prompt is unchanged."""
    return node.model_copy(
        update={
            "metadata": {**node.metadata, DECISION_ID_KEY: decision_id},
            "excluded_llm_metadata_keys": [*node.excluded_llm_metadata_keys, DECISION_ID_KEY],
            "excluded_embed_metadata_keys": [*node.excluded_embed_metadata_keys, DECISION_ID_KEY],
        }
    )


def verify_nodes(
    gate: GateClient,
    credential: Credential,
    nodes: Sequence[NodeWithScore],
    claims: Sequence[ClaimToVerify | Mapping[str, Any]],
    *,
    id_key: str | None = "chunk_id",
) -> Verification:
    """Check ``claims`` against the decisions that admitted ``nodes`` (from a
    :class:`GatePostprocessor`); raises AnswerNotSupported unless every claim is supported.

    A claim is a ClaimToVerify or a mapping with ``chunk_ids`` and ``quotes``.
    The texts sent are the nodes' content without metadata, as the gate hashed it.
    """
    cited = []
    for scored in nodes:
        node = scored.node
        value = node.node_id if id_key is None else node.metadata.get(id_key)
        text = node.get_content(metadata_mode=MetadataMode.NONE)
        cited.append(
            (node.metadata.get(DECISION_ID_KEY), "" if value is None else str(value), text)
        )
    return verify_cited(gate, credential, cited, claims)
