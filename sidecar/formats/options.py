"""The options every adapter takes, checked once: ``AdapterOptions``.

The ``[formats.<name>]`` table of a built-in adapter holds these beside the
adapter's own options (Weaviate's ``generative``, Elasticsearch's ``total``
...); the registry builds one ``AdapterOptions`` from the options an adapter
takes (``ResponseAdapter.options_taken``) and the configured defaults, and
passes the rest to the adapter as keywords.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final

from sidecar.formats.hits import Field, ReleasedFields


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """Which field holds a hit's text and chunk id, and which other fields go out.

    ``text_field`` and ``id_field`` name the fields of a hit's free-form
    object (payload, ``_source``, properties, metadata) holding the text and
    the chunk id; ``id_field`` None reads the database's own id. An adapter
    whose text has a place of its own (Chroma's documents) does not take
    ``text_field``. ``hashed_fields`` and ``releasable_fields`` name the
    fields (dotted paths) that go out beside the text and id: checked against
    the chunk record's ``payload_sha256``, or unverified; every other field
    is dropped. Raises ValueError naming the option that is wrong.
    """

    text_field: str = "text"
    id_field: str | None = None
    hashed_fields: Sequence[str] | None = None
    releasable_fields: Sequence[str] | None = None
    fields: ReleasedFields = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text_field_option(self.text_field)
        id_field_option(self.id_field)
        released = ReleasedFields.from_options(self.hashed_fields, self.releasable_fields)
        # Frozen: the checked form is set once, here.
        object.__setattr__(self, "fields", released)

    def text_at(self, noun: str, within: str | None = None) -> Field:
        """Where a hit keeps its text: ``text_field`` of its object ``within`` (None: of
        the hit itself), named in problems as ``noun`` and the field's name."""
        return Field((self.text_field,), f"{noun} {self.text_field!r}", within)

    def id_at(self, own: Field, noun: str, within: str | None = None) -> Field:
        """Where a hit keeps its chunk id: the database's own id ``own``, unless
        ``id_field`` names a field, found and named as ``text_at`` finds the text."""
        if self.id_field is None:
            return own
        return Field((self.id_field,), f"{noun} {self.id_field!r}", within)

    def distinct_id_field(self) -> str | None:
        """``id_field``, refused when it names the text field: for adapters that read
        both from one object, where the chunk id would be the text."""
        return id_field_option(self.id_field, self.text_field)


def split_table(
    table: Mapping[str, Any],
    not_taken: Collection[str] = frozenset(),
    defaults: Mapping[str, Any] | None = None,
) -> tuple[AdapterOptions, dict[str, Any]]:
    """The ``AdapterOptions`` of a ``[formats.<name>]`` table, over ``defaults``, and the
    table's other options (the adapter's own, or unknown).

    ``not_taken`` are the options the adapter does not read: they stay with
    the others, so that the adapter refuses them as unknown. Raises
    ValueError naming an option that is wrong.
    """
    taken = OPTION_NAMES - set(not_taken)
    chosen = {k: v for k, v in (defaults or {}).items() if k in taken}
    chosen.update((k, v) for k, v in table.items() if k in taken)
    rest = {k: v for k, v in table.items() if k not in taken}
    return AdapterOptions(**chosen), rest


def text_field_option(value: object) -> str:
    """The ``text_field`` option, checked: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError("text_field must be a non-empty string")
    return value


def id_field_option(value: object, text_field: str | None = None) -> str | None:
    """The ``id_field`` option, checked: a non-empty string, or None for the hit's own id.

    With ``text_field``, for adapters that keep both in the same object, the
    two must differ.
    """
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError("id_field must be a non-empty string, or unset for the hit's own id")
    if value is not None and value == text_field:
        raise ValueError("id_field must differ from text_field")
    return value


# Built last: the checks above run when the defaults are built.
DEFAULT_OPTIONS: Final = AdapterOptions()
# The names of the options ``AdapterOptions`` holds, as the settings spell them.
OPTION_NAMES: Final = frozenset(f.name for f in fields(AdapterOptions) if f.init)
