"""What the benchmark ran on: CPU, cores, kernel, versions, revision, load."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from cpu import machine_busy_seconds

from sidecar.runtime.envoy_process import find_envoy

ROOT = Path(__file__).resolve().parents[1]


def _output(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout or done.stderr).strip()


def _cpuinfo() -> tuple[str, int]:
    model, logical = "", 0
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and not model:
            model = line.split(":", 1)[1].strip()
        elif line.startswith("processor"):
            logical += 1
    return model, logical


def _memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return 0.0


def _envoy_version() -> str:
    # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    text = _output([find_envoy(), "--version"])
    parts = text.split("version:", 1)[-1].strip().split("/")
    return parts[1] if len(parts) > 1 else text


def _revision() -> str:
    revision = _output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    changed = _output(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return revision + (" + uncommitted changes" if changed else "")


def background_cores(seconds: float = 2.0) -> float:
    """CPU the machine spends while the benchmark has started nothing (other jobs)."""
    busy = machine_busy_seconds()
    time.sleep(seconds)
    return round((machine_busy_seconds() - busy) / seconds, 2)


def describe() -> dict[str, Any]:
    model, logical = _cpuinfo()
    return {
        "cpu": model,
        "cpus_in_cpuinfo": logical,
        "nproc": len(os.sched_getaffinity(0)),
        "memory_gib": _memory_gib(),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "envoy": _envoy_version(),
        "wrk": _output(["wrk", "-v"]).split(" [", 1)[0],
        "git_revision": _revision(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "busy_cores_before_start": background_cores(),
    }


def one_line(machine: dict[str, Any]) -> str:
    return (
        f"{machine['cpu']}, nproc {machine['nproc']}, {machine['memory_gib']} GiB, "
        f"{machine['kernel']}, Python {machine['python']}, Envoy {machine['envoy']}, "
        f"{machine['wrk']}" + (f", {machine['postgresql']}" if machine.get("postgresql") else "")
    )
