"""`retrieval-gate demo`: Envoy, the gate and a fixture upstream, with the decisions shown."""

from __future__ import annotations

import argparse
import asyncio

from sidecar.demo.run import run_demo


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``demo`` to the top-level ``commands``."""
    demo = commands.add_parser(
        "demo", help="run Envoy + gate + a fixture upstream and show decisions"
    )
    demo.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every step worked."""
    return asyncio.run(run_demo())
