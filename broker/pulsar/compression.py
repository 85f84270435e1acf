"""Opening a Pulsar producer's compressed payload, bounded by the broker's message size limit.

A Pulsar producer compresses a message's payload, or a whole batch, with the codec its
``MessageMetadata.compression`` names, and gives the size before compression in
``uncompressed_size``. The formats are those of Pulsar's own clients:

- ``ZLIB``: a zlib stream (RFC 1950);
- ``LZ4``: one LZ4 *block* (not the LZ4 frame format), with no size prefix: its size is
  ``uncompressed_size``;
- ``ZSTD``: a zstd frame (the C++ and Java clients write one frame, at level 3, with its
  content size);
- ``SNAPPY``: raw snappy (not the framed format), which opens with its own uncompressed length.

ZLIB is decoded with the standard library. LZ4, ZSTD and SNAPPY need ``cramjam`` (one wheel of
Rust and C codecs), which Magnetar's optional extra ``pulsar-compression`` installs
(``pip install 'magnetar[pulsar-compression]'``). Without it such payloads cannot be opened:
:func:`decompress` answers None, and the broker logs once per codec which extra is missing.

Decoding never trusts the producer. The declared size must be within the broker's limit before
anything is allocated, and each decoder writes into a buffer of at most the declared size plus
one byte, so a payload that claims a small size and inflates far (a bomb) stops at that buffer
and is refused; so is one that decodes to fewer bytes than declared, is truncated, or is
followed by other bytes. Every refusal is a :class:`ProtocolError` (or a
:class:`MessageTooLargeError` for a declared size over the limit) naming the codec and what was
wrong. Pure functions over bytes, no I/O but that one warning.
"""

from __future__ import annotations

import importlib
import zlib
from types import ModuleType

from magnetar.common.errors import MessageTooLargeError, ProtocolError
from magnetar.common.log import get_logger
from proto.pulsar import PulsarApi_pb2 as api

log = get_logger("magnetar.broker.pulsar")

EXTRA = "pulsar-compression"
"""Magnetar's optional extra that brings the LZ4, ZSTD and SNAPPY decoders."""

CODEC_NAMES: dict[int, str] = {
    api.NONE: "NONE",
    api.LZ4: "LZ4",
    api.ZLIB: "ZLIB",
    api.ZSTD: "ZSTD",
    api.SNAPPY: "SNAPPY",
}


def _load_cramjam() -> ModuleType | None:
    try:
        return importlib.import_module("cramjam")
    except ImportError:
        return None


_cramjam = _load_cramjam()
"""cramjam, or None when the optional extra is not installed."""

_warned: set[int] = set()

Decoded = bytes | bytearray


def codec_name(compression: int) -> str:
    """The name of a ``CompressionType`` value, as Pulsar's proto spells it."""
    return CODEC_NAMES.get(compression, f"unknown compression {compression}")


def decompress(compression: int, payload: memoryview, declared: int, limit: int) -> Decoded | None:
    """The ``declared`` bytes a payload compressed with ``compression`` decodes to, or None when
    this broker has no decoder for it (LZ4, ZSTD, SNAPPY without ``cramjam``).

    ``declared`` is the metadata's ``uncompressed_size``; ``limit`` the broker's
    ``max_message_bytes``. Raises :class:`MessageTooLargeError` when ``declared`` is over
    ``limit`` and :class:`ProtocolError` when the payload is not what its metadata says.
    """
    if compression == api.NONE:
        return bytes(payload)
    name = codec_name(compression)
    if compression not in CODEC_NAMES:
        raise ProtocolError(f"the payload's compression is {name}", context={"compression": name})
    if declared > limit:
        raise MessageTooLargeError(
            f"a {name} payload declares uncompressed_size={declared:,}, over the broker's limit"
            f" of {limit:,} bytes",
            context={"compression": name, "uncompressed_size": declared, "limit": limit},
        )
    if compression == api.ZLIB:
        return _inflate(payload, declared)
    cramjam = _cramjam
    if cramjam is None:
        if compression not in _warned:
            _warned.add(compression)
            log.warning(
                "pulsar_compression_unavailable",
                compression=name,
                install=f"magnetar[{EXTRA}]",
                effect="stored and sent to Pulsar consumers unopened; Magnetar consumers cannot"
                " read them",
            )
        return None
    try:
        if compression == api.SNAPPY:
            return _snappy(cramjam, payload, declared)
        # one byte more than declared: a payload that fills it decodes to more than it
        # declared, and the decoder stops there (it never writes past the buffer)
        out = bytearray(declared + 1)
        if compression == api.LZ4:
            # LZ4_decompress_safe into ``out``; fails on a malformed or truncated block
            decoded = int(cramjam.lz4.decompress_block_into(payload, out))
        else:
            # a streaming zstd decoder: fails past ``out``'s end, on a truncated frame, and on
            # bytes after the last frame
            decoded = int(cramjam.zstd.decompress_into(payload, out))
    except cramjam.DecompressionError as e:
        raise ProtocolError(
            f"a payload marked {name} does not decode to its declared uncompressed_size of"
            f" {declared:,} bytes: {e}",
            context={"compression": name, "uncompressed_size": declared},
        ) from None
    _exactly(name, decoded, declared)
    del out[declared:]
    return out


def _snappy(cramjam: ModuleType, payload: memoryview, declared: int) -> Decoded:
    # raw snappy opens with its uncompressed length: compare it before allocating anything
    length = int(cramjam.snappy.decompress_raw_len(payload))
    if length != declared:
        raise ProtocolError(
            f"a payload marked SNAPPY says it holds {length:,} bytes, not its declared"
            f" uncompressed_size of {declared:,}",
            context={"compression": "SNAPPY", "uncompressed_size": declared, "snappy": length},
        )
    out = bytearray(declared)
    _exactly("SNAPPY", int(cramjam.snappy.decompress_raw_into(payload, out)), declared)
    return out


def _exactly(name: str, decoded: int, declared: int) -> None:
    if decoded != declared:
        more = "more than" if decoded > declared else f"{decoded:,} bytes, not"
        raise ProtocolError(
            f"a payload marked {name} decodes to {more} its declared uncompressed_size of"
            f" {declared:,} bytes",
            context={"compression": name, "uncompressed_size": declared},
        )


def _inflate(payload: memoryview, declared: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        # one byte more than declared tells a stream that inflates further from one that fits
        raw = inflater.decompress(payload, declared + 1)
    except zlib.error as e:
        raise ProtocolError(f"a payload marked ZLIB is not a zlib stream: {e}") from None
    if len(raw) > declared:
        _exactly("ZLIB", len(raw), declared)
    if not inflater.eof or inflater.unused_data:
        raise ProtocolError(
            "a payload marked ZLIB has a zlib stream that is "
            + ("truncated" if not inflater.eof else "followed by other bytes")
        )
    _exactly("ZLIB", len(raw), declared)
    return raw
