"""The demo: one corpus, three callers, every reason code, through a real Envoy."""

from __future__ import annotations

import asyncio
import tempfile
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from sidecar.audit.verify import verify_chain
from sidecar.config import IdentityMode, load_settings
from sidecar.core.integrity import canonical_sha256
from sidecar.demo.upstream import CannedResponse, FixtureUpstream
from sidecar.runtime.addresses import HostPort
from sidecar.runtime.bootstrap import Upstream
from sidecar.runtime.ports import free_port
from sidecar.runtime.proxy import run_proxy
from sidecar.store.loader import load_jsonl
from sidecar.store.open import open_store
from sidecar.store.sqlite import migrate

SEARCH_PATH = "/collections/docs/points/search"
# Loopback only: ignore any *_proxy settings in the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class DemoChunk:
    point_id: int
    chunk_id: str
    text: str
    status: str = "approved"
    tenant: str = "acme"
    principals: tuple[str, ...] = ("group:qa",)
    effective_at: datetime = datetime(2024, 1, 1, tzinfo=UTC)
    expires_at: datetime | None = None
    in_store: bool = True
    served_text: str | None = None  # what the index returns, when it differs


def _corpus(now: datetime) -> list[DemoChunk]:
    return [
        DemoChunk(1, "sop-7-v3", "SOP-7 rev 3: sterilise the line at 121 C for 20 minutes."),
        DemoChunk(2, "sop-7-v2", "SOP-7 rev 2: sterilise at 115 C.", status="superseded"),
        DemoChunk(
            3, "globex-memo", "Globex pricing memo.", tenant="globex", principals=("group:all",)
        ),
        DemoChunk(4, "hr-salaries", "Salary bands for 2026.", principals=("group:hr",)),
        DemoChunk(5, "sop-8-draft", "SOP-8 draft: new cleaning agent.", status="draft"),
        DemoChunk(6, "batch-recall", "Batch 42 release note.", status="revoked"),
        DemoChunk(7, "supplier-x", "Supplier X audit summary.", status="quarantined"),
        DemoChunk(
            8, "policy-2027", "Policy effective next year.", effective_at=now + timedelta(days=365)
        ),
        DemoChunk(
            9,
            "guidance-2023",
            "Guidance that expired.",
            effective_at=datetime(2023, 1, 1, tzinfo=UTC),
            expires_at=datetime(2024, 1, 1, tzinfo=UTC),
        ),
        DemoChunk(10, "sop-9", "SOP-9: wear gloves.", served_text="SOP-9: gloves are optional."),
        DemoChunk(11, "orphan", "A chunk the store has never heard of.", in_store=False),
        DemoChunk(12, "sales-faq", "Sales FAQ.", principals=("group:sales", "group:qa")),
    ]


def _record_line(chunk: DemoChunk) -> bytes:
    return orjson.dumps(
        {
            "chunk_id": chunk.chunk_id,
            "doc_id": chunk.chunk_id.rsplit("-v", 1)[0],
            "version": chunk.chunk_id.rsplit("-v", 1)[-1] if "-v" in chunk.chunk_id else "1",
            "tenant_id": chunk.tenant,
            "allowed_principals": list(chunk.principals),
            "status": chunk.status,
            "effective_at": chunk.effective_at.isoformat(),
            "expires_at": chunk.expires_at.isoformat() if chunk.expires_at else None,
            "sha256": canonical_sha256(chunk.text),
            "source_uri": f"https://docs.example/{chunk.chunk_id}",
            "superseded_by": "sop-7-v3" if chunk.status == "superseded" else None,
        }
    )


def _search_body(corpus: list[DemoChunk]) -> bytes:
    hits = [
        {
            "id": c.point_id,
            "version": 1,
            "score": round(0.99 - i * 0.03, 2),
            "payload": {"chunk_id": c.chunk_id, "text": c.served_text or c.text},
        }
        for i, c in enumerate(corpus)
    ]
    return orjson.dumps({"result": hits, "status": "ok", "time": 0.002})


def _search(url: str, tenant: str, principals: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(  # noqa: S310 - the demo's own loopback proxy
        url + SEARCH_PATH,
        data=b'{"vector":[0.1,0.2,0.3],"limit":12,"with_payload":true}',
        headers={
            "content-type": "application/json",
            "x-gate-tenant": tenant,
            "x-gate-principals": principals,
        },
        method="POST",
    )
    with _OPENER.open(request, timeout=10) as response:
        return response.status, dict(response.headers.items()), response.read()


def _report(audit_log: Path, decision_id: str, body: bytes) -> None:
    records = [orjson.loads(line) for line in audit_log.read_bytes().splitlines()]
    record = next(r for r in records if r["decision_id"] == decision_id)
    returned = [hit["payload"]["chunk_id"] for hit in orjson.loads(body)["result"]]
    print(f"  admitted ({len(returned)}): {', '.join(returned) or '-'}")
    for rejected in record["rejected"]:
        print(f"  rejected  {rejected['chunk_id']:<14} {', '.join(rejected['reasons'])}")


def demo_corpus() -> list[DemoChunk]:
    """The demo's chunks, dated from now."""
    return _corpus(datetime.now(UTC))


def write_demo_store(workdir: Path, corpus: list[DemoChunk]) -> str:
    """A SQLite store in ``workdir`` holding the records of ``corpus``; its URL."""
    chunks_file = workdir / "chunks.jsonl"
    chunks_file.write_bytes(b"\n".join(_record_line(c) for c in corpus if c.in_store) + b"\n")
    store_url = f"sqlite:///{workdir / 'gate.db'}"
    migrate(workdir / "gate.db")  # `store migrate`: only it creates a store
    store = open_store(store_url)
    store.upsert(load_jsonl(chunks_file))
    store.close()
    return store_url


def demo_settings(store_url: str, audit_log: Path, metrics: str) -> dict[str, Any]:
    """The demo's settings, by flat name (as ``load_settings`` takes them)."""
    return {
        "identity": IdentityMode.TRUSTED_HEADERS.value,
        "store": store_url,
        "id_field": "chunk_id",
        "audit_log": str(audit_log),
        "metrics": metrics,
    }


async def run_demo() -> int:
    """Run the demo end to end and print what each caller received; 0 on success."""
    corpus = demo_corpus()
    with tempfile.TemporaryDirectory(prefix="retrieval-gate-demo-") as tmp:
        workdir = Path(tmp)
        store_url = write_demo_store(workdir, corpus)
        upstream = FixtureUpstream().start()
        upstream.respond("POST", SEARCH_PATH, CannedResponse(_search_body(corpus)))
        audit_log = workdir / "decisions.jsonl"
        metrics_port = free_port()
        settings = load_settings(
            None, demo_settings(store_url, audit_log, f"127.0.0.1:{metrics_port}")
        )
        listen = HostPort("127.0.0.1", free_port())
        stop = asyncio.Event()
        ready = asyncio.Event()
        proxy = asyncio.create_task(
            run_proxy(
                settings,
                listen=listen,
                upstream=Upstream.parse(upstream.url),
                stop=stop,
                ready=ready,
            )
        )
        try:
            await asyncio.wait(
                {proxy, asyncio.ensure_future(ready.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not ready.is_set():
                return await proxy or 1
            ok = await _exercise(f"http://{listen}", upstream, corpus, audit_log, metrics_port)
        finally:
            stop.set()
            proxy_code = await proxy
            upstream.stop()
        return proxy_code if ok else 1


async def _exercise(
    url: str,
    upstream: FixtureUpstream,
    corpus: list[DemoChunk],
    audit_log: Path,
    metrics_port: int,
) -> bool:
    print(f"\nEnvoy on {url} -> fixture upstream {upstream.url} (a fake Qdrant)")
    print(f"The upstream returns the same {len(corpus)} hits for every search.\n")
    for tenant, principals in (
        ("acme", "user:alice,group:qa"),
        ("acme", "user:bob,group:sales"),
        ("globex", "user:mallory,group:all"),
    ):
        status, headers, body = await asyncio.to_thread(_search, url, tenant, principals)
        decision_id = headers["x-retrieval-gate-decision-id"]
        print(
            f"caller tenant={tenant} principals={principals}: HTTP {status}, decision {decision_id}"
        )
        _report(audit_log, decision_id, body)
        print()
    metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port}/metrics")
    print("metrics: retrieval_gate_chunks_total for rejected chunks")
    for line in metrics.splitlines():
        if line.startswith("retrieval_gate_chunks_total{") and 'decision="rejected"' in line:
            print("  " + line)
    report = verify_chain(audit_log)
    verdict = "intact" if report.ok else f"BROKEN: {report.problem}"
    print(f"\naudit log: {report.records} records, hash chain {verdict}")
    return report.ok


def _get(url: str) -> str:
    with _OPENER.open(url, timeout=5) as response:
        return str(response.read().decode())
