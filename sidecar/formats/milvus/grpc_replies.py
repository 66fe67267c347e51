"""Milvus search and query replies: checked, their rows numbered, rebuilt with the rows kept.

``Search`` and ``HybridSearch`` answer ``SearchResults``, ``Query``
``QueryResults`` (``grpc`` says what the gate releases of them); both
hold rows column by column, and a success or error ``status``.

- ``SearchResults.results`` (``schema.SearchResultData``): the hits of every
  query vector one after the other, ``topks`` saying how many belong to each;
  per hit ``ids`` (int64 or string primary keys), ``scores``, ``distances``,
  ``element_indices``; the rows' fields (``grpc_fields``); group-by
  values (``group_by_field_value``, ``group_by_field_values``), per-field
  ``highlight_results``, an iterator's ``search_iterator_v2_results``.
- ``QueryResults``: the rows' fields (the primary key always among them),
  ``element_indices`` per row.

What goes out of them is ``grpc``'s to say (its module docstring).
Here each reply is checked (every per-row list holds one value per row, or
none; an error status comes with no rows), its rows are registered as
candidates, and it is rebuilt from its known fields with the rows that go
out, every list keeping them in the same places so that the lists stay
aligned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sidecar.core.hits import Replacement
from sidecar.formats import grpc_adapter, grpc_messages
from sidecar.formats.base import MalformedBody
from sidecar.formats.body import Selection
from sidecar.formats.hits import Hits, usable_id
from sidecar.formats.milvus.grpc_columns import Column
from sidecar.formats.milvus.grpc_fields import ResultFields
from sidecar.formats.milvus.grpc_request import IteratorEcho
from sidecar.formats.milvus.rest import ERROR_MESSAGE
from sidecar.formats.options import AdapterOptions

SEARCH_RESULTS: Final = "milvus.proto.milvus.SearchResults"
QUERY_RESULTS: Final = "milvus.proto.milvus.QueryResults"


def _message(name: str) -> Any:
    return grpc_messages.message_class(name)


def _failed(status: Any) -> bool:
    return bool(status.code != 0 or status.error_code != 0)


def _ok_status(status: Any) -> Any:
    """A success status without its extra info (cost and scanned bytes of the
    unfiltered search) or text."""
    return _message("milvus.proto.common.Status")(error_code=status.error_code, code=status.code)


def _error_status(status: Any) -> Any:
    """An error status with Milvus' codes and the gate's text."""
    return _message("milvus.proto.common.Status")(
        error_code=status.error_code,
        code=status.code,
        retriable=status.retriable,
        reason=ERROR_MESSAGE,
    )


def _counted(values: Sequence[Any], rows: int, what: str) -> None:
    if len(values) not in (0, rows):
        raise MalformedBody(f"{what} does not hold one value per row")


def _columns_of(rows: int, columns: Sequence[Column]) -> None:
    for column in columns:
        if column.rows != rows:
            raise MalformedBody("a result column does not hold one value per row")


@dataclass(eq=False)
class ColumnarReply(grpc_adapter.RebuiltReply):
    """A parsed ``SearchResults`` or ``QueryResults``, rebuilt column by column
    (by what ``read_search`` or ``read_query`` returns)."""

    def _substituted(self, hit: Any, replacement: Replacement) -> Any:
        # ``send`` only says which substitute takes a row; the columns take it in.
        return replacement


def _kept(
    selection: Selection, groups: Sequence[int]
) -> tuple[list[int], list[int], dict[int, Replacement]]:
    """The rows that go out, how many per group (query vector), and the substitutes
    by index into those rows."""
    limit = selection.limits[0]
    rows: list[int] = []
    counts: list[int] = []
    replaced: dict[int, Replacement] = {}
    start = 0
    for size in groups:
        kept = selection.kept(range(start, start + size))[:limit]
        for row in kept:
            replacement = selection.send(row, None)
            if replacement is not None:
                replaced[len(rows)] = replacement
            rows.append(row)
        counts.append(len(kept))
        start += size
    return rows, counts, replaced


def _error(reply: Any, reply_name: str) -> Callable[[Selection], Any]:
    def rebuild(selection: Selection) -> Any:
        return _message(reply_name)(status=_error_status(reply.status))

    return rebuild


def read_search(
    reply: Any, hits: Hits, options: AdapterOptions, iteration: IteratorEcho | None = None
) -> Callable[[Selection], Any]:
    """``SearchResults``: check the rows, register them in ``hits``, return the rebuild.

    ``iteration`` is what a search iterator's request said of its iteration
    (None: not known), from which the page's iterator fields are rebuilt.
    """
    results = reply.results
    id_kind = results.ids.WhichOneof("id_field")
    ids = list(getattr(results.ids, id_kind).data) if id_kind else []
    rows = len(ids)
    topks = tuple(results.topks)
    if _failed(reply.status):
        if rows or any(topks):
            raise MalformedBody("an error status in a reply with rows")
        return _error(reply, SEARCH_RESULTS)
    if len(results.agg_buckets) or len(results.agg_topks):
        # Buckets summarise every hit: what is left could not be told apart.
        raise MalformedBody("search aggregation results are not supported")
    if any(topk < 0 for topk in topks) or sum(topks) != rows:
        raise MalformedBody("'topks' does not add up to the rows in 'ids'")
    if len(results.scores) != rows:
        raise MalformedBody("'scores' does not hold one value per row")
    _counted(results.distances, rows, "'distances'")
    _counted(results.element_indices.data, rows, "'element_indices'")
    fields = ResultFields(results.fields_data, options, results.primary_field_name)
    # Group-by values and highlights go out for the fields released whole.
    group: Column | None = None
    if (
        results.HasField("group_by_field_value")
        and results.group_by_field_value.field_name in fields.whole
    ):
        group = Column(results.group_by_field_value)
    groups = [
        Column(data) for data in results.group_by_field_values if data.field_name in fields.whole
    ]
    highlights = [h for h in results.highlight_results if h.field_name in fields.whole]
    for highlight in highlights:
        if len(highlight.datas) != rows:
            raise MalformedBody("a highlight does not hold one value per row")
    _columns_of(rows, [*fields.columns(), *groups, *([group] if group else [])])
    for row, key in enumerate(ids):
        found = usable_id(key, "primary key") if options.id_field is None else None
        fields.read(hits, row, found)
    names = fields.names()
    empty_highlight = _message("milvus.proto.common.HighlightData")

    def rebuild(selection: Selection) -> Any:
        kept, counts, replaced = _kept(selection, topks or (rows,))
        limit = selection.limits[0]
        out = _message("milvus.proto.schema.SearchResultData")(
            num_queries=results.num_queries,
            top_k=results.top_k if limit is None else min(results.top_k, limit),
            topks=counts if topks else [],
            output_fields=[name for name in results.output_fields if name in names],
            primary_field_name=results.primary_field_name,
        )
        out.fields_data.extend(fields.cut(kept, replaced))
        out.scores.extend(results.scores[row] for row in kept)
        if len(results.distances):
            out.distances.extend(results.distances[row] for row in kept)
        if id_kind is not None:
            target = getattr(out.ids, id_kind)
            target.SetInParent()
            target.data.extend(ids[row] for row in kept)
            if options.id_field is None:
                for index, replacement in replaced.items():
                    target.data[index] = _key(id_kind, replacement.chunk_id)
        if len(results.element_indices.data):
            out.element_indices.data.extend(results.element_indices.data[row] for row in kept)
        if group is not None:
            out.group_by_field_value.CopyFrom(group.cut(kept))
        out.group_by_field_values.extend(column.cut(kept) for column in groups)
        for highlight in highlights:
            sent = out.highlight_results.add(field_name=highlight.field_name)
            for index, row in enumerate(kept):
                sent.datas.append(empty_highlight() if index in replaced else highlight.datas[row])
        if results.HasField("search_iterator_v2_results"):
            _continue_iteration(out, results, kept, iteration)
        sent_reply = _message(SEARCH_RESULTS)(
            status=_ok_status(reply.status),
            collection_name=reply.collection_name,
            session_ts=reply.session_ts,
        )
        if reply.HasField("results"):
            sent_reply.results.CopyFrom(out)
        return sent_reply

    return rebuild


def _continue_iteration(
    out: Any, results: Any, kept: Sequence[int], iteration: IteratorEcho | None
) -> None:
    """A search iterator's page fields, from the rows that go out and the request.

    As Milvus computes them from the rows it returns (its ``getLastBound``;
    iterators search one vector): the bound is the last row's score; with no
    row, the bound the request started from (none on a first page). Never the
    score of a row the caller does not get.
    """
    upstream = results.search_iterator_v2_results
    sent = out.search_iterator_v2_results
    sent.SetInParent()
    token = None if iteration is None else iteration.token
    sent.token = upstream.token if token is None else token
    if kept:
        sent.last_bound = results.scores[kept[-1]]
    elif iteration is not None and iteration.last_bound is not None:
        sent.last_bound = iteration.last_bound


def _key(kind: str, chunk_id: str) -> Any:
    """A substitute's primary key, as the reply's keys are (int64 or string)."""
    if kind == "str_id":
        return chunk_id
    if chunk_id.isascii() and chunk_id.lstrip("-").isdigit():
        value = int(chunk_id)
        if -(2**63) <= value < 2**63:
            return value
    raise MalformedBody("a replacement id is not an integer, as the primary keys are")


def read_query(reply: Any, hits: Hits, options: AdapterOptions) -> Callable[[Selection], Any]:
    """``QueryResults``: check the rows, register them in ``hits``, return the rebuild."""
    fields = ResultFields(reply.fields_data, options, reply.primary_field_name)
    used = fields.columns()
    if used:
        rows = used[0].rows
    elif len(reply.fields_data):
        rows = Column(reply.fields_data[0]).rows
    else:
        rows = 0
    if _failed(reply.status):
        if rows:
            raise MalformedBody("an error status in a reply with rows")
        return _error(reply, QUERY_RESULTS)
    _columns_of(rows, used)
    _counted(reply.element_indices, rows, "'element_indices'")
    for row in range(rows):
        fields.read(hits, row, None)
    names = fields.names()

    def rebuild(selection: Selection) -> Any:
        kept, _, replaced = _kept(selection, (rows,))
        out = _message(QUERY_RESULTS)(
            status=_ok_status(reply.status),
            collection_name=reply.collection_name,
            output_fields=[name for name in reply.output_fields if name in names],
            session_ts=reply.session_ts,
            primary_field_name=reply.primary_field_name,
        )
        out.fields_data.extend(fields.cut(kept, replaced))
        if len(reply.element_indices):
            out.element_indices.extend(reply.element_indices[row] for row in kept)
        return out

    return rebuild
