"""The `retrieval-gate` command: one module per command group.

``serve`` (serve, proxy), ``check``, ``store``, ``audit``, ``policy``, ``explain``,
``verify-answer`` and ``demo``
each add their parsers; the setting flags are generated in ``flags``; the exit codes are
shared (``exit_codes``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from collections.abc import Sequence

from sidecar.cli import audit, check, demo, explain, policy, serve, store, verify_answer
from sidecar.cli.exit_codes import ExitCode
from sidecar.config import ConfigError
from sidecar.runtime.channel import ListenError
from sidecar.runtime.envoy_process import EnvoyError
from sidecar.store.store import StoreUnavailable


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="retrieval-gate",
        description="Envoy sidecar that removes disallowed chunks from vector-database responses.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (serve, check, store, audit, policy, explain, verify_answer, demo):
        group.add_parsers(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("retrieval-gate")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `retrieval-gate` console script."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    except (EnvoyError, FileNotFoundError, ListenError, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.CANNOT_RUN
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:
        # A failure nobody anticipated: one line, and the traceback with -v.
        if args.verbose:
            raise
        print(
            f"error: {type(exc).__name__}: {exc} (run with -v for the traceback)",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    return code
