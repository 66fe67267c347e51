"""The exit codes every `retrieval-gate` command shares."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What the process exit status says (argparse exits 2 on bad arguments too).

    ``serve`` and ``proxy`` return the runtime's own statuses, which are OK and
    FAILED (``sidecar.runtime.signals.STOPPED`` and ``DIED``).
    """

    # Done: loaded, changed, every chain intact, every Rego test passed, nothing `check`
    # found failed, stopped on request.
    OK = 0
    # Ran, and the answer is no: refused with nothing changed, a broken or unreadable
    # audit chain, a failing Rego test, a failed `check`, or a sidecar worker or Envoy
    # that died.
    FAILED = 1
    # Could not run as given: bad settings or arguments, an unusable URL, a missing
    # file, an address already taken, no Envoy, the store unreachable at start.
    CANNOT_RUN = 2
    # Interrupted (Ctrl-C) before the signal handlers were in place: 128 + SIGINT.
    INTERRUPTED = 130
