"""Several sidecar worker processes behind one Envoy: every stream is served and
filtered, metrics add up across workers, each worker keeps its own audit chain,
and a worker that dies takes the pool down rather than leaving it half-served."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.demo.upstream import CannedResponse
from sidecar.runtime.ports import free_port
from sidecar.runtime.workers import worker_addresses, worker_audit_log
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import CLI, GateStack
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
BODY = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
REQUESTS = 40


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    gate = GateStack(
        tmp_path_factory.mktemp("workers"),
        [record_dict("1"), record_dict("2", status="revoked")],
        config={"workers": 2},
    ).start()
    gate.upstream.respond("POST", SEARCH, CannedResponse(BODY))
    yield gate
    gate.stop()


def worker_pids(stack: GateStack) -> list[int]:
    assert stack.sidecar is not None
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "--ppid", str(stack.sidecar.pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    # Spawned workers, not multiprocessing's resource tracker.
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


def test_every_stream_is_filtered_and_both_workers_serve(stack: GateStack) -> None:
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: stack.search(SEARCH), range(REQUESTS)))
    assert all(r.status == 200 for r in responses)
    assert all([h["id"] for h in r.json()["result"]] == [1] for r in responses)
    # Aggregated by the parent from every worker.
    assert (
        stack.metric(
            'retrieval_gate_responses_total{collection="other",format="qdrant",outcome="filtered"}'
        )
        == REQUESTS
    )
    assert (
        stack.metric(
            'retrieval_gate_chunks_total{collection="other",decision="rejected",format="qdrant",reason="STATUS_REVOKED"}'
        )
        == REQUESTS
    )
    # Each worker wrote its own chain, and each chain verifies.
    counts = []
    for index in range(2):
        log = worker_audit_log(stack.audit_log, index, 2)
        counts.append(len(log.read_bytes().splitlines()) if log.exists() else 0)
        if log.exists():
            verify = subprocess.run([*CLI, "audit", "verify", str(log)], capture_output=True)
            assert verify.returncode == 0, verify.stdout + verify.stderr
    assert sum(counts) == REQUESTS
    assert all(count > 0 for count in counts), counts  # Envoy spread the streams


def test_a_dead_worker_stops_the_pool(stack: GateStack) -> None:
    (first, second) = worker_pids(stack)
    os.kill(first, signal.SIGKILL)
    assert stack.sidecar is not None
    assert stack.sidecar.wait(timeout=20) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and worker_pids(stack):
        time.sleep(0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)
    # Nothing serves, so nothing passes unfiltered: Envoy answers 503.
    response = stack.search(SEARCH)
    assert response.status == 503
    assert b"text" not in response.body


def test_workers_die_with_a_killed_parent(stack: GateStack) -> None:
    pids = worker_pids(stack)
    assert len(pids) == 2
    stack.kill_sidecar()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in pids if _alive(pid)]
    assert alive == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; it is only waiting for its (dead) parent's reaper.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_worker_addresses() -> None:
    assert worker_addresses("unix:/run/gate.sock", 1) == ["unix:/run/gate.sock"]
    assert worker_addresses("unix:/run/gate.sock", 2) == [
        "unix:/run/gate.sock.0",
        "unix:/run/gate.sock.1",
    ]
    assert worker_addresses("127.0.0.1:9001", 3) == [
        "127.0.0.1:9001",
        "127.0.0.1:9002",
        "127.0.0.1:9003",
    ]


def test_a_second_sidecar_on_a_taken_port_fails_instead_of_sharing_it(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "gate.toml"
    config.write_text(
        '[identity]\nmode = "trusted-headers"\n'
        f'[store]\nurl = "{new_sqlite_url(tmp_path / "gate.db")}"\n'
        f'[listen]\ngrpc = "127.0.0.1:{port}"\nexpose_grpc = true\n'
    )
    first = subprocess.Popen([*CLI, "serve", "--config", str(config)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = subprocess.run(
            [*CLI, "serve", "--config", str(config)], capture_output=True, timeout=30
        )
        assert second.returncode != 0
        assert b"cannot listen" in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0
