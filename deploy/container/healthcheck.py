"""The image's HEALTHCHECK: is the sidecar's gRPC server answering? Exit 0 if so, else 1.

It calls ``grpc.health.v1.Health/Check`` (the standard gRPC health service) on
``GATE_HEALTHCHECK_ADDRESS`` (default ``unix:/run/retrieval-gate/envoy.sock``,
where the image's default ``serve`` command listens; ``host:port`` works too):

- SERVING (the sidecar is ready): healthy;
- anything else (NOT_SERVING while its metadata store is still to be reached
  or while it stops, UNIMPLEMENTED from a server that is not the sidecar, no
  answer within the timeout, connection refused): unhealthy.

With ``--alive`` (Kubernetes' startup and liveness probes) any answer of the
health service, NOT_SERVING included, is healthy: a sidecar that waits for
its store is alive and must not be restarted for it.

Docker runs it as the image's user, with the image's Python; it needs only
``grpcio``, a dependency of the sidecar. The messages are encoded by hand
(HealthCheckRequest is empty; HealthCheckResponse is field 1, an enum), so no
generated health module is needed.
"""

from __future__ import annotations

import os
import sys

import grpc

DEFAULT_ADDRESS = "unix:/run/retrieval-gate/envoy.sock"
TIMEOUT_SECONDS = 3.0
_CHECK = "/grpc.health.v1.Health/Check"
# HealthCheckResponse{status: SERVING}: field 1 (varint) = 1.
_SERVING = b"\x08\x01"
_NOT_SERVING = b"\x08\x02"


def check(
    address: str, timeout: float = TIMEOUT_SECONDS, *, alive: bool = False
) -> tuple[bool, str]:
    """Whether the gRPC server at ``address`` is healthy (with ``alive``: answers at
    all), and why (for Docker's log)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(_CHECK)
        try:
            reply: bytes = call(b"", timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            return False, f"{address}: {error.code().name}"
    if reply == _SERVING:
        return True, f"{address}: SERVING"
    if reply == _NOT_SERVING and alive:
        return True, f"{address}: alive, NOT_SERVING"
    return False, f"{address}: not serving (reply {reply.hex() or 'UNKNOWN'})"


def main() -> int:
    """Check the configured address; print the outcome; 0 healthy, 1 not."""
    healthy, why = check(
        os.environ.get("GATE_HEALTHCHECK_ADDRESS", DEFAULT_ADDRESS),
        alive="--alive" in sys.argv[1:],
    )
    print(why)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
