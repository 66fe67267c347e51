"""What the format adapter tests share: hypothesis settings, JSON strategies, and the
contract cases every adapter's body builder provides.

``tests/test_format_contract.py`` runs one property suite against every
``FormatCase``; each ``tests/fixtures/<database>_bodies.py`` makes the cases
of its adapter. The per-adapter test modules use the same settings and
strategies for their database-specific properties.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats.base import ResponseAdapter, ResponseFormat
from sidecar.formats.options import split_table

AdapterT = TypeVar("AdapterT", bound=ResponseAdapter[Any])


def adapter(factory: type[AdapterT], /, **table: Any) -> AdapterT:
    """The adapter ``factory`` builds from options as its ``[formats.<name>]`` table
    spells them (``AdapterOptions`` and its own options alike)."""
    options, own = split_table(table, factory.options_not_taken)
    return cast(Callable[..., AdapterT], factory)(options, **own)


PROPERTIES = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# For properties whose every example is slow (a client library reads the body).
SLOW_PROPERTIES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)

Json = Any  # a decoded JSON value


@dataclass(frozen=True, slots=True)
class Hit:
    """One hit as the contract suite sees it, whatever the database.

    ``chunk_id`` is a decimal number (every database can take it as its hit
    id); ``ordinal`` is unique within a body, for database ids that are not
    the chunk id (when the adapter reads ``id_field``). ``replaced`` is the
    chunk id a substitute took the place of: builders mark it as the adapter
    does.
    """

    chunk_id: str
    text: str
    score: float
    ordinal: int
    replaced: str | None = None


Batches = Sequence[Sequence[Hit]]


@dataclass(frozen=True, slots=True)
class Shape:
    """A filtered route and how many sub-results (and hits in each) its bodies have."""

    name: str
    route: Route
    batches: tuple[int, int] = (1, 1)
    hits: tuple[int, int] = (0, 5)


@dataclass(frozen=True)
class FormatCase:
    """One adapter configuration under the contract, with its body builder.

    ``build(shape, batches)`` is the decoded body the database sends for
    ``batches`` (one list of hits per sub-result); built from the kept hits
    only, it is what rendering must give. ``marks`` says whether substitutes
    carry ``SUBSTITUTED_FOR``. ``wrappers`` put an arbitrary JSON value where
    the adapter looks for hits; ``seeds`` are other valid bodies to mutate.
    ``renders_all_unchanged``: any body it parses renders unchanged when every
    hit is kept (the adapter removes nothing else). ``releases_all_kept``:
    every kept hit is sent (no hit sits in another one, a group or a
    reference, that can go). ``empty_may_not_parse``: a render that releases
    nothing may not parse again (Qdrant drops the ``result`` of a rejected
    single point).
    """

    label: str
    format: ResponseFormat
    shapes: Sequence[Shape]
    build: Callable[[Shape, Batches], Json]
    unhandled: Route
    marks: bool = True
    wrappers: Sequence[Callable[[Json], Json]] = ()
    seeds: Sequence[tuple[Route, Json]] = field(default_factory=tuple)
    renders_all_unchanged: bool = True
    releases_all_kept: bool = True
    empty_may_not_parse: bool = False

    def __str__(self) -> str:
        return self.label


@st.composite
def batches(draw: st.DrawFn, shape: Shape) -> list[list[Hit]]:
    """Hits for ``shape``: unique chunk ids and ordinals, any text and score."""
    count = draw(st.integers(*shape.batches))
    sizes = [draw(st.integers(*shape.hits)) for _ in range(count)]
    ids = draw(
        st.lists(
            st.integers(min_value=0, max_value=2**53).map(str),
            min_size=sum(sizes),
            max_size=sum(sizes),
            unique=True,
        )
    )
    out: list[list[Hit]] = []
    ordinal = 0
    for size in sizes:
        batch = []
        for _ in range(size):
            text = draw(st.text(max_size=12))
            score = draw(st.floats(min_value=0, max_value=1e6, allow_nan=False, width=32))
            batch.append(Hit(ids[ordinal], text, score, ordinal))
            ordinal += 1
        out.append(batch)
    return out


def paths(value: Json, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a decoded body, the root first."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, value: Json) -> Json:
    """``value`` with one place replaced by arbitrary JSON, removed, or given a sibling."""
    path = draw(st.sampled_from(paths(value)))
    new = draw(json_values)
    if not path:
        return new
    action = draw(st.sampled_from(["replace", "delete", "insert"]))
    return _changed(value, path, action, new)


def _changed(value: Json, path: tuple[Any, ...], action: str, new: Json) -> Json:
    head, *rest = path
    if rest:
        child = _changed(value[head], tuple(rest), action, new)
    elif action == "delete":
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k != head}
        return value[:head] + value[head + 1 :]
    elif action == "insert" and isinstance(value, list):
        return [*value[:head], new, *value[head:]]
    else:
        child = new
    if isinstance(value, dict):
        return {**value, head: child}
    return [*value[:head], child, *value[head + 1 :]]
