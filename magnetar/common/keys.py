"""The key hash that key_shared subscriptions route on, shared by producers and brokers.

A producer sends, with each batch, the hash of every message's key (one value when they are all
the same, none when no message has a key); the broker routes on those hashes without opening the
batch. The hash is stable across processes, runs and languages: CRC-32 of the key's UTF-8 bytes,
put through MurmurHash3's 32-bit finalizer so that keys that differ in one character spread over
the whole range. A message without a key hashes as the empty key (as in Pulsar: keyless messages
of a key_shared subscription all go to one consumer, in order).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

__all__ = ["KEYLESS_HASH", "batch_key_hashes", "expand_key_hashes", "key_hash"]


def _fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def key_hash(key: str | bytes | None) -> int:
    """The 32-bit routing hash of a message key (``None``: the empty key)."""
    if key is None:
        return KEYLESS_HASH
    data = key.encode() if isinstance(key, str) else key
    return _fmix32(zlib.crc32(data))


KEYLESS_HASH = _fmix32(zlib.crc32(b""))


def batch_key_hashes(keys: Sequence[str | None]) -> list[int]:
    """What a batch carries: ``[]`` when no message has a key, one hash when every message has
    the same key, else one per message."""
    if all(k is None for k in keys):
        return []
    first = keys[0]
    if all(k == first for k in keys):
        return [key_hash(first)]
    return [key_hash(k) for k in keys]


def expand_key_hashes(hashes: Sequence[int], num_messages: int) -> Sequence[int]:
    """Per-message hashes of a batch from what it carries (see :func:`batch_key_hashes`)."""
    if len(hashes) == num_messages:
        return hashes
    if not hashes:
        return [KEYLESS_HASH] * num_messages
    if len(hashes) == 1:
        return [hashes[0]] * num_messages
    raise ValueError(f"a batch of {num_messages} messages carries {len(hashes)} key hashes")
