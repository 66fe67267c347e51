"""docs/configuration.md lists every setting once, with the flag the command
line really has (or "file only" for a table that only a file can express)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from sidecar.cli.flags import flag_name
from sidecar.config import Settings

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
HEADER = "| setting (TOML key) | flag | default | meaning |"


def documented_flags() -> dict[str, str]:
    """Setting name -> the flag column, from the table under HEADER."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and the |---| line
    rows: dict[str, str] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, flag = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:2])
        assert name not in rows, f"{name} is listed twice"
        rows[name] = flag
    return rows


def test_every_setting_is_documented_with_its_flag() -> None:
    expected = {f.name: flag_name(f) or "file only" for f in fields(Settings)}
    assert documented_flags() == expected
