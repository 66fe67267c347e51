"""Benchmark: does Gate/Filter's reply time say whether another tenant's record exists?

Not a test. Runs a real `retrieval-gate serve` (identity ``jwt``) with
``--candidates`` records of tenant ``globex`` and calls Gate/Filter as a caller
of tenant ``acme`` with three batches of that size, interleaved round by round:

- ``other-right``: the other tenant's ids with their right texts;
- ``other-wrong``: the same ids with wrong guesses (a hash mismatch);
- ``unknown``: ids that have no record.

All three get byte-identical answers (tests/envoy/test_gate_service.py); this
measures whether they take the same time. Reports each case's median and the
median of the per-round differences to ``unknown``, in microseconds.

Usage: .venv/bin/python bench/gate_filter_timing.py [--rounds 200] [--candidates 400]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from sidecar.wire import gate_pb2, gate_pb2_grpc  # noqa: E402
from tests.fixtures import tokens  # noqa: E402
from tests.fixtures.harness import GateStack  # noqa: E402
from tests.fixtures.records import record_dict, text_for  # noqa: E402

SECRET = tokens.hmac_secret()
CASES = ("other-right", "other-wrong", "unknown")


def _batches(count: int) -> dict[str, gate_pb2.FilterRequest]:
    ids = [f"globex-{n}" for n in range(count)]

    def request(pairs: list[tuple[str, str]]) -> gate_pb2.FilterRequest:
        return gate_pb2.FilterRequest(
            candidates=[gate_pb2.Candidate(id=i, text=t) for i, t in pairs]
        )

    return {
        "other-right": request([(i, text_for(i)) for i in ids]),
        # Same length as the right text, one word changed: a plausible guess.
        "other-wrong": request([(i, text_for(i).replace("chunk", "chunx", 1)) for i in ids]),
        "unknown": request([(f"nobody-{n}", text_for(i)) for n, i in enumerate(ids)]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=400)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    records = [record_dict(f"globex-{n}", tenant_id="globex") for n in range(args.candidates)]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        stack = GateStack(
            workdir, records, config=dict(tokens.hmac_identity(workdir, SECRET)), gate_service=True
        ).start()
        channel = grpc.insecure_channel(f"unix:{stack.gate_socket}")
        try:
            stub = gate_pb2_grpc.GateStub(channel)
            token = tokens.token(SECRET, tokens.claims(groups=["qa"], lifetime=3600))
            metadata = (("authorization", f"Bearer {token}"),)
            batches = _batches(args.candidates)
            for request in batches.values():  # warm the caches and the verdict cache
                stub.Filter(request, metadata=metadata)
            times: dict[str, list[float]] = {case: [] for case in CASES}
            for round_number in range(args.rounds):
                # Rotate the order so no case always runs first after a pause.
                order = CASES[round_number % 3 :] + CASES[: round_number % 3]
                for case in order:
                    started = time.perf_counter()
                    stub.Filter(batches[case], metadata=metadata)
                    times[case].append((time.perf_counter() - started) * 1e6)
        finally:
            channel.close()
            stack.stop()
    result = {
        "rounds": args.rounds,
        "candidates": args.candidates,
        "median_us": {case: round(statistics.median(times[case])) for case in CASES},
        "median_difference_to_unknown_us": {
            case: round(
                statistics.median(a - b for a, b in zip(times[case], times["unknown"], strict=True))
            )
            for case in CASES[:2]
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
