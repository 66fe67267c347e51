"""The embedded Rego engine: regorus (the `gordon-to-regorus` wheel) in process."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import regorus

from sidecar.policy.engine import PolicyError

DEFAULT_QUERY = "data.retrieval_gate.chunks.reasons"
_TEST_SUFFIX = "_test.rego"

# The input the policy is validated with at load time: a well-formed empty batch.
_EMPTY_BATCH = orjson.dumps(
    {"caller": {"tenant": "", "principals": []}, "now_ns": 0, "chunks": []}
).decode()

# Regorus errors carry a Rust backtrace after the message; the location line
# (`--> file:line:col`) names policy source only, never input values.
_BACKTRACE_MARKER = "Stack backtrace:"
_LOCATION = re.compile(r"-->\s*(\S+:\d+:\d+)")

# Enough for a policy reload or two without rebuilding the live engine.
_ENGINES_PER_THREAD = 4

# regorus engines are "unsendable": a thread may only use, and drop, the engines
# it created (another thread panics or leaks them). This module-level store
# outlives every RegorusEngine, so a thread's engines are dropped when that
# thread exits, on that thread, and never by a garbage collection elsewhere.
_per_thread = threading.local()


def read_rego_sources(directory: Path, *, include_tests: bool) -> dict[str, str]:
    """Read the ``.rego`` files directly inside ``directory``, by file name.

    Unit-test files (``*_test.rego``) are read only with ``include_tests``.
    Raises PolicyError when the directory cannot be read, a file is not UTF-8,
    or no file qualifies.
    """
    try:
        paths = sorted(directory.glob("*.rego"))
        sources = {
            path.name: path.read_text(encoding="utf-8")
            for path in paths
            if include_tests or not path.name.endswith(_TEST_SUFFIX)
        }
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"cannot read Rego files in {directory}: {exc}") from exc
    if not sources:
        raise PolicyError(f"no Rego policy files in {directory}")
    return sources


def compile_sources(sources: Mapping[str, str]) -> Any:
    """Parse ``sources`` (file name -> text) into a new ``regorus.Engine``.

    Raises PolicyError naming the file that does not compile.
    """
    engine = regorus.Engine()
    for name, text in sources.items():
        try:
            engine.add_policy(name, text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"{name}: {engine_error_message(exc)}") from None
    return engine


def engine_error_message(exc: BaseException) -> str:
    """The engine's message without its Rust backtrace.

    It can quote input values: use it for errors in policy sources, never for
    errors raised while evaluating an input.
    """
    return str(exc).split(_BACKTRACE_MARKER, 1)[0].strip() or type(exc).__name__


class RegorusEngine:
    """A PolicyEngine evaluating Rego in process with regorus.

    Each thread gets its own compiled engine, built on first use from the
    sources loaded here; sources are parsed once per thread, never per call.
    """

    def __init__(self, sources: Mapping[str, str], *, query: str = DEFAULT_QUERY) -> None:
        """Compile and validate ``sources`` (file name -> Rego text).

        ``query`` is the path of the rule that returns reasons per chunk id.
        Raises PolicyError when a file does not compile or the rule does not
        return an object for an empty batch.
        """
        self._sources = dict(sorted(sources.items()))
        self._query = query
        # JSON keeps the encoding unambiguous: no name/text boundary can be forged.
        self._digest = hashlib.sha256(orjson.dumps(list(self._sources.items()))).hexdigest()
        self._validate()

    @classmethod
    def from_directory(cls, path: Path, *, query: str = DEFAULT_QUERY) -> RegorusEngine:
        """Load every ``.rego`` file in ``path`` except ``*_test.rego`` files."""
        return cls(read_rego_sources(path, include_tests=False), query=query)

    @property
    def version(self) -> str:
        """``sha256:`` and 16 hex digits of a digest over the sorted (name, text) pairs."""
        return "sha256:" + self._digest[:16]

    def evaluate(self, policy_input: Mapping[str, Any]) -> dict[str, list[str]]:
        """Reasons per chunk id for one batch (see policies/README.md).

        Raises PolicyError when the input cannot be serialised, the engine
        fails, or the result is not an object of string arrays with exactly one
        entry per input chunk id. Messages never quote input data.
        """
        expected_ids = _chunk_ids(policy_input)
        try:
            payload = orjson.dumps(policy_input).decode()
        except TypeError:
            raise PolicyError("policy input is not JSON-serialisable") from None
        result = self._eval(payload)
        return _reasons(result, expected_ids, self._query)

    def _eval(self, payload: str) -> Any:
        engine = self._thread_engine()
        try:
            engine.set_input_json(payload)
            return engine.eval_rule(self._query)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            raise PolicyError(f"policy evaluation failed{_location(exc)}") from None
        except BaseException as exc:
            # A Rust panic: the engine's state is unknown, so rebuild it next time.
            _thread_engines().pop(self._digest, None)
            raise PolicyError(f"policy engine panicked{_location(exc)}") from None

    def _thread_engine(self) -> Any:
        engines = _thread_engines()
        engine = engines.get(self._digest)
        if engine is None:
            engine = compile_sources(self._sources)
            engines[self._digest] = engine
            while len(engines) > _ENGINES_PER_THREAD:
                engines.popitem(last=False)
        return engine

    def _validate(self) -> None:
        engine = self._thread_engine()
        try:
            engine.set_input_json(_EMPTY_BATCH)
            result = engine.eval_rule(self._query)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"{self._query}: {engine_error_message(exc)}") from None
        _reasons(result, set(), self._query)


def _thread_engines() -> OrderedDict[str, Any]:
    engines: OrderedDict[str, Any] | None = getattr(_per_thread, "engines", None)
    if engines is None:
        engines = OrderedDict()
        _per_thread.engines = engines
    return engines


def _chunk_ids(policy_input: Mapping[str, Any]) -> set[str]:
    # The result is checked against these ids: regorus can drop chunks whose id
    # is missing, and a duplicate id makes the policy's object conflict.
    chunks = policy_input.get("chunks", [])
    if not isinstance(chunks, list):
        raise PolicyError("policy input: chunks must be a list")
    ids: set[str] = set()
    for chunk in chunks:
        chunk_id = chunk.get("id") if isinstance(chunk, dict) else None
        if not isinstance(chunk_id, str) or chunk_id in ids:
            raise PolicyError("policy input: every chunk needs a unique string id")
        ids.add(chunk_id)
    return ids


def _reasons(result: Any, expected_ids: set[str], query: str) -> dict[str, list[str]]:
    if not isinstance(result, dict):
        kind = "undefined" if result is None else type(result).__name__
        raise PolicyError(f"{query} must be an object of string arrays, got {kind}")
    for chunk_id, reasons in result.items():
        if not isinstance(chunk_id, str) or not isinstance(reasons, list):
            raise PolicyError(f"{query} must be an object of string arrays")
        for reason in reasons:
            if not isinstance(reason, str):
                raise PolicyError(f"{query} must be an object of string arrays")
    if result.keys() != expected_ids:
        missing = len(expected_ids - result.keys())
        extra = len(result.keys() - expected_ids)
        raise PolicyError(f"{query} has {missing} chunk ids missing and {extra} unexpected")
    return result


def _location(exc: BaseException) -> str:
    match = _LOCATION.search(str(exc))
    return f" at {match.group(1)}" if match else ""
