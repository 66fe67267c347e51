"""Write the image's lock files: exact versions, each with the SHA-256 of its wheels.

The image installs exactly what ``requirements.lock`` and
``build-requirements.lock`` pin, with ``--require-hashes``: pip refuses a wheel
whose digest is not listed, so a replaced file on the index, a mirror that
serves something else or a typo in a version cannot reach the image. The
Dockerfile also installs with ``--no-deps`` and then runs ``pip check``, so a
lock that misses a dependency fails the build.

The runtime lock's versions come from the environment that runs this script,
normally the project's ``.venv``, so the image gets the versions the test suite
ran against; the build lock's versions are the ones already in it (pip,
setuptools, grpcio-tools: edit a version there, then run this script):

    .venv/bin/python deploy/container/lock.py > deploy/container/requirements.lock
    .venv/bin/python deploy/container/lock.py --build > deploy/container/build-requirements.lock

Only wheels are hashed, because the image installs only wheels, and only those
that can run in the image: CPython 3.11 on glibc Linux, x86_64 or aarch64.
Digests already in a lock are kept while the version stays; new ones come from
the index's JSON simple API (PEP 691), ``--index`` or https://pypi.org/simple.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

PROJECT = "retrieval-gate"
HERE = Path(__file__).resolve().parent
RUNTIME_LOCK = HERE / "requirements.lock"
BUILD_LOCK = HERE / "build-requirements.lock"
DEFAULT_INDEX = "https://pypi.org/simple"

RUNTIME_HEADER = """\
# Exact versions installed in the container image (Dockerfile), each with the
# SHA-256 of every wheel the image may install (pip --require-hashes).
# Generated from the project's .venv by deploy/container/lock.py; do not edit by
# hand. tests/unit/test_container.py checks it against pyproject.toml.
"""
BUILD_HEADER = """\
# Exact versions of the build stage's tools (Dockerfile): pip itself, and what
# pyproject.toml's [build-system] requires to compile proto/ and build the wheel,
# each with the SHA-256 of its wheels (pip --require-hashes). Edit a version,
# then run deploy/container/lock.py --build to refresh the digests.
# tests/unit/test_container.py checks them against [build-system].requires.
"""

# The image: CPython 3.11 on Debian bookworm (glibc 2.36), either architecture.
_PYTHON = (3, 11)
_GLIBC_MINOR = 36
_ARCHITECTURES = ("x86_64", "aarch64")
_LEGACY_MANYLINUX = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}


def _image_platforms() -> list[str]:
    platforms = []
    for arch in _ARCHITECTURES:
        platforms += [f"manylinux_2_{minor}_{arch}" for minor in range(_GLIBC_MINOR, 4, -1)]
        platforms += [f"{legacy}_{arch}" for legacy in _LEGACY_MANYLINUX]
        platforms.append(f"linux_{arch}")
    return platforms


_IMAGE_TAGS = frozenset(
    [
        *tags.cpython_tags(_PYTHON, platforms=_image_platforms()),
        *tags.compatible_tags(_PYTHON, "cp311", _image_platforms()),
    ]
)

_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")

Pins = dict[str, str]
Digests = dict[tuple[str, str], list[str]]


def runtime_closure(project: str = PROJECT) -> Pins:
    """Installed name -> version of everything ``project`` needs at run time, itself excluded."""
    pinned: Pins = {}
    extras_seen: dict[str, frozenset[str]] = {}
    pending: list[tuple[str, frozenset[str]]] = [(project, frozenset())]
    while pending:
        name, extras = pending.pop()
        key = canonicalize_name(name)
        before = extras_seen.get(key)
        if before is not None and extras <= before:
            continue
        extras_seen[key] = (before or frozenset()) | extras
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"{name} is required but not installed in {sys.prefix}") from None
        if key != canonicalize_name(project):
            pinned[key] = dist.version
        environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate(env) for env in environments):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return pinned


def parse_lock(text: str) -> tuple[Pins, Digests]:
    """The pins of a lock file and the digests listed for each (name, version).

    Accepts ``name==version`` with ``--hash=sha256:…`` options, on one line or
    continued with backslashes, as pip reads them.
    """
    pins: Pins = {}
    digests: Digests = {}
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split()
        match = _PIN.fullmatch(requirement)
        if match is None:
            raise ValueError(f"not an exact pin: {requirement!r}")
        name = canonicalize_name(match[1])
        if name in pins:
            raise ValueError(f"{name} pinned twice")
        pins[name] = match[2]
        found = [m[1] for m in map(_HASH.fullmatch, options) if m is not None]
        if len(found) != len(options):
            raise ValueError(f"{name}: only --hash=sha256:<64 hex digits> options are allowed")
        digests[(name, match[2])] = found
    return pins, digests


def image_can_install(filename: str) -> bool:
    """Whether a wheel runs in the image (CPython 3.11, glibc 2.36, x86_64 or aarch64)."""
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return not wheel_tags.isdisjoint(_IMAGE_TAGS)


def index_digests(index: str, name: str, version: str) -> list[str]:
    """SHA-256 of every wheel of ``name`` ``version`` on ``index`` that the image can install."""
    if not index.startswith(("https://", "http://")):
        raise SystemExit(f"--index must be an http(s) URL, not {index!r}")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        f"{index.rstrip('/')}/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
        files = json.load(answer)["files"]
    wanted = Version(version)
    found = sorted(
        entry["hashes"]["sha256"]
        for entry in files
        if entry["filename"].endswith(".whl")
        and image_can_install(entry["filename"])
        and parse_wheel_filename(entry["filename"])[1] == wanted
        and "sha256" in entry.get("hashes", {})
    )
    if not found:
        raise SystemExit(f"{name}=={version}: no wheel on {index} that the image can install")
    return found


def render(header: str, pins: Pins, known: Digests, index: str) -> str:
    """The lock file: each pin with its digests, known ones kept, new ones fetched."""
    lines = [header]
    for name in sorted(pins):
        version = pins[name]
        digests = known.get((name, version)) or index_digests(index, name, version)
        hashes = "".join(f" \\\n    --hash=sha256:{digest}" for digest in sorted(digests))
        lines.append(f"{name}=={version}{hashes}\n")
    return "".join(lines)


def _known(paths: Iterable[Path]) -> Digests:
    known: Digests = {}
    for path in paths:
        if path.exists():
            known.update(parse_lock(path.read_text())[1])
    return known


def main(argv: list[str] | None = None) -> int:
    """Print the runtime lock (or with ``--build`` the build lock) to stdout."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--build", action="store_true", help="the build stage's lock")
    parser.add_argument("--index", default=DEFAULT_INDEX, help="PEP 691 simple index URL")
    args = parser.parse_args(argv)
    known = _known([RUNTIME_LOCK, BUILD_LOCK])
    if args.build:
        pins, _ = parse_lock(BUILD_LOCK.read_text())
        sys.stdout.write(render(BUILD_HEADER, pins, known, args.index))
    else:
        sys.stdout.write(render(RUNTIME_HEADER, runtime_closure(), known, args.index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
