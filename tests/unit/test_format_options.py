"""AdapterOptions: the options every adapter takes, checked once, and how a settings table
is split between them and an adapter's own options."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.hits import Field, ReleasedFields
from sidecar.formats.options import (
    DEFAULT_OPTIONS,
    OPTION_NAMES,
    AdapterOptions,
    split_table,
)
from sidecar.formats.registry import BUILT_IN, build_format_table


def test_the_defaults() -> None:
    assert AdapterOptions() == DEFAULT_OPTIONS
    assert (DEFAULT_OPTIONS.text_field, DEFAULT_OPTIONS.id_field) == ("text", None)
    assert DEFAULT_OPTIONS.fields == ReleasedFields()
    assert {"text_field", "id_field", "hashed_fields", "releasable_fields"} == OPTION_NAMES


def test_released_fields_are_checked_into_paths() -> None:
    options = AdapterOptions(hashed_fields=["title", "meta.page"], releasable_fields=("url",))
    assert options.fields == ReleasedFields((("title",), ("meta", "page")), (("url",),))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"text_field": ""}, "text_field must be a non-empty string"),
        ({"text_field": 3}, "text_field must be a non-empty string"),
        ({"id_field": ""}, "id_field must be a non-empty string"),
        ({"id_field": ["x"]}, "id_field must be a non-empty string"),
        ({"hashed_fields": "title"}, "hashed_fields must be a list"),
        ({"releasable_fields": ["a..b"]}, "releasable_fields: 'a..b' is not a dotted path"),
    ],
)
def test_wrong_options_are_refused_naming_the_option(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdapterOptions(**options)


def test_an_id_field_that_is_the_text_field_is_refused_where_both_share_an_object() -> None:
    same = AdapterOptions(text_field="body", id_field="body")
    with pytest.raises(ValueError, match="id_field must differ from text_field"):
        same.distinct_id_field()
    assert AdapterOptions(text_field="body", id_field="chunk").distinct_id_field() == "chunk"
    assert AdapterOptions(text_field="body").distinct_id_field() is None


def test_the_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        DEFAULT_OPTIONS.text_field = "other"  # type: ignore[misc]


def test_a_table_is_split_into_the_options_taken_and_the_adapters_own() -> None:
    options, own = split_table(
        {"text_field": "body", "generative": "block", "hashed_fields": ["t"]},
        defaults={"text_field": "text", "id_field": "chunk"},
    )
    assert options == AdapterOptions(text_field="body", id_field="chunk", hashed_fields=["t"])
    assert own == {"generative": "block"}


def test_options_an_adapter_does_not_take_stay_with_its_own_and_defaults_do_not_reach_it() -> None:
    options, own = split_table(
        {"text_field": "body"}, ChromaFormat.options_not_taken, {"text_field": "x"}
    )
    assert options == DEFAULT_OPTIONS
    assert own == {"text_field": "body"}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_the_settings_refuse_an_option_named_options(name: str) -> None:
    with pytest.raises(ValueError, match=rf"formats\.{name}: unknown option 'options'"):
        build_format_table({name: {"options": {}}}, {}, text_field="text", id_field=None)


def test_a_generic_format_takes_only_the_released_fields() -> None:
    table = {"adapter": "generic", "routes": ["POST /search"], "hits": "$.hits[*]"}
    table |= {"id": "id", "text": "text"}
    built = build_format_table(
        {"mine": {**table, "releasable_fields": ["lang"]}}, {}, text_field="t", id_field="i"
    )
    assert built.formats[0].name == "mine"
    with pytest.raises(ValueError, match=r"formats\.mine: unknown option 'text_field'"):
        build_format_table(
            {"mine": {**table, "text_field": "t"}}, {}, text_field="t", id_field=None
        )


def test_where_a_hit_keeps_its_text_and_chunk_id() -> None:
    own = Field(("id",), "point id")
    options = AdapterOptions(text_field="body")
    assert options.text_at("payload field", "payload") == Field(
        ("body",), "payload field 'body'", "payload"
    )
    assert options.id_at(own, "payload field", "payload") is own
    chunk = AdapterOptions(id_field="chunk").id_at(own, "property")
    assert chunk == Field(("chunk",), "property 'chunk'", None)
