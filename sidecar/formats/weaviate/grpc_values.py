"""Weaviate's gRPC property values: read, projected, hashed and written for a substitute.

Over gRPC an object's properties are a ``Properties`` message (``fields``: a
map of typed ``Value``s, objects nested as ``object_value``), not the JSON the
REST adapter reads through a ``HitLayout``. Everything the gRPC adapter does
with property values is here: finding one by dotted path, reading the chunk id
and text, writing a value the way Weaviate's REST API writes it in JSON (the
form a chunk record's ``payload_sha256`` is computed over), keeping only the
released paths, putting a substitute's text and id in place, and the names a
value stands for when the search groups by its property.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, Final

from sidecar.core.hits import Replacement
from sidecar.formats.hits import FieldPath

_TEXT_KINDS: Final = frozenset({"text_value", "string_value"})
_ID_KINDS: Final = frozenset({"text_value", "string_value", "uuid_value", "int_value"})
# Kinds whose value a group name can be (Weaviate groups by text, uuid, date, int).
_NAME_KINDS: Final = frozenset({"text_value", "string_value", "uuid_value", "date_value"})


def property_id(values: Any, name: str) -> tuple[str | None, str | None]:
    """``(id, None)``: the non-empty string or integer property ``name`` of ``values``
    (a Properties, or None), as a string; ``(None, problem)`` otherwise."""
    found, problem = _typed(values, name, _ID_KINDS, "a string or integer")
    if problem is not None:
        return None, problem
    chunk_id = str(found)
    return (chunk_id, None) if chunk_id else (None, f"property {name!r} is empty")


def property_text(values: Any, name: str) -> tuple[str | None, str | None]:
    """``(text, None)``: the string property ``name`` of ``values`` (a Properties, or
    None); ``(None, problem)`` otherwise."""
    found, problem = _typed(values, name, _TEXT_KINDS, "a string")
    return (None, problem) if problem is not None else (found, None)


def _typed(values: Any, name: str, kinds: frozenset[str], expected: str) -> tuple[Any, str | None]:
    """The value of the top-level property ``name`` when it is one of ``kinds``, or the
    problem (``expected`` says what it should have been)."""
    label = f"property {name!r}"
    value = values.fields.get(name) if values is not None else None
    kind = None if value is None else value.WhichOneof("kind")
    if kind is None:
        return None, f"{label} missing"
    if kind not in kinds:
        return None, f"{label} is not {expected}"
    return getattr(value, kind), None


def found(values: Any, paths: Sequence[FieldPath]) -> Iterator[tuple[FieldPath, Any]]:
    """The (path, Value) of each of ``paths`` that ``values`` (a Properties) has."""
    for path in paths:
        value = _at(values, path)
        if value is not None:
            yield path, value


def _at(values: Any, path: FieldPath) -> Any:
    """The Value at ``path`` of a Properties, through object values; None when absent."""
    value = None
    for key in path:
        if values is None or key not in values.fields:
            return None
        value = values.fields[key]
        values = value.object_value if value.WhichOneof("kind") == "object_value" else None
    return value


def projected(values: Any, paths: Sequence[FieldPath]) -> Any:
    """The Properties with only the values at ``paths``, nested as they were."""
    if all(len(path) == 1 for path in paths) and values.fields.keys() <= {p[0] for p in paths}:
        return values
    out = type(values)()
    for path, value in found(values, paths):
        target = out
        for key in path[:-1]:
            target = target.fields[key].object_value
        target.fields[path[-1]].CopyFrom(value)
    return out


def plain(value: Any) -> Any:
    """A property Value as Weaviate's REST API writes it in JSON, for the payload hash.

    Numbers without a fraction are integers (Go writes 3.0 as ``3``), geo
    coordinates keep float32 precision; raises ValueError for what has no
    JSON form (an unset Value, packed arrays of the wrong length).
    """
    kind = value.WhichOneof("kind")
    if kind in ("text_value", "string_value", "date_value", "uuid_value", "blob_value"):
        return getattr(value, kind)
    if kind == "number_value":
        return _number(value.number_value)
    if kind in ("int_value", "bool_value"):
        return getattr(value, kind)
    if kind == "null_value":
        return None
    if kind == "object_value":
        return _plain_properties(value.object_value)
    if kind == "list_value":
        return _plain_list(value.list_value)
    if kind == "geo_value":
        geo = value.geo_value
        return {"latitude": _float32(geo.latitude), "longitude": _float32(geo.longitude)}
    if kind == "phone_value":
        phone = value.phone_value
        # REST's camelCase keys, empty values left out as Go's omitempty does.
        keys = (
            ("countryCode", "country_code"),
            ("defaultCountry", "default_country"),
            ("input", "input"),
            ("internationalFormatted", "international_formatted"),
            ("national", "national"),
            ("nationalFormatted", "national_formatted"),
            ("valid", "valid"),
        )
        return {rest: getattr(phone, name) for rest, name in keys if getattr(phone, name)}
    raise ValueError("a property value of no known kind")


def _plain_properties(properties: Any) -> dict[str, Any]:
    return {key: plain(item) for key, item in properties.fields.items()}


def _plain_list(value: Any) -> list[Any]:
    kind = value.WhichOneof("kind")
    if kind is None:
        # Servers before 1.25 send a list as Values.
        return [plain(item) for item in value.values]
    if kind == "number_values":
        return [_number(n) for n in _unpacked("d", value.number_values.values)]
    if kind == "int_values":
        return list(_unpacked("q", value.int_values.values))
    if kind == "object_values":
        return [_plain_properties(item) for item in value.object_values.values]
    return list(getattr(value, kind).values)


def _unpacked(code: str, data: bytes) -> tuple[Any, ...]:
    if len(data) % 8:
        raise ValueError("a packed array is not a whole number of 8-byte values")
    return struct.unpack(f"<{len(data) // 8}{code}", data)


def _number(value: float) -> float | int:
    # Go's encoding/json writes whole float64s below 1e21 without a fraction.
    if value.is_integer() and abs(value) < 1e21:
        return int(value)
    return value


def _float32(value: float) -> float:
    """The shortest decimal that is the same float32, as Go writes a float32 in JSON."""
    packed = struct.pack("<f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("<f", candidate) == packed:
            return candidate
    return value


def substitute_properties(
    out: Any, source: Any, replacement: Replacement, text_field: str, id_field: str | None
) -> None:
    """Put the substitute's text (and id property) where the object keeps them.

    ``out`` is the released Properties, ``source`` the object's own: the id
    keeps the kind the object's id property had where the substitute's id
    fits it (an integer, a UUID), and is text otherwise.
    """
    text = out.fields[text_field]
    text.Clear()
    text.text_value = replacement.text
    if id_field is None:
        return
    kind = source.fields[id_field].WhichOneof("kind") if id_field in source.fields else None
    value = out.fields[id_field]
    value.Clear()
    new_id = replacement.chunk_id
    if kind == "int_value" and new_id.isascii() and new_id.lstrip("-").isdigit():
        value.int_value = int(new_id)
    elif kind == "uuid_value" and _is_uuid(new_id):
        value.uuid_value = str(uuid.UUID(new_id))
    else:
        value.text_value = new_id


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def group_names(value: Any) -> Iterator[str]:
    """The group names a property Value can stand for (an array groups by each element)."""
    kind = value.WhichOneof("kind")
    if kind in _NAME_KINDS:
        yield getattr(value, kind)
    elif kind == "int_value":
        yield str(value.int_value)
    elif kind == "list_value":
        array = value.list_value.WhichOneof("kind")
        if array in ("text_values", "uuid_values", "date_values"):
            yield from getattr(value.list_value, array).values
