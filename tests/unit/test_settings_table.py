"""docs/configuration.md documents every setting under its group, with the flag
the command line really has ("file only" for a table only a file can express)
and the default the code really has; a setting added, moved, renamed or given
another default without the page fails here."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from sidecar.config import GROUPS, SETTINGS, TABLES, Setting

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADER = "| key | flag | default | meaning |"


def documented() -> dict[str, dict[str, tuple[str, str, str]]]:
    """Group -> key -> (flag, default, meaning), from the table under each ``### [group]``."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    tables: dict[str, dict[str, tuple[str, str, str]]] = {}
    for number, line in enumerate(lines):
        if not (line.startswith("### `[") and line.endswith("]`")):
            continue
        group = line.removeprefix("### `[").removesuffix("]`")
        start = lines.index(HEADER, number) + 2  # past the header and the |---| line
        rows = tables.setdefault(group, {})
        for row in lines[start:]:
            if not row.startswith("|"):
                break
            key, flag, default, meaning = (cell.strip() for cell in row.strip("|").split("|", 3))
            key = key.strip("`")
            assert key not in rows, f"{group}.{key} is listed twice"
            rows[key] = (flag.strip("`"), default.replace("`", ""), meaning)
    return tables


def default_text(spec: Setting) -> str:
    """The default as the page writes it (without its backticks)."""
    if spec.info.default_text is not None:
        return spec.info.default_text
    value = spec.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ", ".join(value) if value else "[]"
    if isinstance(value, dict):
        pairs = ", ".join(f'{k} = "{v}"' for k, v in value.items())
        return "{" + pairs + "}"
    return str(value)


def test_every_group_has_a_section_in_order() -> None:
    assert list(documented()) == list(GROUPS)


def test_every_setting_is_documented_under_its_group_with_its_flag_and_default() -> None:
    tables = documented()
    expected = {
        group: {
            spec.key: (spec.flag or "file only", default_text(spec))
            for spec in SETTINGS
            if spec.group == group
        }
        for group in GROUPS
    }
    found = {
        group: {key: (flag, default) for key, (flag, default, _) in rows.items()}
        for group, rows in tables.items()
    }
    assert found == expected


def test_every_setting_has_a_meaning() -> None:
    for group, rows in documented().items():
        for key, (_, _, meaning) in rows.items():
            assert meaning, f"{group}.{key} has no meaning in the page"


def test_the_tables_have_sections() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for table in TABLES:
        assert f"`[{table}." in text, table
