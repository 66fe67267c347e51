"""Benchmark: this checkout against another revision, run side by side, in medians.

Not a test. On a noisy two-core machine two benchmark runs an hour apart
cannot be compared; this alternates them. It makes a worktree of ``--base``
(a git revision; the generated protobuf modules are copied in, since they are
not committed), then runs ``bench/core.py --quick`` and ``bench/suite.py
--quick --sections headline`` from each checkout in turn, base first, each
with that checkout's sidecar package (``PYTHONPATH``) and its own scripts.
The summary gives, per case, the median over rounds of each side's medians
and their ratio, oriented so that a ratio of at least 1 means "not slower".

Usage: .venv/bin/python bench/side_by_side.py --base REV [--rounds 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Not committed: the build writes them (setup.py).
GENERATED = ("sidecar/wire/*_pb2*.py", "sidecar/wire/*_pb2*.pyi", "sidecar/formats/*.binpb")
COMMANDS = {
    "core": ["bench/core.py", "--quick"],
    "headline": ["bench/suite.py", "--quick", "--sections", "headline"],
}


def checkout(revision: str, into: Path) -> Path:
    """A worktree of ``revision`` with this checkout's generated modules."""
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(into), revision], cwd=ROOT, check=True
    )
    for pattern in GENERATED:
        for generated in ROOT.glob(pattern):
            shutil.copy2(generated, into / generated.relative_to(ROOT))
    return into


def run(tree: Path, bench: str, out: Path) -> dict[str, Any]:
    """One run of ``bench`` from ``tree``, measuring ``tree``'s sidecar package."""
    command = [sys.executable, *COMMANDS[bench], "--out", str(out)]
    subprocess.run(command, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": _path()}, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _path() -> str:
    # The venv's entry points (retrieval-gate, envoy) and the system's (wrk).
    return f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def core_cases(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per case, the median microseconds per response (lower is better)."""
    return {
        f"core {r['chunks']} x {r['text_bytes']} B, verdicts {r['verdict_cache']}": {
            "us_per_response": r["median_us"]
        }
        for r in result["scaling"]
    }


def headline_cases(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per connection count, the gate's throughput, sidecar CPU and added latency."""
    cases = {}
    for connections, paths in result["results"]["headline"]["connections"].items():
        gate = paths["gate"]
        cases[f"headline {connections} conn"] = {
            "gate_rps": gate["rps"],
            "sidecar_cpu_us_per_response": gate["sidecar_cpu_s_per_1k"] * 1000,
            "added_p50_ms": paths["compare"]["added_p50_ms"],
            "added_p99_ms": paths["compare"]["added_p99_ms"],
        }
    return cases


HIGHER_IS_BETTER = {"gate_rps"}
CASES = {"core": core_cases, "headline": headline_cases}


def summarise(runs: dict[str, list[dict[str, dict[str, float]]]]) -> dict[str, Any]:
    """Median of each side's per-run figures, and base/new ratios where >= 1 is not slower."""
    summary: dict[str, Any] = {}
    for case in runs["base"][0]:
        for metric in runs["base"][0][case]:
            base = statistics.median(r[case][metric] for r in runs["base"])
            new = statistics.median(r[case][metric] for r in runs["new"])
            ratio = new / base if metric in HIGHER_IS_BETTER else base / new
            summary.setdefault(case, {})[metric] = {
                "base": round(base, 2),
                "new": round(new, 2),
                "ratio": round(ratio, 3),
            }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each side, alternated")
    parser.add_argument(
        "--benches", nargs="+", choices=sorted(COMMANDS), default=["core", "headline"]
    )
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/...)")
    args = parser.parse_args()
    started = datetime.now(UTC)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out = args.out or ROOT / "bench" / "results" / f"{started:%Y-%m-%d}-side-by-side-{head}.json"
    runs: dict[str, dict[str, list[dict[str, dict[str, float]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        base = checkout(args.base, Path(tmp) / "base")
        try:
            for bench in args.benches:
                runs[bench] = {"base": [], "new": []}
                for i in range(args.rounds):
                    for side, tree in (("base", base), ("new", ROOT)):
                        result = run(tree, bench, Path(tmp) / f"{bench}-{side}-{i}.json")
                        runs[bench][side].append(CASES[bench](result))
                        print(f"{bench} round {i + 1}/{args.rounds}: {side} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    document = {
        "benchmark": "side by side: this checkout against --base, alternated",
        "command": "python bench/side_by_side.py " + " ".join(sys.argv[1:]),
        "when": started.isoformat(timespec="seconds"),
        "base": args.base,
        "new": head,
        "rounds": args.rounds,
        "summary": {bench: summarise(r) for bench, r in runs.items()},
        "runs": runs,
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
    for cases in document["summary"].values():
        for case, metrics in cases.items():
            for metric, figures in metrics.items():
                print(f"{case:40} {metric:30} {figures}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
