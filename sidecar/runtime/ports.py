"""Picking a free TCP port for a listener the gate starts itself (the demo, tests, benchmarks).

Binding port 0 returns a port from the kernel's ephemeral range, the same
range it hands out to outgoing connections, so between finding the port and
the real server binding it, a client's connection (to PostgreSQL, to Envoy's
admin port...) can take it and the server fails with "address already in
use". Ports below Linux's default ephemeral range (32768-60999) are never
given to outgoing connections.

Nothing holds a port between this answer and the server's bind, so two
servers set up before either starts (two stacks of a test, a sidecar's
workers on ``port + i``) could be handed the same or neighbouring ports: a
port near one handed out lately is not handed out again.
"""

from __future__ import annotations

import random
import socket
from collections import deque

_BELOW_EPHEMERAL = range(20_000, 32_768)
_ATTEMPTS = 200
# Ports handed out lately; none within _SPREAD of them is handed out again
# (a sidecar's worker i listens on port + i).
_RECENT: deque[int] = deque(maxlen=256)
_SPREAD = 8


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that no socket holds now, outside the ephemeral range.

    Raises OSError when none was found in a few hundred tries.
    """
    for _ in range(_ATTEMPTS):
        port = random.choice(_BELOW_EPHEMERAL)
        if any(abs(port - recent) < _SPREAD for recent in _RECENT):
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _RECENT.append(port)
        return port
    raise OSError(f"no free TCP port found on {host} in {_ATTEMPTS} tries")
