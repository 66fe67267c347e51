"""deploy/prometheus as its users check it: `promtool check rules` and `promtool test rules`.

Every alert has a unit test in which it fires and one in which it stays
silent, carries runbook text, and says which collection and format when it is
about the index; a broken expectation makes promtool fail.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.fixtures.prometheus import RULE_FILES, RULES_DIR, require_promtool

pytestmark = pytest.mark.prometheus

TESTS = sorted((RULES_DIR / "tests").glob("*_test.yaml"))
# Alerts about the index (or one collection's answers): they say which
# collection of which format. The others are about the sidecar process.
PER_COLLECTION = frozenset(
    {
        "RetrievalGateHashMismatch",
        "RetrievalGateIndexTampering",
        "RetrievalGateStaleIngestion",
        "RetrievalGateMissingMetadata",
        "RetrievalGateStaleRetrieval",
        "RetrievalGateAbstentionSpike",
        "RetrievalGateCrossTenantHitsWithPushDown",
        "RetrievalGatePolicyErrors",
        "RetrievalGateMetadataStoreUnavailable",
    }
)


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_promtool(), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alert_rules() -> dict[str, dict[str, Any]]:
    alerts = RULES_DIR / "prometheus_alerts.yaml"
    return {rule["alert"]: rule for group in load(alerts)["groups"] for rule in group["rules"]}


def test_the_rule_files_pass_promtool_check_rules() -> None:
    checked = promtool("check", "rules", *RULE_FILES)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("SUCCESS") == len(RULE_FILES)


def test_the_unit_tests_pass_promtool_test_rules() -> None:
    assert TESTS
    tested = promtool("test", "rules", *TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_tested_firing_and_silent() -> None:
    fired: dict[str, list[dict[str, str]]] = {}
    silent: set[str] = set()
    for path in TESTS:
        for case in load(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                name = check["alertname"]
                if check.get("exp_alerts"):
                    fired.setdefault(name, []).extend(a["exp_labels"] for a in check["exp_alerts"])
                else:
                    silent.add(name)
    alerts = alert_rules()
    assert set(fired) == set(alerts), "alerts never shown firing"
    assert silent == set(alerts), "alerts never shown silent"
    for name in PER_COLLECTION:
        for labels in fired[name]:
            assert {"collection", "format", "job"} <= set(labels), name


def test_every_alert_explains_itself() -> None:
    for name, rule in alert_rules().items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        # Per-collection alerts keep the collection and format through their
        # aggregation (recording rules sum by them).
        if name in PER_COLLECTION:
            assert "collection" in rule["annotations"]["summary"], name


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    # The unit tests can fail: with a threshold changed they do.
    copy = tmp_path / "prometheus"
    shutil.copytree(RULES_DIR, copy)
    alerts = copy / "prometheus_alerts.yaml"
    text = alerts.read_text(encoding="utf-8")
    assert "retrieval_gate:stale_chunks:ratio_rate5m > 0.1" in text
    alerts.write_text(text.replace("ratio_rate5m > 0.1", "ratio_rate5m > 0.5"), encoding="utf-8")
    tested = promtool("test", "rules", copy / "tests" / "drift_test.yaml")
    assert tested.returncode == 1
    assert "RetrievalGateStaleRetrieval" in tested.stdout + tested.stderr
