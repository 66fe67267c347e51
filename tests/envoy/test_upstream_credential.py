"""The database accepts only the gate: a real Chroma that requires a token, and `proxy`
adding it from a file (upstream.credential_file).

Chroma runs as its own Python server (``chromadb.app``, which the chromadb
package ships) with its token authentication on: `chroma run`, the Rust server
of chromadb 1.x, accepts the authentication settings and ignores them
(tests/fixtures/chroma_server.py). A request sent straight to Chroma without
the token is refused; the same request through `retrieval-gate proxy`, which
runs Envoy's credential_injector with the token file, is answered and
filtered; a token the client sends itself never reaches Chroma, and the token
is in none of the proxy's logs, metrics or generated files.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chromadb
import pytest
from chromadb.api.models.Collection import Collection
from chromadb.api.types import PyEmbeddings
from chromadb.config import Settings

from sidecar.runtime.ports import free_port
from tests.fixtures.chroma_server import TOKEN_HEADER, ChromaServer, start_chroma_with_token
from tests.fixtures.harness import HttpResult, http, write_records
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.servers import stop_process
from tests.fixtures.stores import new_sqlite_url

pytestmark = [pytest.mark.envoy, pytest.mark.chroma]

CLI = [sys.executable, "-m", "sidecar.cli"]
TOKEN = "chroma-token-8c1f2e0b9d"  # the test's own Chroma
IDENTITY = {"x-gate-tenant": "acme", "x-gate-principals": "user:alice,group:qa"}
COLLECTION = "gate-credential"
# c-01 is admitted; c-02 is revoked in the store; g-01 is another tenant's.
CHUNKS = {
    "c-01": ("acme", [1.0, 0.0]),
    "c-02": ("acme", [2.0, 0.0]),
    "g-01": ("globex", [3.0, 0.0]),
}


@pytest.fixture(scope="module")
def chroma(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    server = start_chroma_with_token(tmp_path_factory.mktemp("chroma-token"), TOKEN)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def collection(chroma: ChromaServer) -> Collection:
    """The collection, loaded by a client that holds the token."""
    client = chromadb.HttpClient(
        host=chroma.host,
        port=chroma.port,
        headers={TOKEN_HEADER: TOKEN},
        settings=Settings(anonymized_telemetry=False),
    )
    created = client.create_collection(COLLECTION, embedding_function=None)
    embeddings: PyEmbeddings = [vector for _, vector in CHUNKS.values()]
    created.add(
        ids=list(CHUNKS),
        embeddings=embeddings,
        documents=[text_for(i) for i in CHUNKS],
        metadatas=[{"tenant": tenant} for tenant, _ in CHUNKS.values()],
    )
    return created


class Proxy:
    """`retrieval-gate proxy` as an operator runs it, in a directory of its own."""

    def __init__(self, workdir: Path, upstream: str, *flags: str) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.metrics_port = free_port()
        store = new_sqlite_url(workdir / "gate.db")
        records = [record_dict("c-01"), record_dict("c-02", status="revoked")]
        records.append(record_dict("g-01", tenant_id="globex"))
        chunks = write_records(workdir / "chunks.jsonl", records)
        subprocess.run([*CLI, "store", "load", "--store", store, str(chunks)], check=True)
        self.log = workdir / "proxy.log"
        command = [*CLI, "proxy", "--identity", "trusted-headers", "--store", store]
        command += ["--upstream", upstream, "--listen", f"127.0.0.1:{self.port}"]
        command += ["--metrics", f"127.0.0.1:{self.metrics_port}"]
        command += ["--audit-log", str(workdir / "decisions.jsonl"), *flags]
        with self.log.open("ab") as out:
            # -v: every debug line the proxy writes is searched for the token below.
            self.process = subprocess.Popen(
                [*command[:3], "-v", *command[3:]], stdout=out, stderr=out
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.log.read_text()[-3000:])
            try:
                if http("GET", f"{self.url}/api/v2/heartbeat", headers=IDENTITY).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(self.log.read_text()[-3000:])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture(scope="module")
def credential_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "credential"
    path.write_text(TOKEN + "\n")  # as `echo` writes it: Envoy trims the line end
    path.chmod(0o400)
    return path


@pytest.fixture(scope="module")
def proxy(
    tmp_path_factory: pytest.TempPathFactory,
    chroma: ChromaServer,
    collection: Collection,
    credential_file: Path,
) -> Iterator[Proxy]:
    running = Proxy(
        tmp_path_factory.mktemp("proxy"),
        chroma.url,
        *("--upstream-credential-file", str(credential_file)),
        *("--upstream-credential-header", TOKEN_HEADER),
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def query(base: str, collection: Collection, headers: dict[str, str]) -> HttpResult:
    """Chroma's query endpoint, as chromadb's client calls it."""
    path = (
        "/api/v2/tenants/default_tenant/databases/default_database/collections/"
        f"{collection.id}/query"
    )
    body = {"query_embeddings": [[0.0, 0.0]], "n_results": 3, "include": ["documents"]}
    sent = {"content-type": "application/json", **headers}
    return http("POST", base + path, json.dumps(body).encode(), sent)


def ids(result: HttpResult) -> list[str]:
    found: list[list[str]] = result.json()["ids"]
    return found[0]


def test_a_direct_request_without_the_token_is_refused(
    chroma: ChromaServer, collection: Collection
) -> None:
    assert query(chroma.url, collection, {}).status == 403
    assert query(chroma.url, collection, {TOKEN_HEADER: "guessed"}).status == 403
    # The same request with the token: Chroma answers (every chunk, unfiltered).
    allowed = query(chroma.url, collection, {TOKEN_HEADER: TOKEN})
    assert allowed.status == 200
    assert ids(allowed) == ["c-01", "c-02", "g-01"]


def test_the_same_request_through_the_proxy_is_answered_and_filtered(
    proxy: Proxy, collection: Collection
) -> None:
    result = query(proxy.url, collection, IDENTITY)
    assert result.status == 200, result.body
    assert ids(result) == ["c-01"]
    assert result.json()["documents"] == [[text_for("c-01")]]


def test_chromas_own_client_works_through_the_proxy_without_the_token(
    proxy: Proxy, collection: Collection
) -> None:
    client = chromadb.HttpClient(
        host="127.0.0.1",
        port=proxy.port,
        headers=IDENTITY,
        settings=Settings(anonymized_telemetry=False),
    )
    gated = client.get_collection(COLLECTION, embedding_function=None)
    origin: PyEmbeddings = [[0.0, 0.0]]
    result: dict[str, Any] = dict(gated.query(query_embeddings=origin, n_results=3))
    assert result["ids"] == [["c-01"]]


@pytest.mark.parametrize(
    "sent",
    [
        {TOKEN_HEADER: "forged"},
        {TOKEN_HEADER.lower(): "forged", TOKEN_HEADER.upper(): "forged-too"},
        {"authorization": "Bearer forged"},
    ],
)
def test_a_credential_the_client_sends_never_reaches_chroma(
    proxy: Proxy, collection: Collection, sent: dict[str, str]
) -> None:
    # Had Chroma seen the client's value, it would have refused (403): Envoy
    # replaces every value of the header with the gate's credential.
    result = query(proxy.url, collection, {**IDENTITY, **sent})
    assert result.status == 200, result.body
    assert ids(result) == ["c-01"]


def test_the_token_is_in_no_log_metric_or_file_of_the_proxy(
    proxy: Proxy, collection: Collection
) -> None:
    assert query(proxy.url, collection, IDENTITY).status == 200
    metrics = http("GET", f"http://127.0.0.1:{proxy.metrics_port}/metrics").body.decode()
    assert TOKEN not in metrics
    for path in proxy.workdir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    # The generated bootstrap, in the proxy's private temporary directory, holds
    # the file's path and not its value (tests/unit/test_upstream_credential.py).


def test_proxy_refuses_to_start_without_a_readable_credential(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, problem in ((tmp_path / "absent", "cannot read"), (empty, "is empty")):
        done = subprocess.run(
            [
                *CLI,
                *("proxy", "--identity", "trusted-headers", "--upstream", "http://127.0.0.1:1"),
                *("--listen", "127.0.0.1:1", "--upstream-credential-file", str(path)),
                *("--upstream-credential-header", "api-key"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: upstream.credential_file: ") and problem in line
