"""PostgreSQL connection URLs: validated once, redacted in every message.

A URL may carry a password (``postgresql://user:secret@host/db`` or
``?password=secret``). The password is better kept out of the URL altogether
(libpq reads ``PGPASSWORD`` and ``~/.pgpass``), but when it is there it must not
reach a log line, an error message or a terminal. ``PostgresUrl.redacted`` is
the form to print, and ``PostgresUrl.scrub`` removes the password from any text,
such as a driver error, before it is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict

SCHEMES = ("postgresql", "postgres")
REDACTED = "***"

# Greedy up to the last "@": libpq splits there too when the password holds an
# unencoded "@", and redacting too much is harmless where too little is not.
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/?#]*:)(?P<password>.*)@")
_PASSWORD_PARAM = re.compile(r"(?P<head>[?&]password=)(?P<password>[^&]*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """``url`` with its password (in the user part or a ``password=`` parameter) as ``***``."""
    url = _USERINFO.sub(lambda m: f"{m['head']}{REDACTED}@", url, count=1)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['head']}{REDACTED}", url)


@dataclass(frozen=True)
class PostgresUrl:
    """A checked ``postgresql://`` URL. Connect with ``url``; print only ``redacted``."""

    url: str = field(repr=False)
    redacted: str
    parameter_names: frozenset[str]  # the libpq parameters the URL sets
    _secrets: tuple[str, ...] = field(repr=False)

    def __str__(self) -> str:
        return self.redacted

    def scrub(self, text: str) -> str:
        """``text`` with every form of the password replaced by ``***``."""
        text = text.replace(self.url, self.redacted)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


def parse_postgres_url(url: str) -> PostgresUrl:
    """Check a ``postgresql://`` (or ``postgres://``) URL as libpq will read it.

    Raises ValueError, with the URL redacted, when libpq cannot parse it or
    would read a different password than the URL appears to carry (an
    unencoded ``/``, ``?`` or ``#`` in the password moves part of it into the
    host or database name, where it would be echoed by connection errors).
    """
    redacted = redact_url(url)
    scheme = url.partition("://")[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"not a PostgreSQL URL: {redacted}")
    try:
        parsed = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # libpq's message quotes the offending part, which may be the password.
        raise ValueError(
            f"PostgreSQL URL cannot be parsed: {redacted} "
            "(percent-encode special characters, e.g. '@' as %40)"
        ) from None
    raw = [m["password"] for m in (_USERINFO.match(url), _PASSWORD_PARAM.search(url)) if m]
    secrets = {str(parsed.get("password") or "")} | set(raw) | {unquote(r) for r in raw}
    secrets.discard("")
    userinfo = _USERINFO.match(url)
    if userinfo and unquote(userinfo["password"]) != parsed.get("password"):
        raise ValueError(
            f"the password in PostgreSQL URL {redacted} is ambiguous: percent-encode "
            "'/', '?', '#' and '@' in it (e.g. '/' as %2F), or leave it out of the URL "
            "and use PGPASSWORD or ~/.pgpass"
        )
    # Longest first, so that a secret containing another is replaced whole.
    ordered = tuple(sorted(secrets, key=len, reverse=True))
    return PostgresUrl(
        url=url, redacted=redacted, parameter_names=frozenset(parsed), _secrets=ordered
    )
