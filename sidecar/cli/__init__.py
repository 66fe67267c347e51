"""The `retrieval-gate` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sidecar.cli import audit as audit_verify
from sidecar.cli.store import add_store_parsers
from sidecar.config import ConfigError, IdentityMode, Settings, load_settings
from sidecar.core.modes import Mode
from sidecar.runtime.bootstrap import Upstream
from sidecar.runtime.envoy_process import EnvoyError
from sidecar.runtime.server import ListenError, serve_until_signalled, split_host_port
from sidecar.runtime.workers import WorkerPool
from sidecar.store.store import StoreUnavailable

log = logging.getLogger("retrieval_gate")

# Flags shared by `serve` and `proxy`; each maps to the Settings field of the same name.
_SETTING_FLAGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--identity", {"choices": [m.value for m in IdentityMode], "help": "identity mode"}),
    ("--store", {"help": "metadata store URL (default sqlite:///retrieval-gate.db)"}),
    ("--mode", {"choices": [m.value for m in Mode], "help": "enforce (default), strict, audit"}),
    ("--text-field", {"help": "payload field holding the chunk text (default: text)"}),
    ("--id-field", {"help": "payload field holding the chunk id (default: the point id)"}),
    ("--policy-dir", {"help": "directory of Rego policies (default: the bundled ones)"}),
    ("--policy-data", {"help": "JSON file loaded as Rego data (e.g. collection owners)"}),
    ("--jwks", {"help": "JWKS file or http(s) URL (identity jwt, envoy-jwt)"}),
    ("--jwt-public-key", {"help": "PEM public key file (identity jwt, envoy-jwt)"}),
    ("--jwt-hmac-secret-file", {"help": "HMAC secret file (identity jwt, envoy-jwt)"}),
    ("--issuer", {"help": "required token issuer (iss)"}),
    ("--audience", {"help": "required token audience (aud)"}),
    ("--tenant-claim", {"help": "claim holding the tenant (default: tenant)"}),
    ("--drafts-scope", {"help": "token scope that allows reading draft chunks"}),
    ("--tenant-key", {"help": "payload field holding the tenant: enables tenant push-down"}),
    ("--overfetch-factor", {"type": float, "help": "ask the DB for this many times k (1: off)"}),
    ("--metrics", {"help": "host:port to serve /metrics on"}),
    ("--audit-log", {"help": "append hash-chained decision records to this JSON Lines file"}),
    ("--audit-store", {"help": "PostgreSQL URL: ship the audit log to its audit_records table"}),
    ("--max-body-bytes", {"type": int, "help": "largest response body inspected (4 MiB)"}),
    ("--cache-ttl-seconds", {"type": float, "help": "metadata cache TTL (30)"}),
    (
        "--stale-if-error-seconds",
        {
            "type": float,
            "help": "serve expired records this long while the store fails (0: fail closed)",
        },
    ),
    ("--message-timeout-ms", {"type": int, "help": "Envoy's wait per message (2000)"}),
    ("--workers", {"type": int, "help": "sidecar processes, e.g. one per core (1)"}),
)


def _add_setting_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="TOML settings file (flags override it)")
    for flag, options in _SETTING_FLAGS:
        parser.add_argument(flag, **options)


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    overrides = {
        flag[2:].replace("-", "_"): getattr(args, flag[2:].replace("-", "_"))
        for flag, _ in _SETTING_FLAGS
    }
    return load_settings(args.config, overrides | extra)


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args, grpc_listen=args.grpc_listen)
    if settings.workers == 1:
        asyncio.run(serve_until_signalled(settings))
        return 0
    return asyncio.run(_serve_workers(settings))


async def _serve_workers(settings: Settings) -> int:
    pool = WorkerPool(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await pool.start()
        stopped = asyncio.ensure_future(stop.wait())
        exited = asyncio.ensure_future(pool.wait())
        done, pending = await asyncio.wait({stopped, exited}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if exited in done:
            log.error("a worker exited with code %s; stopping", exited.result())
            return 1
        return 0
    finally:
        await pool.stop()


def _cmd_proxy(args: argparse.Namespace) -> int:
    from sidecar.runtime.proxy import run_proxy

    settings = _settings(args, grpc_listen=args.grpc_listen)
    try:
        listen = split_host_port(args.listen)
        upstream = Upstream.parse(args.upstream)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return asyncio.run(
        run_proxy(
            settings,
            listen=listen,
            upstream=upstream,
            envoy_concurrency=args.envoy_concurrency,
            private_socket=args.grpc_listen is None,
        )
    )


def _cmd_policy_test(args: argparse.Namespace) -> int:
    from sidecar.core.policy import PolicyError
    from sidecar.policy.rego_tests import run_rego_tests

    try:
        results = run_rego_tests(args.dir)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    failed = [r for r in results if not r.passed]
    for result in results:
        mark = "PASS" if result.passed else "FAIL"
        print(f"{mark} {result.name}" + (f": {result.message}" if result.message else ""))
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not results else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sidecar.demo.run import run_demo

    return asyncio.run(run_demo())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="retrieval-gate",
        description="Envoy sidecar that removes disallowed chunks from vector-database responses.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the sidecar for an Envoy you configure")
    _add_setting_flags(serve)
    serve.add_argument("--grpc-listen", help="host:port or unix:/path (default 127.0.0.1:9001)")
    serve.set_defaults(func=_cmd_serve)

    proxy = commands.add_parser("proxy", help="run the sidecar plus an Envoy in front of a DB")
    _add_setting_flags(proxy)
    proxy.add_argument(
        "--upstream", required=True, help="vector DB URL, e.g. http://127.0.0.1:6333"
    )
    proxy.add_argument("--listen", required=True, help="host:port for applications to call")
    proxy.add_argument("--grpc-listen", help="sidecar address (default: a private unix socket)")
    proxy.add_argument("--envoy-concurrency", type=int, default=1, help="Envoy worker threads")
    proxy.set_defaults(func=_cmd_proxy)

    store = commands.add_parser("store", help="manage the metadata store")
    add_store_parsers(store.add_subparsers(dest="store_command", required=True))

    audit = commands.add_parser("audit", help="audit log tools")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verify = audit_commands.add_parser("verify", help="check the hash chain of an audit log")
    audit_verify.add_verify_arguments(verify)
    verify.set_defaults(func=audit_verify.verify)

    policy = commands.add_parser("policy", help="policy tools")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    test = policy_commands.add_parser("test", help="run the Rego unit tests in a directory")
    test.add_argument("dir", type=Path, nargs="?", default=Settings().policy_dir)
    test.set_defaults(func=_cmd_policy_test)

    demo = commands.add_parser(
        "demo", help="run Envoy + gate + a fixture upstream and show decisions"
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


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
    except (ConfigError, EnvoyError, FileNotFoundError, ListenError, StoreUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code
