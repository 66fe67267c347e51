"""SPIFFE ids and the workload table that maps them to tenants (identity mode ``mesh-mtls``).

A SPIFFE id is ``spiffe://<trust domain>/<path>``, parsed here as strictly as
the SPIFFE specification writes it (lowercase scheme and trust domain, path
segments of ``[A-Za-z0-9._-]``, no empty, ``.`` or ``..`` segment, no query,
fragment, port or percent-encoding, 2048 bytes at most) and with a non-empty
path, as every workload's id has.

The workload table (the ``[workloads]`` setting) maps ids to a tenant and
principals. A key is an exact id or a pattern whose path segments may be
``*`` (any one segment) or ``{name}`` (any one segment, whose value the
entry's ``tenant`` and ``principals`` may use as ``{name}``). The trust domain
is never a pattern: it is the root of trust, and a rule must name it.

The most specific entry wins: an entry is more specific than another that
matches the same ids when it fixes every segment the other fixes, and more.
Two entries that can match one id where neither is more specific are refused
when the table is loaded, unless an entry for the ids they both match exists
(which is then more specific than both); so every id has at most one winner,
whatever the order of the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.core.caller import Caller

SCHEME = "spiffe://"
MAX_ID_BYTES = 2048
MAX_TRUST_DOMAIN_CHARS = 255
_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]+")
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
ENTRY_KEYS = frozenset({"tenant", "principals", "drafts"})


@dataclass(frozen=True, slots=True)
class SpiffeId:
    """A workload's SPIFFE id: its trust domain and its path segments (at least one)."""

    trust_domain: str
    path: tuple[str, ...]

    def __str__(self) -> str:
        return SCHEME + self.trust_domain + "".join("/" + s for s in self.path)


def _trust_domain(text: str) -> str:
    if not text:
        raise ValueError("the trust domain is empty")
    if len(text) > MAX_TRUST_DOMAIN_CHARS or not _TRUST_DOMAIN.fullmatch(text):
        raise ValueError(
            "the trust domain must be lowercase letters, digits, '.', '-' and '_' "
            f"(at most {MAX_TRUST_DOMAIN_CHARS})"
        )
    return text


def _split(text: str) -> tuple[str, list[str]]:
    """The trust domain and the path segments of ``spiffe://td/a/b``, as written."""
    if len(text.encode()) > MAX_ID_BYTES:
        raise ValueError(f"a SPIFFE id is at most {MAX_ID_BYTES} bytes")
    if not text.startswith(SCHEME):
        raise ValueError(f"a SPIFFE id starts with {SCHEME!r}")
    trust_domain, _, path = text.removeprefix(SCHEME).partition("/")
    if not path:
        raise ValueError("a workload's SPIFFE id has a path (spiffe://trust-domain/path)")
    return _trust_domain(trust_domain), path.split("/")


def _segment(segment: str) -> str:
    if not segment:
        raise ValueError("a SPIFFE id has no empty path segment (no '//', no trailing '/')")
    if segment in (".", "..") or not _SEGMENT.fullmatch(segment):
        raise ValueError(
            "path segments are letters, digits, '.', '-' and '_', and never '.' or '..'"
        )
    return segment


def parse_spiffe_id(text: str) -> SpiffeId:
    """The workload id ``text``; raises ValueError saying what is wrong (never quoting it)."""
    trust_domain, segments = _split(text)
    return SpiffeId(trust_domain, tuple(_segment(s) for s in segments))


@dataclass(frozen=True, slots=True)
class Pattern:
    """A key of the workload table: literal segments, and ``None`` where any one segment matches.

    ``captures`` names, per position, the placeholder a wildcard binds (None:
    ``*`` or a literal).
    """

    trust_domain: str
    segments: tuple[str | None, ...]
    captures: tuple[str | None, ...]

    @property
    def shape(self) -> tuple[str, tuple[str | None, ...]]:
        """What the pattern matches; ``*`` and ``{name}`` match alike."""
        return self.trust_domain, self.segments

    @property
    def literals(self) -> int:
        """How many segments the pattern fixes."""
        return sum(s is not None for s in self.segments)

    def match(self, spiffe_id: SpiffeId) -> dict[str, str] | None:
        """The placeholder values when the pattern matches ``spiffe_id``, else None."""
        if spiffe_id.trust_domain != self.trust_domain or len(spiffe_id.path) != len(self.segments):
            return None
        if any(
            s is not None and s != v for s, v in zip(self.segments, spiffe_id.path, strict=True)
        ):
            return None
        return {
            name: v
            for name, v in zip(self.captures, spiffe_id.path, strict=True)
            if name is not None
        }

    def overlaps(self, other: Pattern) -> bool:
        """Whether some id matches both patterns."""
        return (
            self.trust_domain == other.trust_domain
            and len(self.segments) == len(other.segments)
            and all(
                a is None or b is None or a == b
                for a, b in zip(self.segments, other.segments, strict=True)
            )
        )

    def covers(self, other: Pattern) -> bool:
        """Whether ``other`` fixes every segment this pattern fixes (so matches a subset)."""
        return self.overlaps(other) and all(
            a is None or a == b for a, b in zip(self.segments, other.segments, strict=True)
        )

    def meet(self, other: Pattern) -> Pattern:
        """The pattern of the ids both match (they must overlap); it captures nothing."""
        segments = tuple(
            a if a is not None else b for a, b in zip(self.segments, other.segments, strict=True)
        )
        return Pattern(self.trust_domain, segments, (None,) * len(segments))

    def __str__(self) -> str:
        return SCHEME + self.trust_domain + "".join("/" + (s or "*") for s in self.segments)


def parse_pattern(text: str) -> Pattern:
    """A workload table key: an exact SPIFFE id, or one with ``*`` / ``{name}`` segments."""
    written_domain = text.removeprefix(SCHEME).partition("/")[0]
    if "*" in written_domain or "{" in written_domain:
        raise ValueError("the trust domain is never a pattern: name it")
    trust_domain, raw = _split(text)
    segments: list[str | None] = []
    captures: list[str | None] = []
    for segment in raw:
        placeholder = _PLACEHOLDER.fullmatch(segment)
        if segment == "*" or placeholder:
            name = placeholder.group(1) if placeholder else None
            if name is not None and name in captures:
                raise ValueError(f"placeholder {{{name}}} appears twice")
            segments.append(None)
            captures.append(name)
        elif "*" in segment or "{" in segment or "}" in segment:
            raise ValueError("a pattern segment is a literal, '*' or '{name}', whole")
        else:
            segments.append(_segment(segment))
            captures.append(None)
    return Pattern(trust_domain, tuple(segments), tuple(captures))


@dataclass(frozen=True, slots=True)
class Template:
    """A tenant or principal: text with ``{name}`` placeholders filled from the match."""

    text: str

    @classmethod
    def parse(cls, text: str, names: Iterable[str | None], what: str) -> Template:
        known = {n for n in names if n is not None}
        for name in _PLACEHOLDER.findall(text):
            if name not in known:
                raise ValueError(f"{what} uses {{{name}}}, which the key does not capture")
        if "{" in _PLACEHOLDER.sub("", text) or "}" in _PLACEHOLDER.sub("", text):
            raise ValueError(f"{what}: braces only as a placeholder {{name}}")
        return cls(text)

    def fill(self, values: Mapping[str, str]) -> str:
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], self.text)


@dataclass(frozen=True, slots=True)
class WorkloadEntry:
    """What one workload table entry grants: a tenant, principals, drafts."""

    pattern: Pattern
    tenant: Template
    principals: tuple[Template, ...]
    drafts: bool

    def caller(self, spiffe_id: SpiffeId, values: Mapping[str, str]) -> Caller:
        """The caller for ``spiffe_id``: the entry's principals plus the id itself."""
        principals = {p.fill(values) for p in self.principals} | {str(spiffe_id)}
        return Caller(self.tenant.fill(values), frozenset(principals), drafts_allowed=self.drafts)


def _entry(key: str, value: Any) -> WorkloadEntry:
    pattern = parse_pattern(key)
    if not isinstance(value, Mapping):
        raise TypeError("must be a table {tenant = ..., principals = [...], drafts = ...}")
    unknown = sorted(set(value) - ENTRY_KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (known: {', '.join(sorted(ENTRY_KEYS))})")
    tenant = value.get("tenant")
    if not isinstance(tenant, str) or not tenant.strip():
        raise ValueError("needs a tenant, a non-empty string")
    principals = value.get("principals", [])
    if not isinstance(principals, list) or not all(isinstance(p, str) and p for p in principals):
        raise TypeError("principals must be a list of non-empty strings")
    drafts = value.get("drafts", False)
    if not isinstance(drafts, bool):
        raise TypeError("drafts must be true or false")
    return WorkloadEntry(
        pattern,
        Template.parse(tenant, pattern.captures, "tenant"),
        tuple(Template.parse(p, pattern.captures, "a principal") for p in principals),
        drafts,
    )


class WorkloadMap:
    """The workload table: which entry, if any, a SPIFFE id gets (module docstring)."""

    def __init__(self, entries: Iterable[WorkloadEntry]) -> None:
        self._exact: dict[SpiffeId, WorkloadEntry] = {}
        self._patterns: list[WorkloadEntry] = []
        for entry in entries:
            pattern = entry.pattern
            if pattern.literals == len(pattern.segments):
                exact = SpiffeId(pattern.trust_domain, tuple(s or "" for s in pattern.segments))
                self._exact[exact] = entry
            else:
                self._patterns.append(entry)

    @classmethod
    def parse(cls, table: Mapping[str, Any]) -> WorkloadMap:
        """The table of the ``workloads`` setting; raises ValueError naming the entry."""
        entries: list[WorkloadEntry] = []
        for key, value in table.items():
            try:
                entries.append(_entry(key, value))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"entry {key!r}: {exc}") from None
        _check_unambiguous(entries)
        return cls(entries)

    def lookup(self, spiffe_id: SpiffeId) -> Caller | None:
        """The caller the most specific matching entry makes of ``spiffe_id``; None: unmapped."""
        exact = self._exact.get(spiffe_id)
        if exact is not None:
            return exact.caller(spiffe_id, {})
        best: tuple[WorkloadEntry, dict[str, str]] | None = None
        for entry in self._patterns:
            values = entry.pattern.match(spiffe_id)
            # The table is unambiguous: the winner fixes strictly the most segments.
            if values is None:
                continue
            if best is None or entry.pattern.literals > best[0].pattern.literals:
                best = (entry, values)
        return None if best is None else best[0].caller(spiffe_id, best[1])


def _check_unambiguous(entries: list[WorkloadEntry]) -> None:
    """Refuse two keys for the same ids, and two overlapping keys that nothing decides between."""
    shapes: dict[tuple[str, tuple[str | None, ...]], Pattern] = {}
    for entry in entries:
        earlier = shapes.setdefault(entry.pattern.shape, entry.pattern)
        if earlier is not entry.pattern:
            raise ValueError(
                f"entries {str(earlier)!r} and {str(entry.pattern)!r} match the same ids"
            )
    for i, a in enumerate(entries):
        for b in entries[i + 1 :]:
            first, second = a.pattern, b.pattern
            if not first.overlaps(second) or first.covers(second) or second.covers(first):
                continue
            both = first.meet(second)
            if both.shape not in shapes:
                raise ValueError(
                    f"entries {str(first)!r} and {str(second)!r} both match {str(both)!r} and "
                    f"neither is more specific: add an entry for {str(both)!r}"
                )
