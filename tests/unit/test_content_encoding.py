"""Decoding compressed upstream bodies: every supported coding, stacked codings,
corrupt and truncated data, and decompression bombs."""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.envoy.content_encoding import UndecodableBody, decode, parse_content_encoding

BODY = b'{"result":[{"id":1,"payload":{"text":"hello"}}],"status":"ok"}' * 50

ENCODERS = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_each_coding_round_trips(coding: str) -> None:
    assert decode(ENCODERS[coding](BODY), (coding,), limit=len(BODY)) == BODY


def test_raw_deflate_is_accepted() -> None:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = compressor.compress(BODY) + compressor.flush()
    assert decode(raw, ("deflate",), limit=len(BODY)) == BODY


def test_stacked_codings_are_undone_last_first() -> None:
    body = brotli.compress(gzip.compress(BODY))
    codings = parse_content_encoding("gzip, br")
    assert codings == ("gzip", "br")
    assert decode(body, codings, limit=len(BODY) * 2) == BODY


def test_concatenated_gzip_members() -> None:
    half = len(BODY) // 2
    body = gzip.compress(BODY[:half]) + gzip.compress(BODY[half:])
    assert decode(body, ("gzip",), limit=len(BODY)) == BODY


def test_identity_and_case() -> None:
    assert parse_content_encoding("identity") == ()
    assert parse_content_encoding(" GZIP ") == ("gzip",)
    assert parse_content_encoding("") == ()


@pytest.mark.parametrize("header", ["compress", "gzip, snappy", "lz4", "aes128gcm"])
def test_unknown_codings_are_refused(header: str) -> None:
    with pytest.raises(UndecodableBody, match="unsupported"):
        parse_content_encoding(header)


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_a_body_over_the_limit_once_decoded_is_refused(coding: str) -> None:
    bomb = b"\0" * 1_000_000
    with pytest.raises(UndecodableBody, match="larger than"):
        decode(ENCODERS[coding](bomb), (coding,), limit=100_000)


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_exactly_at_the_limit_is_fine(coding: str) -> None:
    assert decode(ENCODERS[coding](BODY), (coding,), limit=len(BODY)) == BODY


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_truncated_data_is_refused(coding: str) -> None:
    encoded = ENCODERS[coding](BODY)
    with pytest.raises(UndecodableBody):
        decode(encoded[: len(encoded) // 2], (coding,), limit=len(BODY))


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_plain_json_labelled_compressed_is_refused(coding: str) -> None:
    with pytest.raises(UndecodableBody):
        decode(BODY, (coding,), limit=len(BODY))


def test_trailing_garbage_after_deflate_is_refused() -> None:
    with pytest.raises(UndecodableBody):
        decode(zlib.compress(BODY) + b"junk", ("deflate",), limit=len(BODY))


@settings(max_examples=200)
@given(st.binary(max_size=300), st.sampled_from(sorted(ENCODERS)))
def test_arbitrary_bytes_decode_or_raise_the_typed_error(data: bytes, coding: str) -> None:
    try:
        out = decode(data, (coding,), limit=10_000)
    except UndecodableBody:
        return
    assert len(out) <= 10_000


def test_concatenated_zstd_frames() -> None:
    half = len(BODY) // 2
    compress = zstandard.ZstdCompressor().compress
    body = compress(BODY[:half]) + compress(BODY[half:])
    assert decode(body, ("zstd",), limit=len(BODY)) == BODY


def test_a_flood_of_gzip_members_is_refused() -> None:
    empty = gzip.compress(b"")
    with pytest.raises(UndecodableBody, match="members"):
        decode(empty * 50_000, ("gzip",), limit=len(BODY))


def test_a_flood_of_zstd_frames_is_refused() -> None:
    empty = zstandard.ZstdCompressor().compress(b"")
    with pytest.raises(UndecodableBody, match="frames"):
        decode(empty * 50_000, ("zstd",), limit=len(BODY))


def test_too_many_codings_are_refused() -> None:
    with pytest.raises(UndecodableBody, match="content codings"):
        parse_content_encoding("gzip, gzip, gzip, gzip")


def test_a_zstd_window_over_8_mib_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters(window_log=27)
    # Streamed, so the size is unknown and the encoder keeps the large window.
    encoder = zstandard.ZstdCompressor(compression_params=params).compressobj()
    big_window = encoder.compress(BODY) + encoder.flush()
    with pytest.raises(UndecodableBody):
        decode(big_window, ("zstd",), limit=len(BODY))
