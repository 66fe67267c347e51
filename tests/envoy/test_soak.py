"""The soak (bench/soak.py), shortened to under a minute for CI.

The published soak runs 30 minutes (docs/reliability.md); this one runs the
same code briefly, so a change that leaks a revoked chunk under load, loses
an audit record or stops revocations from propagating fails CI. Growth is
judged only by the full soak: a minute shows no trend.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fixtures.postgres import require_postgres

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak import RSS_GROWTH, Revocation, Revocations, Sample, growth, propagation_ms, run_soak
from traffic import READABLE_IDS, Answer

pytestmark = [pytest.mark.envoy, pytest.mark.postgres]


def test_a_short_soak_releases_nothing_revoked_and_loses_no_record() -> None:
    require_postgres()
    result = run_soak(
        minutes=0.5,
        clients=4,
        load_fraction=0.5,
        saturation_seconds=4,
        revoke_every=5,
        hold=3,
        grace=1,
    )
    assert result["answers"]["unfiltered"] == 0, result["answers"]
    assert result["answers"]["filtered"] > 0
    assert result["audit"] == {
        "chains": 2,
        "records": result["audit"]["records"],
        "chains_broken": [],
        "lost": 0,
    }
    assert result["revocations"] >= 4
    assert result["propagation_ms"]["measured"] >= 3
    assert result["propagation_ms"]["max"] < 1000


def _revocation(chunk: int) -> Revocation:
    return Revocation(chunk, begun=10.0, committed=10.1, restoring=20.0, restored=20.1)


def test_a_revoked_chunk_is_optional_in_its_grace_then_forbidden_until_restored() -> None:
    revocations = Revocations("postgresql://unused", every_s=20, hold_s=10, grace_s=2)
    revocations.rounds.append(_revocation(1))
    assert revocations.expect(9.0, 9.5) == (READABLE_IDS, frozenset())
    assert revocations.expect(10.5, 10.6) == (READABLE_IDS, frozenset({1}))
    assert revocations.expect(13.0, 13.1) == (READABLE_IDS - {1}, frozenset())
    assert revocations.expect(19.9, 20.05) == (
        READABLE_IDS,
        frozenset({1}),
    )  # decided while restoring
    assert revocations.expect(23.0, 23.1) == (READABLE_IDS, frozenset())


def _answer(started: float, ended: float, released: set[int]) -> Answer:
    return Answer(started, ended, "filtered", 200, "", "d", frozenset(released))


def test_propagation_is_the_first_clean_answer_after_the_last_that_carried_the_chunk() -> None:
    answers = [
        _answer(10.0, 10.11, {1, 2}),  # started before the commit: not counted
        _answer(10.11, 10.12, {2}),
        _answer(10.12, 10.13, {1, 2}),  # a worker's cache still had it
        _answer(10.13, 10.15, {2}),
    ]
    assert [round(ms) for ms in propagation_ms(answers, [_revocation(1)])] == [50]


def _samples(rss: list[float]) -> list[Sample]:
    return [Sample(i * 10.0 + 120, value, 90, 20, 60.0, 40, 7, i) for i, value in enumerate(rss)]


def test_a_steady_climb_fails_the_growth_bound_even_under_ten_percent() -> None:
    # 0.25 MiB every 10 s: 90 MiB an hour, 7% over the soak: a leak all the same.
    climbing = growth(_samples([330 + 0.25 * i for i in range(100)]), 20)
    assert climbing["problems"] == ["sidecar_rss_mib climbs 90.0 MiB/h (bound 10 MiB/h)"]
    assert climbing["sidecar_rss_mib"]["growth"] < RSS_GROWTH


def test_noise_around_a_level_passes_the_growth_bound() -> None:
    level = growth(_samples([330 + (i % 3) * 0.5 for i in range(100)]), 20)
    assert level["problems"] == []
