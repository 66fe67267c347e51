"""The chunk-record field table in docs/architecture.md says what the loader requires.

Checked against the loader itself: a record without a field the table marks
"required" is refused, naming the field, and a record without any other field
is accepted.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.store.loader import RecordsInvalid, parse_record
from tests.fixtures.records import record_dict

TABLE = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
ROW = re.compile(r"^\| `(\w+)` \| ([^|]*) \|", re.MULTILINE)
START = TABLE.index("| field | type | rule |")
FIELDS = {
    name: "required" in kind
    for name, kind in ROW.findall(TABLE[START : TABLE.index("Also rejected", START)])
}


def test_the_table_lists_the_record_fields() -> None:
    assert set(record_dict("c-1")) - {"text"} <= set(FIELDS)
    assert sum(FIELDS.values()) == 7


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_required_in_the_table_is_required_by_the_loader(name: str) -> None:
    record = record_dict("c-1")
    record.pop(name, None)
    try:
        parse_record(record)
    except (RecordsInvalid, ValueError) as error:
        refused = f'field "{name}"' in str(error)
    else:
        refused = False
    assert refused is FIELDS[name], f"{name}: the table says required={FIELDS[name]}"
