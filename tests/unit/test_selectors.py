"""The selector language of the generic adapter: parsing, errors, matching.

The grammar is the project's own (a subset of JSONPath: ``$``, ``.name``,
``['name']``, ``[*]``), documented in ``sidecar/formats/generic/selectors.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.formats.base import MalformedBody
from sidecar.formats.generic.selectors import EACH, Match, Selector, Step

# -- parsing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("$", ()),
        ("$.results", ("results",)),
        ("$.results[*]", ("results", EACH)),
        ("$.batches[*].hits[*]", ("batches", EACH, "hits", EACH)),
        ("$.ids[*][*]", ("ids", EACH, EACH)),
        ("$[*]", (EACH,)),
        ("doc_id", ("doc_id",)),
        ("meta.id", ("meta", "id")),
        ("$.meta.id", ("meta", "id")),
        ("$['@search.score']", ("@search.score",)),
        ("['a.b'].c", ("a.b", "c")),
        ('$["x y"][*]', ("x y", EACH)),
        ("$['it\\'s']", ("it's",)),
        ("$['back\\\\slash']", ("back\\slash",)),
        ("$['say \"hi\"']", ('say "hi"',)),
        ("$['']", ("",)),
        ("$['*']", ("*",)),
        ("$.a-b_c.D9", ("a-b_c", "D9")),
        ("$.título", ("título",)),
        ("0.1", ("0", "1")),
    ],
)
def test_parse(text: str, steps: tuple[Step, ...]) -> None:
    selector = Selector.parse(text)
    assert selector.steps == steps
    assert selector.text == text


@pytest.mark.parametrize(
    ("text", "problem", "position"),
    [
        ("", "empty selector", 0),
        (".a", "expected a name", 0),
        ("$.", "expected a name", 2),
        ("$..a", "recursive descent", 2),
        ("$.a..b", "recursive descent", 4),
        ("$.a b", "unexpected ' '", 3),
        (" $.a", "expected a name", 0),
        ("$$", "unexpected '\\$'", 1),
        ("a$", "unexpected '\\$'", 1),
        ("$a", "unexpected 'a'", 1),
        ("$.*", "expected a name", 2),
        ("$.a.", "expected a name", 4),
        ("$[0]", "expected \\[\\*\\] or a quoted name", 1),
        ("$.a[-1]", "expected \\[\\*\\] or a quoted name", 3),
        ("$[?(@.x)]", "expected \\[\\*\\] or a quoted name", 1),
        ("$[", "expected \\[\\*\\] or a quoted name", 1),
        ("$[*", "expected ']'", 3),
        ("$[**]", "expected ']'", 3),
        ("$['a'", "expected ']'", 5),
        ("$['a']]", "unexpected ']'", 6),
        ("$['a", "unterminated", 2),
        ("$['a\"]", "unterminated", 2),
        ("$['a\\x']", "only the quote", 5),
        ("$['a\\", "only the quote", 5),
        ("$.a:b", "unexpected ':'", 3),
        ("$.a/b", "unexpected '/'", 3),
    ],
)
def test_parse_errors_name_the_selector_and_position(
    text: str, problem: str, position: int
) -> None:
    with pytest.raises(ValueError, match=problem) as raised:
        Selector.parse(text)
    message = str(raised.value)
    assert message.startswith(f"selector {text!r}: ")
    assert message.endswith(f" at position {position}")


_names = st.text(max_size=6)


def _quoted(name: str) -> str:
    return "['" + name.replace("\\", "\\\\").replace("'", "\\'") + "']"


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.none() | _names, max_size=5), root=st.booleans())
def test_property_quoted_names_round_trip(steps: list[str | None], root: bool) -> None:
    text = ("$" if root else "") + "".join(
        "[*]" if step is None else _quoted(step) for step in steps
    )
    if not text:
        return
    parsed = Selector.parse(text)
    assert parsed.steps == tuple(EACH if step is None else step for step in steps)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="$.[]*'\"\\ab-_ é", max_size=12))
def test_property_any_text_parses_or_is_a_value_error(text: str) -> None:
    try:
        selector = Selector.parse(text)
    except ValueError as exc:
        assert "at position" in str(exc)
    else:
        assert all(step is EACH or isinstance(step, str) for step in selector.steps)


# -- helpers --------------------------------------------------------------------


def test_wildcards_startswith_and_head() -> None:
    hits = Selector.parse("$.batches[*].hits[*]")
    assert hits.wildcards == 2
    assert hits.head(3).steps == ("batches", EACH, "hits")
    assert hits.startswith(Selector.parse("$.batches[*]"))
    assert hits.startswith(Selector.parse("$"))
    assert hits.startswith(hits)
    assert not hits.startswith(Selector.parse("$.batches.hits"))
    assert not Selector.parse("$.batches").startswith(hits)
    # Spelling does not matter, steps do.
    assert Selector.parse("$['batches'][*]").startswith(Selector.parse("batches"))


# -- matching -------------------------------------------------------------------

DOC: dict[str, Any] = {
    "batches": [
        {"hits": [{"id": 1}, {"id": 2}], "n": 2},
        {"hits": [], "n": 0},
        {"hits": [{"id": 3}], "n": None},
    ],
    "a.b": {"c": "dotted"},
    "nothing": None,
}


def test_find_returns_paths_indexes_and_values_in_document_order() -> None:
    assert Selector.parse("$.batches[*].hits[*].id").find(DOC) == [
        Match(("batches", 0, "hits", 0, "id"), (0, 0), 1),
        Match(("batches", 0, "hits", 1, "id"), (0, 1), 2),
        Match(("batches", 2, "hits", 0, "id"), (2, 0), 3),
    ]
    assert Selector.parse("$").find(DOC) == [Match((), (), DOC)]
    assert Selector.parse("$['a.b'].c").find(DOC) == [Match(("a.b", "c"), (), "dotted")]
    assert Selector.parse("$.batches[*].n").find(DOC) == [
        Match(("batches", 0, "n"), (0,), 2),
        Match(("batches", 1, "n"), (1,), 0),
        Match(("batches", 2, "n"), (2,), None),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "$.missing",
        "$.batches.hits",  # a field of an array
        "$.a.b",  # the dotted key is one name
        "$.nothing.x",
        "$.nothing[*]",
        "$.batches[*].hits[*].id.x",
        "$['a.b'][*]",  # [*] does not iterate over an object
        "$.batches[*].n[*]",
    ],
)
def test_find_skips_what_does_not_fit(text: str) -> None:
    assert Selector.parse(text).find(DOC) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$.missing", "an object with field 'missing'"),
        ("$.batches.hits", "an object with field 'hits'"),
        ("$.nothing.x", "an object with field 'x'"),
        ("$.nothing[*]", "an array"),
        ("$['a.b'][*]", "an array"),
        ("$.batches[*].n[*]", "an array"),
        ("$.batches[*].hits[*].x", "an object with field 'x'"),
    ],
)
def test_require_raises_where_a_step_cannot_be_taken(text: str, expected: str) -> None:
    with pytest.raises(MalformedBody, match=f"body does not fit .*: expected {expected}"):
        Selector.parse(text).require(DOC)


def test_require_with_allow_null_returns_the_null_where_it_stopped() -> None:
    selector = Selector.parse("$.nothing[*].x")
    assert selector.require(DOC, allow_null=True) == [Match(("nothing",), (), None)]
    assert Selector.parse("$.batches[*].n").require(DOC, allow_null=True)[2].value is None
    # Only nulls are forgiven; a missing field is still an error.
    with pytest.raises(MalformedBody):
        Selector.parse("$.missing[*]").require(DOC, allow_null=True)


def test_require_finds_nothing_below_an_empty_array() -> None:
    assert Selector.parse("$.batches[*].hits[*].id").require({"batches": []}) == []


def test_error_messages_never_carry_body_values() -> None:
    with pytest.raises(MalformedBody) as raised:
        Selector.parse("$.x[*]").require({"x": "SECRET"})
    assert "SECRET" not in str(raised.value)
