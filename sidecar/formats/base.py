"""What every format adapter provides, and the skeleton every adapter is built on.

An adapter turns a vector database's response body into candidates (one per
returned hit, in body order) and renders the body again keeping only the
admitted positions. An adapter may also rewrite search requests on their way
to the database and read the collections they name (``RequestCapabilities``,
whose defaults read no request). Adapters know nothing about policy or Envoy.

``ResponseAdapter.parse`` is a template method, the same for every database:
find the shape of the route's responses (ValueError for a route the adapter
does not filter), load the JSON, read it, and turn any failure into
MalformedBody, even one that is a bug in the adapter: a body the gate cannot
read never passes. An adapter supplies what is its database's own:

- ``name`` and ``route_kind``: which routes are its and what they do;
- ``_shape(route)``: how the responses of a filtered route are laid out;
- ``_read(document, shape)``: where the hits sit in that shape (numbered with
  a ``hits.Hits`` collector, which reads a hit where its ``hits.HitLayout``
  says) and how the body is rebuilt (a ``body.HitBody``, which owns limits,
  released positions and substitute-and-mark);
- ``_load(body, shape)`` only when the top level is not a JSON object.

Request rewriters have their skeleton in ``rewriter``.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeAlias, TypeVar

import orjson

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind

# Marks a substituted hit (in its free-form metadata object: payload, _source,
# metadata ...) with the chunk it replaced, so readers of the response can tell
# authoritative substitutes from index hits.
SUBSTITUTED_FOR = "retrieval_gate_substituted_for"


class MalformedBody(Exception):
    """The upstream body is not the shape this format expects; never pass it on."""


class Unreleasable(Exception):
    """The body cannot be released once hits are removed from it.

    For example text that the database generated from every hit (Weaviate's
    generative search) when the format is configured to block rather than
    strip it. ``code`` is a short machine-readable reason for the client.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AbsentAnswer(Exception):
    """What the database itself answers when the only hit a route asks for does not exist.

    Raised by ``ParsedBody.render`` when that hit was rejected: a rejected
    point fetched by id must look exactly like a missing one (status and body),
    or the answer tells the caller that it exists.
    """

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"answered as absent ({status})")
        self.status = status
        self.body = body


class MalformedRequest(Exception):
    """A search request body the gate cannot read; answer 400, never forward it."""


@dataclass(frozen=True, slots=True)
class ReportedError:
    """An error the database reported inside a successful answer (HTTP 2xx, gRPC OK).

    ``code`` is the database's own code for it, as ``source:value``
    (``milvus:1100``, ``weaviate:graphql``, ``elasticsearch:parsing_exception``):
    a number or a short token the database chose, never its text (see
    :func:`error_code`), so that it may go to logs. ``text`` is its message as
    the database wrote it: it can quote the request (a filter expression, the
    tenant's value) or a document, so it goes to the audit record only, bounded
    there, and never to the client.
    """

    code: str
    text: str


# What an error code may be made of: a token a database chose, not a text.
_CODE_TOKEN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def error_code(source: str, value: object) -> str:
    """``source:value`` for an integer or a short token; ``source:other`` for
    anything else, which might be text (a message, a value of the request)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{source}:{value}"
    if isinstance(value, str) and _CODE_TOKEN.fullmatch(value):
        return f"{source}:{value}"
    return f"{source}:other"


# The client's error code for an UnfilterableRequest.
NOT_FILTERABLE = "request_not_filterable"


class UnfilterableRequest(MalformedRequest):
    """A search request the gate can read but cannot restrict to the caller's tenant.

    For example a query language construct the push-down does not know how
    to wrap safely. Answered 400 ``request_not_filterable``; never forwarded.
    The message names what was refused, never a value of the request.
    """

    code = NOT_FILTERABLE


# What ``ParsedBody.render`` takes: at most so many kept hits per sub-result
# (None: all of them), and the chunks that take kept hits' places.
RenderLimits: TypeAlias = Sequence[int | None] | None
Replacements: TypeAlias = Mapping[int, Replacement] | None


class ParsedBody(Protocol):
    @property
    def candidates(self) -> Sequence[Candidate]: ...

    @property
    def reported_error(self) -> ReportedError | None:
        """The error the body reports beside (or instead of) its hits; None when none."""
        ...

    def render(
        self, keep: Collection[int], limits: RenderLimits = None, replacements: Replacements = None
    ) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``.

        ``limits`` (a ``RequestRewrite.limits``) gives one entry per sub-result
        of the body (one for a plain search, one per request of a batch): each
        sub-result keeps at most that many of its kept hits (groups, for the
        groups endpoints), in rank order; None keeps them all. None or empty
        trims nothing. Raises MalformedBody if the body has a different number
        of sub-results.

        ``replacements`` maps kept positions to the chunk whose id and text
        take that hit's place; the rest of the hit (score, vector, other
        fields) stays.

        Raises Unreleasable when what remains of the body cannot be sent.
        """
        ...

    def released_positions(self, keep: Collection[int], limits: RenderLimits = None) -> list[int]:
        """The positions ``render(keep, limits)`` sends, in body order."""
        ...


class ResponseFormat(Protocol):
    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        ...

    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in this database's API; None when it is not one of its routes.

        FILTERED only for routes whose successful responses ``parse`` reads.
        """
        ...

    def parse(self, body: bytes, route: Route, echo: object = None) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        ``echo`` is the ``RequestRewrite.echo`` of the request this body answers
        (None when the request was not read): what the answer repeats of the
        request is rebuilt from it, not copied from the database.
        """
        ...

    def missing_field(self, error_text: str) -> str | None:
        """The field a collection lacks, when ``error_text`` (an error the database
        answered) says a query named a field the collection's schema does not
        have; None when it says nothing of the kind."""
        ...

    def rewrites_request(self, route: Route) -> bool:
        """True when requests on ``route`` carry a query the gate may rewrite, or name
        collections in their body: only then is the request body worth reading."""
        ...

    def rewrite_request(
        self,
        body: bytes,
        route: Route,
        *,
        tenant: str,
        tenant_key: str | None,
        overfetch_factor: float,
        overfetch_cap: int,
    ) -> RequestRewrite:
        """Restrict a search request to ``tenant`` and raise its limits.

        ``tenant_key`` is the payload field holding the tenant (None: no
        push-down). Limits are multiplied by ``overfetch_factor``, rounded up
        and capped at ``overfetch_cap`` (a factor of 1 or less: no over-fetch).
        Bodies of routes it does not rewrite come back unchanged. Raises
        MalformedRequest if a rewritable request body cannot be read.
        """
        ...

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The collections a request body on ``route`` names beyond its path, read
        without rewriting anything: ``rewrite_request(body, route, ...).collections``.

        Raises MalformedRequest when a body it reads cannot be read.
        """
        ...

    def query_string_problem(self, route: Route, query_string: str) -> str | None:
        """Why the URL parameters defeat the tenant push-down (naming the parameter,
        never its value); None when they do not."""
        ...

    def overfetch_problem(self, route: Route, query_string: str) -> str | None:
        """Why the URL parameters make over-fetch wrong for this request; None when they do not."""
        ...

    def route_collections(self, route: Route) -> list[str] | None:
        """The collections (names, or patterns with ``*``) ``route``'s path names;
        None to fall back on ``/collections/{name}``."""
        ...

    def id_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """The collections of ``route_collections`` that the path names by an id which
        is not their name (Chroma's record routes): the names the gate has learned
        for them are checked too."""
        ...

    def names_collections(self, route: Route) -> bool:
        """True when a successful answer on ``route`` says which name a collection id
        stands for (a collection's own description)."""
        ...

    def collection_names(self, route: Route, body: bytes) -> list[tuple[CollectionId, str]]:
        """The id and name of every collection a successful answer on ``route``
        describes; [] for an answer it cannot read (it never raises)."""
        ...

    def renamed_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """The collections a request on ``route`` may rename: their learned names no
        longer hold."""
        ...


@dataclass(frozen=True, slots=True)
class CollectionId:
    """A collection as a path names it by id: the id, within the namespace the database
    looks it up in (``scope``: Chroma's tenant and database)."""

    scope: tuple[str, ...]
    id: str


@dataclass(frozen=True, slots=True)
class RequestRewrite:
    """A search request as the gate forwards it, and what was changed.

    ``limits`` has one entry per sub-request, in the order their sub-results
    come back, when any of them was over-fetched: the number of results the
    app asked for where the gate raised it, None where it did not. It is empty
    when nothing was over-fetched. Pass it to ``ParsedBody.render`` as it is.
    ``tenant_filter`` and ``overfetched`` say what was applied, for the audit
    record. ``collections`` are the collections the body names beyond the
    path (a lookup collection, a GraphQL class, a batch line's index), for
    the request policy's ownership check. ``echo`` is what the request asked
    that its answer repeats (Chroma's ``include``, the bound a Milvus
    iterator's page starts from), in the form the format that wrote it reads
    back: pass it to ``ResponseFormat.parse`` with the answer, so that those
    values come from the request, never from the database. None: nothing.
    """

    body: bytes
    limits: tuple[int | None, ...]
    tenant_filter: bool
    overfetched: bool
    collections: tuple[str, ...] = ()
    echo: object = None


class RequestCapabilities:
    """The request side of a ``ResponseFormat`` as a format that reads no request answers it.

    Every adapter and every request module derives from it, so each format
    declares what it does with requests by overriding these, and the request
    path asks any format the same questions without probing its type.
    """

    def rewrites_request(self, route: Route) -> bool:
        """False: no request body is read."""
        return False

    def rewrite_request(
        self,
        body: bytes,
        route: Route,
        *,
        tenant: str,
        tenant_key: str | None,
        overfetch_factor: float,
        overfetch_cap: int,
    ) -> RequestRewrite:
        """``body`` unchanged: nothing applied, no collection named."""
        return unchanged_request(body)

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """None named: the body is not read."""
        return ()

    def query_string_problem(self, route: Route, query_string: str) -> str | None:
        """None: the database reads no search parameter from the URL."""
        return None

    def overfetch_problem(self, route: Route, query_string: str) -> str | None:
        """None: the database reads no search parameter from the URL."""
        return None

    def route_collections(self, route: Route) -> list[str] | None:
        """None: the path names its collection as ``/collections/{name}``, if at all."""
        return None

    def id_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """None: paths name collections by name."""
        return ()

    def names_collections(self, route: Route) -> bool:
        """False: no answer is read for collection names."""
        return False

    def collection_names(self, route: Route, body: bytes) -> list[tuple[CollectionId, str]]:
        """None: no answer is read for collection names."""
        return []

    def renamed_collections(self, route: Route) -> tuple[CollectionId, ...]:
        """None: no name is learned, so none is forgotten."""
        return ()


def unchanged_request(
    body: bytes, collections: tuple[str, ...] = (), echo: object = None
) -> RequestRewrite:
    """``body`` forwarded as it came, naming ``collections``, its answer echoing ``echo``."""
    return RequestRewrite(
        body, (), tenant_filter=False, overfetched=False, collections=collections, echo=echo
    )


ShapeT = TypeVar("ShapeT")


class ResponseAdapter(RequestCapabilities, ABC, Generic[ShapeT]):
    """A ResponseFormat: ``parse`` is shared, the database's shapes are the subclass's."""

    name: str  # short and stable: the ``format`` metric label
    # The ``AdapterOptions`` (``formats.options``) the adapter does not read, so
    # that the settings refuse them as unknown options.
    options_not_taken: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def route_kind(self, route: Route) -> RouteKind | None:
        """What ``route`` does in this database's API; None when it is not one of its routes."""

    def parse(self, body: bytes, route: Route, echo: object = None) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one.

        ``echo``: see ``ResponseFormat.parse``. Raises ValueError if ``route`` is
        not one this format filters.
        """
        shape = self._shape(route)
        if shape is None:
            raise ValueError(f"route is not handled by the {self.name} format")
        try:
            return self._read_echoed(self._load(body, shape), shape, echo)
        except MalformedBody:
            raise
        except orjson.JSONDecodeError:
            message = "body is not valid UTF-8 JSON"
        except Exception:
            message = f"body could not be read as a {self.name} response"
        # Raised outside the handler so that nothing is chained: a decode error's
        # .doc attribute holds the whole body.
        raise MalformedBody(message)

    def missing_field(self, error_text: str) -> str | None:
        """None: the database's errors are not read for a missing field (it answers
        a filter on a field it lacks with no hits, or its errors are not known)."""
        return None

    @abstractmethod
    def _shape(self, route: Route) -> ShapeT | None:
        """How responses on ``route`` are laid out; None unless the route is FILTERED."""

    def _load(self, body: bytes, shape: ShapeT) -> Any:
        """The decoded body: a JSON object, unless the adapter says otherwise."""
        return load_object(body)

    @abstractmethod
    def _read(self, document: Any, shape: ShapeT) -> ParsedBody:
        """Check ``document``, number its hits and return the body to render."""

    def _read_echoed(self, document: Any, shape: ShapeT, echo: object) -> ParsedBody:
        """``_read``, for an answer to a request whose ``RequestRewrite.echo`` is
        ``echo``; a format whose answers repeat the request overrides it."""
        return self._read(document, shape)


def load_json(body: bytes) -> Any:
    """The body as a JSON value; raises MalformedBody (or orjson's error) otherwise.

    A body with a duplicate key in any object is refused: the gate (which,
    like orjson, keeps the last) and a client that keeps the first would read
    two different bodies, for example an error where the client sees rows.
    """
    document = orjson.loads(body)
    if has_duplicate_keys(body, document):
        raise MalformedBody("an object has the same key twice")
    return document


def load_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises MalformedBody (or orjson's error) otherwise."""
    document = load_json(body)
    if not isinstance(document, dict):
        raise MalformedBody("top level is not a JSON object")
    return document


# Where a key of the text ends: its closing quote, optional whitespace, a colon.
_KEY_END = re.compile(rb'"[ \t\r\n]*:')


def has_duplicate_keys(body: bytes, document: Any) -> bool:
    """True when some object of ``body`` (decoded as ``document``) names a key twice.

    Every key of the text has a place of its own where a quote is followed by
    a colon (whitespace between), so there are never fewer such places than
    keys; and a repeated key leaves one entry fewer in the decoded objects.
    So when the places are as many as the decoded keys, no key repeats. This
    settles almost every body in one scan; one whose strings hold a quote
    before a colon, or that does repeat a key, is decoded again pair by pair.
    """
    if len(_KEY_END.findall(body)) == _key_count(document):
        return False
    try:
        json.loads(body, object_pairs_hook=_unique_pairs)
    except _DuplicateKey:
        return True
    except RecursionError:
        # Deeper than the json module decodes (orjson reads up to 1024 levels):
        # keys that cannot be checked are refused as if one repeated.
        return True
    return False


def _key_count(document: Any) -> int:
    """The keys of every object of ``document``; a stack, not recursion."""
    keys = 0
    pending = [document]
    while pending:
        value = pending.pop()
        if type(value) is dict:
            keys += len(value)
            pending.extend(item for item in value.values() if type(item) in _CONTAINERS)
        elif type(value) is list:
            pending.extend(item for item in value if type(item) in _CONTAINERS)
    return keys


_CONTAINERS = (dict, list)


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _DuplicateKey
    return document
