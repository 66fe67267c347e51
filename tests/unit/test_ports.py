"""free_port: a port a listener can bind, never one the kernel hands to outgoing connections."""

from __future__ import annotations

import socket
from collections import deque

import pytest

from sidecar.runtime import ports


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    port = ports.free_port()
    assert 20_000 <= port < 32_768
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))


@pytest.fixture(autouse=True)
def nothing_handed_out_lately(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_RECENT", deque(maxlen=256))


def test_a_held_port_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        candidates = iter([taken, taken, 21_000 if taken != 21_000 else 21_001])
        monkeypatch.setattr("sidecar.runtime.ports.random.choice", lambda _: next(candidates))
        assert ports.free_port() != taken


def test_no_free_port_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr("sidecar.runtime.ports.random.choice", lambda _: taken)
        with pytest.raises(OSError, match="no free TCP port"):
            ports.free_port()


def test_a_port_near_one_handed_out_lately_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two stacks set up before either binds must not share a port, nor sit on a
    # worker's port + i.
    first = ports.free_port()
    candidates = iter([first, first + 1, first + 7, first + 8])
    monkeypatch.setattr("sidecar.runtime.ports.random.choice", lambda _: next(candidates))
    assert ports.free_port() == first + 8
