"""Where policy bundles come from, and the poller that hot-reloads them.

``policy.bundle`` is a file (re-read when its size, mtime or inode changes) or
an http(s) URL (polled with ``If-None-Match``: a ``304`` costs no download).
Every worker process runs its own poller, so each worker verifies, compiles
and tests a new revision before it swaps it in; workers may switch a poll
interval apart, and each audit record says which revision decided it.

A bundle that cannot be fetched, read, verified, compiled or tested is
refused once (the same file or ETag is not retried until it changes): one
log line, one increment of ``retrieval_gate_policy_bundle_refusals_total``,
and the last good revision stays active.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import requests

from sidecar.config import ConfigError, Settings
from sidecar.metrics import GateMetrics
from sidecar.rego.bundle import (
    BUNDLE_REASONS,
    MAX_BUNDLE_BYTES,
    TOO_LARGE,
    BundleError,
    read_bundle,
)
from sidecar.rego.bundle_signature import Verification
from sidecar.rego.reloading import (
    RELOAD_REASONS,
    PolicyRevision,
    ReloadingPolicy,
    prepare_revision,
)

log = logging.getLogger(__name__)

UNAVAILABLE = "unavailable"
REFUSAL_REASONS = (UNAVAILABLE, *BUNDLE_REASONS, *RELOAD_REASONS)
_HTTP_TIMEOUT_SECONDS = 10.0
_CHUNK_BYTES = 64 * 1024


class BundleFetcher(Protocol):
    """Fetches the bundle when it changed since the last fetch."""

    def fetch(self) -> bytes | None:
        """The bundle's bytes, or None when it has not changed; raises BundleError."""
        ...


class FileBundle:
    """A bundle file, re-read when its size, mtime or inode changes (a rename in
    place of the old file, as deployment tools do, changes the inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def fetch(self) -> bytes | None:
        """The file's bytes when it changed since the last call; None otherwise."""
        try:
            stat = self.path.stat()
            seen = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
            if seen == self._seen:
                return None
            if stat.st_size > MAX_BUNDLE_BYTES:
                self._seen = seen
                raise BundleError(TOO_LARGE, f"{self.path} is over {MAX_BUNDLE_BYTES} bytes")
            blob = self.path.read_bytes()
        except OSError as exc:
            raise BundleError(UNAVAILABLE, f"{self.path}: {type(exc).__name__}") from None
        # Remembered even if the bundle is then refused: it is judged once.
        self._seen = seen
        return blob


class HttpBundle:
    """A bundle served over http(s), polled with ETag / If-None-Match."""

    def __init__(self, url: str, *, timeout_seconds: float = _HTTP_TIMEOUT_SECONDS) -> None:
        self.url = url
        self._timeout = timeout_seconds
        self._etag: str | None = None
        self._session = requests.Session()

    def fetch(self) -> bytes | None:
        """The bundle when the server has a new one (200); None on 304 Not Modified."""
        headers = {} if self._etag is None else {"If-None-Match": self._etag}
        try:
            with self._session.get(
                self.url, headers=headers, timeout=self._timeout, stream=True
            ) as response:
                if response.status_code == 304:
                    return None
                if response.status_code != 200:
                    raise BundleError(UNAVAILABLE, f"bundle server answered {response.status_code}")
                blob = bytearray()
                for chunk in response.iter_content(_CHUNK_BYTES):
                    blob += chunk
                    if len(blob) > MAX_BUNDLE_BYTES:
                        self._etag = response.headers.get("ETag")
                        raise BundleError(TOO_LARGE, f"bundle is over {MAX_BUNDLE_BYTES} bytes")
                self._etag = response.headers.get("ETag")
        except requests.RequestException as exc:
            raise BundleError(UNAVAILABLE, f"bundle server: {type(exc).__name__}") from None
        return bytes(blob)


def bundle_fetcher(location: str) -> BundleFetcher:
    """A fetcher for ``location``: an http(s) URL or a file path."""
    scheme = urlsplit(location).scheme.lower()
    if scheme in ("http", "https"):
        return HttpBundle(location)
    if scheme == "file":
        return FileBundle(Path(urlsplit(location).path))
    return FileBundle(Path(location))


class MetricsObserver:
    """Turns activations and refusals into the policy metrics and log lines."""

    def __init__(self, metrics: GateMetrics) -> None:
        self._metrics = metrics
        metrics.preset_bundle_refusals(REFUSAL_REASONS)

    def activated(self, revision: PolicyRevision, previous: PolicyRevision | None) -> None:
        self._metrics.policy_activated(
            revision.revision, None if previous is None else previous.revision
        )
        if previous is not None:
            log.info(
                "policy bundle revision %r active (%s, %d Rego tests passed), replacing %s",
                revision.revision,
                revision.version,
                revision.tests_run,
                previous.version,
            )

    def refused(self, reason: str, message: str) -> None:
        self._metrics.policy_bundle_refusals.labels(reason).inc()
        log.error(
            "policy bundle refused (%s): %s; the last good revision stays active", reason, message
        )


class PolicySource:
    """Polls the bundle location and offers each new bundle to the ReloadingPolicy."""

    def __init__(
        self, fetcher: BundleFetcher, policy: ReloadingPolicy, *, poll_seconds: float
    ) -> None:
        self.fetcher = fetcher
        self.policy = policy
        self._poll_seconds = poll_seconds
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start polling on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def poll_once(self) -> bool:
        """Fetch, and activate what changed; True when a new revision became active."""
        try:
            blob = await asyncio.to_thread(self.fetcher.fetch)
            if blob is None:
                return False
            # Verification, compilation and the Rego tests run off the event
            # loop; requests go on being decided with the active revision.
            revision = await asyncio.to_thread(self.policy.prepare, blob)
        except BundleError as exc:
            self.policy.refuse(exc)
            return False
        self.policy.activate(revision)
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            try:
                await self.poll_once()
            except Exception:
                # The poller must outlive any surprise; the active revision stays.
                log.exception("policy bundle poll failed; the last good revision stays active")


def load_bundle_policy(settings: Settings, metrics: GateMetrics) -> PolicySource:
    """The first revision of ``policy.bundle``, active, and its poller (not started).

    Raises ConfigError when the key cannot be read or the first bundle is not
    usable: with no last good revision, the sidecar must not start.
    """
    assert settings.policy.bundle is not None  # the caller checks
    verification = bundle_verification(settings)
    fetcher = bundle_fetcher(settings.policy.bundle)
    try:
        blob = fetcher.fetch()
        assert blob is not None  # the first fetch always has a bundle
        first = prepare_revision(read_bundle(blob, verification=verification))
    except BundleError as exc:
        raise ConfigError(
            f"policy_bundle {_display(settings.policy.bundle)} refused ({exc.reason}): {exc}"
        ) from None
    policy = ReloadingPolicy(first, verification=verification, observer=MetricsObserver(metrics))
    log.info(
        "policy bundle revision %r (%s) loaded from %s%s",
        first.revision,
        first.version,
        _display(settings.policy.bundle),
        ", signature verified" if verification is not None else "",
    )
    return PolicySource(fetcher, policy, poll_seconds=settings.policy.bundle_poll_seconds)


def bundle_verification(settings: Settings) -> Verification | None:
    """How bundle signatures are checked, or None without ``policy.bundle_public_key``.

    Raises ConfigError when the key file cannot be read.
    """
    policy = settings.policy
    if policy.bundle_public_key is None:
        return None
    try:
        public_key = policy.bundle_public_key.read_bytes()
    except OSError as exc:
        raise ConfigError(f"policy_bundle_public_key {policy.bundle_public_key}: {exc}") from exc
    return Verification(
        public_key,
        algorithm=str(policy.bundle_key_algorithm),
        key_id=policy.bundle_key_id,
        scope=policy.bundle_scope,
    )


def bundle_display(settings: Settings) -> str:
    """Where the bundle comes from, for logs: ``bundle <location>``."""
    assert settings.policy.bundle is not None
    return f"bundle {_display(settings.policy.bundle)}"


def _display(location: str) -> str:
    """``location`` without any credentials or query (which may hold a token)."""
    parts = urlsplit(location)
    if parts.scheme.lower() not in ("http", "https"):
        return os.fspath(location)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
