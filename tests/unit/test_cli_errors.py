"""What the command line prints when something fails: one line, never raw markup."""

from __future__ import annotations

import argparse

import pytest

from sidecar import cli
from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.help_text import plain


def test_an_unforeseen_failure_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("something nobody foresaw")

    # The parser is built inside main, after the patch: `audit verify` runs `broken`.
    monkeypatch.setattr(cli.audit, "verify", broken)
    assert cli.main(["audit", "verify", "log.jsonl"]) == ExitCode.FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: RuntimeError: something nobody foresaw (run with -v for the traceback)"]


def test_with_verbose_the_traceback_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli.audit, "verify", broken)
    with pytest.raises(RuntimeError, match="boom"):
        cli.main(["-v", "audit", "verify", "log.jsonl"])


@pytest.mark.parametrize(
    "command",
    [["serve"], ["proxy"], ["store", "load"], ["store", "migrate"], ["audit", "verify"]],
)
def test_help_text_has_no_docstring_markup(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.main([*command, "--help"])
    shown = capsys.readouterr().out
    assert "``" not in shown and ":func:" not in shown and ":class:" not in shown


def test_plain_strips_literals_and_roles() -> None:
    assert plain("``store load``: see :func:`~sidecar.config.load_settings`") == (
        "store load: see sidecar.config.load_settings"
    )
    assert plain(None) is None
