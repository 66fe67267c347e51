"""The documentation stays true: links resolve, the front page stays short,
configuration examples use real settings, and no page cites a file the
repository does not have."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

# The front page: two commands, how it works, how to run and deploy it, where
# to go next. Raised from 11,000 for the four deployment sections (issue 12).
README_LIMIT_BYTES = 12_000

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_LINK_TEXT = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _toml_blocks(text: str) -> list[str]:
    """The contents of the ```toml fenced blocks."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if current is None:
            if stripped.startswith("```toml"):
                current = []
        elif stripped.startswith("```"):
            blocks.append("\n".join(current) + "\n")
            current = None
        else:
            current.append(line)
    return blocks


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to dashes."""
    text = _INLINE_LINK_TEXT.sub(r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ...)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(path: Path) -> list[str]:
    """Link targets in a Markdown file that are not URLs (code is skipped)."""
    # Joined, not per line: a link's text may wrap onto the next line.
    prose = _CODE_SPAN.sub("", "\n".join(_prose_lines(path.read_text(encoding="utf-8"))))
    return [t for t in _LINK.findall(prose) if not _SCHEME.match(t)]


def test_the_link_checker_knows_github_anchors() -> None:
    assert github_slug("PostgreSQL: the production store") == "postgresql-the-production-store"
    assert github_slug("Testing: what is real and what is fake") == (
        "testing-what-is-real-and-what-is-fake"
    )
    assert github_slug("Modes and failure posture") == "modes-and-failure-posture"
    assert github_slug("`sidecar/core/` and [links](x.md)") == "sidecarcore-and-links"


def test_there_are_pages_to_check() -> None:
    assert README.is_file()
    assert len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    problems: list[str] = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            problems.append(f"{target}: {file_part} does not exist")
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {
        (README.parent / t.partition("#")[0]).resolve()
        for t in relative_links(README)
        if t.partition("#")[0]
    }
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages not linked from README.md: {unlinked}"


def test_readme_stays_a_front_page() -> None:
    size = len(README.read_bytes())
    assert size < README_LIMIT_BYTES, (
        f"README.md is {size} bytes; reference material belongs in docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_configuration_examples_are_settings_files(page: Path, tmp_path: Path) -> None:
    # Each example is a whole file or a part of one: read with an identity mode
    # (unless it sets one), it must load, every key known and every value fit.
    for number, block in enumerate(_toml_blocks(page.read_text(encoding="utf-8")), 1):
        config = tmp_path / f"example-{number}.toml"
        identity = "" if "[identity]" in block else '\n[identity]\nmode = "trusted-headers"\n'
        config.write_text(block + identity, encoding="utf-8")
        try:
            load_settings(config)
        except ConfigError as exc:
            pytest.fail(f"toml block {number} of {page.name}:\n{exc}")


def test_the_configuration_page_has_examples() -> None:
    assert _toml_blocks((DOCS / "configuration.md").read_text(encoding="utf-8"))


def _text_files(top: Path) -> list[Path]:
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(top):
        subdirectories[:] = [d for d in subdirectories if d != "__pycache__"]
        found.extend(Path(directory, name) for name in files if not name.endswith(".pyc"))
    return found


def test_nothing_cites_the_external_design_sketch() -> None:
    # The design document is docs/architecture.md; the early sketch is not in the repository.
    needle = b"ARCHITECTURE" + b".md"
    this_file = Path(__file__).resolve()
    files = [README, *(f for top in ("docs", "sidecar", "tests") for f in _text_files(ROOT / top))]
    citing = [
        str(f.relative_to(ROOT))
        for f in files
        if f.resolve() != this_file and f.is_file() and needle in f.read_bytes()
    ]
    assert not citing, f"files citing {needle.decode()}: {citing}"
