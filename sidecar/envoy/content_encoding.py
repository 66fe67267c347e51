"""Reading compressed response bodies: gzip, deflate, br and zstd.

The gate asks the upstream for uncompressed bodies (it removes the client's
``accept-encoding``), but an upstream may compress regardless. Such a body is
decoded, filtered and sent on uncompressed; a body that cannot be decoded (an
unknown coding, corrupt data, or more than the size limit once decoded) is an
error, never passed unread.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import brotli
import zstandard


class UndecodableBody(Exception):
    """The body's content coding is unknown or its data does not decode within the limit."""


# No server compresses more than twice; more is an attack on decoding time.
MAX_CODINGS = 3
# Concatenated gzip members or zstd frames in one body: legitimate bodies
# have one; each costs a decoder setup, so a flood of empty ones is refused.
MAX_MEMBERS = 16
# RFC 9659: HTTP zstd decoders need not accept windows over 8 MiB.
_ZSTD_MAX_WINDOW = 8 * 1024 * 1024

# Content-coding names (RFC 9110 section 8.4.1, and the IANA registry).
_GZIP = frozenset({"gzip", "x-gzip"})
_KNOWN = _GZIP | {"deflate", "br", "zstd", "identity"}


def parse_content_encoding(header: str) -> tuple[str, ...]:
    """The codings named by a ``content-encoding`` value, in the order they were applied.

    ``identity`` is dropped. Raises UndecodableBody for a coding this module cannot undo.
    """
    codings = tuple(c.strip().lower() for c in header.split(",") if c.strip())
    for coding in codings:
        if coding not in _KNOWN:
            raise UndecodableBody(f"unsupported content-encoding {coding!r}")
    applied = tuple(c for c in codings if c != "identity")
    if len(applied) > MAX_CODINGS:
        raise UndecodableBody(f"more than {MAX_CODINGS} content codings")
    return applied


def decode(body: bytes, codings: Sequence[str], limit: int) -> bytes:
    """Undo ``codings`` (as applied, first to last); at most ``limit`` bytes at every step.

    Raises UndecodableBody for corrupt or truncated data or a body over the limit.
    """
    for coding in reversed(codings):
        try:
            body = _decode_one(body, coding, limit)
        except UndecodableBody:
            raise
        except Exception:
            # zlib.error, brotli.error, zstandard.ZstdError: the data is corrupt.
            raise UndecodableBody(f"corrupt {coding} data") from None
    return body


def _decode_one(body: bytes, coding: str, limit: int) -> bytes:
    if coding in _GZIP:
        return _zlib(body, zlib.MAX_WBITS | 16, limit, coding, members=True)
    if coding == "deflate":
        # "deflate" means the zlib format (RFC 9110), but some servers send raw deflate.
        wbits = zlib.MAX_WBITS if body[:1] and (body[0] & 0x0F) == 8 else -zlib.MAX_WBITS
        return _zlib(body, wbits, limit, coding, members=False)
    if coding == "br":
        return _brotli(body, limit)
    if coding == "zstd":
        return _zstd(body, limit)
    raise UndecodableBody(f"unsupported content-encoding {coding!r}")


def _too_large(coding: str, limit: int) -> UndecodableBody:
    return UndecodableBody(f"{coding} body is larger than {limit} bytes once decoded")


def _zlib(body: bytes, wbits: int, limit: int, coding: str, *, members: bool) -> bytes:
    out = bytearray()
    data = body
    for _ in range(MAX_MEMBERS):
        decoder = zlib.decompressobj(wbits)
        out += decoder.decompress(data, limit + 1 - len(out))
        if len(out) > limit or decoder.unconsumed_tail:
            raise _too_large(coding, limit)
        if not decoder.eof:
            raise UndecodableBody(f"truncated {coding} data")
        data = decoder.unused_data
        # gzip allows several members back to back; anything else after the end is corrupt.
        if not data:
            return bytes(out)
        if not members:
            raise UndecodableBody(f"trailing bytes after {coding} data")
    raise UndecodableBody(f"more than {MAX_MEMBERS} {coding} members")


def _brotli(body: bytes, limit: int) -> bytes:
    decoder = brotli.Decompressor()
    out = bytearray(decoder.process(body, output_buffer_limit=limit + 1))
    while len(out) <= limit and not decoder.is_finished() and not decoder.can_accept_more_data():
        out += decoder.process(b"", output_buffer_limit=limit + 1 - len(out))
    if len(out) > limit:
        raise _too_large("br", limit)
    if not decoder.is_finished():
        raise UndecodableBody("truncated br data")
    return bytes(out)


def _zstd(body: bytes, limit: int) -> bytes:
    # zstandard's decoder object has no output cap, so it is fed small slices:
    # one slice can expand to a few MB at most (RLE blocks), not without bound.
    out = bytearray()
    data = body
    context = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    for _ in range(MAX_MEMBERS):
        if not data:
            return bytes(out)
        decoder = context.decompressobj()
        offset = 0
        while not decoder.eof:
            if offset >= len(data):
                raise UndecodableBody("truncated zstd data")
            out += decoder.decompress(data[offset : offset + _ZSTD_SLICE])
            offset += _ZSTD_SLICE
            if len(out) > limit:
                raise _too_large("zstd", limit)
        # Frames may follow each other; what the last slice held past this one is next.
        data = decoder.unused_data + data[offset:]
    if data:
        raise UndecodableBody(f"more than {MAX_MEMBERS} zstd frames")
    return bytes(out)


_ZSTD_SLICE = 128
