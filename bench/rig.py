"""The stack under test of the fault matrix and the soak, all on loopback.

A database stand-in that misbehaves on command (bench/fault_upstream.py),
`retrieval-gate serve` with two workers on a PostgreSQL store (change listener
on), a signed policy bundle it polls (or a FAKE OPA: no OPA binary installs
here), JSON Lines audit chains on a tmpfs of their own (so that a disk can be
filled), and Envoy with the bootstrap `retrieval-gate proxy` generates.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cpu import process_tree  # noqa: E402
from traffic import Load, records, upstream_body  # noqa: E402

from sidecar.runtime.ports import free_port  # noqa: E402
from tests.fixtures.bundles import (  # noqa: E402
    blocking_files,
    make_bundle,
    rsa_pair,
)
from tests.fixtures.fake_opa import FakeOpa  # noqa: E402
from tests.fixtures.harness import GateStack, http  # noqa: E402
from tests.fixtures.postgres import fresh_database  # noqa: E402

UPSTREAM = Path(__file__).resolve().parent / "fault_upstream.py"
MAX_BODY_BYTES = 256 * 1024
# The shipped default. Below the store's 1 s query timeout, a store outage would
# reach clients as Envoy's 504 instead of the gate's own answer.
MESSAGE_TIMEOUT_MS = 2000
# Room for a 30-minute soak's records (tmpfs takes memory only as it fills).
AUDIT_TMPFS = "size=4g"
# Short, so that a store outage of a few seconds outlasts what the cache holds.
CACHE_TTL_S = 1.0
WORKERS = 2

# The rule of the bundled chunk policy that the fault matrix's failing policies extend.
DENY_UNKNOWN = b'{"POLICY_DENY" | not object.get(c, "status", null) in known_statuses}'


def _bundle(private_key: bytes, revision: str, chunk_rule: bytes = DENY_UNKNOWN) -> bytes:
    files = blocking_files([])
    name = "retrieval_gate/chunks.rego"
    # A rule that is not there would leave the policy unchanged and the fault uninjected.
    if DENY_UNKNOWN not in files[name]:
        raise ValueError(f"{name} no longer holds the rule the fault bundles extend")
    files[name] = files[name].replace(DENY_UNKNOWN, chunk_rule, 1)
    return make_bundle(files, revision=revision, private_key=private_key)


def _replace(path: Path, blob: bytes) -> None:
    partial = path.with_suffix(".partial")
    partial.write_bytes(blob)
    os.replace(partial, path)


class Rig:
    """The stack under test: fault upstream, sidecar, Envoy; ``engine`` "rego" or "opa"."""

    def __init__(
        self,
        workdir: Path,
        store_url: str,
        engine: str,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        """``overrides``: settings that replace the rig's own (see ``config`` below)."""
        self.workdir = workdir
        self.audit_dir = workdir / "audit"
        self.audit_dir.mkdir()
        self.tmpfs = _mount_tmpfs(self.audit_dir)
        self.upstream_port = free_port()
        body = workdir / "upstream-body.json"
        body.write_bytes(upstream_body())
        with (workdir / "upstream.log").open("ab") as log:
            self.upstream = subprocess.Popen(
                [
                    sys.executable,
                    str(UPSTREAM),
                    "--port",
                    str(self.upstream_port),
                    "--body",
                    str(body),
                    "--oversize-bytes",
                    str(MAX_BODY_BYTES * 2),
                ],
                stdout=log,
                stderr=log,
            )
        self.opa: FakeOpa | None = None
        self.stalled: list[int] = []
        self.key = rsa_pair()
        self.bundle = workdir / "policy.tar.gz"
        self.revision = 0
        config: dict[str, Any] = {
            "workers": WORKERS,
            "audit_log": str(self.audit_dir / "decisions.jsonl"),
            "max_body_bytes": MAX_BODY_BYTES,
            "message_timeout_ms": MESSAGE_TIMEOUT_MS,
            "cache_ttl_seconds": CACHE_TTL_S,
        }
        config |= overrides or {}
        self.workers = int(config["workers"])
        if engine == "opa":
            self.opa = FakeOpa().start()
            config |= {"policy_engine": "opa", "opa_url": self.opa.url}
        else:
            self.install_bundle()
            key_file = workdir / "bundle-key.pem"
            key_file.write_bytes(self.key[1])
            config |= {
                "policy_bundle": str(self.bundle),
                "policy_bundle_public_key": str(key_file),
                "policy_bundle_poll_seconds": 0.2,
            }
        self.gate = GateStack(
            workdir,
            records(),
            config=config,
            store_url=store_url,
            upstream_url=f"http://127.0.0.1:{self.upstream_port}",
        )
        try:
            self.gate.start()
        except BaseException:
            self.close()  # the upstream, the fake OPA and the tmpfs are already up
            raise

    @property
    def port(self) -> int:
        return self.gate.listen_port

    def install_bundle(self, chunk_rule: bytes = DENY_UNKNOWN, *, tampered: bool = False) -> None:
        """A new signed revision with ``chunk_rule`` in its chunk policy (tampered:
        its content changed after signing)."""
        self.revision += 1
        blob = _bundle(self.key[0], f"r{self.revision}", chunk_rule)
        if tampered:
            # Same length, one byte of the compressed stream changed: the
            # signature no longer matches, whatever the archive now holds.
            middle = len(blob) // 2
            blob = blob[:middle] + bytes([blob[middle] ^ 0x01]) + blob[middle + 1 :]
        _replace(self.bundle, blob)

    def fake_opa(self) -> FakeOpa:
        if self.opa is None:
            raise RuntimeError("this rig's policy engine is in process, not OPA")
        return self.opa

    def upstream_mode(self, mode: str) -> None:
        url = f"http://127.0.0.1:{self.upstream_port}/__fault/{mode}"
        if http("POST", url).status != 200:
            raise RuntimeError(f"the fault upstream refused mode {mode}")

    def sidecar_pids(self) -> list[int]:
        assert self.gate.sidecar is not None
        return process_tree(self.gate.sidecar.pid)

    def audit_logs(self) -> list[Path]:
        return sorted(self.audit_dir.glob("decisions*.jsonl"))

    def wait_healthy(self, limit_s: float = 60.0) -> None:
        """Return once a search is released in full (the gate answers correctly)."""
        load = Load(self.port, total=None, clients=1).start()
        deadline = time.monotonic() + limit_s
        try:
            while time.monotonic() < deadline:
                tail = load.answers[-5:]
                if len(tail) == 5 and all(a.kind == "filtered" for a in tail):
                    return
                time.sleep(0.05)
        finally:
            load.stop()
        raise TimeoutError(f"the gate did not answer correctly within {limit_s} s")

    def close(self) -> None:
        self.gate.stop()
        if self.opa is not None:
            self.opa.stop()
        self.upstream.terminate()
        self.upstream.wait(10)
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.audit_dir)], check=False)


def _mount_tmpfs(path: Path) -> bool:
    """Mount a tmpfs of its own on ``path`` (root only); False where that is not possible."""
    if os.geteuid() != 0:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", AUDIT_TMPFS, "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@contextlib.contextmanager
def running_rig(engine: str, overrides: Mapping[str, Any] | None = None) -> Iterator[Rig]:
    """A started rig on a fresh database, stopped (and its database dropped) afterwards."""
    with fresh_database() as store_url, tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        rig = Rig(Path(tmp), store_url, engine, overrides)
        try:
            yield rig
        finally:
            rig.close()
