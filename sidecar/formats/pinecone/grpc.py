"""Pinecone gRPC data-plane responses: ``Query`` and ``Fetch`` of ``VectorService``.

The pinecone client's gRPC transport calls ``/VectorService/<Method>`` on the
index host (Pinecone's proto has no package). Two replies carry stored
vectors with their metadata, and both are filtered:

- ``Query`` returns a ``QueryResponse``: ``matches`` (``ScoredVector``:
  ``id``, ``score``, ``values``, ``sparse_values``, ``metadata``), the
  deprecated ``results`` (one ``SingleQueryResults`` per query of a
  multi-query: ``matches``, ``namespace``), ``namespace`` and ``usage``.
- ``Fetch`` returns a ``FetchResponse``: ``vectors``, a map from vector id to
  ``Vector`` (``id``, ``values``, ``sparse_values``, ``metadata``),
  ``namespace`` and ``usage``. A rejected vector is left out of the map, which
  is how Pinecone answers for an id it does not have.

Hits are read as the REST adapter (``pinecone``) reads a query match: the
chunk id is the vector id (for ``Fetch``, its map key; a ``Vector`` whose own
``id`` is set and differs from its key is refused), or the metadata field
``id_field`` when set; the text is the metadata field ``text_field``. Metadata
is a ``google.protobuf.Struct``; its numbers are doubles, read as ints where
integral (below 2**53) as the REST API's JSON writes them, so hashed fields
hash alike over both APIs.

Replies are rebuilt from known fields only: a hit keeps ``id``, ``score``,
``values``, ``sparse_values`` and, of its metadata, the text and id fields
and the declared ``hashed_fields`` and ``releasable_fields``; the reply keeps
its hits and ``namespace`` (and each ``results`` entry its own). Read units
count every record the database read, whichever tenant's, so ``usage`` is
dropped (optional in the proto). Fields of a newer server that the gate's
proto does not declare are dropped with it. A substitute takes the hit's
text and id (a ``Fetch`` substitute moves to its own id's key; one whose key
an admitted vector already holds is not sent twice) and is marked in its
metadata. Query ``matches`` keep at most the app's ``top_k`` when the request
was over-fetched; the multi-query is never over-fetched. A reply from which
nothing was removed goes out byte for byte.

Every method of the service is classified as the REST twin classifies its
route: ``List`` (the ids of every tenant's vectors), ``DescribeIndexStats``
(counts per namespace, and with a filter a count of matches: an oracle for
other tenants' metadata), ``ListNamespaces``, ``DescribeNamespace`` and
``FetchByMetadata`` (vectors by metadata filter, not filtered here) are
content; ``Upsert``, ``Update``, ``Delete``, ``CreateNamespace`` and
``DeleteNamespace`` write. A method the gate does not know is content: it
may return stored data. Requests are rewritten by ``grpc_request``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from sidecar.core.hits import RouteKind
from sidecar.formats import grpc_adapter, grpc_messages
from sidecar.formats.body import Selection
from sidecar.formats.hits import Hits
from sidecar.formats.options import AdapterOptions
from sidecar.formats.pinecone.grpc_request import (
    FETCH,
    QUERY,
    SERVICE,
    PineconeGrpcRequests,
    python_struct,
)
from sidecar.formats.pinecone.rest import PineconeFormat

_KINDS: Final[Mapping[str, RouteKind]] = {
    QUERY: RouteKind.FILTERED,
    FETCH: RouteKind.FILTERED,
    "Upsert": RouteKind.WRITE,
    "Update": RouteKind.WRITE,
    "Delete": RouteKind.WRITE,
    "List": RouteKind.CONTENT,
    "DescribeIndexStats": RouteKind.CONTENT,
    "ListNamespaces": RouteKind.CONTENT,
    "DescribeNamespace": RouteKind.CONTENT,
    "FetchByMetadata": RouteKind.CONTENT,
    "CreateNamespace": RouteKind.WRITE,
    "DeleteNamespace": RouteKind.WRITE,
}
# The reply message of each filtered method.
_REPLIES: Final[Mapping[str, str]] = {QUERY: "QueryResponse", FETCH: "FetchResponse"}
_KEY_MISMATCH: Final = "vector id differs from its map key"

# A hit as the shared layout reads it: {"id": vector id, "metadata": dict or None}.
View = dict[str, Any]


def _view(vector_id: str, hit: Any) -> View:
    metadata = python_struct(hit.metadata) if hit.HasField("metadata") else None
    return {"id": vector_id, "metadata": metadata}


def _built(cls: Any, hit: Any, sent: View, vector_id: str) -> Any:
    """A ``cls`` (``ScoredVector`` or ``Vector``) from the known fields of ``hit``, with
    ``vector_id`` and the metadata as ``sent`` (released, perhaps substituted) has it."""
    out = cls(id=vector_id, values=hit.values)
    if cls is _message("ScoredVector"):
        out.score = hit.score
    if hit.HasField("sparse_values"):
        sparse = out.sparse_values
        sparse.SetInParent()
        sparse.indices.extend(hit.sparse_values.indices)
        sparse.values.extend(hit.sparse_values.values)
    metadata = sent.get("metadata")
    if metadata is not None:
        out.metadata.SetInParent()
        out.metadata.update(metadata)
    return out


def _message(name: str) -> Any:
    return grpc_messages.message_class(name)


class PineconeGrpcFormat(grpc_adapter.TwinGrpcAdapter, PineconeGrpcRequests):
    """Adapter for the gRPC data plane of a Pinecone index host (``VectorService``):
    filters ``Query`` and ``Fetch`` replies, rewrites ``Query`` requests."""

    name = "pinecone_grpc"
    service = SERVICE
    kinds = _KINDS
    replies = _REPLIES

    def _twin(self, options: AdapterOptions) -> PineconeFormat:
        # A match (a ScoredVector) is read as the JSON match {"id", "metadata"} it stands for.
        return PineconeFormat(options)

    def _read(self, document: tuple[bytes, Any], shape: str) -> grpc_adapter.RebuiltReply:
        body, reply = document
        hits = Hits(self._layout)
        if shape == QUERY:
            rebuild, sub_results = _query(reply, hits), 1
        else:
            rebuild, sub_results = _fetch(reply, hits), None
        unknown = grpc_messages.has_unknown_fields(reply)
        return grpc_adapter.RebuiltReply(
            hits, body, reply, unknown, rebuild, sub_results=sub_results
        )


def _views(hits: Hits, matches: Any) -> tuple[int, list[View]]:
    """Register the ``ScoredVector``s ``matches``; their first position, and their views."""
    views = [_view(hit.id, hit) for hit in matches]
    return hits.add_list(views, "matches are not a list").start, views


def _query(reply: Any, hits: Hits) -> Callable[[Selection], Any]:
    """``QueryResponse``: the deprecated ``results`` (numbered first, in field order),
    then ``matches``, trimmed to the app's ``top_k``.

    Every ``results`` entry stays, even when none of its matches do: entries
    answer the request's ``queries`` in order.
    """
    entries = [(entry, *_views(hits, entry.matches)) for entry in reply.results]
    start, views = _views(hits, reply.matches)
    scored = _message("ScoredVector")

    def sent(
        selection: Selection, matches: Any, start: int, views: list[View], limit: int | None
    ) -> list[Any]:
        kept = selection.kept(range(start, start + len(views)))[:limit]
        out = []
        for position in kept:
            view = selection.send(position, views[position - start])
            out.append(_built(scored, matches[position - start], view, view["id"]))
        return out

    def rebuild(selection: Selection) -> Any:
        out = _message("QueryResponse")(namespace=reply.namespace)
        for entry, entry_start, entry_views in entries:
            out.results.add(
                matches=sent(selection, entry.matches, entry_start, entry_views, None),
                namespace=entry.namespace,
            )
        out.matches.extend(sent(selection, reply.matches, start, views, selection.limits[0]))
        return out

    return rebuild


def _fetch(reply: Any, hits: Hits) -> Callable[[Selection], Any]:
    """``FetchResponse``: the ``vectors`` map, numbered in the order the decoded map
    yields its entries (a map has no order of its own)."""
    items = list(reply.vectors.items())
    views = []
    for key, vector in items:
        view = _view(key, vector)
        views.append(view)
        if vector.id in ("", key):
            hits.add(view)
        else:
            _, text = hits.layout.read(view)
            hits.add_found((None, _KEY_MISMATCH), text, hits.hashed(hits.layout.holder(view)))
    vector_cls = _message("Vector")

    def rebuild(selection: Selection) -> Any:
        out = _message("FetchResponse")(namespace=reply.namespace)
        kept = selection.kept(range(len(items)))
        # Admitted vectors first: a substitute never displaces one under its key.
        kept.sort(key=selection.replaced)
        for position in kept:
            key, vector = items[position]
            view = selection.send(position, views[position])
            new_key = view["id"]
            if new_key in out.vectors:
                # A substitute for a vector already sent under that key: sent once.
                # (So replacements can change what goes out; the gate reads the
                # released positions after the render, which HitBody remembers.)
                selection.released.pop()
                continue
            # A substitute's Vector carries its new id; otherwise the id as it came.
            vector_id = new_key if vector.id or new_key != key else vector.id
            out.vectors[new_key].CopyFrom(_built(vector_cls, vector, view, vector_id))
        return out

    return rebuild
