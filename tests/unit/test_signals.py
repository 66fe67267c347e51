"""The one wait-for-signal loop that serve, the worker pool and the proxy share."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from sidecar.runtime.signals import DIED, STOP_SIGNALS, STOPPED, StopSignals


async def exit_after(seconds: float, code: int) -> int:
    await asyncio.sleep(seconds)
    return code


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_a_signal_stops_the_wait_and_the_handlers_go_afterwards(signum: signal.Signals) -> None:
    async def scenario() -> int:
        with StopSignals() as signals:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signum)
            status = await signals.wait({"envoy": exit_after(30, 1)})
        # The handler is gone: the loop no longer owns the signal.
        assert not asyncio.get_running_loop().remove_signal_handler(signum)
        return status

    assert asyncio.run(scenario()) == STOPPED


def test_a_signal_during_start_up_stops_once_started() -> None:
    async def scenario() -> int:
        with StopSignals() as signals:
            os.kill(os.getpid(), signal.SIGTERM)
            # "Starting": the signal is handled before anyone waits. Polled, not slept.
            async with asyncio.timeout(10):
                await signals.stop.wait()
            return await signals.wait({"a worker": exit_after(30, 1)})

    assert asyncio.run(scenario()) == STOPPED


def test_the_first_process_to_exit_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        with StopSignals() as signals:
            return await signals.wait(
                {"envoy": exit_after(30, 0), "a sidecar worker": exit_after(0.01, 9)}
            )

    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == DIED
    assert caplog.messages == ["a sidecar worker exited with code 9; stopping"]


def test_an_exit_outranks_a_stop_that_came_with_it(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> int:
        stop = asyncio.Event()
        stop.set()
        envoy: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        envoy.set_result(3)
        with StopSignals(stop) as signals:
            return await signals.wait({"envoy": envoy})

    # Both are done when the wait looks: the failure must be reported, not lost.
    with caplog.at_level(logging.ERROR):
        assert asyncio.run(scenario()) == DIED
    assert caplog.messages == ["envoy exited with code 3; stopping"]


def test_a_stop_set_by_the_caller_ends_the_wait() -> None:
    async def scenario() -> int:
        stop = asyncio.Event()
        with StopSignals(stop) as signals:
            asyncio.get_running_loop().call_later(0.01, stop.set)
            return await signals.wait()

    assert asyncio.run(scenario()) == STOPPED
