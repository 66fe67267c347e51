"""Reading settings: defaults, then a TOML file, then the command line's values.

Every problem is collected, in the file and on the command line alike, and
reported at once in one :class:`ConfigError`, one line each, naming the
setting as ``group.key``. Unknown keys are errors (a typo must not leave a
default, possibly a less safe one, in force) with the nearest known key
suggested; the flat keys of the layout before the groups are refused with
their new place rather than read, so that a file has one meaning.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from sidecar.config._schema import ConfigError, Group, Setting, convert, group_settings
from sidecar.config.checks import cross_field_problems
from sidecar.config.settings import GROUPS, SETTINGS, TABLES, RouteOptions, Settings

G = TypeVar("G", bound=Group)

_BY_NAME = {spec.name: spec for spec in SETTINGS}
_BY_PATH = {spec.path: spec for spec in SETTINGS}
_ROUTE_OPTIONS = {spec.key: spec for spec in group_settings(RouteOptions)}


class _Reading:
    """The values read so far, by group, and the problems found on the way."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
        self.tables: dict[str, Any] = {}
        self.problems: list[str] = []
        self.refused: set[str] = set()

    def set(self, spec: Setting, value: Any, source: str = "") -> None:
        try:
            self.values[spec.group][spec.key] = convert(spec, value)
        except (TypeError, ValueError) as exc:
            self.refuse(spec.path, f"{spec.path}{source}: {exc}")

    def refuse(self, path: str, problem: str) -> None:
        self.problems.append(problem)
        self.refused.add(path)

    def read_document(self, document: dict[str, Any]) -> None:
        for key, value in document.items():
            name = key.replace("-", "_")
            if name in TABLES:
                self.tables[name] = value
            elif name in GROUPS and isinstance(value, dict):
                self.read_group(name, value)
            elif name in _BY_NAME:
                spec = _BY_NAME[name]
                self.refuse(
                    spec.path,
                    f"{key} is now {spec.path} (in the [{spec.group}] table: {spec.key} = ...)",
                )
            elif name in GROUPS:
                self.problems.append(f"{key} must be a table ([{name}])")
            else:
                self.problems.append(f"{key}: unknown setting{_suggestion(name, _top_level())}")

    def read_group(self, group: str, table: dict[str, Any]) -> None:
        for key, value in table.items():
            name = key.replace("-", "_")
            spec = _BY_PATH.get(f"{group}.{name}")
            if spec is None:
                self.problems.append(
                    f"{group}.{key}: unknown setting{_suggestion(name, *_in_group(group))}"
                )
            else:
                self.set(spec, value)

    def settings(self) -> Settings:
        routes = self._routes(self.tables.get("routes", {}))
        formats = self._formats(self.tables.get("formats", {}))
        # Each group's field on Settings is named by the group, as its table is.
        groups: dict[str, Any] = {name: self.group(cls) for name, cls in GROUPS.items()}
        settings = Settings(**groups, routes=routes, formats=formats)
        self.problems.extend(cross_field_problems(settings, self.refused))
        if self.problems:
            raise ConfigError(*self.problems)
        return settings

    def group(self, cls: type[G]) -> G:
        """The group ``cls`` with the values read for it (each already checked)."""
        return cls(**self.values[cls.group])

    def _routes(self, value: Any) -> dict[str, RouteOptions]:
        if not isinstance(value, dict):
            self.refuse("routes", "routes: must be a table of path prefix = {options}")
            return {}
        routes = {}
        for prefix, options in value.items():
            where = f'routes."{prefix}"'
            if not isinstance(options, dict):
                self.refuse("routes", f"{where}: must be a table of options")
                continue
            values = {}
            for key, value in options.items():
                spec = _ROUTE_OPTIONS.get(key)
                if spec is None:
                    known = {name: name for name in _ROUTE_OPTIONS}
                    problem = f"unknown route option{_suggestion(key, known)}"
                    self.refuse("routes", f"{where}.{key}: {problem}")
                    continue
                try:
                    values[key] = convert(spec, value)
                except (TypeError, ValueError) as exc:
                    self.refuse("routes", f"{where}.{key}: {exc}")
            if "routes" not in self.refused:
                routes[str(prefix)] = RouteOptions(**values)
        return routes

    def _formats(self, value: Any) -> dict[str, dict[str, Any]]:
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            self.refuse("formats", "formats: must be a table of format name = {options}")
            return {}
        return {str(k): dict(v) for k, v in value.items()}


def load_settings(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Defaults, then the TOML file at ``path`` (if any), then non-None ``overrides``.

    ``overrides`` are keyed by a setting's flat name, its flag without dashes
    (``tenant_claim``, ``grpc_listen``), or ``routes`` and ``formats``. Raises
    ConfigError listing every problem.
    """
    reading = _Reading()
    if path is not None:
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        reading.read_document(document)
    for name, value in (overrides or {}).items():
        if value is None:
            continue
        if name in TABLES:
            reading.tables[name] = value
        elif name in _BY_NAME:
            spec = _BY_NAME[name]
            reading.set(spec, value, f" ({spec.flag})" if spec.flag else "")
        else:
            reading.problems.append(f"{name}: unknown setting{_suggestion(name, _flat())}")
    return reading.settings()


def grouped(values: Mapping[str, Any]) -> dict[str, Any]:
    """The file layout of ``values`` given by flat name (as :func:`load_settings`'
    overrides are): ``{"tenant_claim": "org"}`` is ``{"identity": {"tenant_claim": "org"}}``.
    For whoever writes a settings file from a program (the tests' and benchmarks'
    stacks); raises KeyError for a name that is not a setting."""
    document: dict[str, Any] = {}
    for name, value in values.items():
        if name in TABLES:
            document[name] = value
        else:
            spec = _BY_NAME[name]
            document.setdefault(spec.group, {})[spec.key] = value
    return document


def _top_level() -> dict[str, str]:
    """What a misspelt top-level key may have meant: a table, or a flat key's new place."""
    return {
        **{spec.name: spec.path for spec in SETTINGS},
        **{name: f"[{name}]" for name in GROUPS},
        **{name: f"[{name}]" for name in TABLES},
    }


def _in_group(group: str) -> tuple[dict[str, str], dict[str, str]]:
    """What a misspelt key in ``[group]`` may have meant: first one of the group's own
    (by key or flat name: ``[cache] cache_size`` is ``cache.size``), then any other."""
    own = [spec for spec in SETTINGS if spec.group == group]
    return (
        {spec.key: spec.path for spec in own} | {spec.name: spec.path for spec in own},
        {spec.key: spec.path for spec in SETTINGS} | {spec.name: spec.path for spec in SETTINGS},
    )


def _flat() -> dict[str, str]:
    return {spec.name: spec.name for spec in SETTINGS} | {name: name for name in TABLES}


def _suggestion(word: str, *tiers: dict[str, str]) -> str:
    """``; did you mean ...?`` for the nearest candidate of the first tier that has one."""
    for candidates in tiers:
        close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.7)
        if close:
            return f"; did you mean {candidates[close[0]]}?"
    return ""
