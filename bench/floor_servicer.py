"""A measurement tool, not a product: an Envoy ext_proc servicer that does no work.

The benchmark suite's "floor" section (bench/suite.py) puts this behind the same
front Envoy as the gate (the gate's own `build_bootstrap`, the same processing
mode) to measure what one Python grpc.aio ext_proc stream per request costs
before the gate does anything: it answers every message at once, with an empty
"continue" answer (request headers -> HeadersResponse, response headers ->
HeadersResponse, response body -> BodyResponse). With ``--echo-body`` it
replaces the response body with the same bytes, as the gate replaces it with
the filtered one, so the copy back to Envoy is counted too. With
``--echo-request-body`` it does the same with the request body (the gate's
push-down replaces it with the rewritten query), for a processing mode that
sends it. It serves on the event loop the sidecar would (``--event-loop``, the
sidecar's own choice of loop), so a faster loop is not counted as the gate's.

It never reads identity, never asks a policy and never filters: do not put it
in front of anything real.

Usage: .venv/bin/python bench/floor_servicer.py [--echo-body] [--echo-request-body]
       [--event-loop auto|uvloop|asyncio] [--max-message-bytes N] ADDRESS [ADDRESS ...]

ADDRESS is what gRPC binds (``unix:/path`` or ``host:port``). Several addresses
run one process each (this one serves the first and starts the others as its
children), like the sidecar's ``workers``; SIGTERM or SIGINT stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: make `sidecar` importable

from sidecar.config import EventLoopName  # noqa: E402
from sidecar.runtime import event_loop  # noqa: E402
from sidecar.wire import ext_proc_pb2 as ext_proc  # noqa: E402
from sidecar.wire import ext_proc_pb2_grpc as ext_proc_grpc  # noqa: E402

_REQUEST_HEADERS = ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
_RESPONSE_HEADERS = ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse())
_BODY = ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
_REQUEST_BODY = ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
_TRAILERS = ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class FloorServicer(ext_proc_grpc.ExternalProcessorServicer):
    """Answers each message with an empty continue response (``echo_body``: the body
    comes back as a body mutation with the same bytes)."""

    def __init__(self, echo_body: bool, echo_request_body: bool = False) -> None:
        self._echo_body = echo_body
        self._echo_request_body = echo_request_body

    async def Process(
        self,
        request_iterator: AsyncIterator[ext_proc.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_headers":
                yield _REQUEST_HEADERS
            elif kind == "response_headers":
                yield _RESPONSE_HEADERS
            elif kind == "response_body":
                yield _echoed(kind, request.response_body.body) if self._echo_body else _BODY
            elif kind == "request_body":
                echo = self._echo_request_body
                yield _echoed(kind, request.request_body.body) if echo else _REQUEST_BODY
            else:
                yield _TRAILERS


def _echoed(kind: str, body: bytes) -> ext_proc.ProcessingResponse:
    """The answer to a ``kind`` body message that replaces the body with the same bytes."""
    common = ext_proc.CommonResponse()
    common.body_mutation.body = body
    answer = ext_proc.ProcessingResponse()
    getattr(answer, kind).response.CopyFrom(common)
    return answer


async def serve(
    address: str, echo_body: bool, echo_request_body: bool, max_message_bytes: int
) -> None:
    # The same server options as the sidecar's gRPC server (sidecar/runtime/server.py).
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
    )
    ext_proc_grpc.add_ExternalProcessorServicer_to_server(
        FloorServicer(echo_body, echo_request_body), server
    )
    if server.add_insecure_port(address) == 0 and not address.startswith("unix:"):
        raise OSError(f"cannot listen on {address}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0.5)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("addresses", nargs="+", help="unix:/path or host:port, one per process")
    parser.add_argument("--echo-body", action="store_true", help="send the body back unchanged")
    parser.add_argument(
        "--echo-request-body", action="store_true", help="send the request body back unchanged"
    )
    parser.add_argument(
        "--event-loop", choices=[e.value for e in EventLoopName], default=EventLoopName.AUTO.value
    )
    parser.add_argument("--max-message-bytes", type=int, default=4 * 1024 * 1024 + 256 * 1024)
    args = parser.parse_args()
    options = ["--max-message-bytes", str(args.max_message_bytes), "--event-loop", args.event_loop]
    options += ["--echo-body"] if args.echo_body else []
    options += ["--echo-request-body"] if args.echo_request_body else []
    # Started before this process creates any gRPC state (gRPC does not survive a fork).
    children = [
        subprocess.Popen([sys.executable, __file__, *options, address], preexec_fn=_die_with_parent)
        for address in args.addresses[1:]
    ]
    try:
        event_loop.run(
            serve(
                args.addresses[0], args.echo_body, args.echo_request_body, args.max_message_bytes
            ),
            EventLoopName(args.event_loop),
        )
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
