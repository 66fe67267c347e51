"""Weaviate's error answers: GraphQL ``errors`` inside a 200, and what a missing property says.

``POST /v1/graphql`` answers a failed query with HTTP 200 and a non-empty
``errors`` list (``[{"message": ..., "path": [...], "locations": [...]}]``),
beside ``data`` or instead of it; GraphQL gives them no code. Messages can
quote the query, its values and stored text, so they go to the audit record
only (``ReportedError``).

A ``where`` filter on a property the class does not have fails with the
schema's own message, wrapped by the callers that add their context in front
(``invalid 'where' filter: ``, the explorer's steps): ``no such prop with name
'<name>' found in class '<class>' in the schema. Check your schema files for
which properties in this class are available``. Read at the end of a message,
where the innermost error sits, so that a value the message quotes cannot pass
for one. The gRPC API fails a search with the same text in its status.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

from sidecar.formats.base import ReportedError

# GraphQL errors carry no code of their own.
GRAPHQL_ERROR: Final = "weaviate:graphql"
_MISSING_PROPERTY: Final = re.compile(
    r"no such prop with name '([^'\n]+)' found in class '[^'\n]*' in the schema\. "
    r"Check your schema files for which properties in this class are available\.?\Z"
)


def reported(errors: list[Any]) -> ReportedError | None:
    """The error a response's non-empty ``errors`` lists report (their JSON); None for none."""
    if not errors:
        return None
    return ReportedError(GRAPHQL_ERROR, orjson.dumps(errors).decode())


def missing_field(error_text: str) -> str | None:
    """The property ``error_text`` says the class does not have, or None.

    ``error_text`` is one message, or a JSON list of GraphQL errors (as
    ``reported`` writes it): each message is read on its own.
    """
    for message in _messages(error_text):
        found = _MISSING_PROPERTY.search(message.rstrip())
        if found:
            return found.group(1)
    return None


def _messages(error_text: str) -> list[str]:
    try:
        errors = orjson.loads(error_text)
    except orjson.JSONDecodeError:
        return [error_text]
    if not isinstance(errors, list):
        return [error_text]
    return [
        error["message"]
        for error in errors
        if isinstance(error, dict) and isinstance(error.get("message"), str)
    ]
