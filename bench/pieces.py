"""Where the sidecar's CPU goes per response, measured under load through Envoy.

A sampling profiler (py-spy, ``--gil --nonblocking --threads``) watches the
sidecar while wrk drives requests through the front Envoy; nothing in the
sidecar is changed or paused. Each sample is the Python stack of the thread
holding the GIL at that moment, so samples count Python work (and C code called
with the GIL held), not idle waits. Every piece of the gate's work runs on the
main thread (the event loop): a main-thread sample goes to the first piece, from
the innermost frame out, whose function it names (``PIECES``), and samples x
sampling interval / responses gives µs per response.

Two corrections keep the pieces adding up to the CPU ``/proc`` counts. A thread
that holds the GIL while the kernel has it waiting for a core is sampled but
uses no CPU, so on a busy machine the samples can exceed the main thread's CPU:
then every piece is scaled down alike. When they fall short, the rest of the
main thread's CPU ran with the GIL released (system calls, gRPC's C code): a
piece of its own. The other threads' CPU (gRPC's poller, the metrics server) is
another.

The same runs on the floor servicer give the floor's pieces; the difference is
what each part of the gate costs above a Python ext_proc stream that does nothing.

Needs py-spy (``pip install -e '.[bench]'``) and permission to read another
process's memory (root, or ptrace_scope 0).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cpu import thread_cpu_seconds, tree_cpu_seconds
from load import run_wrk

# (piece, function names as py-spy prints them): the innermost frame that names one of
# a piece's functions decides the sample's piece. The gate's steps, in request order.
PIECES: tuple[tuple[str, frozenset[str]], ...] = (
    ("request policy (Rego)", frozenset({"RequestPolicy.evaluate", "CompiledPolicy.evaluate"})),
    ("admission: identity, request checks", frozenset({"RequestAdmission.admit"})),
    (
        "request headers: routing, answer",
        frozenset({"ExternalProcessorServicer._open", "RequestPath.plan"}),
    ),
    ("request body: tenant push-down", frozenset({"FilteringProcessor.request_body"})),
    ("response: parse body", frozenset({"ResponseAdapter.parse"})),
    ("response: store lookup (cache)", frozenset({"Decider._lookup"})),
    ("response: chunk policy and verdict cache", frozenset({"DecisionCore._policy_reasons"})),
    ("response: integrity checks, decisions", frozenset({"DecisionCore.decide", "Decider.decide"})),
    ("response: render released body", frozenset({"release"})),
    ("audit: record, chain, write", frozenset({"Recorder._record", "Recorder._write"})),
    ("metrics", frozenset({"Recorder._count"})),
    (
        "response: spans, facts, headers",
        frozenset({"ResponseFilter.filter", "FilteringProcessor.response_body"}),
    ),
    ("response headers", frozenset({"FilteringProcessor.response_headers"})),
    (
        "stream: messages in and out (Python)",
        frozenset({"ExternalProcessorServicer.Process", "FloorServicer.Process"}),
    ),
)
EVENT_LOOP = "event loop and gRPC callbacks (GIL held)"
MAIN_NO_GIL = "main thread, GIL released (system calls, gRPC C code)"
OTHER_THREADS = "other threads (gRPC poller, metrics server)"
RATE_HZ = 250


def available() -> str | None:
    """Why pieces cannot be measured here, or None when they can."""
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        return "py-spy is not installed (pip install -e '.[bench]')"
    return None


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else "py-spy"


def piece_of(frames: Sequence[str]) -> str:
    """The piece a sampled stack (outermost frame first, as py-spy's raw format lists
    them) belongs to."""
    for frame in reversed(frames):
        name = frame.split(" (", 1)[0]
        for piece, functions in PIECES:
            if name in functions:
                return piece
    return EVENT_LOOP


def tally(raw: str) -> dict[str, int]:
    """Main-thread samples per piece from py-spy's raw output with ``--threads`` (each
    stack's first frame names its thread)."""
    counts: dict[str, int] = {}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or not frames[0].endswith(": MainThread"):
            continue
        piece = piece_of(frames[1:])
        counts[piece] = counts.get(piece, 0) + int(count)
    return counts


def profile(
    url: str,
    connections: int,
    seconds: float,
    script: Path,
    pid: int,
) -> dict[str, Any]:
    """One wrk run at ``connections`` while py-spy samples process ``pid`` (a single
    process: ``workers = 1``); µs per response per piece, in ``PIECES`` order, then the
    event loop, the main thread's GIL-free time and the other threads."""
    with tempfile.TemporaryDirectory(prefix="gate-pieces-") as tmp:
        out = Path(tmp) / "stacks.txt"
        command = [_py_spy(), "record", "--pid", str(pid), "--rate", str(RATE_HZ)]
        command += ["--gil", "--nonblocking", "--threads", "--format", "raw"]
        command += ["--output", str(out)]
        command += ["--duration", str(round(seconds) + 2)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches before the measured run starts
        before = tree_cpu_seconds(pid), thread_cpu_seconds(pid)
        run = run_wrk(url, connections, seconds, script)
        used = tree_cpu_seconds(pid) - before[0]
        main = thread_cpu_seconds(pid) - before[1]
        _, errors = spy.communicate(timeout=seconds + 30)
        if spy.returncode != 0 or not out.exists():
            raise RuntimeError(f"py-spy failed ({spy.returncode}): {errors.decode()[-500:]}")
        counts = tally(out.read_text())
    responses = max(run["requests"], 1.0)
    # py-spy is attached a second before wrk starts and stops after it ends; the
    # idle process around the run holds the GIL for next to nothing, so every
    # sample is counted against the run's responses.
    cpu_us, main_us = used * 1e6 / responses, main * 1e6 / responses
    sampled_us = sum(counts.values()) * 1e6 / RATE_HZ / responses
    # Sampled GIL time beyond the main thread's CPU was time spent waiting for a core.
    scale = 1e6 / RATE_HZ / responses * min(1.0, main_us / max(sampled_us, 1e-9))
    pieces = {piece: counts.get(piece, 0) * scale for piece, _ in PIECES}
    pieces[EVENT_LOOP] = counts.get(EVENT_LOOP, 0) * scale
    pieces[MAIN_NO_GIL] = max(0.0, main_us - sampled_us)
    pieces[OTHER_THREADS] = max(0.0, cpu_us - main_us)
    return {
        "connections": connections,
        "rps": run["rps"],
        "cpu_us": cpu_us,
        "main_thread_us": main_us,
        "sampled_us": sampled_us,
        "samples": sum(counts.values()),
        "pieces": pieces,
    }


def above(gate: Mapping[str, Any], floor: Mapping[str, Any]) -> dict[str, float]:
    """Per piece, the gate's µs per response minus the floor's (the floor has no
    gate pieces, only the stream, the loop and gRPC's threads)."""
    return {
        piece: gate["pieces"].get(piece, 0.0) - floor["pieces"].get(piece, 0.0)
        for piece in gate["pieces"]
    }
