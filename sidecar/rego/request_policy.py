"""The request policy: may this caller send this request at all?

Evaluated once per request, before the vector database is called; the contract
(input, output, policy data) is in policies/README.md. Any failure is a
PolicyError, which callers treat as a denial.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.core.policy import PolicyError
from sidecar.rego.purity import is_time_pure
from sidecar.rego.regorus_engine import CompiledPolicy, read_rego_sources

REQUEST_QUERY = "data.retrieval_gate.request.denials"

# The input the rule is validated with at load time: a request that names no collection.
_SAMPLE_REQUEST: dict[str, Any] = {
    "caller": {"tenant": "", "principals": [], "drafts_allowed": False},
    "method": "POST",
    "path": "/",
    "collections": [],
    "unnamed_collections": [],
    "route_kind": None,
}


class RequestPolicy:
    """Evaluates ``data.retrieval_gate.request.denials`` in process with regorus."""

    remote = False  # in process: evaluated where it is asked

    def __init__(
        self, sources: Mapping[str, str], *, data: Mapping[str, Any] | None = None
    ) -> None:
        """Compile and validate ``sources`` (file name -> Rego text).

        ``data`` is optional policy data (``data.*``), e.g. collection
        ownership. Raises PolicyError when a file does not compile, the data is
        invalid, or the rule does not return an array of strings for a request
        that names no collection.
        """
        self._policy = CompiledPolicy(sources, data=data)
        checked_denials(self._policy.probe(REQUEST_QUERY, _SAMPLE_REQUEST))
        self._time_pure = is_time_pure(self._policy, REQUEST_QUERY, _SAMPLE_REQUEST)

    @classmethod
    def from_directory(cls, path: Path, *, data: Mapping[str, Any] | None = None) -> RequestPolicy:
        """Load every ``.rego`` file in ``path`` except ``*_test.rego`` files."""
        return cls(read_rego_sources(path, include_tests=False), data=data)

    @property
    def version(self) -> str:
        """``sha256:`` and 16 hex digits of a digest over the sources and the data.

        The same as the chunk policy's version for the same directory and data.
        """
        return self._policy.version

    @property
    def time_pure(self) -> bool:
        """True when the policy declares ``time_pure := true`` next to ``denials``: its
        answer then depends only on its input and the policy, and may be kept per input
        (``sidecar.request.answers.RequestAnswers``). Checked as the chunk policy's declaration is
        (``sidecar.rego.purity``)."""
        return self._time_pure

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        """The reasons the request is denied for; an empty list allows it.

        ``request_input`` follows the contract in policies/README.md. Raises
        PolicyError when the input cannot be serialised, the engine fails, or
        the result is not an array of strings. Messages never quote input data.
        """
        return checked_denials(self._policy.evaluate(REQUEST_QUERY, request_input))


def checked_denials(result: Any) -> list[str]:
    """The request policy's denials from an engine's answer; PolicyError unless an array
    of strings (both engines refuse the same answers)."""
    if not isinstance(result, list):
        kind = "undefined" if result is None else type(result).__name__
        raise PolicyError(f"{REQUEST_QUERY} must be an array of strings, got {kind}")
    if not all(isinstance(reason, str) for reason in result):
        raise PolicyError(f"{REQUEST_QUERY} must be an array of strings")
    return result
