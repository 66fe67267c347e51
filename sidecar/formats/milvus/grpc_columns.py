"""Columns of Milvus search and query results (``schema.FieldData``): rows, values, cuts.

Milvus returns result rows column by column: one ``FieldData`` per output
field, each with one value per row, in row order. A nullable column carries
``valid_data``, one flag per row. Scalar columns keep a slot for a null row
(a placeholder value); vector columns store only the valid rows, and pymilvus
reads them so. Both layouts are accepted for every column and told apart by
the number of slots: they differ whenever a row is null, and when no row is
null they are the same.

``Column`` reads a column once (its data kind, its slots, which slot holds
each row) and cuts it to some of its rows: a new ``FieldData`` built from the
known fields of the old one, in the same layout. A column the gate cannot
count (a data kind a newer server added, a vector width that does not divide
its data, a field the gate's proto lacks) raises MalformedBody as soon as it
is read, so it never goes out uncut.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final

import orjson
from google.protobuf.descriptor import FieldDescriptor

from sidecar.formats import grpc_messages
from sidecar.formats.base import MalformedBody

FIELD_DATA: Final = "milvus.proto.schema.FieldData"
# Dense vector kinds held as bytes, and the bytes per row for a dimension.
_BYTES_PER_ROW: Final[Mapping[str, Callable[[int], int]]] = {
    "binary_vector": lambda dim: dim // 8 if dim % 8 == 0 else 0,
    "float16_vector": lambda dim: 2 * dim,
    "bfloat16_vector": lambda dim: 2 * dim,
    "int8_vector": lambda dim: dim,
}
_INTEGER: Final = re.compile(r"-?[0-9]+")
# A sparse vector row: (uint32 index, float32 value) pairs, little-endian.
_SPARSE_PAIR: Final = struct.Struct("<If")


def _zero(container_holder: Any) -> Any:
    """The placeholder for a null row in the ``data`` list of a scalar array message."""
    field = container_holder.DESCRIPTOR.fields_by_name["data"]
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return grpc_messages.message_class(field.message_type.full_name)()
    if field.type == FieldDescriptor.TYPE_BOOL:
        return False
    if field.type == FieldDescriptor.TYPE_STRING:
        return ""
    if field.type == FieldDescriptor.TYPE_BYTES:
        return b""
    return 0


class Column:
    """One result column, read: ``rows`` values, and where each one is kept."""

    __slots__ = ("_kind", "_part", "_slot", "_subcolumns", "_valid", "_width", "data", "rows")

    def __init__(self, data: Any) -> None:
        """Read ``data`` (a ``FieldData``); MalformedBody if it cannot be counted."""
        if grpc_messages.has_unknown_fields(data):
            raise MalformedBody("a result column holds a field the gate does not know")
        self.data = data
        self._part: str | None = data.WhichOneof("field")
        self._kind: str | None = None
        self._width = 0
        self._subcolumns: tuple[Column, ...] = ()
        slots = self._count_slots()
        self._valid: tuple[bool, ...] = tuple(data.valid_data)
        # _slot[row] is the slot of each row in the compact layout; None when
        # every row has a slot of its own (no flags, or a placeholder per null).
        self._slot: tuple[int | None, ...] | None = None
        if not self._valid or slots == len(self._valid):
            self.rows = slots
        elif slots == sum(self._valid):
            self.rows = len(self._valid)
            positions: list[int | None] = []
            taken = 0
            for valid in self._valid:
                positions.append(taken if valid else None)
                taken += valid
            self._slot = tuple(positions)
        else:
            raise MalformedBody("a result column's values do not match its validity flags")

    @property
    def name(self) -> str:
        """The field the column holds."""
        return str(self.data.field_name)

    @property
    def nullable(self) -> bool:
        """True when a row can be sent as null (the column has validity flags)."""
        return bool(self._valid) and self._part != "struct_arrays"

    @property
    def is_json(self) -> bool:
        """True for a column of JSON documents (a JSON field, or the dynamic field)."""
        return self._part == "scalars" and self._kind == "json_data"

    @property
    def is_dynamic(self) -> bool:
        """True for the dynamic field (``$meta``): a JSON object of undeclared fields per row."""
        return bool(self.data.is_dynamic)

    def _count_slots(self) -> int:
        data = self.data
        if self._part == "scalars":
            self._kind = data.scalars.WhichOneof("data")
            if self._kind is None:
                return 0
            return len(getattr(data.scalars, self._kind).data)
        if self._part == "vectors":
            return self._count_vectors(data.vectors)
        if self._part == "struct_arrays":
            self._subcolumns = tuple(Column(field) for field in data.struct_arrays.fields)
            counts = {column.rows for column in self._subcolumns}
            if len(counts) > 1:
                raise MalformedBody("the fields of a struct column differ in length")
            return counts.pop() if counts else 0
        return 0

    def _count_vectors(self, vectors: Any) -> int:
        self._kind = kind = vectors.WhichOneof("data")
        dim = vectors.dim
        if kind is None:
            return 0
        if kind == "sparse_float_vector":
            return len(vectors.sparse_float_vector.contents)
        if kind == "vector_array":
            return len(vectors.vector_array.data)
        if kind == "float_vector":
            size, self._width = len(vectors.float_vector.data), dim
        else:
            size, self._width = len(getattr(vectors, kind)), _BYTES_PER_ROW[kind](dim)
        if size == 0:
            return 0
        if self._width <= 0 or size % self._width:
            raise MalformedBody("a vector column's data does not divide into rows")
        return size // self._width

    def _slot_of(self, row: int) -> int | None:
        """The slot holding ``row``; None for a null row that has no slot."""
        return row if self._slot is None else self._slot[row]

    def value(self, row: int) -> Any:
        """The value of ``row`` as a JSON-like Python value (None for a null row).

        JSON documents are decoded (ValueError if they do not decode), arrays
        are lists, float vectors lists of floats; other vectors and binary
        values are ``bytes``, which have no canonical form.
        """
        if self._valid and not self._valid[row]:
            return None
        slot = self._slot_of(row)
        if slot is None:
            return None
        data = self.data
        if self._part == "scalars" and self._kind is not None:
            value = getattr(data.scalars, self._kind).data[slot]
            if self._kind == "json_data":
                return orjson.loads(value)
            if self._kind == "array_data":
                kind = value.WhichOneof("data")
                return [] if kind is None else list(getattr(value, kind).data)
            return value
        if self._part == "vectors" and self._kind is not None:
            if self._kind == "float_vector":
                start = slot * self._width
                return list(data.vectors.float_vector.data[start : start + self._width])
            if self._kind in _BYTES_PER_ROW:
                start = slot * self._width
                return bytes(getattr(data.vectors, self._kind)[start : start + self._width])
        raise ValueError("this column's values have no JSON form")

    def cut(
        self,
        rows: Sequence[int],
        nulled: Collection[int] = (),
        transform: Callable[[int, Any], Any] | None = None,
    ) -> Any:
        """A new ``FieldData`` with only ``rows`` (in that order), in the same layout.

        Rows in ``nulled`` go out as null (the caller checks ``nullable``
        first). A null row's slot, where it has one, goes out as a
        placeholder, whatever the database put there. ``transform`` takes a
        row and its decoded JSON document and gives the document that goes out
        (JSON columns only); MalformedBody if a document does not decode.
        Only the known fields of the column are copied.
        """
        data = self.data
        out = grpc_messages.message_class(FIELD_DATA)(
            type=data.type,
            field_name=data.field_name,
            field_id=data.field_id,
            is_dynamic=data.is_dynamic,
        )
        if self._valid:
            out.valid_data.extend(self._valid[row] and row not in nulled for row in rows)
        # (row, slot) of every slot that goes out; slot None: a placeholder.
        slots: list[tuple[int, int | None]] = []
        for row in rows:
            valid = not self._valid or (self._valid[row] and row not in nulled)
            if self._slot is None:
                slots.append((row, row if valid else None))
            elif valid:
                slots.append((row, self._slot[row]))
        if self._part == "scalars":
            self._cut_scalars(out, slots, transform)
        elif self._part == "vectors":
            self._cut_vectors(out, [slot for _, slot in slots])
        elif self._part == "struct_arrays":
            # A struct row's fields have no placeholder: a null row keeps its slot.
            sub_rows = [row if slot is None else slot for row, slot in slots]
            out.struct_arrays.SetInParent()
            out.struct_arrays.fields.extend(column.cut(sub_rows) for column in self._subcolumns)
        return out

    def _cut_scalars(
        self,
        out: Any,
        slots: list[tuple[int, int | None]],
        transform: Callable[[int, Any], Any] | None,
    ) -> None:
        out.scalars.SetInParent()
        if self._kind is None:
            return
        source = getattr(self.data.scalars, self._kind)
        target = getattr(out.scalars, self._kind)
        target.SetInParent()
        if self._kind == "array_data":
            target.element_type = source.element_type
        values = source.data
        zero = _zero(source)
        if transform is None or self._kind != "json_data":
            target.data.extend([zero if slot is None else values[slot] for _, slot in slots])
            return
        try:
            documents = [
                None if slot is None else transform(row, orjson.loads(values[slot]))
                for row, slot in slots
            ]
        except orjson.JSONDecodeError:
            raise MalformedBody("a JSON column holds a document that does not decode") from None
        target.data.extend(
            zero if document is None and slot is None else orjson.dumps(document)
            for document, (_, slot) in zip(documents, slots, strict=True)
        )

    def _cut_vectors(self, out: Any, slots: list[int | None]) -> None:
        source = self.data.vectors
        vectors = out.vectors
        vectors.SetInParent()
        vectors.dim = source.dim
        kind, width = self._kind, self._width
        if kind is None:
            return
        if kind == "float_vector":
            floats = source.float_vector.data
            vectors.float_vector.SetInParent()
            for slot in slots:
                if slot is None:
                    vectors.float_vector.data.extend([0.0] * width)
                else:
                    vectors.float_vector.data.extend(floats[slot * width : (slot + 1) * width])
        elif kind in _BYTES_PER_ROW:
            raw = getattr(source, kind)
            setattr(
                vectors,
                kind,
                b"".join(
                    bytes(width) if slot is None else raw[slot * width : (slot + 1) * width]
                    for slot in slots
                ),
            )
        elif kind == "sparse_float_vector":
            contents = [
                b"" if slot is None else source.sparse_float_vector.contents[slot] for slot in slots
            ]
            vectors.sparse_float_vector.SetInParent()
            vectors.sparse_float_vector.contents.extend(contents)
            # The dimension of the rows that go out, not of every row the search found.
            vectors.sparse_float_vector.dim = _sparse_dim(contents)
        else:  # vector_array
            array = source.vector_array
            vectors.vector_array.SetInParent()
            vectors.vector_array.dim = array.dim
            vectors.vector_array.element_type = array.element_type
            empty = grpc_messages.message_class("milvus.proto.schema.VectorField")()
            vectors.vector_array.data.extend(
                empty if slot is None else array.data[slot] for slot in slots
            )


def _sparse_dim(contents: Sequence[bytes]) -> int:
    """One past the largest index of the sparse rows ``contents``; 0 for none."""
    largest = -1
    for row in contents:
        if len(row) % _SPARSE_PAIR.size:
            raise MalformedBody("a sparse vector row is not index-value pairs")
        for index, _ in _SPARSE_PAIR.iter_unpack(row):
            largest = max(largest, index)
    return largest + 1


def place(column: Any, index: int, value: str | int) -> None:
    """Put ``value`` (a substitute's text or id) in row ``index`` of a cut ``column``.

    Only string and integer scalar columns hold text and ids; a null row
    becomes valid. Raises MalformedBody where the value cannot go.
    """
    kind = column.scalars.WhichOneof("data") if column.WhichOneof("field") == "scalars" else None
    if kind not in ("string_data", "long_data", "int_data"):
        raise MalformedBody("a replacement cannot be placed in this column")
    values = getattr(column.scalars, kind).data
    flags = column.valid_data
    if flags and len(values) != len(flags):
        raise MalformedBody("a replacement cannot be placed in this column")
    if kind == "string_data":
        values[index] = str(value)
    elif isinstance(value, int) or (value.isascii() and _INTEGER.fullmatch(value)):
        # An integer key column holds a substitute whose id is one.
        values[index] = int(value)
    else:
        raise MalformedBody("a replacement id is not an integer, as the key column's are")
    if flags:
        flags[index] = True
