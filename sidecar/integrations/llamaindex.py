"""LlamaIndex: a node postprocessor that keeps only the nodes the gate admits.

Needs the ``retrieval-gate[llamaindex]`` extra (``llama-index-core``)::

    engine = index.as_query_engine(
        node_postprocessors=[GatePostprocessor(gate=GateClient("127.0.0.1:50051"),
                                               credential=user_jwt)],
    )
"""

from __future__ import annotations

from llama_index.core.bridge.pydantic import Field
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from sidecar.integrations.client import Credential, GateClient, GateError


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
        return [scored for scored, ok in zip(nodes, decisions.admitted, strict=True) if ok]

    def _id_of(self, scored: NodeWithScore) -> str:
        """The chunk id the gate knows the node by; "" (rejected by the gate) if none."""
        node = scored.node
        value = node.node_id if self.id_key is None else node.metadata.get(self.id_key)
        if value is None:
            return ""
        if not isinstance(value, str | int):
            raise GateError(f"node id of type {type(value).__name__} is not a chunk id")
        return str(value)
