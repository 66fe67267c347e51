"""Fuzz targets for the response adapters (``sidecar/formats/registry.py`` BUILT_IN and generic).

An input is four selector bytes and a body: the adapter configuration and
route (byte 0), the salt of the admission rule (byte 1, ``fuzz_targets.admits``),
whether admitted hits get substitutes (byte 2) and the over-fetch limits
(byte 3). The JSON adapters' configurations, routes and seed bodies are the
contract cases of ``tests/fixtures/*_bodies.py`` (``tests/unit/test_format_contract.py``);
the gRPC adapters' are below, framed protobuf replies built from the gate's
own message classes.

The oracle (``check_release``): the body parses, or is MalformedBody. The
gate's rule decides: a hit is admitted when it has an id and a text and the
rule admits its id. The body is rendered with the admitted positions (and
substitutes), which may raise MalformedBody, Unreleasable or AbsentAnswer
(the latter only when a hit was rejected). The rendered body is parsed again
by the same adapter, and it must hold exactly the released positions' hits:
every id in it admitted (or a substitute's), as many hits as released, each
with the text it had (or its substitute's). And the text of a
rejected hit that occurs once in the body (so nowhere but in that hit) does
not occur in the rendered body.
"""

from __future__ import annotations

import base64
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import orjson
from fuzz_targets import ACCEPTED, REFUSED, OracleFailure, Target, admits, header, pick
from google.protobuf import json_format

from sidecar.core.hits import Candidate, Replacement, Route
from sidecar.formats import grpc_messages
from sidecar.formats.base import AbsentAnswer, MalformedBody, ResponseFormat, Unreleasable
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.grpc_frames import frame
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.options import AdapterOptions
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from sidecar.formats.qdrant.grpc import QdrantGrpcFormat
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat
from sidecar.formats.weaviate.rest import WeaviateFormat
from tests.fixtures import (
    chroma_bodies,
    elasticsearch_bodies,
    generic_bodies,
    milvus_bodies,
    pinecone_bodies,
    qdrant_bodies,
    weaviate_bodies,
)
from tests.fixtures.format_strategies import FormatCase, Hit

HEADER: Final = 4
# Texts shorter than this may occur in a body by chance (a key, another value):
# the residue check looks only for longer ones.
_RESIDUE_CHARS: Final = 12
# Seed texts: long enough for the residue check.
_TEXTS: Final = ("alpha secret text one", "beta secret text two", "gamma secret text three")


@dataclass(frozen=True)
class Variant:
    """One adapter configuration on one of its filtered routes."""

    format: ResponseFormat
    route: Route


def check_release(variant: Variant, selectors: Sequence[int], body: bytes) -> str:
    """Parse, decide, render and parse again; see the module docstring."""
    salt, options, limit_bits = selectors
    fmt, route = variant.format, variant.route
    try:
        parsed = fmt.parse(body, route)
    except MalformedBody:
        return REFUSED
    candidates = parsed.candidates
    if [c.position for c in candidates] != list(range(len(candidates))):
        raise OracleFailure("candidate positions are not 0..n-1 in order")
    keep = frozenset(
        c.position
        for c in candidates
        if c.chunk_id is not None and c.text is not None and admits(salt, c.chunk_id)
    )
    replacements = _replacements(candidates, keep, options)
    limits = _limits(limit_bits)
    try:
        out = parsed.render(keep, limits, replacements)
    except (MalformedBody, Unreleasable):
        return REFUSED
    except AbsentAnswer:
        if len(keep) == len(candidates):
            raise OracleFailure("a body whose every hit was kept was answered as absent") from None
        return REFUSED
    released = parsed.released_positions(keep, limits)
    if released != sorted(set(released)) or not set(released) <= keep:
        raise OracleFailure("released positions are not kept positions in body order")
    expected = [
        (replacements[p].chunk_id, replacements[p].text)
        if p in replacements
        else (candidates[p].chunk_id, candidates[p].text)
        for p in released
    ]
    allowed = {candidates[p].chunk_id for p in keep} | {r.chunk_id for r in replacements.values()}
    try:
        again = fmt.parse(out, route)
    except MalformedBody:
        # Only a render that releases nothing may leave a body without its hits' container.
        if released:
            raise OracleFailure("a rendered body with released hits does not parse") from None
        again = None
    got = [] if again is None else [(c.chunk_id, c.text) for c in again.candidates]
    if any(chunk_id not in allowed for chunk_id, _ in got):
        raise OracleFailure("a chunk the policy rejected is in the rendered body")
    if len(got) != len(released):
        raise OracleFailure(f"{len(got)} hits in the rendered body, {len(released)} released")
    # As multisets: a reply whose hits sit in a map (Pinecone's Fetch) has no order
    # that survives encoding; the contract suite checks the order of the others.
    if Counter(got) != Counter(expected):
        raise OracleFailure("the rendered body's hits are not the released ones")
    _check_residue(body, out, [candidates[p].text for p in range(len(candidates)) if p not in keep])
    return ACCEPTED


def _replacements(
    candidates: Sequence[Candidate], keep: Collection[int], options: int
) -> dict[int, Replacement]:
    """Substitutes for every other kept position when bit 0 of ``options`` says so,
    as the gate makes them for superseded chunks (ids in a range no seed uses)."""
    if not options & 1:
        return {}
    return {
        p: Replacement(_substitute_id(candidates[p].chunk_id, p), f"substitute text {p}")
        for p in sorted(keep)[::2]
    }


def _substitute_id(chunk_id: str | None, position: int) -> str:
    """A substitute's id of the kind the database uses for this hit (a UUID or a number)."""
    try:
        uuid.UUID(chunk_id or "")
    except ValueError:
        return str(9000 + position)
    return str(uuid.UUID(int=9000 + position))


def _limits(bits: int) -> tuple[int | None, ...] | None:
    """No limits for the low values; otherwise 1 to 3 entries of 0, 1, 2 or None."""
    count = bits >> 6
    if count == 0:
        return None
    entries = [(bits >> (2 * i)) & 3 for i in range(count)]
    return tuple(None if entry == 3 else entry for entry in entries)


def _check_residue(body: bytes, out: bytes, rejected: Sequence[str | None]) -> None:
    for text in rejected:
        if text is None or len(text) < _RESIDUE_CHARS:
            continue
        needle = text.encode("utf-8", "surrogatepass")
        if body.count(needle) == 1 and needle in out:
            raise OracleFailure("a rejected hit's text is in the rendered body")


def _run(variants: Sequence[Variant], data: bytes) -> str:
    (which, *selectors), body = header(data, HEADER)
    return check_release(variants[pick(variants, which)], selectors, body)


def _input(index: int, body: bytes, salt: int = 0, options: int = 1, limits: int = 0) -> bytes:
    return bytes([index, salt, options, limits]) + body


# -- JSON adapters: the contract cases ------------------------------------------------

_CASES: Final[Sequence[FormatCase]] = (
    *qdrant_bodies.CONTRACT_CASES,
    *chroma_bodies.CONTRACT_CASES,
    *weaviate_bodies.CONTRACT_CASES,
    *elasticsearch_bodies.CONTRACT_CASES,
    *pinecone_bodies.CONTRACT_CASES,
    *milvus_bodies.CONTRACT_CASES,
    *generic_bodies.CONTRACT_CASES,
)
# Options the contract cases leave at their defaults, on the same routes and bodies.
_MORE_OPTIONS: Final[Mapping[str, Sequence[ResponseFormat]]] = {
    "elasticsearch": (
        ElasticsearchFormat(total="remove", inner_hits="keep", aggregations="keep", suggest="keep"),
        ElasticsearchFormat(AdapterOptions(releasable_fields=["meta.lang"], hashed_fields=["k"])),
    ),
    "weaviate": (WeaviateFormat(generative="block"),),
}


def _json_target(name: str, cases: Sequence[FormatCase]) -> Target:
    variants: list[Variant] = []
    seeds: list[tuple[int, bytes]] = []
    for case in cases:
        routes = dict.fromkeys([*(s.route for s in case.shapes), *(r for r, _ in case.seeds)])
        first = len(variants)
        variants.extend(Variant(case.format, route) for route in routes)
        index = {route: first + i for i, route in enumerate(routes)}
        for shape in case.shapes:
            batches = max(1, shape.batches[0])
            hits = min(max(3, shape.hits[0]), shape.hits[1])
            body = case.build(shape, _hits(batches, hits))
            seeds.append((index[shape.route], orjson.dumps(body)))
        seeds.extend((index[route], orjson.dumps(body)) for route, body in case.seeds)
    for fmt in _MORE_OPTIONS.get(name, ()):
        routes = dict.fromkeys(v.route for v in variants)
        variants.extend(Variant(fmt, route) for route in routes)

    def make_seeds() -> list[bytes]:
        out = []
        for salt, (index, body) in enumerate(seeds):
            out.append(_input(index, body, salt=salt))
        # The same bodies with every hit admitted, and with over-fetch limits.
        out.extend(_input(index, body, salt=255, options=0, limits=0x45) for index, body in seeds)
        return out

    return Target(f"response-{name}", partial(_run, variants), make_seeds, "json", HEADER)


def _hits(batches: int, per_batch: int) -> list[list[Hit]]:
    out, ordinal = [], 0
    for _ in range(batches):
        batch = []
        for _ in range(per_batch):
            text = f"{_TEXTS[ordinal % len(_TEXTS)]} {ordinal}"
            batch.append(Hit(str(ordinal + 1), text, 0.5 - ordinal / 100, ordinal))
            ordinal += 1
        out.append(batch)
    return out


def _json_targets() -> list[Target]:
    by_name: dict[str, list[FormatCase]] = {}
    for case in _CASES:
        name = "generic" if case.format.name not in _BUILT_IN_JSON else case.format.name
        by_name.setdefault(name, []).append(case)
    return [_json_target(name, cases) for name, cases in by_name.items()]


_BUILT_IN_JSON: Final = ("qdrant", "chroma", "weaviate", "elasticsearch", "pinecone", "milvus")


# -- gRPC adapters: replies built from the gate's own message classes --------------------


def _message(full_name: str, value: dict[str, Any]) -> bytes:
    """``value`` (protobuf JSON) as a framed ``full_name`` message."""
    message = grpc_messages.message_class(full_name)()
    json_format.ParseDict(value, message)
    return frame(message.SerializeToString())


def _qdrant_payload(n: int, text: str) -> dict[str, Any]:
    return {
        "text": {"stringValue": text},
        "chunk": {"stringValue": str(n)},
        "lang": {"stringValue": "en"},
    }


def _qdrant_scored(n: int) -> dict[str, Any]:
    text = f"{_TEXTS[n % 3]} {n}"
    return {
        "id": {"num": str(n)},
        "payload": _qdrant_payload(n, text),
        "score": 0.5,
        "version": "3",
    }


def _qdrant_retrieved(n: int) -> dict[str, Any]:
    text = f"{_TEXTS[n % 3]} {n}"
    return {"id": {"num": str(n)}, "payload": _qdrant_payload(n, text)}


def _qdrant_replies() -> dict[str, tuple[str, dict[str, Any]]]:
    scored = [_qdrant_scored(n) for n in (1, 2, 3)]
    retrieved = [_qdrant_retrieved(n) for n in (1, 2, 3)]
    batch = {"result": [{"result": scored[:2]}, {"result": scored[2:]}], "time": 0.1}
    # Grouped by "lang" and by "chunk": values the id_field configuration releases.
    groups = {
        "result": {
            "groups": [
                {"id": {"stringValue": "en"}, "hits": scored[:2], "lookup": retrieved[0]},
                {"id": {"stringValue": "3"}, "hits": scored[2:]},
            ]
        }
    }
    return {
        "Get": ("qdrant.GetResponse", {"result": retrieved, "time": 0.1}),
        "Scroll": (
            "qdrant.ScrollResponse",
            {"result": retrieved, "nextPageOffset": {"num": "9"}, "time": 0.1},
        ),
        "Search": ("qdrant.SearchResponse", {"result": scored, "time": 0.1}),
        "SearchBatch": ("qdrant.SearchBatchResponse", batch),
        "SearchGroups": ("qdrant.SearchGroupsResponse", groups),
        "Recommend": ("qdrant.RecommendResponse", {"result": scored}),
        "RecommendBatch": ("qdrant.RecommendBatchResponse", batch),
        "RecommendGroups": ("qdrant.RecommendGroupsResponse", groups),
        "Discover": ("qdrant.DiscoverResponse", {"result": scored}),
        "DiscoverBatch": ("qdrant.DiscoverBatchResponse", batch),
        "Query": ("qdrant.QueryResponse", {"result": scored}),
        "QueryBatch": ("qdrant.QueryBatchResponse", batch),
        "QueryGroups": ("qdrant.QueryGroupsResponse", groups),
    }


def _milvus_columns(keys: Sequence[int]) -> list[dict[str, Any]]:
    texts = [f"{_TEXTS[k % 3]} {k}" for k in keys]
    return [
        {"type": "VarChar", "fieldName": "text", "scalars": {"stringData": {"data": texts}}},
        {
            "type": "VarChar",
            "fieldName": "chunk",
            "scalars": {"stringData": {"data": [str(k) for k in keys]}},
        },
        {
            "type": "Int64",
            "fieldName": "year",
            "scalars": {"longData": {"data": [str(2000 + k) for k in keys]}},
        },
    ]


def _milvus_replies() -> dict[str, tuple[str, dict[str, Any]]]:
    keys = [1, 2, 3]
    search = {
        "status": {},
        "results": {
            "numQueries": "2",
            "topK": "2",
            "topks": ["2", "1"],
            "scores": [0.9, 0.8, 0.7],
            "ids": {"intId": {"data": [str(k) for k in keys]}},
            "fieldsData": _milvus_columns(keys),
            "outputFields": ["text", "chunk", "year"],
            "primaryFieldName": "pk",
        },
        "collectionName": "docs",
    }
    pk = {"type": "Int64", "fieldName": "pk", "scalars": {"longData": {"data": ["1", "2", "3"]}}}
    query = {
        "status": {},
        "fieldsData": [pk, *_milvus_columns(keys)],
        "outputFields": ["pk", "text", "chunk", "year"],
        "primaryFieldName": "pk",
        "collectionName": "docs",
    }
    return {
        "Search": ("milvus.proto.milvus.SearchResults", search),
        "HybridSearch": ("milvus.proto.milvus.SearchResults", search),
        "Query": ("milvus.proto.milvus.QueryResults", query),
    }


def _pinecone_vector(n: int) -> dict[str, Any]:
    text = f"{_TEXTS[n % 3]} {n}"
    return {
        "id": str(n),
        "values": [0.5],
        "metadata": {"text": text, "chunk": str(n), "lang": "en"},
    }


def _pinecone_replies() -> dict[str, tuple[str, dict[str, Any]]]:
    matches = [{**_pinecone_vector(n), "score": 0.5} for n in (1, 2, 3)]
    return {
        "Query": (
            "QueryResponse",
            {"matches": matches, "namespace": "ns", "usage": {"readUnits": 5}},
        ),
        "Fetch": (
            "FetchResponse",
            {"vectors": {str(n): _pinecone_vector(n) for n in (1, 2)}, "namespace": "ns"},
        ),
    }


def _weaviate_object(n: int) -> dict[str, Any]:
    text = f"{_TEXTS[n % 3]} {n}"
    uuid_bytes = (0x12340000000000000000000000000000 + n).to_bytes(16, "big")
    return {
        "properties": {
            "nonRefProps": {
                "fields": {
                    "text": {"textValue": text},
                    "chunk": {"textValue": str(n)},
                    "lang": {"textValue": "en"},
                }
            },
            "targetCollection": "Docs",
        },
        "metadata": {
            "idAsBytes": base64.b64encode(uuid_bytes).decode(),
            "distance": 0.25,
            "distancePresent": True,
        },
    }


def _weaviate_replies() -> dict[str, tuple[str, dict[str, Any]]]:
    objects = [_weaviate_object(n) for n in (1, 2, 3)]
    grouped = {
        "groupByResults": [
            {"name": "g1", "objects": objects[:2], "numberOfObjects": "2"},
            {"name": "g2", "objects": objects[2:], "numberOfObjects": "1"},
        ],
        "took": 0.1,
    }
    generated = {
        "results": [{**objects[0], "generative": {"values": [{"result": "made from one"}]}}],
        "generativeGroupedResults": {"values": [{"result": "made from all"}]},
    }
    return {
        "Search": ("weaviate.v1.SearchReply", {"results": objects, "took": 0.1}),
        "Search/groups": ("weaviate.v1.SearchReply", grouped),
        "Search/generative": ("weaviate.v1.SearchReply", generated),
    }


@dataclass(frozen=True)
class _GrpcAdapter:
    name: str
    service: str
    formats: Sequence[ResponseFormat]
    replies: Callable[[], dict[str, tuple[str, dict[str, Any]]]]


_GRPC: Final = (
    _GrpcAdapter(
        "qdrant_grpc",
        "qdrant.Points",
        (
            QdrantGrpcFormat(),
            QdrantGrpcFormat(AdapterOptions(id_field="chunk", releasable_fields=["lang"])),
        ),
        _qdrant_replies,
    ),
    _GrpcAdapter(
        "milvus_grpc",
        "milvus.proto.milvus.MilvusService",
        (
            MilvusGrpcFormat(),
            MilvusGrpcFormat(AdapterOptions(id_field="chunk", releasable_fields=["year"])),
        ),
        _milvus_replies,
    ),
    _GrpcAdapter(
        "pinecone_grpc",
        "VectorService",
        (
            PineconeGrpcFormat(),
            PineconeGrpcFormat(AdapterOptions(id_field="chunk", hashed_fields=["lang"])),
        ),
        _pinecone_replies,
    ),
    _GrpcAdapter(
        "weaviate_grpc",
        "weaviate.v1.Weaviate",
        (
            WeaviateGrpcFormat(),
            WeaviateGrpcFormat(
                AdapterOptions(id_field="chunk", releasable_fields=["lang"]), generative="block"
            ),
        ),
        _weaviate_replies,
    ),
)


def _grpc_target(adapter: _GrpcAdapter) -> Target:
    methods = list(dict.fromkeys(key.split("/")[0] for key in adapter.replies()))
    variants = [
        Variant(fmt, Route("POST", f"/{adapter.service}/{method}"))
        for fmt in adapter.formats
        for method in methods
    ]

    def make_seeds() -> list[bytes]:
        out = []
        for salt, (key, (message, value)) in enumerate(adapter.replies().items()):
            body = _message(message, value)
            for offset in range(len(adapter.formats)):
                index = offset * len(methods) + methods.index(key.split("/")[0])
                out.append(_input(index, body, salt=salt))
                out.append(_input(index, body, salt=255, options=0, limits=0x45))
        return out

    return Target(f"response-{adapter.name}", partial(_run, variants), make_seeds, "grpc", HEADER)


def targets() -> list[Target]:
    """The response adapter targets, one per adapter (every generic configuration in one)."""
    return [*_json_targets(), *(_grpc_target(adapter) for adapter in _GRPC)]
