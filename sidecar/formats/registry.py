"""The configured formats: which adapters exist, with what options, and who owns a route.

Built-in adapters are detected by route, in a fixed order; configured generic
adapters come first (their routes are the user's own, so the most specific).
A route prefix may name the one format that owns it, for APIs mounted where
detection would guess wrong.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sidecar.core.hits import Route, RouteKind, path_under
from sidecar.formats.base import CollectionId, ResponseAdapter, ResponseFormat
from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.collection_names import CollectionNames
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.generic.rest import GenericFormat
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.milvus.rest import MilvusFormat
from sidecar.formats.options import OPTION_NAMES, split_table
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from sidecar.formats.pinecone.rest import PineconeFormat
from sidecar.formats.qdrant.grpc import QdrantGrpcFormat
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat
from sidecar.formats.weaviate.rest import WeaviateFormat

# Detection order. The path spaces do not overlap on the databases' standard
# routes; Elasticsearch's ``/{index}/_...`` routes are the loosest, so last.
# The gRPC adapters' routes are their services' method paths
# (``/qdrant.Points/Query``), which no REST route looks like.
BUILT_IN: Final[Mapping[str, type[ResponseAdapter[Any]]]] = {
    "qdrant": QdrantFormat,
    "qdrant_grpc": QdrantGrpcFormat,
    "chroma": ChromaFormat,
    "weaviate": WeaviateFormat,
    "weaviate_grpc": WeaviateGrpcFormat,
    "milvus": MilvusFormat,
    "milvus_grpc": MilvusGrpcFormat,
    "pinecone": PineconeFormat,
    "pinecone_grpc": PineconeGrpcFormat,
    "elasticsearch": ElasticsearchFormat,
}
GENERIC = "generic"


_COLLECTION = re.compile(r"/collections/([^/?]+)")


def path_collections(route: Route) -> list[str]:
    """The collection a vector-DB path names (``/collections/{name}/...``), if any."""
    match = _COLLECTION.search(route.path)
    return [match.group(1)] if match else []


# For routes that several formats claim: the strictest answer wins.
_STRICTNESS = {RouteKind.READ: 0, RouteKind.WRITE: 1, RouteKind.CONTENT: 2}
# Routes whose classification and collections a FormatTable remembers.
_ROUTES_KEPT = 4096


def classify(
    route: Route, formats: Sequence[ResponseFormat]
) -> tuple[ResponseFormat, RouteKind] | None:
    """The format that owns ``route`` and what the route does; None if no format knows it.

    Every format is asked, because the databases' path spaces overlap at the
    edges (an Elasticsearch index named ``collections`` looks like Qdrant's
    collection routes). A route that exactly one format filters is that
    format's. Otherwise the strictest answer wins (content over write over
    read), and a route that two formats would filter is content: the gate
    cannot tell which body it will get.
    """
    claims = [(fmt, kind) for fmt in formats if (kind := fmt.route_kind(route)) is not None]
    if not claims:
        return None
    filtering = [claim for claim in claims if claim[1] is RouteKind.FILTERED]
    if len(filtering) == 1:
        return filtering[0]
    if filtering:
        return filtering[0][0], RouteKind.CONTENT
    return max(claims, key=lambda claim: _STRICTNESS[claim[1]])


class FormatTable:
    """The formats in detection order, and the route prefixes pinned to one of them.

    Routes can have formats of their own: the same adapters, built with other
    options (the fields a route releases). The table also keeps the names its
    formats' answers gave collection ids (``names``), for every adapter of a
    format alike.
    """

    def __init__(
        self,
        formats: Sequence[ResponseFormat],
        pinned: Mapping[str, str] | None = None,
        per_route: Mapping[str, Sequence[ResponseFormat]] | None = None,
    ) -> None:
        """``pinned`` maps a path prefix to a format name; ``per_route`` a path prefix to
        the formats that serve it instead of ``formats`` (longest prefix wins)."""
        self.formats = tuple(formats)
        self._by_name = {fmt.name: fmt for fmt in self.formats}
        self._pinned = dict(pinned or {})
        self._per_route = {prefix: tuple(found) for prefix, found in (per_route or {}).items()}
        for prefix, name in self._pinned.items():
            if name not in self._by_name:
                raise ValueError(f"route {prefix!r}: no enabled format is named {name!r}")
        # What each route is and names, remembered: every request asks three or
        # four times, and each answer asks every format. Bounded, as paths are
        # the client's choice.
        self._classified: dict[Route, tuple[ResponseFormat, RouteKind] | None] = {}
        self._named: dict[Route, tuple[str, ...]] = {}
        self._by_id: dict[Route, tuple[str, tuple[CollectionId, ...]]] = {}
        self.names = CollectionNames()

    def classify(self, route: Route) -> tuple[ResponseFormat, RouteKind] | None:
        """The format that knows ``route``, and what the route does; None if none knows it.

        Under a pinned prefix only the pinned format is asked, and a route it
        does not know is content: the prefix says what is behind it, so an
        unrecognised route there is not just any unknown route.
        """
        try:
            return self._classified[route]
        except KeyError:
            pass
        found = self._classify(route)
        if len(self._classified) >= _ROUTES_KEPT:
            self._classified.clear()
        self._classified[route] = found
        return found

    def _classify(self, route: Route) -> tuple[ResponseFormat, RouteKind] | None:
        formats = self.formats
        own = _longest(self._per_route, route.path)
        if own is not None:
            formats = self._per_route[own]
        prefix = _longest(self._pinned, route.path)
        if prefix is None:
            return classify(route, formats)
        name = self._pinned[prefix]
        pinned = next(fmt for fmt in formats if fmt.name == name)
        return classify(route, [pinned]) or (pinned, RouteKind.CONTENT)

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does, by the format that knows it; None if none does."""
        found = self.classify(route)
        return None if found is None else found[1]

    def collections(self, route: Route) -> tuple[str, ...]:
        """The collections (names or patterns) ``route``'s path names, for the request policy.

        The format that knows the route says, where it can (an Elasticsearch
        index expression); otherwise the ``/collections/{name}`` segment.
        """
        named = self._named.get(route)
        if named is None:
            found = self.classify(route)
            names = None if found is None else found[0].route_collections(route)
            named = tuple(path_collections(route) if names is None else names)
            if len(self._named) >= _ROUTES_KEPT:
                self._named.clear()
            self._named[route] = named
        return named

    def id_names(self, route: Route) -> dict[str, str | None]:
        """The ids among ``collections(route)`` that name a collection by id, each with
        the name learned for it (None: not known to this process)."""
        by_id = self._by_id.get(route)
        if by_id is None:
            found = self.classify(route)
            by_id = ("", ()) if found is None else (found[0].name, found[0].id_collections(route))
            if len(self._by_id) >= _ROUTES_KEPT:
                self._by_id.clear()
            self._by_id[route] = by_id
        format_name, collections = by_id
        return {c.id: self.names.name(format_name, c) for c in collections}

    def names_collections(self, route: Route) -> bool:
        """True when a successful answer on ``route`` says which names collection ids
        stand for (``learn_names`` reads it)."""
        found = self.classify(route)
        return found is not None and found[0].names_collections(route)

    def learn_names(self, route: Route, body: bytes) -> None:
        """Remember the names a successful answer on ``route`` gives collection ids."""
        found = self.classify(route)
        if found is not None:
            self.names.learn(found[0].name, found[0].collection_names(route, body))

    def forget_renamed(self, route: Route) -> None:
        """Forget the names of the collections a request on ``route`` may rename."""
        found = self.classify(route)
        if found is not None:
            self.names.forget(found[0].name, found[0].renamed_collections(route))

    def response_format(self, route: Route) -> ResponseFormat | None:
        """The format whose responses on ``route`` must be filtered, or None to pass them."""
        found = self.classify(route)
        if found is None or found[1] is not RouteKind.FILTERED:
            return None
        return found[0]


def _longest(prefixes: Mapping[str, object], path: str) -> str | None:
    """The longest of ``prefixes`` that ``path`` is under, by whole segments."""
    return max((p for p in prefixes if path_under(path, p)), key=len, default=None)


def build_format_table(
    options: Mapping[str, Mapping[str, Any]],
    pinned: Mapping[str, str],
    *,
    text_field: str,
    id_field: str | None,
    route_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> FormatTable:
    """Build the adapters from the ``formats`` settings table.

    ``options`` maps a format name to its options: a built-in name configures
    (or, with ``enabled = false``, removes) that adapter; any other name is a
    generic adapter and needs ``adapter = "generic"``. ``text_field`` and
    ``id_field`` are the defaults for the adapters that take them. An adapter
    takes only the options it uses: any other is refused. Raises ValueError
    naming the format and the option that is wrong.

    ``route_options`` maps a path prefix to options that every adapter serving
    it takes in place of its own (``hashed_fields``, ``releasable_fields``).
    """
    formats = _build(options, text_field, id_field)
    per_route = {
        prefix: _build(
            # Switched-off adapters stay off: only the enabled ones take the overrides.
            {**options, **{f.name: {**options.get(f.name, {}), **overrides} for f in formats}},
            text_field,
            id_field,
        )
        for prefix, overrides in (route_options or {}).items()
    }
    return FormatTable(formats, pinned, per_route)


def _build(
    options: Mapping[str, Mapping[str, Any]], text_field: str, id_field: str | None
) -> list[ResponseFormat]:
    defaults = {"text_field": text_field, "id_field": id_field}
    generic: list[ResponseFormat] = []
    built_in: dict[str, ResponseFormat] = {}
    for name, factory in BUILT_IN.items():
        table = dict(options.get(name, {}))
        if not _enabled(name, table):
            continue
        built_in[name] = _make(name, factory, table, defaults)
    for name, custom in options.items():
        if name in BUILT_IN:
            continue
        table = dict(custom)
        adapter = table.pop("adapter", None)
        if adapter != GENERIC:
            raise ValueError(
                f"formats.{name}: not a built-in format ({', '.join(BUILT_IN)}); "
                f'a custom format needs adapter = "{GENERIC}"'
            )
        if not _enabled(name, table):
            continue
        generic.append(_make(name, GenericFormat, {"name": name, **table}, defaults))
    return [*generic, *built_in.values()]


def _enabled(name: str, table: dict[str, Any]) -> bool:
    enabled = table.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"formats.{name}: option 'enabled' must be true or false")
    return enabled


def _make(
    name: str,
    factory: type[ResponseAdapter[Any]],
    table: Mapping[str, Any],
    defaults: Mapping[str, Any],
) -> ResponseFormat:
    """The adapter, given the defaults of the options it takes and its own table."""
    # Its own options are its keywords; ``options`` is no option's name.
    own = set(inspect.signature(factory).parameters) - {"options"}
    unknown = sorted(set(table) - (OPTION_NAMES - factory.options_not_taken) - own)
    if unknown:
        raise ValueError(f"formats.{name}: unknown option {unknown[0]!r}")
    try:
        options, rest = split_table(table, factory.options_not_taken, defaults)
        build: Callable[..., ResponseFormat] = factory  # an adapter class, not the abstract base
        return build(options, **rest)
    except TypeError as exc:
        # A required option is missing: Python's message names it.
        raise ValueError(f"formats.{name}: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"formats.{name}: {exc}") from None
