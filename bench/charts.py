"""PNG charts of a suite result, for docs/benchmarks.md.

  bench-latency.png     latency distribution: Envoy alone, the floor, the gate (floor section)
  bench-throughput.png  requests/s against connections, and the gate's share of Envoy alone
  bench-chunks.png      added p50 and sidecar CPU against chunks per response (scaling)
  bench-pieces.png      the sidecar's CPU per response, piece by piece (pieces)

A chart whose data the result does not hold is not written (an older result has no
latency distribution, sweep or pieces).

Usage: .venv/bin/python bench/charts.py bench/results/<file>.json [--out docs/]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

BENCH = Path(__file__).resolve().parent
# 800 x 450 px: the width of a rendered Markdown page.
SIZE, DPI = (8.0, 4.5), 100
COLOURS = {"envoy": "#4c72b0", "floor": "#8c8c8c", "gate": "#dd8452"}
# Where the slowest request is drawn on the percentile axis (the logit scale has no 100%).
MAX_AT = 99.99
PERCENTILE_TICKS = (1, 10, 50, 90, 99, 99.9)


def _figure(panels: int, title: str) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    axes = [figure.add_subplot(1, panels, n + 1) for n in range(panels)]
    figure.suptitle(title)
    return figure, axes


def _save(figure: Figure, path: Path) -> Path:
    # No software version in the PNG: regenerating with another matplotlib changes nothing.
    figure.savefig(path, format="png", metadata={"Software": None})
    return path


def _label(path: str, floor_name: str | None = None) -> str:
    """A path's name in a legend; a floor's may be more precise than its key."""
    fixed = {"envoy": "Envoy alone", "gate": "Envoy + gate"}
    return fixed.get(path, f"{floor_name or path} (no-op ext_proc)")


def _colour(path: str) -> str:
    return COLOURS["floor" if path.startswith("floor") else path]


def _workload(results: Mapping[str, Any], section: Mapping[str, Any]) -> str:
    """The section's workload, else the suite's headline one (the sections share it)."""
    for where in (section, results.get("floor", {}), results.get("headline", {})):
        if "workload" in where:
            return str(where["workload"])
    return "the suite's search"


def _plural(connections: str | int) -> str:
    return f"{connections} connection{'' if str(connections) == '1' else 's'}"


# --- latency distribution ----------------------------------------------------------------


def latency_panels(floor: Mapping[str, Any]) -> dict[str, dict[str, Sequence[Sequence[float]]]]:
    """Per connection count ("1", "8"): path -> (percentile, µs) pairs, for Envoy alone, the
    floor the gate is matched with and the gate; only the runs that hold a distribution, and
    only where the gate's does."""
    matched = floor.get("matched_floor", "floor+body")
    panels: dict[str, dict[str, Sequence[Sequence[float]]]] = {}
    for c in ("1", "8"):
        runs = floor.get("connections", {}).get(c)
        if not runs:
            continue
        paths = runs.get("paths", {})
        found = {
            "envoy": runs.get("envoy", {}).get("latency_us"),
            matched: paths.get(matched, {}).get("run", {}).get("latency_us"),
            "gate": paths.get("gate", {}).get("run", {}).get("latency_us"),
        }
        if found["gate"]:
            panels[c] = {path: d for path, d in found.items() if d}
    return panels


def _percentile_axis(ax: Axes) -> None:
    """Logit scale: room for both the body (p1-p90) and the tail (p99, p99.9, the max)."""
    ax.set_xscale("logit")
    ticks = [p / 100 for p in (*PERCENTILE_TICKS, MAX_AT)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    labels = [f"p{p:g}" for p in PERCENTILE_TICKS] + ["max"]
    ax.xaxis.set_major_formatter(FuncFormatter(lambda _, n: labels[n] if n < len(labels) else ""))
    ax.set_xlim(0.005, 0.99995)
    ax.set_xlabel("percentile of requests")


def _ms_log_axis(ax: Axes) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def latency_chart(results: Mapping[str, Any], path: Path) -> Path | None:
    """Latency against percentile, one panel per connection count."""
    floor = results.get("floor", {})
    panels = latency_panels(floor)
    if not panels:
        return None
    figure, axes = _figure(len(panels), f"Latency distribution: {_workload(results, floor)}")
    for ax, (connections, paths) in zip(axes, panels.items(), strict=True):
        for key, distribution in paths.items():
            x = [MAX_AT / 100 if p >= 100 else p / 100 for p, _ in distribution]
            y = [us / 1000 for _, us in distribution]
            ax.plot(x, y, marker=".", label=_label(key), color=_colour(key))
        _percentile_axis(ax)
        _ms_log_axis(ax)
        ax.set_title(_plural(connections))
        ax.set_ylabel("latency (ms, log scale)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(loc="upper left")
    return _save(figure, path)


# --- throughput against connections ------------------------------------------------------


def sweep_paths(sweep: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """path -> one run per connection count; paths with a run missing are left out."""
    count, paths = len(sweep.get("connections", [])), sweep.get("paths", {})
    wanted = ("envoy", "floor", "gate")
    return {p: paths[p] for p in wanted if count and len(paths.get(p, [])) == count}


def throughput_chart(results: Mapping[str, Any], path: Path) -> Path | None:
    """Requests/s against connections, and each path's share of Envoy alone."""
    sweep = results.get("sweep", {})
    connections, paths = sweep.get("connections", []), sweep_paths(sweep)
    if "gate" not in paths:
        return None
    title = f"Throughput against connections: {_workload(results, sweep)}"
    figure, (rps_ax, share_ax) = _figure(2, title)
    for key, runs in paths.items():
        rps, label = [run["rps"] for run in runs], _label(key, sweep.get("floor"))
        rps_ax.plot(connections, rps, marker="o", label=label, color=_colour(key))
        if key != "envoy" and "envoy" in paths:
            alone = [run["rps"] for run in paths["envoy"]]
            share = [100 * r / a for r, a in zip(rps, alone, strict=True)]
            share_ax.plot(connections, share, marker="o", label=label, color=_colour(key))
            share_ax.annotate(
                f"{share[-1]:.0f}%",
                (connections[-1], share[-1]),
                xytext=(0, 6),
                textcoords="offset points",
                ha="center",
                fontsize=9,
            )
    for ax in (rps_ax, share_ax):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(connections))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("connections (wrk)")
        ax.grid(True, alpha=0.3)
    rps_ax.set_ylabel("requests/s")
    rps_ax.set_ylim(bottom=0)
    rps_ax.legend()
    share_ax.set_ylabel("% of Envoy alone's requests/s")
    share_ax.set_ylim(0, 100)
    share_ax.set_title("share of Envoy alone")
    rps_ax.set_title("requests/s")
    return _save(figure, path)


# --- cost against chunks per response ----------------------------------------------------


def chunk_rows(scaling: Mapping[str, Any], text_bytes: int = 800) -> list[Mapping[str, Any]]:
    """The scaling workloads of ``text_bytes`` of text per chunk, by chunks."""
    rows = [w for w in scaling.values() if w.get("text_bytes") == text_bytes]
    return sorted(rows, key=lambda w: w["chunks"])


def chunks_chart(results: Mapping[str, Any], path: Path, text_bytes: int = 800) -> Path | None:
    """Added p50 and the sidecar's CPU per response against chunks per response."""
    rows = chunk_rows(results.get("scaling", {}), text_bytes)
    if not rows:
        return None
    chunks = [w["chunks"] for w in rows]
    added = [w["compare"]["added_p50_ms"] for w in rows]
    # sidecar_cpu_s_per_1k: CPU seconds per 1,000 responses = ms per response.
    cpu = [1000 * w["gate"]["sidecar_cpu_s_per_1k"] for w in rows]
    title = f"Cost against chunks per response (N chunks x {text_bytes} B, 1 connection, hot cache)"
    figure, (p50_ax, cpu_ax) = _figure(2, title)
    p50_ax.plot(chunks, added, marker="o", color=COLOURS["gate"])
    p50_ax.set_ylabel("added p50 (ms), gate vs Envoy alone")
    p50_ax.set_title("added latency")
    cpu_ax.plot(chunks, cpu, marker="o", color=COLOURS["gate"])
    cpu_ax.set_ylabel("sidecar CPU (µs per response)")
    cpu_ax.set_title("sidecar CPU")
    if len(rows) > 1:
        fit = statistics.linear_regression(chunks, cpu)
        cpu_ax.annotate(
            f"least squares: {fit.intercept:,.0f} µs + {fit.slope:,.1f} µs per chunk",
            (0.03, 0.95),
            xycoords="axes fraction",
            va="top",
            fontsize=9,
        )
    for ax in (p50_ax, cpu_ax):
        ax.set_xlabel("chunks per response")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    return _save(figure, path)


# --- CPU per piece -----------------------------------------------------------------------

REST = "rest (not attributed to a piece)"
# matplotlib's ten colours, then tab20's light ones but its grey (REST is grey).
PALETTE = [f"C{n}" for n in range(10)] + [
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
]


def piece_bars(pieces: Mapping[str, Any]) -> list[tuple[str, dict[str, float], float]]:
    """One bar per (connections, path), the gate next to its floor: its label, µs per
    response by piece (in the order measured, plus what the total has that no piece
    accounts for) and the total."""
    names = {"gate": "gate", "floor": pieces.get("floor_name", "floor")}
    bars = []
    for connections in ("1", "8"):
        for path, name in names.items():
            measured = pieces.get(path, {}).get(connections)
            if not measured:
                continue
            parts = dict(measured.get("pieces", {}))
            total = measured.get("cpu_us", sum(parts.values()))
            if total - sum(parts.values()) >= 0.5:
                parts[REST] = total - sum(parts.values())
            bars.append((f"{name}, {_plural(connections)}", parts, total))
    return bars


def pieces_chart(results: Mapping[str, Any], path: Path) -> Path | None:
    """Horizontal stacked bars of the sidecar's CPU per response, piece by piece."""
    section = results.get("pieces", {})
    bars = piece_bars(section)
    if not bars:
        return None
    names = list(dict.fromkeys(name for _, parts, _ in bars for name in parts))
    colours = {name: PALETTE[n % len(PALETTE)] for n, name in enumerate(names)}
    colours[REST] = "#d9d9d9"
    figure, (ax,) = _figure(1, f"Sidecar CPU per response, by piece: {_workload(results, section)}")
    labels = [label for label, _, _ in bars]
    lefts = [0.0] * len(bars)
    for name in names:
        widths = [parts.get(name, 0.0) for _, parts, _ in bars]
        ax.barh(labels, widths, left=lefts, color=colours[name], label=name, height=0.6)
        lefts = [left + width for left, width in zip(lefts, widths, strict=True)]
    for n, (_, _, total) in enumerate(bars):
        ax.annotate(
            f"{total:,.0f} µs",
            (total, n),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=9,
        )
    ax.invert_yaxis()
    ax.set_xlabel("sidecar CPU (µs per response)")
    ax.set_xlim(0, max(total for _, _, total in bars) * 1.12)
    ax.grid(True, axis="x", alpha=0.3)
    # Two columns: the pieces' names run to ~55 characters.
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    return _save(figure, path)


# --- all of them -------------------------------------------------------------------------

CHARTS = {
    "bench-latency.png": latency_chart,
    "bench-throughput.png": throughput_chart,
    "bench-chunks.png": chunks_chart,
    "bench-pieces.png": pieces_chart,
}


def write_charts(report: Mapping[str, Any], directory: Path) -> list[Path]:
    """Every chart the suite result ``report`` has data for, as PNG files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    results = report.get("results", {})
    written = [chart(results, directory / name) for name, chart in CHARTS.items()]
    return [path for path in written if path is not None]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a suite result (bench/results/*.json)")
    parser.add_argument("--out", type=Path, default=BENCH.parent / "docs", help="where to write")
    args = parser.parse_args()
    written = write_charts(json.loads(args.report.read_text()), args.out)
    for path in written:
        print(path)
    skipped = sorted(set(CHARTS) - {path.name for path in written})
    if skipped:
        print(f"no data in {args.report} for: {', '.join(skipped)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
