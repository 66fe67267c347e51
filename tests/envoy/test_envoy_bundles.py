"""Signed policy bundles hot-reloaded through a real Envoy (issue 14, item 2).

A background thread searches continuously while the bundle file is replaced by
a new signed revision that blocks chunk 8: no request fails, and from the swap
on every answer and audit record is the new revision's. Then a tampered signed
bundle is refused: the old revision stays active, and the metric and the log
say so.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.bundles import blocking_files, make_bundle, rsa_pair, signatures_for, tar_gz
from tests.fixtures.harness import GateStack, HttpResult, search_ids, wait_until
from tests.fixtures.records import record_dict, text_for

pytestmark = pytest.mark.envoy

SEARCH = "/collections/docs/points/search"
RECORDS = [record_dict("1"), record_dict("2", status="revoked"), record_dict("8")]
POINTS = [qb.point(int(r["chunk_id"]), text_for(r["chunk_id"])) for r in RECORDS]
BODY = qb.encode(qb.search_body(POINTS))
REFUSALS = "retrieval_gate_policy_bundle_refusals_total"


def _replace(path: Path, blob: bytes) -> None:
    partial = path.with_suffix(".partial")
    partial.write_bytes(blob)
    os.replace(partial, path)


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return rsa_pair()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, keys: tuple[bytes, bytes]
) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("bundles")
    bundle_file = workdir / "policy.tar.gz"
    _replace(bundle_file, make_bundle(blocking_files([]), revision="r1", private_key=keys[0]))
    key_file = workdir / "bundle-key.pem"
    key_file.write_bytes(keys[1])
    config = {
        "policy_bundle": str(bundle_file),
        "policy_bundle_public_key": str(key_file),
        "policy_bundle_poll_seconds": 0.2,
        "workers": 2,
    }
    gate = GateStack(workdir, RECORDS, config=config).start()
    gate.upstream.respond("POST", SEARCH, CannedResponse(BODY))
    yield gate
    gate.stop()


class _Load:
    """Searches continuously on a thread; remembers every answer in order."""

    def __init__(self, stack: GateStack) -> None:
        self._stack = stack
        self.results: list[HttpResult | BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.results.append(self._stack.search(SEARCH))
            except BaseException as exc:  # a failed request is a result too
                self.results.append(exc)

    def __enter__(self) -> _Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _ids(result: HttpResult | BaseException) -> list[int] | None:
    if isinstance(result, BaseException) or result.status != 200:
        return None
    return search_ids(result)


def test_revisions_swap_under_load_then_a_tampered_bundle_is_refused(
    stack: GateStack, keys: tuple[bytes, bytes]
) -> None:
    bundle_file = stack.workdir / "policy.tar.gz"
    assert search_ids(stack.search(SEARCH)) == [1, 8]
    assert _all_audit_records(stack)[-1]["policy_version"].startswith("bundle:r1@sha256:")
    assert stack.metric('retrieval_gate_policy_info{revision="r1"}') == 1

    with _Load(stack) as load:
        assert wait_until(lambda: len(load.results) >= 20)
        _replace(
            bundle_file, make_bundle(blocking_files(["8"]), revision="r2", private_key=keys[0])
        )

        def swapped() -> bool:
            # Both workers on r2: the last answers (either worker's) block 8.
            recent = load.results[-10:]
            return len(recent) == 10 and all(_ids(r) == [1] for r in recent)

        assert wait_until(swapped, timeout=30)
        count = len(load.results)
        assert wait_until(lambda: len(load.results) >= count + 20)
    answers = [_ids(result) for result in load.results]
    # Zero failed requests: every answer was a 200 from one revision or the other.
    assert None not in answers, [r for r in load.results if _ids(r) is None][:3]
    assert {tuple(ids or ()) for ids in answers} == {(1, 8), (1,)}
    # From the moment both workers had swapped, only the new revision decided.
    assert all(ids == [1] for ids in answers[count - 10 :])
    assert stack.metric('retrieval_gate_policy_info{revision="r2"}') == 1
    assert stack.metric('retrieval_gate_policy_info{revision="r1"}') == 0
    # The audit trail shows which revision decided each response.
    versions = [record["policy_version"] for record in _all_audit_records(stack)]
    assert {v.split("@")[0] for v in versions} == {"bundle:r1", "bundle:r2"}
    after = versions[-20:]
    assert all(v.startswith("bundle:r2@") for v in after)

    # A signed bundle whose data was changed after signing: refused, r2 stays.
    refused_before = stack.metric(f'{REFUSALS}{{reason="signature"}}')
    members = {**blocking_files(["1"]), ".manifest": b'{"revision": "r3"}'}
    members[".signatures.json"] = signatures_for(members, keys[0], "RS256")
    members["retrieval_gate/blocked_chunks/data.json"] = b'["1", "8"]'
    _replace(bundle_file, tar_gz(members))
    assert wait_until(
        lambda: stack.metric(f'{REFUSALS}{{reason="signature"}}') >= refused_before + 2
    ), "both workers refuse the tampered bundle"
    for _ in range(10):
        assert search_ids(stack.search(SEARCH)) == [1]
    assert _all_audit_records(stack)[-1]["policy_version"].startswith("bundle:r2@")
    assert stack.metric('retrieval_gate_policy_info{revision="r2"}') == 1
    assert stack.metric('retrieval_gate_policy_info{revision="r3"}') == 0
    log = (stack.workdir / "sidecar.log").read_text()
    assert "policy bundle refused (signature)" in log
    assert "the last good revision stays active" in log


def _all_audit_records(stack: GateStack) -> list[dict[str, Any]]:
    """Every worker's audit records, in time order."""
    records: list[dict[str, Any]] = []
    for path in sorted(stack.workdir.glob("decisions*.jsonl")):
        records.extend(orjson.loads(line) for line in path.read_bytes().splitlines())
    records.sort(key=lambda record: str(record.get("time", "")))
    return records
