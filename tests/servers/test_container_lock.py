"""The image's locks against the real index: pip, with --require-hashes, gets every wheel.

tests/unit/test_container.py checks the locks' syntax and that every pin has a
digest; only pip downloading the wheels for the image's platform proves the
digests are the right ones. A digest that is not the file's is refused here as
in the image build.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.container_lock import BUILD_LOCK, LOCK, RUNTIME_LOCK
from tests.fixtures.servers import server_missing


@pytest.fixture(scope="module")
def index_reachable() -> None:
    try:
        urllib.request.urlopen(f"{LOCK.DEFAULT_INDEX}/pip/", timeout=10).close()
    except OSError as exc:
        server_missing(f"the package index {LOCK.DEFAULT_INDEX} is not reachable: {exc}")


def download(lock: Path, into: Path) -> subprocess.CompletedProcess[str]:
    """pip download of ``lock`` as the image's x86_64 build installs it."""
    platforms = [p for p in LOCK._image_platforms() if p.endswith("x86_64")]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--require-hashes", "--index-url", LOCK.DEFAULT_INDEX]
    command += ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
    command += [arg for platform in platforms for arg in ("--platform", platform)]
    command += ["--requirement", str(lock), "--dest", str(into)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


@pytest.mark.usefixtures("index_reachable")
@pytest.mark.parametrize("lock", [RUNTIME_LOCK, BUILD_LOCK], ids=["runtime", "build"])
def test_every_locked_wheel_matches_its_digest(lock: Path, tmp_path: Path) -> None:
    done = download(lock, tmp_path)
    assert done.returncode == 0, done.stderr
    pins, _ = LOCK.parse_lock(lock.read_text())
    assert len(list(tmp_path.glob("*.whl"))) == len(pins)


@pytest.mark.usefixtures("index_reachable")
def test_a_wheel_whose_digest_is_not_listed_is_refused(tmp_path: Path) -> None:
    pins, digests = LOCK.parse_lock(RUNTIME_LOCK.read_text())
    version = pins["cachetools"]
    tampered = tmp_path / "tampered.lock"
    tampered.write_text(f"cachetools=={version} --hash=sha256:{'0' * 64}\n")
    done = download(tampered, tmp_path / "wheels")
    assert done.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert digests[("cachetools", version)]  # the real lock does list one
