"""Fuzz the gate's parsers: response adapters, request rewriters, record and bundle loaders.

Not a test: the kept corpus is replayed in CI by tests/unit/test_fuzz_corpus.py.
Coverage-guided with atheris (libFuzzer): each target runs in a process of
its own, with the project's modules instrumented, from its corpus in
``tests/corpus/<target>/``; a structure-aware mutator changes JSON bodies as
trees and protobuf bodies as wire fields, beside byte-level mutations.
Every input goes through the target's oracle (``fuzz_targets.judge``):
crashes, hangs and oracle failures are counted, and the first input of each
distinct failure goes into the results (base64) and into
``$TMPDIR/retrieval-gate-fuzz/failures/``.
A failure's input belongs in the corpus as ``regression-<what>``, with a test.

Usage:
  .venv/bin/python bench/fuzz.py --target all --runs 1000000   # the published run
  .venv/bin/python bench/fuzz.py --target response-qdrant --seconds 60
  .venv/bin/python bench/fuzz.py --list
  .venv/bin/python bench/fuzz.py --seed-corpus          # seeds for targets without a corpus
  .venv/bin/python bench/fuzz.py --target all --runs 1000000 --merge   # and minimise
      the inputs that reached new coverage into tests/corpus/ (libFuzzer -merge=1,
      then at most CORPUS_BYTES_PER_TARGET bytes per target)

``--runs`` is the total over the targets chosen (split by ``WEIGHTS``);
``--seconds`` bounds each target's run. Results: ``bench/results/<date>-fuzz.json``.
Needs atheris (``pip install atheris``; the [fuzz] extra) for fuzzing; the
corpus replay does not.
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

BENCH: Final = Path(__file__).resolve().parent
ROOT: Final = BENCH.parent
sys.path.insert(0, str(ROOT))  # run as a script: make `tests` importable

from fuzz_targets import (  # noqa: E402
    CORPUS,
    CRASH,
    HANG,
    ORACLE,
    OUTCOMES,
    Target,
    all_targets,
    judge,
)

RESULTS: Final = BENCH / "results"
WORK: Final = Path(tempfile.gettempdir()) / "retrieval-gate-fuzz"
FAILURES: Final = WORK / "failures"
MAX_LEN: Final = 2048
# The corpus kept in the repository: at most this many bytes per target (the
# largest inputs of a merged corpus over it are dropped), and the regression
# inputs (named regression-*), which are never dropped.
CORPUS_BYTES_PER_TARGET: Final = 16_000
# libFuzzer's own bound, for an input that never returns (the harness's is HANG_SECONDS).
HARD_TIMEOUT_SECONDS: Final = 20
# Share of --runs per target, relative: the loaders and the GraphQL and
# bundle targets are slower per input, the adapters the main surface.
WEIGHTS: Final = {"bundle-loader": 0.5, "record-loader": 1.0}
_STATS_EVERY_SECONDS: Final = 2.0
_COVERAGE: Final = re.compile(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


# -- the worker: one target under libFuzzer ----------------------------------------------


class _Tally:
    """What a worker has seen, written to ``path`` every few seconds and on every failure."""

    def __init__(self, target: str, path: Path, runs: int, deadline: float) -> None:
        self.target = target
        self.path = path
        self.runs = runs
        self.deadline = deadline
        self.outcomes: Counter[str] = Counter()
        self.failures: dict[str, dict[str, Any]] = {}
        self.slowest = 0.0
        self.written = 0.0

    def add(self, data: bytes, outcome: str, seconds: float, detail: str, signature: str) -> None:
        self.outcomes[outcome] += 1
        self.slowest = max(self.slowest, seconds)
        if outcome in (CRASH, HANG, ORACLE):
            failure = self.failures.setdefault(
                signature, {"outcome": outcome, "detail": detail, "count": 0}
            )
            failure["count"] += 1
            if failure["count"] == 1:
                failure["input_base64"] = base64.b64encode(data).decode()
                _keep_failure(self.target, signature, data)
            self.write()
        elif time.monotonic() - self.written > _STATS_EVERY_SECONDS:
            self.write()

    def done(self) -> bool:
        return sum(self.outcomes.values()) >= self.runs or time.monotonic() > self.deadline

    def write(self) -> None:
        self.written = time.monotonic()
        report = {
            "inputs": sum(self.outcomes.values()),
            "outcomes": {name: self.outcomes[name] for name in OUTCOMES},
            "slowest_input_seconds": round(self.slowest, 4),
            "failures": list(self.failures.values()),
        }
        self.path.write_text(json.dumps(report, indent=1))


def _keep_failure(target: str, signature: str, data: bytes) -> None:
    folder = FAILURES / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{signature}.bin").write_bytes(data)


def work(name: str, runs: int, seconds: float, stats: Path, corpora: Sequence[Path]) -> None:
    """Fuzz ``name`` under atheris until ``runs`` inputs or ``seconds`` have passed.

    Exits the process when done (libFuzzer never returns), after writing ``stats``.
    """
    # Optional (the [fuzz] extra) and untyped: only the fuzzing itself needs it.
    import atheris  # type: ignore[import-untyped,import-not-found,unused-ignore]

    with atheris.instrument_imports(include=["sidecar"]):
        target = all_targets()[name]
    tally = _Tally(name, stats, runs, time.monotonic() + seconds)
    mutate = _mutator(target)

    def one(data: bytes) -> None:
        verdict = judge(target, data)
        signature = verdict.signature() if verdict.detail else ""
        tally.add(data, verdict.outcome, verdict.seconds, verdict.detail, signature)
        if tally.done():
            tally.write()
            sys.stderr.flush()
            os._exit(0)

    argv = [
        sys.argv[0],
        f"-max_len={MAX_LEN}",
        f"-timeout={HARD_TIMEOUT_SECONDS}",
        "-rss_limit_mb=3072",
        f"-artifact_prefix={FAILURES / name}/libfuzzer-",
        *(str(path) for path in corpora),
    ]
    (FAILURES / name).mkdir(parents=True, exist_ok=True)
    atheris.Setup(argv, one, custom_mutator=mutate)
    atheris.Fuzz()


# -- structure-aware mutation ------------------------------------------------------------


def _mutator(target: Target) -> Callable[[bytes, int, int], bytes]:
    """libFuzzer's custom mutator for ``target``: half of the time a structural change
    of the body (JSON tree, protobuf wire fields), else a byte mutation; sometimes a
    selector byte.

    The byte mutations are our own: atheris 3.0's ``Mutate`` (libFuzzer's) fails
    with "Fuzz() must be called before Mutate()" once the code under test is
    instrumented, so it is not used.
    """

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        head, body = bytearray(data[: target.header]), data[target.header :]
        if head and rng.random() < 0.15:
            head[rng.randrange(len(head))] = rng.randrange(256)
            return bytes(head) + body
        room = max(1, max_size - len(head))
        changed: bytes | None = None
        structural = _STRUCTURAL.get(target.kind)
        if structural is not None and rng.random() < 0.5:
            try:
                changed = structural(body, rng)
            except (ValueError, TypeError, IndexError, KeyError, RecursionError):
                changed = None  # a tree the step cannot change: mutate the bytes
        if changed is None or len(changed) > room:
            changed = _mutate_bytes(body, rng)[:room]
        return bytes(head) + changed

    return mutate


_TOKENS: Final = (
    b"null", b"true", b"0", b"-1", b"1e999", b"18446744073709551616", b'""', b"[]", b"{}",
    b'"id"', b'"text"', b'"_id"', b'"hits"', b"\\u0000", b"\\ud800", b"\xff", b"\x00",
    b"\n", b"(", b")", b'"', b"\\", b",", b":",
)  # fmt: skip


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to four byte-level changes: flip, set, insert, delete, duplicate, a token."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(out))
        action = rng.randrange(6)
        if action == 0 and at < len(out):
            out[at] ^= 1 << rng.randrange(8)
        elif action == 1 and at < len(out):
            out[at] = rng.randrange(256)
        elif action == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif action == 3 and out:
            del out[at : at + rng.randint(1, 8)]
        elif action == 4 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start : start + rng.randint(1, 32)]
        else:
            out[at:at] = rng.choice(_TOKENS)
    return bytes(out)


_INTERESTING: Final[Sequence[Any]] = (
    None, True, False, 0, 1, -1, 2**31, 2**53 + 1, 2**63, 2**64, -(2**63) - 1, 0.5, 1e308,
    "", "1", "9000", "a", "text", "id", "_id", "\u0000", "\ud7ff\ue000", "x" * 40, [], {},
    {"text": "delta secret text four"}, {"id": 7, "payload": {"text": "epsilon secret text"}},
)  # fmt: skip


def _mutate_json(body: bytes, rng: random.Random) -> bytes | None:
    # The json module, not orjson: integers past 64 bits and lone surrogates are
    # inputs worth sending.
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    for _ in range(rng.randint(1, 3)):
        document = _json_step(document, rng)
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        return None
    return text.encode("utf-8", "surrogatepass")


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    found = [(path, value)]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _nodes(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _nodes(child, (*path, index))
    return found


def _json_step(document: Any, rng: random.Random) -> Any:
    """One change to the tree: replace, delete, duplicate, move in a copy, rename a key."""
    nodes = _nodes(document)
    path, node = rng.choice(nodes)
    other = rng.choice(nodes)[1]
    keys = [p[-1] for p, _ in nodes if p and isinstance(p[-1], str)] or ["id"]
    action = rng.randrange(6)
    if not path:
        return copy.deepcopy(other) if action == 0 else document
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == 0:
        parent[last] = rng.choice(_INTERESTING)
    elif action == 1:
        del parent[last]
    elif action == 2 and isinstance(parent, list):
        parent.insert(last, copy.deepcopy(node))
    elif action == 3:
        moved = copy.deepcopy(other)
        if isinstance(node, list):
            node.insert(rng.randint(0, len(node)), moved)
        elif isinstance(node, dict):
            node[rng.choice(keys)] = moved
        else:
            parent[last] = moved
    elif action == 4 and isinstance(parent, dict):
        parent[rng.choice(keys)] = parent.pop(last)
    elif action == 5 and isinstance(parent, list) and len(parent) > 1:
        i = rng.randrange(len(parent))
        parent[i], parent[last] = parent[last], parent[i]
    else:
        parent[last] = [node]
    return document


def _mutate_lines(body: bytes, rng: random.Random) -> bytes | None:
    """A JSON change to one line of a JSON Lines body."""
    lines = body.split(b"\n")
    index = rng.randrange(len(lines))
    changed = _mutate_json(lines[index], rng)
    if changed is None:
        return None
    lines[index] = changed
    return b"\n".join(lines)


def _mutate_grpc(body: bytes, rng: random.Random) -> bytes | None:
    """A change to the wire fields of the framed message (kept one valid frame)."""
    if len(body) < 5:
        return None
    fields = _wire_fields(body[5:])
    if fields is None:
        return None
    changed = _wire_step(fields, rng, depth=0)
    message = _wire_encode(changed)
    return b"\0" + len(message).to_bytes(4, "big") + message


Field = tuple[int, int, Any]  # field number, wire type, int or bytes


def _varint(data: bytes, offset: int) -> tuple[int, int] | None:
    value = shift = 0
    while offset < len(data) and shift < 70:
        byte = data[offset]
        value |= (byte & 0x7F) << shift
        offset += 1
        if not byte & 0x80:
            return value, offset
        shift += 7
    return None


def _wire_fields(data: bytes) -> list[Field] | None:
    fields: list[Field] = []
    offset = 0
    while offset < len(data):
        read = _varint(data, offset)
        if read is None:
            return None
        key, offset = read
        number, kind = key >> 3, key & 7
        if kind == 0:
            value = _varint(data, offset)
            if value is None:
                return None
            fields.append((number, kind, value[0]))
            offset = value[1]
        elif kind in (1, 5):
            size = 8 if kind == 1 else 4
            fields.append((number, kind, data[offset : offset + size]))
            offset += size
        elif kind == 2:
            length = _varint(data, offset)
            if length is None or length[1] + length[0] > len(data):
                return None
            fields.append((number, kind, data[length[1] : length[1] + length[0]]))
            offset = length[1] + length[0]
        else:
            return None
    return fields if offset == len(data) else None


def _put_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _wire_encode(fields: Sequence[Field]) -> bytes:
    out = bytearray()
    for number, kind, value in fields:
        out += _put_varint(number << 3 | kind)
        if kind == 0:
            out += _put_varint(value)
        elif kind == 2:
            out += _put_varint(len(value)) + value
        else:
            out += value
    return bytes(out)


_WIRE_VALUES: Final = (0, 1, 2, 3, 2**63, 2**64 - 1, 9000)


def _wire_step(fields: list[Field], rng: random.Random, depth: int) -> list[Field]:
    """Duplicate, drop, swap or change a field; or the same inside a nested message."""
    if not fields:
        return [(rng.randint(1, 20), 0, rng.choice(_WIRE_VALUES))]
    index = rng.randrange(len(fields))
    number, kind, value = fields[index]
    action = rng.randrange(6)
    if action == 0:
        fields.insert(index, fields[index])
    elif action == 1:
        del fields[index]
    elif action == 2:
        other = rng.randrange(len(fields))
        fields[index], fields[other] = fields[other], fields[index]
    elif action == 3 and kind == 0:
        fields[index] = (number, kind, rng.choice(_WIRE_VALUES))
    elif action == 4:
        fields.insert(rng.randrange(len(fields) + 1), rng.choice(fields))
    elif kind == 2 and depth < 6:
        nested = _wire_fields(value)
        if nested is not None and nested:
            fields[index] = (number, kind, _wire_encode(_wire_step(nested, rng, depth + 1)))
        else:
            fields[index] = (number, kind, value + rng.choice([b"", b"x", value]))
    return fields


_STRUCTURAL: Final[dict[str, Callable[[bytes, random.Random], bytes | None]]] = {
    "json": _mutate_json,
    "ndjson": _mutate_lines,
    "grpc": _mutate_grpc,
}


# -- the parent: runs, corpus, results -----------------------------------------------------


def _split(total: int, names: Sequence[str]) -> dict[str, int]:
    weights = {name: WEIGHTS.get(name, 1.0) for name in names}
    scale = total / sum(weights.values())
    # Rounded up: the targets together get at least ``total`` inputs.
    return {name: max(1, math.ceil(weight * scale)) for name, weight in weights.items()}


def _coverage(log: str) -> dict[str, int] | None:
    last = None
    for line in log.splitlines():
        match = _COVERAGE.match(line)
        if match:
            last = match
    if last is None:
        return None
    return {
        "edges": int(last.group(2)),
        "features": int(last.group(3)),
        "corpus": int(last.group(4)),
    }


def fuzz(names: Sequence[str], runs: int, seconds: float, work_root: Path) -> dict[str, Any]:
    """Fuzz each target in turn (one process each); the results by target."""
    results: dict[str, Any] = {}
    for name, count in _split(runs, names).items():
        work_dir = work_root / name
        work_dir.mkdir(parents=True, exist_ok=True)
        stats = work_root / f"{name}.stats.json"
        stats.unlink(missing_ok=True)
        kept = CORPUS / name
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
        command += ["--runs", str(count), "--seconds", str(seconds), "--stats", str(stats)]
        command += [str(work_dir), *([str(kept)] if kept.is_dir() else [])]
        started = time.monotonic()
        print(f"{name}: {count} inputs ...", file=sys.stderr, flush=True)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - started
        (work_root / f"{name}.log").write_text(done.stderr)
        report = json.loads(stats.read_text()) if stats.exists() else {"inputs": 0}
        if done.returncode != 0:
            _ended_by_libfuzzer(name, done.returncode, done.stderr, report)
        report["seconds"] = round(elapsed, 1)
        report["coverage"] = _coverage(done.stderr)
        report["new_corpus_inputs"] = len(list(work_dir.iterdir()))
        results[name] = report
        print(f"{name}: {json.dumps(_summary(report))}", file=sys.stderr, flush=True)
    return results


def _ended_by_libfuzzer(name: str, code: int, log: str, report: dict[str, Any]) -> None:
    """Count what made libFuzzer end a worker: an input past the hard timeout (a
    hang) or out of memory (a crash); anything else is the harness's own failure."""
    if "ALARM: working on the last Unit" in log:
        outcome = HANG
    elif "out-of-memory" in log:
        outcome = CRASH
    else:
        raise RuntimeError(f"{name}: the fuzz worker failed ({code}):\n{log[-3000:]}")
    report.setdefault("failures", []).append(
        {"outcome": outcome, "detail": f"libFuzzer ended the run ({code})", "count": 1}
    )
    outcomes = report.setdefault("outcomes", {})
    outcomes[outcome] = outcomes.get(outcome, 0) + 1


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    outcomes = report.get("outcomes", {})
    return {
        "inputs": report.get("inputs", 0),
        "crashes": outcomes.get(CRASH, 0),
        "hangs": outcomes.get(HANG, 0),
        "oracle_failures": outcomes.get(ORACLE, 0),
        "seconds": report.get("seconds"),
        "coverage": report.get("coverage"),
    }


def merge(names: Sequence[str], work_root: Path) -> None:
    """Minimise ``tests/corpus/<target>`` with the inputs found in ``work_root``: libFuzzer's
    -merge=1 keeps the smallest set reaching the same coverage."""
    for name in names:
        found = work_root / name
        kept = CORPUS / name
        merged = work_root / f"{name}.merged"
        shutil.rmtree(merged, ignore_errors=True)
        merged.mkdir()
        # libFuzzer runs the merge in a child it starts as ``argv[0] <its flags>``:
        # a script that starts the worker again.
        wrapper = work_root / f"merge-{name}"
        wrapper.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" '
            f'--worker "{name}" --merge-into "{merged}" -- "$@"\n'
        )
        wrapper.chmod(0o755)
        sources = [str(path) for path in (found, kept) if path.is_dir()]
        command = [str(wrapper), "-merge=1", f"-max_len={MAX_LEN}", str(merged), *sources]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        inputs = list(merged.iterdir())
        if done.returncode != 0 or not inputs:
            raise RuntimeError(f"{name}: the corpus merge failed:\n{done.stderr[-3000:]}")
        regressions = sorted(kept.glob("regression-*")) if kept.is_dir() else []
        known = {path.read_bytes() for path in regressions}
        inputs = _within_budget([p for p in inputs if p.read_bytes() not in known])
        staged = work_root / f"{name}.kept"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        for path in [*inputs, *regressions]:
            shutil.copy(path, staged / path.name)
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(staged, kept)
        size = sum(path.stat().st_size for path in kept.iterdir())
        print(f"{name}: {len(inputs)} corpus inputs, {size} bytes", file=sys.stderr)


def _within_budget(inputs: list[Path]) -> list[Path]:
    """The smallest of ``inputs`` that fit in ``CORPUS_BYTES_PER_TARGET`` together."""
    kept, total = [], 0
    for path in sorted(inputs, key=lambda p: (p.stat().st_size, p.name)):
        total += path.stat().st_size
        if total > CORPUS_BYTES_PER_TARGET:
            break
        kept.append(path)
    return kept


def merge_worker(name: str, merged: Path, libfuzzer_args: Sequence[str]) -> None:
    """libFuzzer's corpus merge for ``name`` into ``merged`` (run from the wrapper
    ``merge`` writes, which libFuzzer runs again for the merge's inner steps; exits)."""
    # Optional (the [fuzz] extra) and untyped: only the fuzzing itself needs it.
    import atheris  # type: ignore[import-untyped,import-not-found,unused-ignore]

    with atheris.instrument_imports(include=["sidecar"]):
        target = all_targets()[name]

    def one(data: bytes) -> None:
        judge(target, data)

    wrapper = merged.parent / f"merge-{name}"
    atheris.Setup([str(wrapper), *libfuzzer_args], one)
    atheris.Fuzz()


def seed_corpus(names: Sequence[str]) -> None:
    """Write each target's seeds to ``tests/corpus/<target>`` where it has no corpus yet."""
    targets = all_targets()
    for name in names:
        folder = CORPUS / name
        if folder.is_dir() and any(folder.iterdir()):
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for data in targets[name].seeds():
            (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="all", help="a target name, or all")
    parser.add_argument("--runs", type=int, default=10_000, help="inputs in total")
    parser.add_argument("--seconds", type=float, default=3600.0, help="bound per target")
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--seed-corpus", action="store_true")
    parser.add_argument("--merge", action="store_true", help="minimise into tests/corpus")
    parser.add_argument("--out", type=Path, help="results file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--merge-into", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("corpora", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker and args.merge_into:
        # After "--": libFuzzer's own arguments, passed on as they came.
        merge_worker(args.worker, args.merge_into, [str(arg) for arg in args.corpora])
        return
    if args.worker:
        work(args.worker, args.runs, args.seconds, args.stats, args.corpora)
        return
    names = list(all_targets()) if args.target == "all" else args.target.split(",")
    if args.list:
        print("\n".join(names))
        return
    if args.seed_corpus:
        seed_corpus(names)
        return
    results = fuzz(names, args.runs, args.seconds, WORK)
    if args.merge:
        merge(names, WORK)
    _publish(results, args)


def _publish(results: dict[str, Any], args: argparse.Namespace) -> None:
    from machine import describe

    totals = Counter[str]()
    for report in results.values():
        totals.update(_summary(report) | {"coverage": 0, "seconds": 0})
    document = {
        "command": " ".join(["bench/fuzz.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": describe(),
        "engine": "atheris (libFuzzer), structure-aware mutator",
        "totals": {k: v for k, v in totals.items() if k not in ("coverage", "seconds")},
        "targets": results,
    }
    out = args.out or RESULTS / f"{datetime.now(UTC).date().isoformat()}-fuzz.json"
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(document["totals"]), file=sys.stderr)
    print(f"written {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)


if __name__ == "__main__":
    main()
