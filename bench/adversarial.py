"""Benchmark: adversarial identity and tenancy cases (issue 16, item 2) against the real gate.

Not a test: ``tests/envoy/test_adversarial_identity.py`` runs the same generator
(``tests/adversarial``) at a reduced count in CI. This runs the full count:

- header and token cases (forged and duplicated identity headers, header
  case and whitespace, alg/kid/jku/x5u/jwk/x5c confusion, nested JWTs, times
  at the leeway's edges, wrong iss/aud, unicode-confusable, control-character
  and very long tenants, chunk id collisions in the database's answers)
  through a real Envoy with ``retrieval-gate serve``, once per JWT mode
  (``envoy-jwt`` and ``jwt``), in front of a database that ignores the tenant
  filter and returns every tenant's points;
- record cases (missing, null, mistyped, duplicated fields) through the
  record loader;
- chunk ids loaded for one tenant, then another, through a sidecar assembled
  in process as ``serve`` assembles it.

Prints a Markdown table per case class (cases, refused by status/code,
admitted with only the caller's own tenant's chunks, cross-tenant releases,
other failed invariants), where the two JWT modes answered differently, and
every failed invariant; writes the same, with every case's outcome, to
``--out``. Exits 1 if any cross-tenant release happened.

Usage: .venv/bin/python bench/adversarial.py [--seed 16] [--count 1200] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machine import describe, one_line  # noqa: E402

from tests.fixtures.adversarial.cases import generate  # noqa: E402
from tests.fixtures.adversarial.model import EITHER, Case, HttpCase, RecordCase, StoreCase  # noqa: E402
from tests.fixtures.adversarial.runner import (  # noqa: E402
    MODES,
    EnvoyStacks,
    InProcessSidecar,
    run_record_case,
)
from tests.fixtures.adversarial.tokens import Keys  # noqa: E402
from tests.fixtures.adversarial.verdicts import Outcome, table  # noqa: E402
from tests.fixtures.adversarial.world import GHOSTS, TENANTS, build_world  # noqa: E402


def run_all(cases: Sequence[Case], workdir: Path) -> list[Outcome]:
    """Every case where it runs: HTTP ones through both stacks, the others in process."""
    world = build_world()
    outcomes: list[Outcome] = []
    stacks = EnvoyStacks(workdir, world, Keys()).start()
    try:
        for case in cases:
            if isinstance(case, HttpCase):
                outcomes += stacks.run(case)
    finally:
        stacks.stop()
    outcomes += [run_record_case(c, workdir) for c in cases if isinstance(c, RecordCase)]
    outcomes += asyncio.run(_store_cases([c for c in cases if isinstance(c, StoreCase)], workdir))
    return outcomes


async def _store_cases(cases: Sequence[StoreCase], workdir: Path) -> list[Outcome]:
    sidecar = InProcessSidecar(workdir)
    try:
        return [outcome for case in cases for outcome in await sidecar.run(case)]
    finally:
        await sidecar.close()


def mode_disagreements(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Cases the two JWT modes answered differently (admitted by one, refused by the other)."""
    by_case: dict[str, dict[str, Outcome]] = defaultdict(dict)
    for outcome in outcomes:
        if outcome.where in MODES:
            by_case[outcome.case_id][outcome.where] = outcome
    counted: Counter[tuple[str, str, str, str]] = Counter()
    for pair in by_case.values():
        answers = {mode: _answer(outcome) for mode, outcome in pair.items()}
        if len({outcome.result for outcome in pair.values()}) > 1:
            sample = next(iter(pair.values()))
            counted[(sample.kind, sample.what, answers["envoy-jwt"], answers["jwt"])] += 1
    return [
        {"class": kind, "case": what, "envoy-jwt": envoy, "jwt": jwt, "cases": n}
        for (kind, what, envoy, jwt), n in sorted(counted.items())
    ]


def _answer(outcome: Outcome) -> str:
    return "200" if outcome.result == "admitted" else (outcome.refusal or "refused")


def either_answers(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """How each mode answered the cases the documents promise nothing about."""
    counted: Counter[tuple[str, str, str, str]] = Counter()
    for outcome in outcomes:
        if outcome.expect == EITHER:
            counted[(outcome.kind, outcome.what, outcome.where, _answer(outcome))] += 1
    return [
        {"class": kind, "case": what, "ran": where, "answer": answer, "cases": n}
        for (kind, what, where, answer), n in sorted(counted.items())
    ]


def failures(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    """Every failed invariant, grouped by class, mode, case and problem."""
    counted: Counter[tuple[str, str, str, str]] = Counter()
    for outcome in outcomes:
        for problem in outcome.problems:
            counted[(outcome.kind, outcome.where, outcome.what, problem)] += 1
    return [
        {"class": kind, "ran": where, "case": what, "problem": problem, "cases": n}
        for (kind, where, what, problem), n in sorted(counted.items())
    ]


def _markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "-|" * len(columns)]
    for row in rows:
        cells = [str(row[column]).replace("|", "\\|").replace("\n", "\\n") for column in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    """Run the cases, print the tables, write the results file; 1 if anything crossed tenants."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--count", type=int, default=1200)
    today = datetime.now(UTC).date().isoformat()
    default_out = ROOT / "bench" / "results" / f"{today}-adversarial.json"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    machine = describe()
    cases = generate(args.seed, args.count)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_all(cases, Path(tmp))
    seconds = time.monotonic() - started
    summary = table(outcomes)
    disagreements = mode_disagreements(outcomes)
    either = either_answers(outcomes)
    failed = failures(outcomes)
    leaks = sum(outcome.cross_tenant for outcome in outcomes)
    print(f"{len(cases)} cases (seed {args.seed}), {len(outcomes)} runs, {seconds:.0f} s")
    print(f"machine: {one_line(machine)}\n")
    print(summary)
    print("\nWhere the JWT modes answered differently:\n")
    print(_markdown(disagreements, ("class", "case", "envoy-jwt", "jwt", "cases")))
    print("\nFailed invariants:\n")
    print(_markdown(failed, ("class", "ran", "case", "problem", "cases")) if failed else "none")
    report = {
        "benchmark": "bench/adversarial.py",
        "command": f"python bench/adversarial.py --seed {args.seed} --count {args.count} "
        f"--out {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}",
        "seed": args.seed,
        "count": args.count,
        "cases_per_class": dict(Counter(case.kind for case in cases)),
        "runs": len(outcomes),
        "seconds": round(seconds, 1),
        "machine": machine,
        "world": {
            "tenants": len(TENANTS),
            "tenants_without_records": len(GHOSTS),
            "points_per_answer": len(build_world().points),
        },
        "cross_tenant_releases": leaks,
        # Client headers with "gate" in their name that reached the database (not
        # a failed invariant: only x-gate-* is the gate's, and it is stripped).
        "gate_like_headers_forwarded": dict(
            Counter(
                name
                for outcome in outcomes
                for name in outcome.notes.get("gate_like_headers_forwarded", [])
            )
        ),
        "runs_with_failed_invariants": sum(1 for outcome in outcomes if outcome.problems),
        "table": summary,
        "mode_disagreements": disagreements,
        "either_answers": either,
        "failed_invariants": failed,
        # Every run, by where it ran and what came of it (expectation: answer):
        # the case ids, space-separated; an in-process case's runs are .1 to .6
        # (after the first load: first, second tenant asks; after the second load,
        # cache warm; after the cache dropped the record).
        "outcomes": _by_answer(outcomes),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    return 1 if leaks else 0


def _by_answer(outcomes: Sequence[Outcome]) -> dict[str, dict[str, str]]:
    grouped: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    steps: Counter[str] = Counter()
    for outcome in outcomes:
        case_id = outcome.case_id
        if outcome.where == "in process":
            steps[case_id] += 1
            case_id = f"{case_id}.{steps[case_id]}"
        grouped[outcome.where][_line(outcome)].append(case_id)
    return {
        where: {line: " ".join(ids) for line, ids in sorted(lines.items())}
        for where, lines in grouped.items()
    }


def _line(outcome: Outcome) -> str:
    released = f", released {len(outcome.released)}" if outcome.result == "admitted" else ""
    crossed = f", CROSS-TENANT {outcome.cross_tenant}" if outcome.cross_tenant else ""
    failed = f", FAILED: {'; '.join(outcome.problems)}" if outcome.problems else ""
    return f"{outcome.expect}: {_answer(outcome)}{released}{crossed}{failed}"


if __name__ == "__main__":
    sys.exit(main())
