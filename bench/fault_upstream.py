"""A database stand-in that misbehaves on command, for the fault matrix (bench/faults.py).

Not the gate and not a database: a small HTTP/1.1 server (asyncio, keep-alive)
that answers every request with one canned Qdrant search body, the way the
real one would, until it is told to misbehave. ``POST /__fault/<mode>`` on
its own port switches the mode for every later request:

* ``normal``: the canned body, 200;
* ``reset``: the connection is reset (RST) after the request is read;
* ``truncate``: full headers, half the body, then the connection is closed;
* ``slow``: the body dripped in ten pieces, ``--drip-seconds`` apart;
* ``bomb``: a gzip body that inflates to ``--bomb-mib`` MiB of JSON;
* ``oversize``: a valid body ``--oversize-bytes`` long (over the gate's limit);
* ``error``: a 500 whose text names a secret (the gate must not relay it).

Usage: python bench/fault_upstream.py --port P --body FILE
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import socket
import struct
from pathlib import Path

import orjson

MODES = ("normal", "reset", "truncate", "slow", "bomb", "oversize", "error")
ERROR_TEXT = b'{"status":{"error":"CANARY upstream error text: collection secret-merger"}}'


class Bodies:
    """Every answer's bytes, built once: the server must not be the bottleneck."""

    def __init__(self, body: bytes, bomb_mib: int, oversize_bytes: int) -> None:
        self.body = body
        decoded = orjson.loads(body)
        # A valid search body whose hits array is padded with whitespace: the
        # same JSON, too long to inspect.
        padding = b" " * max(0, oversize_bytes - len(body))
        self.oversize = body.replace(b'"result":[', b'"result":[' + padding, 1)
        assert orjson.loads(self.oversize) == decoded
        filler = b" " * (bomb_mib * 1024 * 1024)
        self.bomb = gzip.compress(body.replace(b'"result":[', b'"result":[' + filler, 1), 9)


def _head(status: int, length: int, extra: bytes = b"") -> bytes:
    reason = b"OK" if status == 200 else b"Internal Server Error"
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n" % (
        status,
        reason,
        length,
        extra,
    )


class FaultUpstream:
    """Serves ``bodies`` per the current mode."""

    def __init__(self, bodies: Bodies, drip_seconds: float) -> None:
        self.bodies = bodies
        self.drip_seconds = drip_seconds
        self.mode = "normal"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                length = 0
                for line in lines:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                path = request_line.split(" ")[1]
                if path.startswith("/__fault/"):
                    mode = path.removeprefix("/__fault/")
                    ok = mode in MODES
                    if ok:
                        self.mode = mode
                    writer.write(_head(200 if ok else 500, 0))
                    await writer.drain()
                    continue
                if not await self._answer(writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter) -> bool:
        """Answer one request per the mode; False when the connection is done."""
        mode, bodies = self.mode, self.bodies
        if mode == "reset":
            sock = writer.get_extra_info("socket")
            # Linger 0: close() sends RST instead of FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if mode == "truncate":
            writer.write(_head(200, len(bodies.body)) + bodies.body[: len(bodies.body) // 2])
            await writer.drain()
            return False
        if mode == "slow":
            body = bodies.body
            writer.write(_head(200, len(body)))
            step = -(-len(body) // 10)
            for start in range(0, len(body), step):
                writer.write(body[start : start + step])
                await writer.drain()
                await asyncio.sleep(self.drip_seconds)
            return True
        if mode == "bomb":
            body, extra = bodies.bomb, b"content-encoding: gzip\r\n"
        elif mode == "oversize":
            body, extra = bodies.oversize, b""
        elif mode == "error":
            writer.write(_head(500, len(ERROR_TEXT)) + ERROR_TEXT)
            await writer.drain()
            return True
        else:
            body, extra = bodies.body, b""
        writer.write(_head(200, len(body), extra) + body)
        await writer.drain()
        return True


async def serve(port: int, upstream: FaultUpstream) -> None:
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", type=Path, required=True, help="the canned search body")
    parser.add_argument("--drip-seconds", type=float, default=0.05)
    parser.add_argument("--bomb-mib", type=int, default=64)
    parser.add_argument("--oversize-bytes", type=int, default=1024 * 1024)
    args = parser.parse_args()
    bodies = Bodies(args.body.read_bytes(), args.bomb_mib, args.oversize_bytes)
    asyncio.run(serve(args.port, FaultUpstream(bodies, args.drip_seconds)))


if __name__ == "__main__":
    main()
