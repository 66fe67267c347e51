"""`retrieval-gate check`: is this configuration ready to serve? One line per check.

Takes the settings ``serve`` and ``proxy`` take (``--config`` and the same
flags), plus where the database is (``--upstream``, ``--grpc-upstream``),
which database it is (``--database``) and which collections to ask it about
(``--collection``, added to those the settings and the policy data name).
Each check prints ``ok``, ``FAIL`` or ``not checked``, what it checked, and
what it found or how to fix it. Nothing is changed: a missing SQLite file is
reported, not created.

Exit status: 0 every check ok (or not checkable), 1 a check failed, 2 the
settings cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.flags import add_setting_flags, settings_from_flags
from sidecar.cli.help_text import plain
from sidecar.cli.serve import check_exposure, check_plain_http
from sidecar.config import ConfigError, PolicyEngineName, Settings
from sidecar.core.policy import PolicyError
from sidecar.formats.probes import DATABASES, NO_SCHEMA, SCHEMA_PROBES
from sidecar.formats.schema_probe import Presence, SchemaAnswerError, SchemaProbe
from sidecar.rego.bundle import BundleError, read_bundle
from sidecar.rego.opa_engine import OpaEngine
from sidecar.rego.policy_data import described_collections
from sidecar.rego.rego_tests import run_rego_tests
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.reloading import DATA, TESTS, prepare_revision
from sidecar.runtime.bootstrap import Upstream, check_upstream_credential
from sidecar.runtime.policy_source import bundle_display, bundle_fetcher, bundle_verification
from sidecar.runtime.server import (
    build_identity,
    build_policies,
    load_policy_data,
    one_line,
    rego_error_line,
)
from sidecar.runtime.upstream_probe import UpstreamUnreachable, connect, credential_headers, send
from sidecar.store.inspection import COUNT_TIMEOUT_S, inspect_store
from sidecar.store.store import StoreUnavailable

DEFAULT_TIMEOUT_SECONDS = 3.0


class Outcome(StrEnum):
    OK = "ok"
    FAIL = "FAIL"
    # The check cannot be made here: what is missing, or why it cannot be told.
    NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class Result:
    """One line of the report."""

    outcome: Outcome
    what: str
    detail: str


@dataclass(frozen=True)
class _Database:
    """Where the database is, as ``proxy`` takes it."""

    upstream: Upstream | None
    grpc_upstream: Upstream | None


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``check`` to the top-level ``commands``."""
    checking = commands.add_parser(
        "check",
        help="check settings, policy, store, upstream and tenant fields before serving",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_setting_flags(checking)
    database = checking.add_argument_group("the database")
    database.add_argument("--upstream", help="vector DB URL, as proxy takes it")
    database.add_argument("--grpc-upstream", help="the DB's gRPC endpoint, as proxy takes it")
    database.add_argument(
        "--database",
        choices=DATABASES,
        help="which database it is, to ask whether its collections hold the tenant field",
    )
    database.add_argument(
        "--collection",
        action="append",
        default=[],
        metavar="NAME",
        help="a collection to check the tenant field of (repeatable); also checked: "
        "telemetry.metric_collections and the collections the policy data describes",
    )
    checking.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"seconds to wait for each connection or answer (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    checking.add_argument("--json", action="store_true", help="one JSON object per check")
    checking.set_defaults(func=run_check)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be above 0")
    return value


def run_check(args: argparse.Namespace) -> int:
    """Run every check and print one line each; 0 all ok, 1 one failed, 2 bad settings."""
    try:
        settings = settings_from_flags(args)
        check_exposure(settings)
        check_plain_http(settings)
        database = _Database(_parse(args.upstream), _parse(args.grpc_upstream))
    except ConfigError as exc:
        _print([Result(Outcome.FAIL, "settings", problem) for problem in exc.problems], args.json)
        return ExitCode.CANNOT_RUN
    source = str(args.config) if args.config is not None else "defaults and flags"
    results = [Result(Outcome.OK, "settings", f"{source}: loaded and valid")]
    results.append(_identity(settings))
    policy_results, data = _policy(settings)
    results += policy_results
    results.append(_store(settings))
    results += _upstream(settings, database, args.timeout)
    collections = _collections(args.collection, settings, data)
    results += _tenant_fields(settings, database, args.database, collections, args.timeout)
    _print(results, args.json)
    failed = any(result.outcome is Outcome.FAIL for result in results)
    return ExitCode.FAILED if failed else ExitCode.OK


def _parse(url: str | None) -> Upstream | None:
    if url is None:
        return None
    try:
        return Upstream.parse(url)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _identity(settings: Settings) -> Result:
    try:
        build_identity(settings)
    except ConfigError as exc:
        return Result(Outcome.FAIL, "identity", "; ".join(exc.problems))
    assert settings.identity.mode is not None  # load_settings requires it
    return Result(Outcome.OK, "identity", f"mode {settings.identity.mode.value}")


def _policy(settings: Settings) -> tuple[list[Result], Mapping[str, Any] | None]:
    """The policy's results, and its data (None when there is none, or it is OPA's)."""
    if settings.policy.bundle is not None:
        return _bundle(settings)
    if settings.policy.engine is PolicyEngineName.OPA:
        return _opa(settings), None
    return _policy_dir(settings)


def _policy_dir(settings: Settings) -> tuple[list[Result], Mapping[str, Any] | None]:
    policy = settings.policy
    results = []
    data = None
    try:
        data = load_policy_data(settings)
    except ConfigError as exc:
        results.append(Result(Outcome.FAIL, "policy data", "; ".join(exc.problems)))
    else:
        given = f"{policy.data} matches its schema" if policy.data is not None else "none given"
        results.append(Result(Outcome.OK, "policy data", given))
    try:
        engine = RegorusEngine.from_directory(policy.dir, data=data)
    except PolicyError as exc:
        fix = f" (retrieval-gate policy test {policy.dir} shows where)"
        results.append(Result(Outcome.FAIL, "policy", rego_error_line(exc) + fix))
        return results, data
    results.append(Result(Outcome.OK, "policy", f"{engine.version} compiles ({policy.dir})"))
    results.append(_rego_tests(settings))
    return results, data


def _rego_tests(settings: Settings) -> Result:
    where = settings.policy.dir
    try:
        tests = run_rego_tests(where)
    except PolicyError as exc:
        return Result(Outcome.FAIL, "policy tests", rego_error_line(exc))
    failed = [test.name for test in tests if not test.passed]
    if failed:
        return Result(
            Outcome.FAIL,
            "policy tests",
            f"{len(failed)} of {len(tests)} failed: {', '.join(failed[:5])} "
            f"(retrieval-gate policy test {where} says why)",
        )
    if not tests:
        return Result(Outcome.NOT_CHECKED, "policy tests", f"no test_* rules in {where}")
    return Result(Outcome.OK, "policy tests", f"{len(tests)} passed")


def _bundle(settings: Settings) -> tuple[list[Result], Mapping[str, Any] | None]:
    where = bundle_display(settings)
    try:
        verification = bundle_verification(settings)
        assert settings.policy.bundle is not None  # the caller checks
        blob = bundle_fetcher(settings.policy.bundle).fetch()
        assert blob is not None  # a first fetch always has the bundle
        bundle = read_bundle(blob, verification=verification)
    except ConfigError as exc:
        return [Result(Outcome.FAIL, "policy bundle", "; ".join(exc.problems))], None
    except BundleError as exc:
        return [
            Result(Outcome.FAIL, "policy bundle", f"{where} refused ({exc.reason}): {exc}")
        ], None
    signed = ", signature verified" if verification is not None else ""
    results = [Result(Outcome.OK, "policy bundle", f"{where} revision {bundle.revision!r}{signed}")]
    try:
        revision = prepare_revision(bundle)
    except BundleError as exc:
        what = {DATA: "policy data", TESTS: "policy tests"}.get(exc.reason, "policy")
        results.append(Result(Outcome.FAIL, what, str(exc)))
        return results, bundle.data
    results += [
        Result(Outcome.OK, "policy data", "the bundle's data matches its schema"),
        Result(Outcome.OK, "policy", f"{revision.version} compiles"),
        Result(Outcome.OK, "policy tests", f"{revision.tests_run} passed"),
    ]
    return results, bundle.data


def _opa(settings: Settings) -> list[Result]:
    try:
        engine, _, source = build_policies(settings)
    except ConfigError as exc:
        return [Result(Outcome.FAIL, "policy", "; ".join(exc.problems))]
    assert isinstance(engine, OpaEngine)  # policy.engine opa, no bundle
    try:
        engine.probe()
    except PolicyError as exc:
        return [Result(Outcome.FAIL, "policy", f"OPA at {source}: {one_line(str(exc))}")]
    why = "the policy and its data are OPA's: test them where they are built (opa test)"
    return [
        Result(Outcome.OK, "policy", f"OPA at {source} serves the chunk policy"),
        Result(Outcome.NOT_CHECKED, "policy tests", why),
    ]


def _store(settings: Settings) -> Result:
    try:
        summary = inspect_store(settings.store.url, pgbouncer=settings.store.pgbouncer)
    except ValueError as exc:
        return Result(Outcome.FAIL, "store", f"store.url: {exc}")
    except StoreUnavailable as exc:
        return Result(Outcome.FAIL, "store", one_line(str(exc)))
    if summary.records is None:
        records = f"records not counted (over {COUNT_TIMEOUT_S:g} s)"
    elif summary.records == 0:
        records = "0 records (empty: every chunk is rejected until `retrieval-gate store load`)"
    else:
        records = f"{summary.records} records"
    note = f" ({summary.note})" if summary.note else ""
    return Result(
        Outcome.OK,
        "store",
        f"{summary.kind} {summary.where}, schema version {summary.schema_version}{note}, {records}",
    )


def _upstream(settings: Settings, database: _Database, timeout: float) -> list[Result]:
    results = []
    if settings.upstream.credential_file is not None:
        try:
            check_upstream_credential(settings)
        except ConfigError as exc:
            results.append(Result(Outcome.FAIL, "upstream credential", "; ".join(exc.problems)))
        else:
            results.append(
                Result(Outcome.OK, "upstream credential", f"{settings.upstream.credential_file}")
            )
    given = [
        (name, upstream)
        for name, upstream in (
            ("upstream", database.upstream),
            ("gRPC upstream", database.grpc_upstream),
        )
        if upstream is not None
    ]
    if not given:
        why = "give --upstream URL (with serve: the database your Envoy forwards to)"
        return [*results, Result(Outcome.NOT_CHECKED, "upstream", why)]
    for name, upstream in given:
        try:
            connect(upstream, timeout)
        except UpstreamUnreachable as exc:
            results.append(Result(Outcome.FAIL, name, str(exc)))
        else:
            results.append(
                Result(Outcome.OK, name, f"{upstream.host}:{upstream.port} accepts connections")
            )
    return results


def _collections(
    named: Sequence[str], settings: Settings, data: Mapping[str, Any] | None
) -> list[str]:
    """Those given, those counted in the metrics and those the policy data describes."""
    found = [*named, *settings.telemetry.metric_collections]
    if data is not None:
        found += described_collections(data)
    return list(dict.fromkeys(found))


def _tenant_fields(
    settings: Settings,
    database: _Database,
    database_name: str | None,
    collections: list[str],
    timeout: float,
) -> list[Result]:
    what = "tenant field"
    if not collections:
        why = (
            "no collection named: give --collection NAME (or describe collections in the "
            "policy data, or list them in telemetry.metric_collections)"
        )
        return [Result(Outcome.NOT_CHECKED, what, why)]
    if database_name is None:
        why = f"give --database ({', '.join(DATABASES)}) to ask about {', '.join(collections)}"
        return [Result(Outcome.NOT_CHECKED, what, why)]
    if database_name in NO_SCHEMA:
        return [Result(Outcome.NOT_CHECKED, what, NO_SCHEMA[database_name])]
    probe = SCHEMA_PROBES[database_name]
    headers = credential_headers(settings)
    return [
        result
        for collection in collections
        for result in _tenant_field(settings, database, probe, collection, headers, timeout)
    ]


def _tenant_field(
    settings: Settings,
    database: _Database,
    probe: SchemaProbe,
    collection: str,
    headers: Mapping[str, str],
    timeout: float,
) -> Iterator[Result]:
    what = f"tenant field in {collection}"
    paths = probe.search_paths(collection)
    keys = dict.fromkeys(
        key for path in paths if (key := settings.route_policy(path).tenant_key) is not None
    )
    if not keys:
        yield Result(Outcome.NOT_CHECKED, what, "push-down is off on its routes")
        return
    request = probe.request(collection)
    target = (database.grpc_upstream or database.upstream) if request.grpc else database.upstream
    if target is None:
        yield Result(Outcome.NOT_CHECKED, what, "give --upstream URL to ask the database")
        return
    try:
        status, body = send(request, target, headers, timeout)
    except UpstreamUnreachable as exc:
        yield Result(Outcome.FAIL, what, str(exc))
        return
    except SchemaAnswerError as exc:
        yield Result(Outcome.FAIL, what, f"{probe.database} answered: {exc}")
        return
    for key in keys:
        try:
            report = probe.read(status, body, key)
        except SchemaAnswerError as exc:
            yield Result(Outcome.FAIL, what, f"{probe.database} answered: {exc}")
            return
        outcome = {
            Presence.FOUND: Outcome.OK,
            Presence.MISSING: Outcome.FAIL,
            Presence.UNKNOWN: Outcome.NOT_CHECKED,
        }[report.presence]
        yield Result(outcome, what, report.detail)


def _print(results: list[Result], as_json: bool) -> None:
    for result in results:
        if as_json:
            line = {"check": result.what, "outcome": str(result.outcome), "detail": result.detail}
            print(json.dumps(line, ensure_ascii=False))
        else:
            print(f"{result.outcome} {result.what} — {result.detail}")
