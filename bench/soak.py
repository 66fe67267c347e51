"""The soak: half of the measured saturation for 30 minutes, with revocations, every answer judged.

Not a unit test (tests/envoy/test_soak.py runs it for a minute in CI). The rig is
the fault matrix's (bench/rig.py: Envoy, two workers, PostgreSQL store with
its change listener, a signed bundle, audit chains), with the cache TTL the
gate ships with. First the saturation is measured (``--clients`` clients, no
pacing, ``--saturation-seconds``); then the clients are paced at
``--load-fraction`` of it for ``--minutes``. Every ``--revoke-every`` seconds
one readable chunk is revoked in PostgreSQL (a committed UPDATE, as any tool
would), and approved again ``--hold`` seconds later. Every 10 s the sidecar's and
Envoy's resident memory, open file descriptors and sockets, and the store's
connections from the gate are sampled.

Judged at the end:

* 0 unfiltered answers (bench/traffic.py), where a revoked chunk counts as
  forbidden from ``--grace`` seconds after its commit until it is approved again;
* 0 decision ids missing from the verified audit chains;
* bounded growth: after the warm-up (the first ``WARM_UP_S``), the last
  minutes' median RSS at most ``RSS_GROWTH`` above the first minutes', and
  descriptors, sockets and store connections at most ``COUNT_GROWTH`` above;
* revocation propagation (commit -> the first answer without the chunk after
  which no answer carries it): p50, p99, max.

Usage: .venv/bin/python bench/soak.py [--minutes 30] [--plot docs/charts/soak.png]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core import percentile  # noqa: E402
from machine import describe as describe_machine  # noqa: E402
from rig import Rig, running_rig  # noqa: E402
from traffic import (  # noqa: E402
    NOTHING,
    READABLE,
    READABLE_IDS,
    Answer,
    Load,
    read_audit_chains,
    tally,
)

SAMPLE_EVERY_S = 10.0
WARM_UP_S = 120.0
# The growth bound: what a soak may add after its warm-up.
RSS_GROWTH = 0.10  # of the median RSS in the first minutes after the warm-up
# A steady climb is a leak even while the total stays under RSS_GROWTH: the
# least-squares slope of RSS after the warm-up, per hour.
RSS_SLOPE_MIB_PER_HOUR = 10.0
COUNT_GROWTH = 8  # descriptors, sockets, store connections


@dataclass(frozen=True)
class Sample:
    at_s: float  # since the paced load started
    sidecar_rss_mib: float  # parent and workers
    sidecar_fds: int
    sidecar_sockets: int
    envoy_rss_mib: float
    envoy_fds: int
    store_connections: int  # the gate's sessions in pg_stat_activity
    answers: int


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _fds(pid: int) -> tuple[int, int]:
    """(open descriptors, of which sockets)."""
    try:
        targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return 0, 0
    return len(targets), sum(t.startswith("socket:") for t in targets)


def sample(rig: Rig, since: float, answers: int) -> Sample:
    sidecar = rig.sidecar_pids()
    fds = [_fds(pid) for pid in sidecar]
    assert rig.gate.envoy is not None
    envoy = rig.gate.envoy.pid
    database = rig.gate.store_url.rsplit("/", 1)[1]
    with psycopg.connect(rig.gate.store_url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        ).fetchone()
    return Sample(
        round(time.monotonic() - since, 1),
        round(sum(_rss_mib(pid) for pid in sidecar), 1),
        sum(f[0] for f in fds),
        sum(f[1] for f in fds),
        round(_rss_mib(envoy), 1),
        _fds(envoy)[0],
        int(row[0]) if row else 0,
        answers,
    )


@dataclass
class Revocation:
    chunk: int
    begun: float  # time.monotonic() before the UPDATE
    committed: float
    restoring: float = float("inf")  # before the UPDATE that approves it again
    restored: float = float("inf")


class Revocations:
    """Revokes one readable chunk at a time in the store and approves it again ``hold`` s later.

    Also the load's expectation: a request that overlaps the revocation's first
    ``grace`` seconds or its restoring may get the chunk or not; one that
    started ``grace`` s after the commit and ended before the restoring must
    not get it (an unfiltered answer otherwise).
    """

    def __init__(self, store_url: str, every_s: float, hold_s: float, grace_s: float) -> None:
        self._store_url = store_url
        self._every = every_s
        self._hold = hold_s
        self.grace = grace_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.rounds: list[Revocation] = []
        self._lock = threading.Lock()

    def start(self) -> Revocations:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def expect(self, started: float, ended: float) -> tuple[frozenset[int], frozenset[int]]:
        readable = set(READABLE_IDS)
        optional: set[int] = set()
        with self._lock:
            recent = self.rounds[-3:]
        for r in recent:
            if ended < r.begun or started >= r.restored + self.grace:
                continue
            if started >= r.committed + self.grace and ended < r.restoring:
                readable.discard(r.chunk)
            else:
                optional.add(r.chunk)
        return frozenset(readable), frozenset(optional) or NOTHING

    def _run(self) -> None:
        with psycopg.connect(self._store_url, autocommit=True) as connection:
            turn = 0
            while not self._stop.wait(self._every - self._hold if self.rounds else 1.0):
                chunk = READABLE[turn % len(READABLE)]
                turn += 1
                begun = time.monotonic()
                connection.execute(
                    "UPDATE chunks SET status = 'revoked' WHERE chunk_id = %s", (chunk,)
                )
                revocation = Revocation(int(chunk), begun, time.monotonic())
                with self._lock:
                    self.rounds.append(revocation)
                self._stop.wait(self._hold)
                revocation.restoring = time.monotonic()
                connection.execute(
                    "UPDATE chunks SET status = 'approved' WHERE chunk_id = %s", (chunk,)
                )
                revocation.restored = time.monotonic()


def propagation_ms(answers: Sequence[Answer], rounds: Sequence[Revocation]) -> list[float]:
    """Per revocation: commit -> the first answer without the chunk after which none carries it
    (answers that ended before the chunk was approved again)."""
    released = sorted((a for a in answers if a.kind in ("filtered", "withheld")), key=_ended)
    found = []
    for r in rounds:
        window = [a for a in released if r.committed <= a.started and a.ended < r.restoring]
        last_with = max((a.ended for a in window if r.chunk in a.released), default=r.committed)
        clean = (a.ended for a in window if a.ended > last_with and r.chunk not in a.released)
        first_clean = next(clean, None)
        if first_clean is not None:
            found.append((first_clean - r.committed) * 1000)
    return found


def _ended(answer: Answer) -> float:
    return answer.ended


def growth(samples: Sequence[Sample], minutes: float) -> dict[str, Any]:
    """Median of the first and the last stretch after the warm-up, per quantity, and the verdict."""
    settled = [s for s in samples if s.at_s >= min(WARM_UP_S, minutes * 60 / 4)]
    if len(settled) < 4:
        return {"samples_compared": 0, "problems": []}  # too short to show a trend
    stretch = max(2, len(settled) // 5)
    first, last = settled[:stretch], settled[-stretch:]
    report: dict[str, Any] = {"samples_compared": stretch}
    problems = []
    for name in ("sidecar_rss_mib", "envoy_rss_mib"):
        a = statistics.median(getattr(s, name) for s in first)
        b = statistics.median(getattr(s, name) for s in last)
        # Per hour; the settled samples are 10 s apart, so the times never all coincide.
        fit = statistics.linear_regression(
            [s.at_s for s in settled], [getattr(s, name) for s in settled]
        )
        slope = fit.slope * 3600
        report[name] = {
            "first": a,
            "last": b,
            "growth": round(b / a - 1, 4) if a else 0.0,
            "slope_mib_per_hour": round(slope, 2),
        }
        if a and b > a * (1 + RSS_GROWTH):
            problems.append(f"{name} grew {b / a - 1:.1%} (bound {RSS_GROWTH:.0%})")
        if slope > RSS_SLOPE_MIB_PER_HOUR:
            problems.append(
                f"{name} climbs {slope:.1f} MiB/h (bound {RSS_SLOPE_MIB_PER_HOUR:g} MiB/h)"
            )
    for name in ("sidecar_fds", "sidecar_sockets", "envoy_fds", "store_connections"):
        a = statistics.median(getattr(s, name) for s in first)
        b = statistics.median(getattr(s, name) for s in last)
        peak = max(getattr(s, name) for s in settled)
        report[name] = {"first": a, "last": b, "max": peak}
        if b > a + COUNT_GROWTH:
            problems.append(f"{name} grew from {a} to {b} (bound +{COUNT_GROWTH})")
    report["problems"] = problems
    return report


def run_soak(
    *,
    minutes: float,
    clients: int,
    load_fraction: float,
    saturation_seconds: float,
    revoke_every: float,
    hold: float,
    grace: float,
) -> dict[str, Any]:
    with running_rig("rego", {"cache_ttl_seconds": 30.0}) as rig:
        rig.wait_healthy()
        saturation = Load(rig.port, clients=clients).start()
        time.sleep(saturation_seconds)
        measured = saturation.stop()
        full_rate = len(measured) / saturation_seconds
        rate = full_rate * load_fraction
        total = int(rate * minutes * 60)
        revocations = Revocations(rig.gate.store_url, revoke_every, hold, grace)
        load = Load(rig.port, total=total, clients=clients, rate=rate, expect=revocations.expect)
        since = time.monotonic()
        load.start()
        revocations.start()
        samples = [sample(rig, since, 0)]
        while load.done() < total and time.monotonic() - since < minutes * 60 * 2:
            time.sleep(SAMPLE_EVERY_S)
            samples.append(sample(rig, since, load.done()))
            print(json.dumps(asdict(samples[-1])), flush=True)
        revocations.stop()
        answers = load.wait()
        elapsed = time.monotonic() - since
        chains = read_audit_chains(rig.audit_logs())
        propagation = sorted(propagation_ms(answers, revocations.rounds))
        latencies = sorted((a.ended - a.started) * 1000 for a in answers)
        return {
            "saturation_rps": round(full_rate, 1),
            "saturation_answers": tally(measured),
            "target_rps": round(rate, 1),
            "achieved_rps": round(len(answers) / elapsed, 1),
            "seconds": round(elapsed, 1),
            "answers": tally(answers),
            "latency_ms": {
                "p50": round(percentile(latencies, 0.5), 2),
                "p99": round(percentile(latencies, 0.99), 2),
                "max": round(latencies[-1], 2),
            },
            "audit": {
                "chains": chains.chains,
                "records": chains.records,
                "chains_broken": chains.broken,
                "lost": chains.lost(answers),
            },
            "revocations": len(revocations.rounds),
            "propagation_ms": {
                "measured": len(propagation),
                "p50": round(percentile(propagation, 0.5), 1) if propagation else None,
                "p99": round(percentile(propagation, 0.99), 1) if propagation else None,
                "max": round(max(propagation), 1) if propagation else None,
            },
            "growth": growth(samples, minutes),
            "samples": [asdict(s) for s in samples],
        }


def judge_soak(result: dict[str, Any]) -> list[str]:
    """What is wrong with a soak (empty: it held)."""
    problems = []
    if result["answers"]["unfiltered"]:
        problems.append(f"{result['answers']['unfiltered']} unfiltered answers")
    if result["audit"]["lost"] or result["audit"]["chains_broken"]:
        problems.append(f"audit: {result['audit']}")
    if not result["propagation_ms"]["measured"]:
        problems.append("no revocation propagated (or none was made)")
    problems += result["growth"]["problems"]
    return problems


def plot(result: dict[str, Any], out: Path, earlier: Sequence[dict[str, Any]] = ()) -> None:
    """Three panels over time: resident memory, descriptors and connections, answers/s.

    ``earlier``: other soaks' results, whose sidecar memory is drawn dashed for comparison.
    """
    samples = result["samples"]
    minutes = [s["at_s"] / 60 for s in samples]
    figure = Figure(figsize=(8.0, 6.0), dpi=100, layout="constrained")
    memory, counts, rate = (figure.add_subplot(3, 1, n) for n in (1, 2, 3))
    memory.plot(
        minutes, [s["sidecar_rss_mib"] for s in samples], label="sidecar (2 workers + parent)"
    )
    for other, linestyle in zip(earlier, ("--", ":", "-."), strict=False):
        memory.plot(
            [s["at_s"] / 60 for s in other["samples"]],
            [s["sidecar_rss_mib"] for s in other["samples"]],
            linestyle=linestyle,
            color="#999999",
            label=f"sidecar, {other['label']}",
        )
    memory.plot(minutes, [s["envoy_rss_mib"] for s in samples], label="Envoy")
    memory.set_ylabel("RSS, MiB")
    memory.set_ylim(bottom=0)
    memory.legend(loc="lower right")
    for name, label in (
        ("sidecar_fds", "sidecar descriptors"),
        ("sidecar_sockets", "sidecar sockets"),
        ("envoy_fds", "Envoy descriptors"),
        ("store_connections", "PostgreSQL sessions"),
    ):
        counts.plot(minutes, [s[name] for s in samples], label=label)
    counts.set_ylabel("open")
    counts.set_ylim(bottom=0)
    counts.legend(loc="lower right", ncols=2)
    rates = [
        (b["answers"] - a["answers"]) / (b["at_s"] - a["at_s"])
        for a, b in itertools.pairwise(samples)
    ]
    rate.plot(minutes[1:], rates, color="#555555")
    rate.axhline(result["target_rps"], linestyle=":", color="#999999", label="target")
    rate.set_ylabel("answers/s")
    rate.set_xlabel("minutes")
    rate.set_ylim(bottom=0)
    rate.legend(loc="lower right")
    figure.suptitle(
        f"Soak: {result['seconds'] / 60:.0f} min at {result['target_rps']:.0f}/s "
        f"(half of {result['saturation_rps']:.0f}/s), {result['revocations']} revocations"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)


def rejudge(path: Path, plot_to: Path | None, compare: Sequence[Path]) -> int:
    """Judge a saved soak again (growth and problems), rewrite it, and redraw its plot."""
    report = json.loads(path.read_text())
    samples = [Sample(**s) for s in report["samples"]]
    report["growth"] = growth(samples, report["seconds"] / 60)
    report["problems"] = judge_soak(report)
    path.write_text(json.dumps(report, indent=2) + "\n")
    if plot_to is not None:
        plot(report, plot_to, [json.loads(p.read_text()) for p in compare])
    for problem in report["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if report["problems"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--load-fraction", type=float, default=0.5)
    parser.add_argument("--saturation-seconds", type=float, default=20.0)
    parser.add_argument("--revoke-every", type=float, default=20.0)
    parser.add_argument("--hold", type=float, default=10.0, help="seconds a chunk stays revoked")
    parser.add_argument(
        "--grace",
        type=float,
        default=2.0,
        help="seconds after a commit in which the revoked chunk may still be released",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    parser.add_argument("--plot", type=Path, help="write the PNG here (e.g. docs/charts/soak.png)")
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        help="an earlier soak's JSON (with a 'label') whose sidecar memory the plot also draws"
        " (repeatable)",
    )
    parser.add_argument(
        "--rejudge",
        type=Path,
        help="judge a saved result again with this revision's bounds (and redraw --plot)",
    )
    args = parser.parse_args()
    if args.rejudge is not None:
        return rejudge(args.rejudge, args.plot, args.compare)
    started = time.time()
    result = run_soak(
        minutes=args.minutes,
        clients=args.clients,
        load_fraction=args.load_fraction,
        saturation_seconds=args.saturation_seconds,
        revoke_every=args.revoke_every,
        hold=args.hold,
        grace=args.grace,
    )
    result["problems"] = judge_soak(result)
    report = {
        "machine": describe_machine(),
        "command": " ".join(["bench/soak.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        **result,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.plot is not None:
        plot(result, args.plot, [json.loads(p.read_text()) for p in args.compare])
    summary = {k: v for k, v in report.items() if k not in ("samples", "machine")}
    print(json.dumps(summary, indent=2))
    for problem in result["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
