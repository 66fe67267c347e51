"""Draining an Envoy before it stops, so that no request in flight is reset.

Envoy exits at once on SIGTERM and resets whatever it was proxying. So both
``proxy`` (before it stops its Envoy) and the Kubernetes gateway's Envoy
(``preStop``, ``python -m sidecar.runtime.envoy_drain``) first ask Envoy's
admin endpoint to drain (``POST /drain_listeners?graceful``): from then on
Envoy tells every client to close its connection after the answer in flight
(``Connection: close``, an HTTP/2 GOAWAY; all at once with
``--drain-strategy immediate``), keeps accepting new connections for
``--drain-time-s`` (a load balancer may still send some) and then closes its
listeners. The drain then waits until no downstream request is active (the
``http.*.downstream_rq_active`` gauges, the admin endpoint's own excluded),
at least ``min_seconds`` and at most ``max_seconds``; after that the stop
signal finds nothing to reset.

Only the standard library and the admin endpoint on loopback: the preStop
hook runs in the Envoy container with the gate's image's Python.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

log = logging.getLogger(__name__)

DRAIN_PATH = "/drain_listeners?graceful"
ACTIVE_PATH = "/stats?filter=downstream_rq_active$"
_POLL_SECONDS = 0.1
_ADMIN_TIMEOUT_SECONDS = 2.0


async def admin_request(host: str, port: int, method: str, path: str) -> tuple[int, bytes]:
    """One HTTP/1.1 request to Envoy's admin endpoint: (status, body); OSError when it fails."""
    async with asyncio.timeout(_ADMIN_TIMEOUT_SECONDS):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            # Envoy refuses HTTP/1.0 unless configured to accept it.
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    line = head.split(b"\r\n", 1)[0]
    status = int(line.split(b" ", 2)[1]) if line.startswith(b"HTTP/") else 0
    return status, body


def active_requests(stats: bytes) -> int:
    """The downstream requests in flight, from ``/stats`` text (the admin endpoint's excluded)."""
    total = 0
    for line in stats.decode(errors="replace").splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if not name.endswith("downstream_rq_active") or name.startswith("http.admin."):
            continue
        try:
            total += int(value.strip())
        except ValueError:
            continue
    return total


async def drain(
    host: str, port: int, *, min_seconds: float = 0.0, max_seconds: float = 30.0
) -> int:
    """Start a graceful drain and wait until no request is in flight; the requests still
    active when ``max_seconds`` ran out (0: drained). OSError when Envoy's admin
    endpoint does not answer the drain request."""
    started = time.monotonic()
    status, body = await admin_request(host, port, "POST", DRAIN_PATH)
    if status != 200:
        raise OSError(f"envoy admin {DRAIN_PATH}: HTTP {status} {body[:200]!r}")
    active = -1
    while True:
        elapsed = time.monotonic() - started
        try:
            _, stats = await admin_request(host, port, "GET", ACTIVE_PATH)
            active = active_requests(stats)
        except OSError:
            return 0  # Envoy is gone: nothing left to drain
        if active == 0 and elapsed >= min_seconds:
            return 0
        if elapsed >= max_seconds:
            return active
        await asyncio.sleep(_POLL_SECONDS)


def main(argv: list[str] | None = None) -> int:
    """``python -m sidecar.runtime.envoy_drain``: a preStop hook. Exit 0 when drained,
    1 when requests were still active at ``--max-seconds``, 2 when Envoy did not answer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--admin", default="127.0.0.1:9901", help="Envoy's admin host:port")
    parser.add_argument(
        "--min-seconds",
        type=float,
        default=0.0,
        help="keep serving at least this long (while the endpoint leaves the load balancers)",
    )
    parser.add_argument("--max-seconds", type=float, default=30.0, help="give up after this long")
    args = parser.parse_args(argv)
    host, _, port = args.admin.rpartition(":")
    try:
        left = asyncio.run(
            drain(
                host.strip("[]"),
                int(port),
                min_seconds=args.min_seconds,
                max_seconds=args.max_seconds,
            )
        )
    except (OSError, TimeoutError) as exc:
        print(f"envoy drain: {exc}", file=sys.stderr)
        return 2
    if left:
        print(f"envoy drain: {left} requests still active after {args.max_seconds:g} s")
        return 1
    print("envoy drained")
    return 0


if __name__ == "__main__":
    sys.exit(main())
