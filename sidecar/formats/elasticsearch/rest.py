"""Elasticsearch and OpenSearch search responses: search, scroll, templates, kNN, multi-search.

Both databases answer every search endpoint with the same body (``took``,
``timed_out``, ``_shards``, ``hits: {total, max_score, hits: [...]}``, ...);
multi-search wraps one such body, or an error item, per request in
``responses``. Each hit is a candidate: its id is ``_id`` (or the ``_source``
field ``id_field``), its text the ``_source`` field ``text_field`` (top level
of ``_source``; a hit without ``_source`` is a malformed chunk).

Bodies are rebuilt from the keys known to be safe; everything else, known
or not, is removed (OpenSearch's ``ext`` holds search pipeline output such as
a RAG answer generated from every hit; ``profile`` holds rewritten queries
with terms read from stored documents; ``phase_took`` and
``terminated_early`` say how the search over every document went). Counts,
flags and cursors describe only what is released:

- ``hits.total`` is the number of hits released, ``relation: "eq"`` (the
  integer form stays an integer; absent stays absent); ``total = "remove"``
  removes it. ``hits.max_score`` (and a top-level ``max_score``) is the best
  released ``_score``.
- ``_shards`` keeps ``total``, ``successful`` and ``failed``; ``skipped`` is
  0 (the can-match phase skips a shard when no document of it, any tenant's,
  can match: an oracle; skipped shards count as successful anyway) and
  ``failures`` go (a reason can quote a document, e.g. a script error); the
  body reports them, and multi-search error items, as its
  ``reported_error``, for the audit record.
  ``_clusters`` keeps its counts, not its ``details``.
- ``took``, ``timed_out``, ``num_reduce_phases`` and a multi-search item's
  ``status`` stay, as does ``pit_id``: the next page is a search of its own,
  confined to the caller's tenant and filtered like this one. ``_scroll_id``
  goes: a scroll continues the search that opened it, confined to whoever
  opened it, for whoever holds the id (the request side refuses scrolls).
- A multi-search body keeps ``took`` and ``responses``; an error item
  becomes ``{"error": {"type": "retrieval_gate_upstream_error", "reason":
  ...}, "status": N}`` with the upstream's status and none of its text.
- ``aggregations`` and ``suggest`` are computed over every matching
  document (``top_hits`` and completion suggestions even carry their
  ``_source``): removed unless the operator keeps them.

A hit keeps Elasticsearch's own keys (``_index``, ``_id``, ``_score``,
``_routing``, ``_version``, ``_seq_no``, ``_primary_term``, ``sort``,
``matched_queries``, ``_nested``, ``_shard``, ``_node``, ``_ignored``,
``_rank``, ``_type``) and of its ``_source`` the text, the id, and the
``hashed_fields`` and ``releasable_fields``. Its ``highlight`` keeps only
entries of released ``_source`` fields, and of each only the fragments that,
without Elasticsearch's highlight tags (``<em>``, ``</em>`` and the styled
schema's ``<em class="hltN">``), are part of that field's released value: a
fragment quoting another document, or a field that does not go out, goes,
and so does one written with other tags or HTML-encoded. Its ``fields`` only
entries of released ``_source`` paths (and their sub-fields) that are not
shaped like a lookup runtime field (which copies another index's fields);
``_explanation`` goes (its statistics count every tenant's documents), and
``inner_hits`` (other documents: parent/child, collapse) unless kept.

A substitute takes the hit's text and id, the marker goes into its
``_source``, and it loses its highlights and the ``fields`` entries of the
text and id field (they quote the replaced document).

These rules hold for every render, even one that keeps every hit (to
substitute a chunk). Search requests are rewritten by
``rest_request``.

The adapter claims only paths with an API segment (``_name``) first or after
an index expression, plus ``/``. Index-level paths (``PUT /{index}``, ``GET
/{index}``) are left unclaimed: the request policy reads unknown GETs as
reads and other unknown methods as writes, which is what they are. Legacy
typed paths (``/{index}/{type}/{id}``, Elasticsearch 7 and REST
compatibility mode) are not recognised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

import orjson

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats.base import MalformedBody, ReportedError, ResponseAdapter, error_code
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.elasticsearch import rest_routes as routes
from sidecar.formats.elasticsearch.rest_request import ElasticsearchRequests
from sidecar.formats.hits import Field, HitLayout, Hits
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions

TotalMode = Literal["recompute", "remove"]
KeepMode = Literal["remove", "keep"]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


# Keys of a search response kept as they are, if their value has the type it must.
_SCALARS: Final[dict[str, Callable[[Any], bool]]] = {
    "took": _is_int,
    "timed_out": _is_bool,
    "num_reduce_phases": _is_int,
    "status": _is_int,  # on multi-search items
    "pit_id": _is_str,
}
_SHARD_COUNTS: Final = ("total", "successful", "skipped", "failed")
_CLUSTER_COUNTS: Final = ("total", "successful", "skipped", "running", "partial", "failed")

# The keys of a hit that are Elasticsearch's (and OpenSearch's) own and safe:
# ``_source`` is projected by the layout, ``highlight``, ``fields`` and
# ``inner_hits`` by the adapter.
_HIT_KEYS: Final = frozenset(
    {
        "_index", "_id", "_score", "_source", "_routing", "_version", "_seq_no",
        "_primary_term", "sort", "matched_queries", "_nested", "_shard", "_node", "_ignored",
        "_rank", "_type", "highlight", "fields", "inner_hits",
    }
)  # fmt: skip

UPSTREAM_ERROR: Final = "retrieval_gate_upstream_error"
_ERROR_REASON: Final = "the search failed in the database; its error is not released"


def _check_score(value: Any, label: str) -> None:
    if value is not None and not _is_number(value):
        raise MalformedBody(f"{label} is not a number")


def _check_total(total: Any) -> None:
    """``hits.total``: absent, an integer (rest_total_hits_as_int) or ``{value, relation}``."""
    if total is None or _is_int(total):
        return
    if (
        isinstance(total, dict)
        and _is_int(total.get("value"))
        and total.get("relation") in ("eq", "gte")
    ):
        return
    raise MalformedBody("hits.total is neither a count nor {value, relation}")


def _lookup_shaped(values: Any) -> bool:
    """True for a ``fields`` entry shaped like a lookup runtime field: ``[{"f": [..]}]``."""
    return isinstance(values, list) and any(
        isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values())
        for value in values
    )


@dataclass(frozen=True, slots=True)
class _Response:
    """One search response: the whole body, or one item of a multi-search."""

    document: dict[str, Any]
    hits: dict[str, Any]  # the ``hits`` object, its list already checked
    start: int  # position of the first hit


def _response(document: Any, hits: Hits) -> _Response:
    """Check a search response and number its hits."""
    if not isinstance(document, dict):
        raise MalformedBody("a search response is not a JSON object")
    found = document.get("hits")
    if not isinstance(found, dict) or not isinstance(found.get("hits"), list):
        # filter_path can drop hits.hits; a body without them cannot be checked.
        raise MalformedBody("a search response has no hits.hits list")
    _check_total(found.get("total"))
    _check_score(found.get("max_score"), "hits.max_score")
    _check_score(document.get("max_score"), "max_score")
    start = len(hits.candidates)
    for hit in found["hits"]:
        if isinstance(hit, dict):
            _check_score(hit.get("_score"), "a hit's _score")
            if "fields" in hit and not isinstance(hit["fields"], dict):
                raise MalformedBody("a hit's fields is not an object")
        hits.add(hit)
    return _Response(document, found, start)


def _item(item: Any, hits: Hits) -> _Response | None:
    """A multi-search item: a search response, or None for an error item."""
    if isinstance(item, dict) and "hits" not in item and "error" in item:
        return None
    return _response(item, hits)


@dataclass(frozen=True, slots=True)
class _Options:
    text_field: str
    id_field: str | None
    total: TotalMode
    aggregations: KeepMode
    suggest: KeepMode
    inner_hits: KeepMode
    # Dotted ``_source`` paths whose ``fields`` entries go out.
    released_paths: tuple[str, ...]


def _max_score(upstream: Any, hits: Sequence[dict[str, Any]]) -> Any:
    """The best released ``_score``; null when the upstream had none or no hit has one."""
    if upstream is None:
        return None
    scores = [hit["_score"] for hit in hits if _is_number(hit.get("_score"))]
    return max(scores, default=None)


def _total(upstream: Any, released: int) -> Any:
    """``hits.total`` counting the released hits: every match the caller may know of."""
    if _is_int(upstream):
        return released
    return {"value": released, "relation": "eq"}


def _shards(upstream: dict[str, Any]) -> dict[str, int]:
    """Shard counts without failures; ``skipped`` is 0 (skipped shards count as
    successful already)."""
    out = {key: upstream[key] for key in _SHARD_COUNTS if _is_int(upstream.get(key))}
    if "skipped" in out:
        out["skipped"] = 0
    return out


def _clusters(upstream: dict[str, Any]) -> dict[str, int]:
    """Cross-cluster counts without their per-cluster details."""
    return {key: upstream[key] for key in _CLUSTER_COUNTS if _is_int(upstream.get(key))}


def _reported(responses: list[Any]) -> ReportedError | None:
    """What the search responses report failed: multi-search error items and shard
    failures, as the database wrote them; None when nothing did. The code is the
    first one's error type (its status where it has none)."""
    errors: list[Any] = []
    for response in responses:
        if not isinstance(response, dict):
            continue
        if "hits" not in response and "error" in response:
            errors.append(response)
        shards = response.get("_shards")
        failures = shards.get("failures") if isinstance(shards, dict) else None
        if isinstance(failures, list):
            errors.extend(failures)
    if not errors:
        return None
    first = errors[0]
    # An error item has "error" and "status"; a shard failure its "reason".
    detail = first.get("error", first.get("reason")) if isinstance(first, dict) else None
    kind = detail.get("type") if isinstance(detail, dict) else None
    if kind is None and isinstance(first, dict):
        kind = first.get("status")
    return ReportedError(error_code("elasticsearch", kind), orjson.dumps(errors).decode())


def _error_item(item: Any) -> dict[str, Any]:
    """A multi-search error item as the gate writes it: the upstream's status only."""
    status = item.get("status") if isinstance(item, dict) else None
    return {
        "error": {"type": UPSTREAM_ERROR, "reason": _ERROR_REASON},
        "status": status if _is_int(status) else 500,
    }


@dataclass(eq=False)
class _ElasticsearchBody(HitBody):
    """Side structures are rebuilt as the module docstring describes."""

    document: dict[str, Any]
    # A plain search: its response. A multi-search: one entry per item, None
    # for error items.
    single: _Response | None
    items: tuple[_Response | None, ...]
    options: _Options

    def _rebuild(self, selection: Selection) -> dict[str, Any]:
        if self.single is not None:
            return self._response(self.single, selection, selection.limits[0])
        responses = [
            _error_item(original)
            if item is None
            else self._response(item, selection, selection.limits[index])
            for index, (item, original) in enumerate(
                zip(self.items, self.document["responses"], strict=True)
            )
        ]
        # A multi-search body has nothing else to say about its searches.
        return {
            key: responses if key == "responses" else value
            for key, value in self.document.items()
            if key == "responses" or (key == "took" and _is_int(value))
        }

    def _response(
        self, response: _Response, selection: Selection, limit: int | None
    ) -> dict[str, Any]:
        items: list[Any] = response.hits["hits"]
        hits = [self._hit(hit) for hit in selection.sent(items, response.start, limit)]
        options = self.options
        hits_object: dict[str, Any] = {}
        for key, value in response.hits.items():
            if key == "hits":
                hits_object[key] = hits
            elif key == "total" and options.total == "recompute":
                hits_object[key] = _total(value, len(hits))
            elif key == "max_score":
                hits_object[key] = _max_score(value, hits)
        out: dict[str, Any] = {}
        for key, value in response.document.items():
            if key == "hits":
                out[key] = hits_object
            elif key == "max_score":
                out[key] = _max_score(value, hits)
            elif key == "_shards" and isinstance(value, dict):
                out[key] = _shards(value)
            elif key == "_clusters" and isinstance(value, dict):
                out[key] = _clusters(value)
            elif key in _SCALARS:
                if _SCALARS[key](value):
                    out[key] = value
            elif (key == "aggregations" and options.aggregations == "keep") or (
                key == "suggest" and options.suggest == "keep"
            ):
                out[key] = value
        return out

    def _hit(self, hit: dict[str, Any]) -> dict[str, Any]:
        """A released hit with only the text's highlights, the released paths' fields
        and, unless kept, no inner hits."""
        options = self.options
        drop_inner = options.inner_hits == "remove" and "inner_hits" in hit
        if "highlight" not in hit and "fields" not in hit and not drop_inner:
            return hit
        out = dict(hit)
        if drop_inner:
            del out["inner_hits"]
        highlight = _released_highlight(
            out.pop("highlight", None), out.get("_source"), options.released_paths
        )
        if highlight:
            out["highlight"] = highlight
        fields = out.pop("fields", None)
        if isinstance(fields, dict):
            released = {
                name: values
                for name, values in fields.items()
                if _under(name, options.released_paths) and not _lookup_shaped(values)
            }
            if released:
                out["fields"] = released
        return out

    def _substituted(self, hit: Any, replacement: Replacement) -> dict[str, Any]:
        out = self._layout.substituted(hit, replacement)
        # Highlights quote the replaced text, and fields are the replaced
        # document's values (its text, or fields checked against its record);
        # the substitute's own would need a new search.
        out.pop("highlight", None)
        out.pop("fields", None)
        return out


# The tags Elasticsearch and OpenSearch put around highlighted terms by default
# and with ``tags_schema: styled``.
_HIGHLIGHT_TAG: Final = re.compile(r'<em>|</em>|<em class="hlt(?:10|[1-9])">')


def _released_highlight(highlight: Any, source: Any, paths: Sequence[str]) -> dict[str, list[str]]:
    """Of a hit's ``highlight``, the fragments of released fields that quote their
    released value (in the released ``_source``), by field."""
    if not isinstance(highlight, dict) or not isinstance(source, dict):
        return {}
    out: dict[str, list[str]] = {}
    for name, fragments in highlight.items():
        if name not in paths or not isinstance(fragments, list):
            continue
        values = _texts(_source_value(source, name))
        kept = [
            fragment
            for fragment in fragments
            if isinstance(fragment, str)
            and any(_HIGHLIGHT_TAG.sub("", fragment) in value for value in values)
        ]
        if kept:
            out[name] = kept
    return out


def _source_value(source: dict[str, Any], name: str) -> Any:
    """The value of the field ``name`` (dotted: into objects) in ``source``; None if absent."""
    if name in source:
        return source[name]
    value: Any = source
    for key in name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _texts(value: Any) -> list[str]:
    """The strings a field's value holds: itself, or those of its array."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    return []


def _under(name: str, paths: Sequence[str]) -> bool:
    """True when the field ``name`` is one of ``paths`` or below one (a sub-field)."""
    return any(name == path or name.startswith(f"{path}.") for path in paths)


class ElasticsearchFormat(ResponseAdapter[str], ElasticsearchRequests):
    """Adapter for Elasticsearch's and OpenSearch's REST APIs: filters responses,
    rewrites search requests (``rest_request``).

    ``total``: "recompute" (default: the number of hits released) or
    "remove" ``hits.total``. ``aggregations``, ``suggest``, ``inner_hits``:
    "remove" (default) or "keep". Keeping them is unsafe: they are computed
    from, or are, documents the gate never checked.
    """

    name = "elasticsearch"

    def __init__(
        self,
        options: AdapterOptions = DEFAULT_OPTIONS,
        *,
        total: TotalMode = "recompute",
        aggregations: KeepMode = "remove",
        suggest: KeepMode = "remove",
        inner_hits: KeepMode = "remove",
    ) -> None:
        """The text, the id (None: the hit's ``_id``) and the released fields are
        ``_source`` fields; every other ``_source`` field is dropped."""
        text_field, id_field = options.text_field, options.id_field
        for option, value, allowed in (
            ("total", total, get_args(TotalMode)),
            ("aggregations", aggregations, get_args(KeepMode)),
            ("suggest", suggest, get_args(KeepMode)),
            ("inner_hits", inner_hits, get_args(KeepMode)),
        ):
            if value not in allowed:
                raise ValueError(f"{option} must be one of {', '.join(map(repr, allowed))}")
        fields = options.fields
        chunk = (text_field, *([id_field] if id_field else []))
        declared = (".".join(path) for path in (*fields.hashed, *fields.releasable))
        self._options = _Options(
            text_field,
            id_field,
            total,
            aggregations,
            suggest,
            inner_hits,
            (*chunk, *declared),
        )
        text = options.text_at("_source field", "_source")
        chunk_id = options.id_at(Field(("_id",), "_id"), "_source field", "_source")
        self._layout = HitLayout(
            "hit", chunk_id, text, ("_source",), hit_keys=_HIT_KEYS, fields=fields
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """FILTERED for the search endpoints; the kind of any other API path.

        Searches: ``_search``, ``_search/scroll``, ``_search/template``,
        ``_msearch``, ``_msearch/template``, ``_knn_search``, search
        applications and Fleet searches. Document reads (``_doc``,
        ``_source``, ``_mget``, ...), query languages (SQL, ES|QL, EQL, PPL),
        async searches and snapshots are CONTENT; counts, PIT, cat and
        cluster reads are READ; anything that changes data is WRITE. Unknown
        API paths count as content when read and as writes otherwise. Paths
        without an API segment are not claimed, except ``/``.
        """
        return routes.route_kind(route)

    def route_collections(self, route: Route) -> list[str] | None:
        """The indices ``route``'s path names (``rest_routes.index_expression``):
        names and patterns, ``*`` for every index; None when it names none."""
        return routes.index_expression(route)

    def _shape(self, route: Route) -> str | None:
        return routes.shape(route)

    def _read(self, document: dict[str, Any], shape: str) -> _ElasticsearchBody:
        hits = Hits(self._layout)
        if shape == routes.SINGLE:
            single = _response(document, hits)
            return _ElasticsearchBody(
                hits,
                document,
                single,
                (),
                self._options,
                sub_results=1,
                reported_error=_reported([document]),
            )
        responses = document.get("responses")
        if not isinstance(responses, list):
            raise MalformedBody("a multi-search body has no responses list")
        items = tuple(_item(item, hits) for item in responses)
        return _ElasticsearchBody(
            hits,
            document,
            None,
            items,
            self._options,
            sub_results=len(items),
            reported_error=_reported(responses),
        )
