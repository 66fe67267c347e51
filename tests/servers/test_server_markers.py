"""A test whose server is missing skips on a laptop and fails in CI (tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.fixtures import chroma_server, postgres
from tests.fixtures.servers import server_missing

pytest_plugins = ["pytester"]

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/postgres"
MARKED = """
import pytest

@pytest.mark.postgres
def test_needs_postgres():
    pass

@pytest.mark.chroma
def test_needs_chroma():
    pass

def test_needs_nothing():
    pass
"""


@pytest.fixture
def servers_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "ADMIN_URL", UNREACHABLE)
    monkeypatch.setattr(chroma_server, "chroma_executable", lambda: None)


def test_a_missing_server_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^no such server$"):
        server_missing("no such server")


def test_a_missing_server_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"^no such server \(CI is set"):
        server_missing("no such server")


@pytest.mark.parametrize(("ci", "outcomes"), [(None, {"skipped": 2}), ("true", {"errors": 2})])
def test_marked_tests_check_their_server_before_running(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    servers_missing: None,
    ci: str | None,
    outcomes: dict[str, int],
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makeconftest("from tests.conftest import pytest_runtest_setup")
    pytester.makepyfile(MARKED)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-W", "ignore", "-rsE")
    result.assert_outcomes(passed=1, **outcomes)
    assert "PostgreSQL not reachable at " + UNREACHABLE in result.stdout.str()
    assert "the `chroma` executable is not installed" in result.stdout.str()
