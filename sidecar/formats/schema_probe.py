"""Asking a vector database whether a collection has a field: the shape every probe shares.

Push-down adds ``<tenant_key> == <tenant>`` to every search; a collection whose
documents lack that field, or hold it in a form the condition cannot match
exactly, answers nothing or the wrong things. Some databases can tell from
their schema (Milvus' collection description, an Elasticsearch mapping, a
Weaviate class, Qdrant's payload indexes); others keep no schema of their
metadata at all. A probe knows one database's question and how to read its
answer; it sends nothing itself (``retrieval-gate check`` does) and knows
nothing of tenants or policy beyond the field's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import orjson


class Presence(Enum):
    """What the database's schema says about the field."""

    # There, in a form an equality condition matches exactly.
    FOUND = "found"
    # Not there, or there in a form that matches other values too: push-down
    # would answer nothing, or rely on the response check alone.
    MISSING = "missing"
    # The schema cannot tell (no schema of metadata, or an unindexed field).
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class FieldReport:
    """The answer about one field of one collection, with what it rests on."""

    presence: Presence
    detail: str


@dataclass(frozen=True)
class SchemaRequest:
    """One request that asks for a collection's schema: an HTTP request on the
    database's REST port, or a unary call (``grpc``) with ``path`` its method."""

    method: str
    path: str
    body: bytes | None = None
    grpc: bool = False


class SchemaProbe(Protocol):
    """One database's question about a collection's fields, and how to read the answer."""

    database: str

    def search_paths(self, collection: str) -> tuple[str, ...]:
        """The request paths a search in ``collection`` takes (REST and gRPC), whose
        ``routes`` options give the field push-down uses there."""
        ...

    def request(self, collection: str) -> SchemaRequest:
        """The request that asks for ``collection``'s schema."""
        ...

    def read(self, status: int, body: bytes, field: str) -> FieldReport:
        """What the answer (HTTP status, or 200 for a gRPC OK, and body) says about
        ``field``; raises SchemaAnswerError for an answer that is an error."""
        ...


class SchemaAnswerError(Exception):
    """The database answered the schema request with an error; ``str()`` says which,
    in the database's words (never more than a line)."""


MAX_ERROR_CHARS = 300


def error_text(status: int, body: bytes, *keys: str) -> str:
    """``HTTP <status>`` and the database's own error message, found under ``keys``
    (a path into the JSON body, e.g. ``error``, ``reason``), shortened to a line."""
    message = _find(body, keys)
    if message is None:
        return f"HTTP {status}"
    return f"HTTP {status}: {shorten(message)}"


def shorten(text: str) -> str:
    """``text`` on one line, at most MAX_ERROR_CHARS characters."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."


def _find(body: bytes, keys: tuple[str, ...]) -> str | None:
    try:
        node: object = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node if isinstance(node, str) and node else None


def load_json(body: bytes, what: str) -> object:
    """``body`` as JSON; SchemaAnswerError naming ``what`` when it is not JSON."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise SchemaAnswerError(f"{what} is not JSON") from None
