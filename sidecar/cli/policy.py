"""`retrieval-gate policy test`: run the Rego unit tests of a policy directory."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sidecar.cli.exit_codes import ExitCode
from sidecar.config import default_policy_dir
from sidecar.core.policy import PolicyError
from sidecar.rego.rego_tests import run_rego_tests


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policy`` and its subcommands to the top-level ``commands``."""
    policy = commands.add_parser("policy", help="policy tools")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    testing = policy_commands.add_parser("test", help="run the Rego unit tests in a directory")
    testing.add_argument("dir", type=Path, nargs="?", default=default_policy_dir())
    testing.set_defaults(func=run_tests)


def run_tests(args: argparse.Namespace) -> int:
    """Print PASS or FAIL per test; 0 when every test passed and there was one at least."""
    try:
        results = run_rego_tests(args.dir)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    failed = [r for r in results if not r.passed]
    for result in results:
        mark = "PASS" if result.passed else "FAIL"
        print(f"{mark} {result.name}" + (f": {result.message}" if result.message else ""))
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return ExitCode.FAILED if failed or not results else ExitCode.OK
