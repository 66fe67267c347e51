"""Print the image's pinned runtime requirements: retrieval-gate's dependency closure as installed.

The image installs exactly the versions in ``requirements.lock`` (the Dockerfile
installs them with ``--no-deps`` and then runs ``pip check``, so a lock that
misses a dependency fails the build). This script writes that file from the
environment that runs it, normally the project's ``.venv``, so the image gets
the versions the test suite ran against:

    .venv/bin/python deploy/container/lock.py > deploy/container/requirements.lock

Environment markers are evaluated for the running interpreter; the image runs
the same Python minor version (3.11) on Linux.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "retrieval-gate"

HEADER = """\
# Exact versions installed in the container image (Dockerfile), one per line.
# Generated from the project's .venv by deploy/container/lock.py; do not edit by
# hand. tests/unit/test_container.py checks it against pyproject.toml.
"""


def runtime_closure(project: str = PROJECT) -> dict[str, str]:
    """Installed name -> version of everything ``project`` needs at run time, itself excluded."""
    pinned: dict[str, str] = {}
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


def main() -> int:
    """Print the lock file to stdout."""
    pins = runtime_closure()
    sys.stdout.write(HEADER + "".join(f"{name}=={pins[name]}\n" for name in sorted(pins)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
