"""Help text from docstrings: what a terminal shows, without the markup.

Docstrings use reST literals (````store load````) and roles
(``:func:`load_settings```); ``--help`` prints them as plain words.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(docstring: str | None) -> str | None:
    """``docstring`` without reST literals and roles; None stays None."""
    if docstring is None:
        return None
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", docstring))
