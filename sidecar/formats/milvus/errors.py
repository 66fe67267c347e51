"""Milvus' error answers, as both its APIs report them inside a successful answer.

REST v2 answers HTTP 200 with ``{"code": <non-zero>, "message": ...}``; gRPC
answers an OK reply whose ``status`` has a non-zero ``code`` (Milvus' error
class, ``merr``) or, from older servers, a non-zero legacy ``error_code``, and
its text in ``reason``. The text can quote the request's filter expression,
and so the tenant's value and the client's query: it goes to the audit record
only (``ReportedError``).

A filter naming a field the collection's schema lacks (and with no dynamic
field to fall back on) fails with a text that names the field. Two spellings
are known, each read where the server puts it, so that a string literal of
the client's own filter (which the texts quote) cannot pass for one:

- Milvus: ``failed to create query plan: cannot parse expression: <the
  expression>, error: field <name> not exist: invalid parameter``, the
  field's error last (code 1100);
- Milvus Lite: ``unknown field '<name>' at column <n>`` first, then the
  expression and the schema's fields.
"""

from __future__ import annotations

import re
from typing import Final

from sidecar.formats.base import ReportedError, error_code

_SOURCE: Final = "milvus"
_SERVER_MISSING: Final = re.compile(r"error: field (\S+) not exist(?:: invalid parameter)?\Z")
_LITE_MISSING: Final = re.compile(r"\Aunknown field '([^'\n]+)' at column [0-9]+")


def reported(code: int, message: object) -> ReportedError:
    """The error a Milvus answer with ``code`` and ``message`` reports."""
    return ReportedError(error_code(_SOURCE, code), message if isinstance(message, str) else "")


def missing_field(error_text: str) -> str | None:
    """The field Milvus' ``error_text`` says the collection does not have, or None."""
    found = _SERVER_MISSING.search(error_text.rstrip()) or _LITE_MISSING.match(error_text)
    return found.group(1) if found else None
