"""The embedded Rego engine: regorus (the `gordon-to-regorus` wheel) in process.

CompiledPolicy holds Rego sources and optional policy data, compiled into one
regorus engine per thread, and evaluates any rule path. The chunk policy
(RegorusEngine, here) and the request policy (RequestPolicy, in
sidecar/rego/request_policy.py) are thin layers over it; whether the chunk
policy's verdicts may be cached is decided in sidecar/rego/purity.py.
"""

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

from sidecar.core.policy import PolicyError
from sidecar.rego.purity import is_time_pure

DEFAULT_QUERY = "data.retrieval_gate.chunks.reasons"
_TEST_SUFFIX = "_test.rego"

# The input the chunk rule is validated with at load time: a well-formed empty batch.
_EMPTY_BATCH = {
    "caller": {"tenant": "", "principals": [], "drafts_allowed": False},
    "now_ns": 0,
    "chunks": [],
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Regorus errors carry a Rust backtrace after the message; the location line
# (`--> file:line:col`) names policy source only, never input values.
_BACKTRACE_MARKER = "Stack backtrace:"
_LOCATION = re.compile(r"-->\s*(\S+:\d+:\d+)")

# Enough for a policy reload or two without rebuilding the live engine.
_ENGINES_PER_THREAD = 4

# regorus engines are "unsendable": a thread may only use, and drop, the engines
# it created (another thread panics or leaks them). This module-level store
# outlives every CompiledPolicy, so a thread's engines are dropped when that
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


def compile_sources(sources: Mapping[str, str], *, data_json: str | None = None) -> Any:
    """Parse ``sources`` (file name -> text) into a new ``regorus.Engine``.

    ``data_json`` is a JSON object added as policy data (``data.*``). Raises
    PolicyError naming the file that does not compile, or when the data cannot
    be added or has a value at or above a policy package.
    """
    engine = regorus.Engine()
    for name, text in sources.items():
        try:
            engine.add_policy(name, text)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"{name}: {engine_error_message(exc)}") from None
    if data_json is not None:
        _reject_data_over_packages(engine, orjson.loads(data_json))
        try:
            engine.add_data_json(data_json)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"policy data: {engine_error_message(exc)}") from None
    return engine


def package_path(module: Mapping[str, Any]) -> list[str]:
    """The package segments of one module of ``engine.get_ast_as_json()``.

    ``package a["b-c"]`` gives ``["a", "b-c"]``. Raises KeyError on an AST
    node it does not know.
    """
    return _ref_segments(module["ast"]["package"]["refr"])


def rule_path(segments: list[str]) -> str:
    """A Rego reference for ``segments``: ``data.a["b-c"].d`` for ``["data", "a", "b-c", "d"]``."""
    path = segments[0]
    for segment in segments[1:]:
        if _IDENTIFIER.fullmatch(segment):
            path += f".{segment}"
        else:
            path += f"[{orjson.dumps(segment).decode()}]"
    return path


def engine_error_message(exc: BaseException) -> str:
    """The engine's message without its Rust backtrace.

    It can quote input values: use it for errors in policy sources, never for
    errors raised while evaluating an input.
    """
    return str(exc).split(_BACKTRACE_MARKER, 1)[0].strip() or type(exc).__name__


class CompiledPolicy:
    """Rego sources and optional policy data, compiled once per thread.

    Each thread gets its own compiled engine, built on first use; sources are
    parsed once per thread, never per call. Engines are keyed by the digest of
    sources and data, so policies loaded twice from the same files and data (the
    chunk policy and the request policy) share one engine per thread. The rule
    to evaluate is a parameter of each call.
    """

    def __init__(
        self, sources: Mapping[str, str], *, data: Mapping[str, Any] | None = None
    ) -> None:
        """Compile ``sources`` (file name -> Rego text) with ``data`` as ``data.*``.

        ``data`` must be a JSON object (nested dicts, lists, strings, numbers,
        booleans, None); an empty one is the same as none. Raises PolicyError
        when a file does not compile or the data is not valid policy data.
        """
        self._sources = dict(sorted(sources.items()))
        self._data_json = _encode_data(data)
        # JSON keeps the encoding unambiguous: no name/text boundary can be forged.
        # Without data the digest covers the sources alone, as before data existed,
        # so that existing policy versions stay the same.
        digested = orjson.dumps(list(self._sources.items()))
        if self._data_json is not None:
            digested = orjson.dumps(
                {"data": orjson.Fragment(self._data_json), "sources": orjson.Fragment(digested)}
            )
        self._digest = hashlib.sha256(digested).hexdigest()
        # Compile now, so that a bad file or bad data fails the load, not a request.
        self._thread_engine()

    @property
    def version(self) -> str:
        """``sha256:`` and 16 hex digits of a digest over the sources and the data."""
        return "sha256:" + self._digest[:16]

    def evaluate(self, query: str, policy_input: Mapping[str, Any]) -> Any:
        """The value of the rule ``query`` for ``policy_input`` (None when undefined).

        Raises PolicyError when the input cannot be serialised or the engine
        fails. Messages never quote input data, only the policy location.
        """
        try:
            payload = orjson.dumps(policy_input).decode()
        except TypeError:
            raise PolicyError("policy input is not JSON-serialisable") from None
        engine = self._thread_engine()
        try:
            engine.set_input_json(payload)
            return engine.eval_rule(query)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            raise PolicyError(f"policy evaluation failed{_location(exc)}") from None
        except BaseException as exc:
            # A Rust panic: the engine's state is unknown, so rebuild it next time.
            _thread_engines().pop(self._digest, None)
            raise PolicyError(f"policy engine panicked{_location(exc)}") from None

    def probe(self, query: str, sample_input: Mapping[str, Any]) -> Any:
        """Evaluate ``query`` for a fixed sample input, to validate the rule at load time.

        Unlike :meth:`evaluate`, a PolicyError carries the engine's message: the
        sample input is the caller's constant, not request data.
        """
        engine = self._thread_engine()
        try:
            engine.set_input_json(orjson.dumps(sample_input).decode())
            return engine.eval_rule(query)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"{query}: {engine_error_message(exc)}") from None

    def declared(self, path: str, sample_input: Mapping[str, Any]) -> Any:
        """The value of the rule at ``path`` for ``sample_input``; None when no
        such rule exists or it is undefined for that input.

        Raises PolicyError (with the engine's message) when evaluation fails.
        """
        engine = self._thread_engine()
        try:
            engine.set_input_json(orjson.dumps(sample_input).decode())
            answer = engine.eval_query(path)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise PolicyError(f"{path}: {engine_error_message(exc)}") from None
        results = answer.get("result") if isinstance(answer, dict) else None
        if not results:
            return None
        try:
            return results[0]["expressions"][0]["value"]
        except (KeyError, IndexError, TypeError):
            raise PolicyError(f"{path}: unexpected answer from the engine") from None

    def ast(self) -> Any:
        """The modules of the sources' syntax tree, as regorus renders them in JSON.

        Raises PolicyError when the engine's AST cannot be read.
        """
        try:
            return orjson.loads(self._thread_engine().get_ast_as_json())
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise PolicyError(f"cannot read the regorus AST: {exc!r}") from exc

    def _thread_engine(self) -> Any:
        engines = _thread_engines()
        engine = engines.get(self._digest)
        if engine is None:
            engine = compile_sources(self._sources, data_json=self._data_json)
            engines[self._digest] = engine
            while len(engines) > _ENGINES_PER_THREAD:
                engines.popitem(last=False)
        return engine


class RegorusEngine:
    """A PolicyEngine evaluating the chunk policy in process with regorus."""

    remote = False  # in process: evaluated where it is asked

    def __init__(
        self,
        sources: Mapping[str, str],
        *,
        query: str = DEFAULT_QUERY,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Compile and validate ``sources`` (file name -> Rego text).

        ``query`` is the path of the rule that returns reasons per chunk id;
        ``data`` is optional policy data (see CompiledPolicy). Raises
        PolicyError when a file does not compile, the data is invalid, or the
        rule does not return an object for an empty batch.
        """
        self._policy = CompiledPolicy(sources, data=data)
        self._query = query
        checked_reasons(self._policy.probe(query, _EMPTY_BATCH), set(), query)
        self._time_pure = is_time_pure(self._policy, query, _EMPTY_BATCH)

    @classmethod
    def from_directory(
        cls,
        path: Path,
        *,
        query: str = DEFAULT_QUERY,
        data: Mapping[str, Any] | None = None,
    ) -> RegorusEngine:
        """Load every ``.rego`` file in ``path`` except ``*_test.rego`` files."""
        return cls(read_rego_sources(path, include_tests=False), query=query, data=data)

    @property
    def version(self) -> str:
        """``sha256:`` and 16 hex digits of a digest over the sources and the data."""
        return self._policy.version

    @property
    def time_pure(self) -> bool:
        """True when the policy declares ``time_pure := true`` next to its reasons rule.

        The gate then caches each chunk's reasons until the chunk's next
        validity boundary (policies/README.md, "Verdict cache").
        """
        return self._time_pure

    def evaluate(self, policy_input: Mapping[str, Any]) -> dict[str, list[str]]:
        """Reasons per chunk id for one batch (see policies/README.md).

        Raises PolicyError when the input cannot be serialised, the engine
        fails, or the result is not an object of string arrays with exactly one
        entry per input chunk id. Messages never quote input data.
        """
        expected_ids = input_chunk_ids(policy_input)
        result = self._policy.evaluate(self._query, policy_input)
        return checked_reasons(result, expected_ids, self._query)


def _thread_engines() -> OrderedDict[str, Any]:
    engines: OrderedDict[str, Any] | None = getattr(_per_thread, "engines", None)
    if engines is None:
        engines = OrderedDict()
        _per_thread.engines = engines
    return engines


def input_chunk_ids(policy_input: Mapping[str, Any]) -> set[str]:
    """The chunk ids of a policy input, each once; PolicyError for a missing or repeated one."""
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


def checked_reasons(result: Any, expected_ids: set[str], query: str) -> dict[str, list[str]]:
    """The reasons per chunk id from an engine's answer to ``query``; PolicyError unless an
    object of string arrays with exactly ``expected_ids`` (both engines refuse the same)."""
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


def _encode_data(data: Mapping[str, Any] | None) -> str | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise PolicyError("policy data must be a JSON object")
    if not data:
        return None
    try:
        # Sorted keys: the same document always gives the same version.
        return orjson.dumps(dict(data), option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        raise PolicyError("policy data is not JSON-serialisable") from None


def _reject_data_over_packages(engine: Any, data: dict[str, Any]) -> None:
    # regorus lets a data value at a package's path replace that package's rules
    # (data {"retrieval_gate": {"request": {"denials": []}}} would allow every
    # request), and a non-object above a package breaks every evaluation. OPA
    # refuses both as conflicts; so does this.
    try:
        packages = [package_path(module) for module in orjson.loads(engine.get_ast_as_json())]
    except (KeyError, TypeError, IndexError, orjson.JSONDecodeError) as exc:
        raise PolicyError(f"cannot read packages from the regorus AST: {exc!r}") from exc
    for package in packages:
        name = rule_path(["data", *package])
        node: Any = data
        for segment in package:
            if not isinstance(node, dict):
                raise PolicyError(f"policy data has a non-object value above package {name}")
            if segment not in node:
                break
            node = node[segment]
        else:
            raise PolicyError(f"policy data has a value at package {name}")


def _ref_segments(refr: dict[str, Any]) -> list[str]:
    # A package name is a Var, RefDot (`a.b`) or RefBrack (`a["b-c"]`) node; any
    # other node raises KeyError, reported as an unreadable AST.
    if "Var" in refr:
        return [refr["Var"]["value"]]
    if "RefDot" in refr:
        node = refr["RefDot"]
        return [*_ref_segments(node["refr"]), node["field"][1]]
    node = refr["RefBrack"]
    return [*_ref_segments(node["refr"]), node["index"]["String"]["value"]]


def _location(exc: BaseException) -> str:
    match = _LOCATION.search(str(exc))
    return f" at {match.group(1)}" if match else ""
