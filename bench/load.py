"""Load generation with wrk, and one measured run: wrk's numbers plus the CPU spent meanwhile."""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpu import machine_busy_seconds, reaped_children_seconds

# Identity is trusted-headers (development mode): the caller's tenant and groups are headers.
CALLER_HEADERS = {
    "content-type": "application/json",
    "x-gate-tenant": "acme",
    "x-gate-principals": "user:alice,group:qa",
}
SEARCH_BODY = '{"vector":[0.1,0.2,0.3],"limit":100,"with_payload":true}'

_LATENCY = re.compile(r"^\s+(50|90|99)%\s+([\d.]+)(us|ms|s|m)\s*$", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_REQUESTS = re.compile(r"^\s+(\d+) requests in ", re.M)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_TO_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
_PERCENTILE = re.compile(r"^PCT ([\d.]+) (\d+)$", re.M)

# The numbers summarised as medians over rounds.
KEYS = ("rps", "p50_ms", "p90_ms", "p99_ms")
# The latency distribution a run reports under LATENCY: (percentile, µs) pairs at these
# percentiles, 100 being the slowest request. wrk's --latency table has four points only.
LATENCY = "latency_us"
PERCENTILES = (1, 5, 10, 20, 30, 40, 50, 60, 70, 75, 80, 85, 90, 95, 97.5, 99, 99.5, 99.9, 100)

# One wrk run, or the medians of rounds: floats by name, and the distribution under LATENCY.
Run = dict[str, Any]

# wrk calls done() once, with every thread's latencies merged. Its percentile(100) is 0
# (wrk 4.1 looks for rank count + 1), so the slowest request is latency.max.
_DONE = """
done = function(summary, latency, requests)
  for _, p in ipairs({%s}) do
    local us = p == 100 and latency.max or latency:percentile(p)
    io.write(string.format("PCT %%g %%d\\n", p, us))
  end
end
"""


def write_script(path: Path, body: str = SEARCH_BODY) -> Path:
    """The wrk Lua script that sends the search ``body`` as the caller and prints, at the
    end, the latency at each of PERCENTILES (lines ``PCT <percentile> <µs>``)."""
    lines = ['wrk.method = "POST"', f"wrk.body = '{body}'"]
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in CALLER_HEADERS.items()]
    lines.append(_DONE % ", ".join(f"{p:g}" for p in PERCENTILES))
    path.write_text("\n".join(lines))
    return path


def parse_wrk(output: str) -> Run:
    """requests/s, p50/p90/p99 (ms), requests, non-2xx and socket errors from `wrk --latency`,
    and the latency distribution (LATENCY) printed by write_script's done()."""
    result: Run = {f"p{p}_ms": float(v) * _TO_MS[u] for p, v, u in _LATENCY.findall(output)}
    distribution = tuple((float(p), float(us)) for p, us in _PERCENTILE.findall(output))
    rps, requests = _RPS.search(output), _REQUESTS.search(output)
    seen = tuple(p for p, _ in distribution)
    if rps is None or requests is None or len(result) != 3 or seen != PERCENTILES:
        raise RuntimeError(f"unexpected wrk output:\n{output}")
    result[LATENCY] = distribution
    result["rps"] = float(rps.group(1))
    result["requests"] = float(requests.group(1))
    non_2xx = _NON_2XX.search(output)
    result["non_2xx"] = float(non_2xx.group(1)) if non_2xx else 0.0
    errors = _SOCKET_ERRORS.search(output)
    result["socket_errors"] = float(sum(int(g) for g in errors.groups())) if errors else 0.0
    return result


def run_wrk(url: str, connections: int, seconds: float, script: Path) -> Run:
    command = [
        "wrk",
        f"-t{min(connections, 2)}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)


def measure(
    url: str,
    connections: int,
    seconds: float,
    script: Path,
    cpu_of: Mapping[str, Callable[[], float]],
) -> Run:
    """One wrk run, plus CPU seconds per 1,000 responses for each watched process
    (``cpu_of``: name -> cumulative CPU seconds) and for wrk itself, and the CPU
    that everything else on the machine used meanwhile (``other_cores``: the
    noise from other jobs on a shared machine, in cores)."""
    before = {name: read() for name, read in cpu_of.items()}
    busy, wrk_cpu, wall = machine_busy_seconds(), reaped_children_seconds(), time.monotonic()
    run = run_wrk(url, connections, seconds, script)
    wall = time.monotonic() - wall
    wrk_cpu = reaped_children_seconds() - wrk_cpu
    busy = machine_busy_seconds() - busy
    used = {name: read() - before[name] for name, read in cpu_of.items()}
    per_1k = 1000 / max(run["requests"], 1.0)
    for name, seconds_used in used.items():
        run[f"{name}_cpu_s_per_1k"] = seconds_used * per_1k
    run["wrk_cpu_s_per_1k"] = wrk_cpu * per_1k
    run["other_cores"] = max(0.0, busy - wrk_cpu - sum(used.values())) / wall
    return run


def medians(runs: Sequence[Mapping[str, Any]]) -> Run:
    """Median of every numeric field over rounds, and of each percentile of the latency
    distribution; errors are summed, not medianed."""
    summary: Run = {
        key: statistics.median(r[key] for r in runs) for key in runs[0] if key != LATENCY
    }
    summary[LATENCY] = median_distribution([r[LATENCY] for r in runs])
    for key in ("non_2xx", "socket_errors", "requests"):
        summary[key] = sum(r[key] for r in runs)
    rps = [r["rps"] for r in runs]
    summary["rps_spread_pct"] = 100 * (max(rps) - min(rps)) / max(statistics.median(rps), 1e-9)
    return summary


def median_distribution(
    distributions: Sequence[Sequence[tuple[float, float]]],
) -> tuple[tuple[float, float], ...]:
    """Per percentile, the median latency over rounds (every round has the same percentiles)."""
    percentiles = [p for p, _ in distributions[0]]
    if any([p for p, _ in d] != percentiles for d in distributions):
        raise ValueError("the rounds' latency distributions are at different percentiles")
    return tuple(
        (p, statistics.median(d[i][1] for d in distributions)) for i, p in enumerate(percentiles)
    )


def compare(envoy: Mapping[str, float], gate: Mapping[str, float]) -> dict[str, Any]:
    """Envoy + gate against Envoy alone (both medians)."""
    return {
        "rps_ratio": gate["rps"] / envoy["rps"],
        "added_p50_ms": gate["p50_ms"] - envoy["p50_ms"],
        "added_p90_ms": gate["p90_ms"] - envoy["p90_ms"],
        "added_p99_ms": gate["p99_ms"] - envoy["p99_ms"],
    }
