"""What every fuzz target shares: the target record, the oracle's verdicts, one run.

A target takes one input (bytes) and returns ``ACCEPTED`` (the oracle checked
what the gate made of it) or ``REFUSED`` (one of the target's documented
exceptions); it raises ``OracleFailure`` when the gate's answer breaks the
oracle, and anything else that escapes is a crash. ``judge`` runs one input
and names the outcome, with the per-input time bound that makes a hang.

The targets live in ``fuzz_responses`` (response adapters), ``fuzz_requests``
(request rewriters) and ``fuzz_loaders`` (record and bundle loaders);
``bench/fuzz.py`` fuzzes them and ``tests/unit/test_fuzz_corpus.py`` replays the
kept corpus (``tests/corpus/<target>/``) through the same ``judge``.
"""

from __future__ import annotations

import hashlib
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
CORPUS: Final = ROOT / "tests" / "corpus"

ACCEPTED: Final = "accepted"
REFUSED: Final = "refused"
CRASH: Final = "crash"
HANG: Final = "hang"
ORACLE: Final = "oracle"
OUTCOMES: Final = (ACCEPTED, REFUSED, CRASH, HANG, ORACLE)

# An input that takes longer than this is a hang. Inputs are at most a few KB
# and the slowest target (a bundle compiled by regorus) takes milliseconds,
# so the bound leaves room for a loaded machine and an instrumented run.
HANG_SECONDS: Final = 2.0


class OracleFailure(Exception):
    """The gate's answer breaks the oracle (a disallowed chunk released, a search
    forwarded without the tenant filter, an invalid record accepted)."""


@dataclass(frozen=True)
class Target:
    """One fuzz target.

    ``run`` checks one input (see the module docstring). ``seeds`` are the
    inputs a fresh corpus starts from. ``kind`` says how the structure-aware
    mutator reads an input: ``json``, ``ndjson`` and ``grpc`` bodies after
    ``header`` selector bytes, or ``raw``.
    """

    name: str
    run: Callable[[bytes], str]
    seeds: Callable[[], list[bytes]]
    kind: str
    header: int


@dataclass(frozen=True)
class Verdict:
    """The outcome of one input; ``detail`` is the failure's text for crashes and
    oracle failures (the exception type and where it was raised)."""

    outcome: str
    seconds: float
    detail: str = ""

    def signature(self) -> str:
        """A short stable name of the failure, to count distinct ones."""
        return hashlib.sha256(self.detail.encode()).hexdigest()[:12]


def judge(target: Target, data: bytes) -> Verdict:
    """Run ``data`` through ``target`` and name the outcome."""
    started = time.perf_counter()
    try:
        outcome = target.run(data)
        detail = ""
    except OracleFailure as exc:
        outcome, detail = ORACLE, f"OracleFailure: {exc}"
    except Exception as exc:
        outcome, detail = CRASH, _where(exc)
    seconds = time.perf_counter() - started
    if outcome in (ACCEPTED, REFUSED) and seconds > HANG_SECONDS:
        outcome = HANG
    return Verdict(outcome, seconds, detail)


def _where(exc: BaseException) -> str:
    """The exception's type and the innermost frame of the project that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "/sidecar/" in f.filename] or frames
    place = f"{Path(own[-1].filename).name}:{own[-1].lineno}" if own else "?"
    return f"{type(exc).__name__} at {place}"


def all_targets() -> dict[str, Target]:
    """Every target by name."""
    # Imported here: the target modules import this one.
    import fuzz_loaders
    import fuzz_requests
    import fuzz_responses

    found = [*fuzz_responses.targets(), *fuzz_requests.targets(), *fuzz_loaders.targets()]
    return {target.name: target for target in found}


def header(data: bytes, size: int) -> tuple[Sequence[int], bytes]:
    """The first ``size`` bytes of ``data`` as numbers (zeros past its end), and the rest."""
    head = data[:size].ljust(size, b"\0")
    return list(head), data[size:]


def pick(items: Sequence[object], selector: int) -> int:
    """The index ``selector`` picks among ``items``."""
    return selector % len(items)


def admits(salt: int, chunk_id: str) -> bool:
    """The oracle's fixed rule for which chunk ids the policy admits.

    Salt 255 admits every id and 254 none; otherwise an id is admitted when
    the hash of the salt and the id is even, so the fuzzer steers which hits
    go by changing one byte.
    """
    if salt == 255:
        return True
    if salt == 254:
        return False
    digest = hashlib.sha256(bytes([salt]) + chunk_id.encode("utf-8", "surrogatepass")).digest()
    return digest[0] % 2 == 0
