"""Start-up failures end in one line that names what to fix, and exit 2 for configuration.

Each case starts the real ``retrieval-gate serve`` (and ``--workers 2`` where
the workers' own /metrics server is concerned) and reads its stderr: exactly
one ``error:`` line, no traceback.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.cli.exit_codes import ExitCode
from sidecar.runtime.ports import free_port
from tests.fixtures.harness import CLI
from tests.fixtures.stores import new_sqlite_url

pytestmark = pytest.mark.envoy


def serve(tmp_path: Path, *args: str) -> tuple[int, list[str], str]:
    """Run ``serve`` with ``args``: (exit status, its ``error:`` lines, all of stderr)."""
    done = subprocess.run(
        [
            *CLI,
            "serve",
            "--store",
            new_sqlite_url(tmp_path / "gate.db"),
            "--grpc-listen",
            f"unix:{tmp_path / 'gate.sock'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    return done.returncode, errors, done.stderr


def assert_one_line(result: tuple[int, list[str], str], *expected: str) -> None:
    status, errors, stderr = result
    assert "Traceback" not in stderr, stderr
    assert status == ExitCode.CANNOT_RUN, stderr
    assert len(errors) == 1, stderr
    for part in expected:
        assert part in errors[0], errors[0]


def test_a_short_hmac_secret(tmp_path: Path) -> None:
    secret = tmp_path / "hmac.key"
    secret.write_text("short")
    result = serve(
        tmp_path,
        *("--identity", "jwt", "--jwt-hmac-secret-file", str(secret)),
        *("--issuer", "https://idp", "--audience", "gate"),
    )
    assert_one_line(result, "identity keys:", "hmac.key", "5 bytes", "at least 32")


def test_a_rego_syntax_error(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "chunks.rego").write_text("package retrieval_gate.chunks\n\nreasons := {\n")
    result = serve(tmp_path, "--identity", "trusted-headers", "--policy-dir", str(policies))
    assert_one_line(result, f"policy.dir {policies}:", "chunks.rego:4:1:", "expecting")


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_metrics_port_in_use(tmp_path: Path, taken_port: int, workers: str) -> None:
    address = f"127.0.0.1:{taken_port}"
    result = serve(
        tmp_path, "--identity", "trusted-headers", "--metrics", address, "--workers", workers
    )
    assert_one_line(result, f"telemetry.metrics {address}:", "in use", "--metrics")


def test_a_socket_in_a_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "run" / "retrieval-gate"
    result = serve(
        tmp_path, "--identity", "trusted-headers", "--grpc-listen", f"unix:{missing}/envoy.sock"
    )
    assert_one_line(
        result, f"cannot listen on unix:{missing}/envoy.sock", f"no directory {missing}"
    )


def test_an_unreadable_mtls_file(tmp_path: Path) -> None:
    absent = tmp_path / "tls.crt"
    result = serve(
        tmp_path,
        *("--identity", "trusted-headers", "--grpc-listen", "127.0.0.1:1"),
        *("--grpc-cert-file", str(absent), "--grpc-key-file", str(absent)),
        *("--grpc-client-ca-file", str(absent), "--grpc-client-id", "spiffe://td/envoy"),
    )
    assert_one_line(result, f"listen.grpc_cert_file {absent}", "No such file")


def test_version_names_the_installed_release() -> None:
    done = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert done.stdout.startswith("retrieval-gate ") and done.stdout.split()[1][0].isdigit()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sqlite_store_that_does_not_exist(tmp_path: Path, workers: str) -> None:
    # A typo used to serve an empty store that rejected every chunk.
    missing = tmp_path / "gaet.db"
    url = f"sqlite:///{missing}"
    result = serve(tmp_path, "--identity", "trusted-headers", "--store", url, "--workers", workers)
    assert_one_line(
        result,
        f"error: SQLite metadata store {missing} does not exist; create it with: "
        f"retrieval-gate store migrate --store {url}",
    )
    assert not missing.exists()


def test_proxy_with_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "gaet.db"
    done = subprocess.run(
        [
            *CLI,
            *("proxy", "--identity", "trusted-headers", "--store", f"sqlite:///{missing}"),
            *("--upstream", "http://127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert_one_line((done.returncode, errors, done.stderr), f"{missing} does not exist")
    assert not missing.exists()
