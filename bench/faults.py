"""The fault matrix: each fault injected under load through a real Envoy, every answer judged.

Not a unit test (tests/envoy/test_fault_matrix.py runs it at a reduced count in CI).
Per fault, ``--clients`` clients search through Envoy + `retrieval-gate serve`
(two workers, PostgreSQL store with its change listener, a signed policy
bundle, JSON Lines audit chains on a tmpfs of their own) in front of a
database stand-in that misbehaves on command (bench/fault_upstream.py). After
30% of ``--requests`` the fault is injected; ``--fault-seconds`` later it is
lifted; the load runs on until ``--requests`` answers are in and the gate has
answered correctly for a while. Every answer is judged (bench/traffic.py):
filtered, withheld, refused (by status and code) or **unfiltered** (must be
0). Reported per fault: the counts before, during and after the fault, the
recovery time (fault lifted -> the last answer that was not a full, correct
release), and the audit records lost (decision ids a client received that no
verified chain holds).

Usage:
  .venv/bin/python bench/faults.py                       # full: 10,000 requests per fault
  .venv/bin/python bench/faults.py --requests 400 --fault-seconds 2 --only sidecar_killed
Needs root (pg_ctlcluster for the PostgreSQL fault, a tmpfs for the audit one)
and PostgreSQL on 127.0.0.1:5432; a fault whose need is missing is reported
as not run, with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine import describe as describe_machine  # noqa: E402
from rig import DENY_UNKNOWN, MAX_BODY_BYTES, MESSAGE_TIMEOUT_MS, Rig, running_rig  # noqa: E402
from traffic import Answer, Load, read_audit_chains, tally  # noqa: E402

from tests.fixtures.fake_opa import FakeOpa  # noqa: E402
from tests.fixtures.postgres import (  # noqa: E402
    control_cluster,
    local_cluster,
    postgres_available,
)

# The gate is back when this many answers in a row, after the fault, were full releases.
SETTLED_ANSWERS = 50
RECOVERY_LIMIT_S = 60.0

# Chunk policies that fail at evaluation: iterating over a string is a runtime
# error in Rego. ERRORS_ON_OUR_DATA fails only on this corpus's chunk 3, so the
# bundle's own tests pass and it is activated: a policy that breaks in
# production. ERRORS_EVERYWHERE fails on every input: the bundle's tests fail
# and the gate refuses it before it is ever used.
ERRORS_ON_OUR_DATA = (
    DENY_UNKNOWN + b' |\n\t\t{"POLICY_DENY" | c.id == "3"; some part in c.source_uri; part == ""}'
)
ERRORS_EVERYWHERE = (
    DENY_UNKNOWN + b' |\n\t\t{"POLICY_DENY" | some part in c.source_uri; part == ""}'
)


# ---- the faults -------------------------------------------------------------------------


def _signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _kill_sidecar(rig: Rig) -> None:
    _signal_all(rig.sidecar_pids(), signal.SIGKILL)


def _restart_sidecar(rig: Rig) -> None:
    assert rig.gate.sidecar is not None
    rig.gate.sidecar.wait(30)
    rig.gate.start_sidecar()


def _stall_sidecar(rig: Rig) -> None:
    rig.stalled = rig.sidecar_pids()
    _signal_all(rig.stalled, signal.SIGSTOP)


def _resume_sidecar(rig: Rig) -> None:
    _signal_all(rig.stalled, signal.SIGCONT)


def _kill_one_worker(rig: Rig) -> None:
    assert rig.gate.sidecar is not None
    workers = [pid for pid in rig.sidecar_pids() if pid != rig.gate.sidecar.pid]
    os.kill(max(workers), signal.SIGKILL)


_LISTENING = re.compile(rb"listening for metadata changes on .* \(backend pid (\d+)\)")


def _cut_listener(rig: Rig) -> None:
    """Terminate every worker's LISTEN session (the backend pids their logs name)."""
    log = rig.workdir / "sidecar.log"
    deadline = time.monotonic() + 30
    with psycopg.connect(rig.gate.store_url, autocommit=True) as connection:
        while True:
            named = [int(pid) for pid in _LISTENING.findall(log.read_bytes())]
            live = connection.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", (named,)
            ).fetchall()
            # A listener still reconnecting after an earlier fault is waited for.
            if len(live) >= rig.workers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for (pid,) in live:
            connection.execute("SELECT pg_terminate_backend(%s)", (pid,))
    if len(live) < rig.workers:
        raise RuntimeError(f"found {len(live)} LISTEN sessions, expected {rig.workers}")


_FILLER = "filler.bin"


def _fill_audit_disk(rig: Rig) -> None:
    """Take every free byte of the audit tmpfs with a filler file."""
    with (rig.audit_dir / _FILLER).open("wb", buffering=0) as filler:
        free = os.statvfs(rig.audit_dir)
        # Reserved in large pieces (a write loop over gigabytes would outlast
        # the fault), halving when the gate's own writes got there first, then
        # topped up by writes to the last byte.
        size, end = free.f_bavail * free.f_frsize, 0
        while size >= 4096:
            try:
                os.posix_fallocate(filler.fileno(), end, size)
                end += size
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2
        filler.seek(end)
        for size in (4096, 64, 1):
            block = b"\0" * size
            try:
                while True:
                    filler.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


def _free_audit_disk(rig: Rig) -> None:
    (rig.audit_dir / _FILLER).unlink()


def _reopen(opa: FakeOpa) -> None:
    opa.start()


def _nothing(rig: Rig) -> None:
    """The fault ends by itself (the gate must recover without help)."""


def _needs_root_cluster() -> str | None:
    if local_cluster() is None:
        return "needs a local PostgreSQL cluster this user can stop (pg_ctlcluster, root)"
    return None


def _needs_tmpfs() -> str | None:
    return None if os.geteuid() == 0 else "needs root to mount a small tmpfs for the audit log"


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[Rig], None]
    clear: Callable[[Rig], None]
    # True: answers during the fault must not all be full releases (else the
    # fault was not injected); False: the gate must absorb it (all full releases).
    disturbs: bool
    engine: str = "rego"
    needs: Callable[[], str | None] = lambda: None


def _upstream(mode: str, what: str, disturbs: bool = True) -> Fault:
    return Fault(
        f"upstream_{mode}",
        what,
        lambda rig: rig.upstream_mode(mode),
        lambda rig: rig.upstream_mode("normal"),
        disturbs,
    )


FAULTS = [
    Fault(
        "sidecar_killed",
        "every sidecar process SIGKILLed, restarted when the fault ends",
        _kill_sidecar,
        _restart_sidecar,
        True,
    ),
    Fault(
        "sidecar_stalled",
        f"every sidecar process SIGSTOPped past Envoy's {MESSAGE_TIMEOUT_MS} ms message timeout",
        _stall_sidecar,
        _resume_sidecar,
        True,
    ),
    Fault(
        "worker_killed",
        "one of two workers SIGKILLed (the pool stops); restarted when the fault ends",
        _kill_one_worker,
        _restart_sidecar,
        True,
    ),
    Fault(
        "store_stopped",
        "PostgreSQL stopped (pg_ctlcluster stop), started when the fault ends",
        lambda rig: control_cluster("stop"),
        lambda rig: control_cluster("start"),
        True,
        needs=_needs_root_cluster,
    ),
    Fault(
        "listener_cut",
        "the change listener's connection terminated (pg_terminate_backend)",
        _cut_listener,
        _nothing,
        False,
    ),
    Fault(
        "policy_error",
        "a signed bundle whose chunk policy errors on this corpus (its own tests pass); "
        "the good one back after",
        lambda rig: rig.install_bundle(ERRORS_ON_OUR_DATA),
        lambda rig: rig.install_bundle(),
        True,
    ),
    Fault(
        "bundle_tests_fail",
        "a signed bundle whose policy errors on every input, so its own tests fail",
        lambda rig: rig.install_bundle(ERRORS_EVERYWHERE),
        lambda rig: rig.install_bundle(),
        False,
    ),
    Fault(
        "bad_bundle",
        "a bundle altered after signing; the good one back after",
        lambda rig: rig.install_bundle(tampered=True),
        lambda rig: rig.install_bundle(),
        False,
    ),
    _upstream("reset", "the database resets the connection (RST) instead of answering"),
    _upstream("truncate", "the database sends half the body and closes"),
    _upstream("slow", "the database drips the body in ten pieces", disturbs=False),
    _upstream("bomb", "a gzip body that inflates to 64 MiB"),
    _upstream("oversize", f"a valid body of {2 * MAX_BODY_BYTES} bytes (limit {MAX_BODY_BYTES})"),
    _upstream("error", "a 500 whose text names another collection"),
    Fault(
        "audit_disk_full",
        "the audit log's filesystem full (a tmpfs filled up), space freed when the fault ends",
        _fill_audit_disk,
        _free_audit_disk,
        True,
        needs=_needs_tmpfs,
    ),
    Fault(
        "opa_down",
        "the OPA server's port closed (a FAKE OPA: no OPA binary here), reopened after",
        lambda rig: rig.fake_opa().down(),
        lambda rig: _reopen(rig.fake_opa()),
        True,
        engine="opa",
    ),
]


# ---- running one fault --------------------------------------------------------------------


def _settled(answers: list[Answer], since: float) -> bool:
    tail = answers[-SETTLED_ANSWERS:]
    return (
        len(tail) == SETTLED_ANSWERS
        and tail[0].started >= since
        and all(a.kind == "filtered" for a in tail)
    )


def run_fault(
    rig: Rig, fault: Fault, *, requests: int, fault_seconds: float, clients: int
) -> dict[str, Any]:
    """Inject ``fault`` under load; the judged answers, by phase, and the recovery time."""
    rig.wait_healthy(RECOVERY_LIMIT_S)
    load = Load(rig.port, total=None, clients=clients).start()
    while load.done() < requests * 0.3:
        time.sleep(0.01)
    on = time.monotonic()
    fault.inject(rig)
    time.sleep(fault_seconds)
    # Recovery counts from the moment the fault is lifted: a restart's own
    # start-up time is part of it.
    off = time.monotonic()
    fault.clear(rig)
    deadline = off + RECOVERY_LIMIT_S
    while time.monotonic() < deadline and not (
        load.done() >= requests and _settled(load.answers, off)
    ):
        time.sleep(0.05)
    answers = sorted(load.stop(), key=lambda a: a.ended)
    recovered = _settled(answers, off)
    unhealthy = [a.ended for a in answers if a.kind != "filtered" and a.ended > off]
    return {
        "fault": fault.name,
        "what": fault.what,
        "disturbs": fault.disturbs,
        "fault_seconds": round(off - on, 3),
        "recovered": recovered,
        "recovery_s": round(max(unhealthy) - off, 3) if unhealthy and recovered else 0.0,
        "all": tally(answers),
        "before": tally(a for a in answers if a.ended < on),
        "during": tally(a for a in answers if on <= a.ended < off),
        "after": tally(a for a in answers if a.ended >= off),
        "_answers": answers,
    }


def judge_fault(result: dict[str, Any]) -> list[str]:
    """What is wrong with one fault's result (empty: the gate kept its promise)."""
    problems = []
    if result["all"]["unfiltered"]:
        problems.append(f"{result['all']['unfiltered']} unfiltered answers")
    if result["audit"]["chains_broken"]:
        problems.append(f"audit chains broken: {result['audit']['chains_broken']}")
    if result.get("audit_lost"):
        problems.append(f"{result['audit_lost']} decision ids missing from the audit chains")
    if not result["recovered"]:
        problems.append(f"not recovered within {RECOVERY_LIMIT_S} s")
    during = result["during"]
    if result["disturbs"] and during["filtered"] == during["requests"]:
        problems.append("every answer during the fault was a full release: was it injected?")
    if not result["disturbs"] and during["filtered"] != during["requests"]:
        problems.append(f"the gate did not absorb the fault: {during}")
    return problems


def run_matrix(
    names: list[str] | None, *, requests: int, fault_seconds: float, clients: int
) -> list[dict[str, Any]]:
    """Every fault (or those ``names``), per engine one rig; audit checked per rig at the end."""
    chosen = [f for f in FAULTS if names is None or f.name in names]
    results: list[dict[str, Any]] = []
    for engine in ("rego", "opa"):
        faults = [f for f in chosen if f.engine == engine]
        if not faults:
            continue
        with running_rig(engine) as rig:
            ran = []
            for fault in faults:
                missing = fault.needs()
                if missing is not None:
                    results.append({"fault": fault.name, "what": fault.what, "not_run": missing})
                    continue
                try:
                    result = run_fault(
                        rig, fault, requests=requests, fault_seconds=fault_seconds, clients=clients
                    )
                finally:
                    if postgres_available() is not None and local_cluster() is not None:
                        control_cluster("start")  # never leave the machine without its server
                print(_line(result), flush=True)
                ran.append(result)
            chains = read_audit_chains(rig.audit_logs())
            for result in ran:
                answers = result.pop("_answers")
                result["audit"] = {
                    "decision_ids_received": len({a.decision_id for a in answers} - {None}),
                    "chains": chains.chains,
                    "records": chains.records,
                    "chains_broken": chains.broken,
                }
                result["audit_lost"] = chains.lost(answers)
                result["problems"] = judge_fault(result)
            results.extend(ran)
    return results


def _line(result: dict[str, Any]) -> str:
    during, every = result["during"], result["all"]
    return (
        f"{result['fault']:<18} requests {every['requests']:>6}  unfiltered {every['unfiltered']}"
        f"  during: filtered {during['filtered']} withheld {during['withheld']}"
        f" refused {during['refused']} {during['refusals']}  recovery {result['recovery_s']} s"
    )


def markdown(results: list[dict[str, Any]]) -> str:
    """The table docs/reliability.md shows."""
    rows = [
        "| fault | requests | during the fault: filtered / withheld / refused (by status and code)"
        " | **unfiltered** | recovery | audit records lost |",
        "|-|-|-|-|-|-|",
    ]
    for r in results:
        if "not_run" in r:
            rows.append(f"| {r['fault']} | not run: {r['not_run']} | | | | |")
            continue
        d = r["during"]
        refusals = ", ".join(f"{k} {v}" for k, v in d["refusals"].items()) or "none"
        rows.append(
            f"| {r['fault']} | {r['all']['requests']:,} | {d['filtered']} / {d['withheld']} / "
            f"{d['refused']} ({refusals}) | **{r['all']['unfiltered']}** | "
            f"{r['recovery_s']} s | {r['audit_lost']} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="at least, per fault")
    parser.add_argument("--fault-seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--only", action="append", help="a fault's name (repeatable)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "faults.json")
    args = parser.parse_args()
    unknown = set(args.only or ()) - {f.name for f in FAULTS}
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {[f.name for f in FAULTS]}")
    started = time.time()
    results = run_matrix(
        args.only, requests=args.requests, fault_seconds=args.fault_seconds, clients=args.clients
    )
    report = {
        "machine": describe_machine(),
        "command": " ".join(["bench/faults.py", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "requests_per_fault": args.requests,
        "fault_seconds": args.fault_seconds,
        "clients": args.clients,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(results))
    failed = {r["fault"]: r["problems"] for r in results if r.get("problems")}
    for name, problems in failed.items():
        print(f"FAILED {name}: {'; '.join(problems)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
