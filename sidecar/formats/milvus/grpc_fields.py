"""The fields of the rows of a Milvus search or query reply: read, and cut to what goes out.

A reply holds its rows' fields column by column (``fields_data``), one
``FieldData`` per output field (``grpc_columns.Column``), and the
dynamic field ``$meta``: a JSON object per row holding the fields the schema
does not declare. A field is a column of that name, or else a key of the
dynamic field's object. ``ResultFields`` reads a row's chunk id, text and
hashed fields from them for the candidate, and cuts the columns that go out
to the rows that go out.

Which columns go out, and what a substitute changes in them, is
``grpc``'s to say (its module docstring): the id and text fields and
the declared paths, a dotted path into a JSON field or into the dynamic
field releasing only what it names (the documents are projected onto the
paths). A reply with two columns of one field, or two dynamic fields, is
refused: a client could read either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from sidecar.core.hits import Replacement
from sidecar.formats.base import MalformedBody
from sidecar.formats.hits import (
    FieldPath,
    Found,
    Hits,
    project_fields,
    usable_id,
    usable_text,
    without_declared,
)
from sidecar.formats.milvus.grpc_columns import Column, place
from sidecar.formats.options import AdapterOptions

# A field the reply does not hold (None is a null it holds).
_ABSENT: Final = object()


class ResultFields:
    """The ``fields_data`` of a reply: how each row's fields are read, and which
    columns go out (whole, or JSON documents projected onto some paths)."""

    def __init__(self, fields_data: Sequence[Any], options: AdapterOptions, primary: str) -> None:
        """Read the columns ``fields_data`` for ``options``; ``primary`` is the reply's
        primary key field (its ``primary_field_name``). MalformedBody for two
        dynamic fields, two columns of one field, or a dynamic field that holds
        no JSON."""
        self._options = options
        # The id as a field: ``id_field``, or the primary key column (a query's id).
        self.id_name = options.id_field or primary
        paths: list[FieldPath] = [(options.text_field,)]
        if self.id_name:
            paths.append((self.id_name,))
        paths += [*options.fields.hashed, *options.fields.releasable]
        self._declared = {*options.fields.hashed, *options.fields.releasable}
        self.whole = {path[0] for path in paths if len(path) == 1}
        dynamic = [data for data in fields_data if data.is_dynamic]
        if len(dynamic) > 1:
            raise MalformedBody("a reply has two dynamic fields")
        self._named = {data.field_name: data for data in fields_data if not data.is_dynamic}
        if len(self._named) + len(dynamic) != len(fields_data):
            # Which of two same-named columns would a client read?
            raise MalformedBody("two result columns hold the same field")
        self._columns: dict[str, Column] = {}
        self.dynamic: Column | None = None
        self._dynamic_paths: tuple[FieldPath, ...] = ()
        # (column, paths into its JSON documents; None: the whole column), in reply order.
        self.released: list[tuple[Column, tuple[FieldPath, ...] | None]] = []
        for data in fields_data:
            if data.is_dynamic:
                inner = _outermost(tuple(path for path in paths if path[0] not in self._named))
                if inner:
                    self.dynamic = Column(data)
                    if not self.dynamic.is_json:
                        raise MalformedBody("the dynamic field is not a JSON column")
                    self._dynamic_paths = inner
                    self.released.append((self.dynamic, inner))
                continue
            name = data.field_name
            subpaths = tuple(path[1:] for path in paths if path[0] == name)
            if not subpaths:
                continue
            column = self._column(name)
            if () in subpaths:
                self.released.append((column, None))
            elif column.is_json:
                self.released.append((column, _outermost(subpaths)))
        self._documents: dict[int, Any] = {}

    def _column(self, name: str) -> Column:
        column = self._columns.get(name)
        if column is None:
            column = self._columns[name] = Column(self._named[name])
        return column

    def columns(self) -> list[Column]:
        """Every column read or released, to check that they hold one value per row."""
        used = [column for column, _ in self.released]
        return used + [c for c in self._columns.values() if all(c is not u for u in used)]

    def names(self) -> set[str]:
        """The fields that go out (columns, and keys of the dynamic field's object)."""
        out = {column.name for column, _ in self.released if not column.is_dynamic}
        out.update(path[0] for path in self._dynamic_paths)
        return out

    def get(self, row: int, name: str, label: str) -> tuple[Any, str | None]:
        """``(value, None)`` of field ``name`` in ``row``: ``_ABSENT`` when the reply
        does not hold the field, None when it is null; or ``(None, problem)``."""
        try:
            if name in self._named:
                return self._column(name).value(row), None
            if self.dynamic is None:
                return _ABSENT, None
            document = self._document(row)
        except ValueError:
            return None, f"{label} has no JSON form"
        if document is None:
            return _ABSENT, None
        if not isinstance(document, dict):
            return None, "the dynamic field is not a JSON object"
        return document.get(name, _ABSENT), None

    def _document(self, row: int) -> Any:
        if row not in self._documents:
            assert self.dynamic is not None
            self._documents[row] = self.dynamic.value(row)
        return self._documents[row]

    def read(self, hits: Hits, row: int, chunk_id: Found | None) -> None:
        """Register ``row`` as the next candidate; ``chunk_id`` when the reply holds it
        beside the fields (a search's ``ids``)."""
        options = self._options
        if chunk_id is None:
            if not self.id_name:
                chunk_id = (None, "the reply names no primary key field")
            else:
                label = f"field {self.id_name!r}"
                value, problem = self.get(row, self.id_name, label)
                chunk_id = (None, problem) if problem else usable_id(_none(value), label)
        label = f"field {options.text_field!r}"
        value, problem = self.get(row, options.text_field, label)
        text = (None, problem) if problem else usable_text(_none(value), label)
        hashed: Found = (None, None)
        if options.fields.hashed:
            holder: dict[str, Any] = {}
            for key in dict.fromkeys(path[0] for path in options.fields.hashed):
                value, problem = self.get(row, key, f"field {key!r}")
                if problem:
                    hashed = (None, "hashed fields have no canonical form")
                    break
                if value is not _ABSENT:
                    # A null is a value, as the REST API's JSON writes it.
                    holder[key] = value
            else:
                hashed = hits.hashed(holder)
        hits.add_found(chunk_id, text, hashed)

    def cut(self, rows: Sequence[int], replaced: Mapping[int, Replacement]) -> list[Any]:
        """The released columns with only ``rows``; ``replaced`` maps an index of
        ``rows`` to the substitute that takes that row's place."""
        options = self._options
        by_row = {rows[index]: replacement for index, replacement in replaced.items()}
        out = []
        for column, paths in self.released:
            if paths is None:
                role = column.name
                own = role in (options.text_field, self.id_name)
                # A substitute's declared fields describe the document it replaced.
                declared = not own and (role,) in self._declared and column.nullable
                cut = column.cut(rows, set(by_row) if declared else ())
                for index, replacement in replaced.items():
                    if role == options.text_field:
                        place(cut, index, replacement.text)
                    elif role == self.id_name:
                        place(cut, index, replacement.chunk_id)
                out.append(cut)
            else:
                out.append(column.cut(rows, transform=self._projection(column, paths, by_row)))
        return out

    def _projection(
        self,
        column: Column,
        paths: tuple[FieldPath, ...],
        replaced: Mapping[int, Replacement],
    ) -> Callable[[int, Any], Any]:
        """What one JSON document of ``column`` becomes: projected onto ``paths``, and
        for a substitute without its declared fields, with its text and id."""
        options = self._options
        own = {
            (options.text_field,): "text",
            **({(options.id_field,): "id"} if options.id_field and column.is_dynamic else {}),
        }
        prefix = () if column.is_dynamic else (column.name,)
        declared = {path for path in self._declared if path[: len(prefix)] == prefix}

        def transform(row: int, document: Any) -> Any:
            projected = project_fields(document, paths)
            replacement = replaced.get(row)
            if replacement is None or not isinstance(projected, dict):
                return projected
            projected = without_declared(projected, [path[len(prefix) :] for path in declared])
            if column.is_dynamic:
                for path, what in own.items():
                    if path in paths:
                        projected[path[0]] = (
                            replacement.text if what == "text" else replacement.chunk_id
                        )
            return projected

        return transform


def _none(value: Any) -> Any:
    return None if value is _ABSENT else value


def _outermost(paths: tuple[FieldPath, ...]) -> tuple[FieldPath, ...]:
    """``paths`` without those inside another one (which goes out whole with it)."""
    return tuple(
        path
        for path in dict.fromkeys(paths)
        if not any(other != path and path[: len(other)] == other for other in paths)
    )
