"""The benchmark's responses: N Qdrant search hits of T bytes of text, half rejected.

Each workload is one collection name, so one static upstream serves them all
(one route per collection) and one metadata store holds every workload's
records (chunk ids do not overlap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sidecar.core.integrity import canonical_sha256

_FILLER = "lorem ipsum dolor sit amet "


@dataclass(frozen=True)
class Workload:
    chunks: int
    text_bytes: int
    first_id: int  # point ids first_id .. first_id + chunks - 1

    @property
    def name(self) -> str:
        return f"{self.chunks}x{self.text_bytes}B"

    @property
    def collection(self) -> str:
        return f"bench_{self.chunks}x{self.text_bytes}"

    @property
    def path(self) -> str:
        return f"/collections/{self.collection}/points/search"

    @property
    def admitted(self) -> int:
        """Even positions are approved, odd ones revoked: the caller keeps ceil(N/2)."""
        return (self.chunks + 1) // 2

    def _text(self, i: int) -> str:
        head = f"chunk {self.first_id + i} "
        return (head + _FILLER * (self.text_bytes // len(_FILLER) + 1))[: self.text_bytes]

    def records(self) -> list[dict[str, Any]]:
        """Authoritative metadata: tenant acme, group:qa may read, every other one revoked."""
        return [
            {
                "chunk_id": str(self.first_id + i),
                "doc_id": f"doc-{self.first_id + i}",
                "version": "1",
                "tenant_id": "acme",
                "allowed_principals": ["group:qa"],
                "status": "approved" if i % 2 == 0 else "revoked",
                "effective_at": "2025-01-01T00:00:00Z",
                "expires_at": None,
                "sha256": canonical_sha256(self._text(i)),
            }
            for i in range(self.chunks)
        ]

    def body(self) -> bytes:
        """The upstream's Qdrant search response."""
        hits = [
            {
                "id": self.first_id + i,
                "version": 1,
                "score": 1 - i / 1000,
                "payload": {"text": self._text(i)},
            }
            for i in range(self.chunks)
        ]
        return orjson.dumps({"result": hits, "status": "ok", "time": 0.001})


def workload(chunks: int, text_bytes: int) -> Workload:
    # Ids derive from the shape, so every workload has its own id range.
    return Workload(chunks, text_bytes, first_id=(chunks * 10_000 + text_bytes) * 1000)


# The headline configuration (its targets are stated for this one).
HEADLINE = workload(20, 800)
# Scaling: chunks per response at ~800 B, and text size at 20 chunks.
SCALING = (
    workload(1, 800),
    workload(10, 800),
    HEADLINE,
    workload(50, 800),
    workload(100, 800),
    workload(20, 200),
    workload(20, 2000),
)
ALL = SCALING
