"""Hot reload of policy bundles: the active Rego revision, swapped atomically.

A new bundle becomes a PolicyRevision (its chunk policy and request policy
compiled from the bundle's Rego and data, its Rego unit tests run against the
same data) BEFORE anything changes; only a revision that compiles and passes
every test is swapped in, with one assignment. A bundle that fails any step
is refused: the last good revision stays active and the observer is told why
(a log line and a metric, in sidecar/runtime/policy_source.py).

The policy version of a bundle revision, as audit records and spans show it,
is ``bundle:<revision>@sha256:<16 hex>`` (the digest covers its sources and
data, as for a policy directory).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sidecar.core.policy import PolicyError
from sidecar.rego.bundle import Bundle, BundleError, read_bundle
from sidecar.rego.bundle_signature import Verification
from sidecar.rego.policy_data import (
    BUNDLED_POLICY_DIR,
    PolicyDataError,
    check_policy_data,
    schema_for,
)

# The runner's internals are reused so that a bundle's tests run exactly as
# `retrieval-gate policy test` runs a directory's, but with the bundle's data.
from sidecar.rego.rego_tests import RegoTestResult, run_compiled_tests
from sidecar.rego.regorus_engine import RegorusEngine, compile_sources
from sidecar.rego.request_policy import RequestPolicy

log = logging.getLogger(__name__)

# Refusal reasons beyond the bundle format's (sidecar.rego.bundle.BUNDLE_REASONS).
COMPILE = "compile"
TESTS = "tests"
DATA = "data"
TIME_PURITY = "time_purity"
RELOAD_REASONS = (COMPILE, TESTS, TIME_PURITY, DATA)


class ReloadObserver(Protocol):
    """Told about every activation and refusal (the runtime turns them into metrics)."""

    def activated(self, revision: PolicyRevision, previous: PolicyRevision | None) -> None: ...

    def refused(self, reason: str, message: str) -> None: ...


@dataclass(frozen=True)
class PolicyRevision:
    """One bundle revision, compiled and tested: both policies and its version."""

    revision: str
    chunk_policy: RegorusEngine
    request_policy: RequestPolicy
    tests_run: int

    @property
    def version(self) -> str:
        """``bundle:<revision>@sha256:<16 hex>``: the policy version in audit records."""
        return f"bundle:{self.revision}@{self.chunk_policy.version}"


def prepare_revision(bundle: Bundle) -> PolicyRevision:
    """Compile ``bundle`` and run its Rego unit tests; raises BundleError (reason
    ``compile`` or ``tests``) when it must not become active."""
    sources = bundle.policy_sources()
    try:
        check_policy_data(bundle.data, bundle.data_schema or schema_for(BUNDLED_POLICY_DIR))
    except PolicyDataError as exc:
        raise BundleError(DATA, f"revision {bundle.revision!r}: {exc}") from None
    data = dict(bundle.data) or None
    try:
        chunk_policy = RegorusEngine(sources, data=data)
        request_policy = RequestPolicy(sources, data=data)
        results = run_bundle_tests(bundle)
    except BundleError:
        raise
    except PolicyError as exc:
        raise BundleError(COMPILE, f"revision {bundle.revision!r}: {exc}") from None
    failed = [result for result in results if not result.passed]
    if failed:
        names = ", ".join(result.name for result in failed[:5])
        raise BundleError(
            TESTS, f"revision {bundle.revision!r}: {len(failed)} Rego tests failed: {names}"
        )
    return PolicyRevision(bundle.revision, chunk_policy, request_policy, len(results))


def run_bundle_tests(bundle: Bundle) -> list[RegoTestResult]:
    """Run every ``test_*`` rule of the bundle with its policies and data loaded,
    as ``opa test`` runs a bundle. Raises PolicyError when it does not compile."""
    data_json = orjson.dumps(dict(bundle.data)).decode() if bundle.data else None
    return run_compiled_tests(compile_sources(dict(bundle.rego), data_json=data_json))


class ReloadingPolicy:
    """The active bundle revision, as a chunk PolicyEngine, with its request policy.

    ``version`` and ``evaluate`` are consistent within one decision: reading
    ``version`` pins the then-active revision for this thread, and the next
    ``evaluate`` on the thread uses it, so a swap between the two never puts
    one revision's decisions under the other's version (the gate reads the
    version once, then evaluates once, per response).
    """

    remote = False

    def __init__(
        self,
        first: PolicyRevision,
        *,
        verification: Verification | None = None,
        observer: ReloadObserver | None = None,
    ) -> None:
        """Start with ``first`` active; later bundles are checked with ``verification``."""
        self._active = first
        self._verification = verification
        self._observer = observer
        self._pinned = threading.local()
        # The gate decides at construction whether to cache verdicts, so every
        # revision must keep the first one's time purity (policies/README.md).
        self._time_pure = first.chunk_policy.time_pure
        self._request_policy = _ActiveRequestPolicy(self)
        if observer is not None:
            observer.activated(first, None)

    @property
    def active(self) -> PolicyRevision:
        """The revision decisions are made with now."""
        return self._active

    @property
    def version(self) -> str:
        """The active revision's version (see the class docstring on pinning)."""
        revision = self._active
        self._pinned.revision = revision
        return revision.version

    @property
    def time_pure(self) -> bool:
        """The first revision's time purity, which every later revision keeps."""
        return self._time_pure

    @property
    def request_policy(self) -> _ActiveRequestPolicy:
        """The request policy of whichever revision is active at each call."""
        return self._request_policy

    def evaluate(self, policy_input: Mapping[str, Any]) -> dict[str, list[str]]:
        """The chunk policy's reasons, from the revision pinned by ``version``."""
        revision: PolicyRevision | None = getattr(self._pinned, "revision", None)
        self._pinned.revision = None
        if revision is None:
            revision = self._active
        return revision.chunk_policy.evaluate(policy_input)

    def prepare(self, blob: bytes) -> PolicyRevision:
        """Verify, read, compile and test the bundle ``blob``, without activating it.

        Raises BundleError (with a reason from BUNDLE_REASONS or RELOAD_REASONS).
        """
        error: BundleError | None = None
        try:
            revision = prepare_revision(read_bundle(blob, verification=self._verification))
        except BundleError as exc:
            error = BundleError(exc.reason, str(exc))
        if error is not None:
            # A fresh error, raised once the original is gone: its traceback
            # holds regorus engines, which must be dropped on this thread
            # (prepare runs off the event loop; see regorus_engine).
            raise error
        if revision.chunk_policy.time_pure != self._time_pure:
            raise BundleError(
                TIME_PURITY,
                f"revision {revision.revision!r} changes time_pure to "
                f"{revision.chunk_policy.time_pure}: restart the gate to change it",
            )
        return revision

    def activate(self, revision: PolicyRevision) -> None:
        """Make ``revision`` the active one (one assignment: in-flight decisions
        finish with the revision they started with)."""
        previous, self._active = self._active, revision
        if self._observer is not None:
            self._observer.activated(revision, previous)

    def refuse(self, error: BundleError) -> None:
        """Report a refused bundle; the active revision stays."""
        if self._observer is not None:
            self._observer.refused(error.reason, str(error))

    def offer(self, blob: bytes) -> bool:
        """Prepare and activate ``blob``; True when it became active, False when
        it was refused (the last good revision stays)."""
        try:
            revision = self.prepare(blob)
        except BundleError as exc:
            self.refuse(exc)
            return False
        self.activate(revision)
        return True


class _ActiveRequestPolicy:
    """The request policy of the revision active at each call."""

    remote = False  # every revision is evaluated in process

    def __init__(self, policy: ReloadingPolicy) -> None:
        self._policy = policy

    @property
    def version(self) -> str:
        return self._policy.active.version

    @property
    def time_pure(self) -> bool:
        """Whether the active revision's request policy declares itself time-pure."""
        return self._policy.active.request_policy.time_pure

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        """The active revision's request denials (see RequestPolicy.evaluate)."""
        return self._policy.active.request_policy.evaluate(request_input)
