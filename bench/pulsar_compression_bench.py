"""What opening a Pulsar producer's compressed batch on SEND costs the broker, per batch.

Run from the repository root (needs the ``pulsar-compression`` extra, cramjam)::

    .venv/bin/python bench/pulsar_compression_bench.py            # about 10 seconds
    .venv/bin/python bench/pulsar_compression_bench.py --rounds 3 # quicker

One batch of 1,000 messages of 100 B (JSON-like text, partly repetitive, as events are), each
with a key, compressed as Pulsar's C++ client does it. For each codec it times, in one process
with no I/O, the best of ``--rounds`` rounds of ``--batches`` batches:

- ``decode``: :func:`broker.pulsar.compression.decompress` alone;
- ``send check``: :func:`broker.pulsar.entries.incoming_batch`, all a SEND costs in the entry
  code (decoding, splitting the batch into its 1,000 messages, their key hashes); for NONE it is
  the cost without any decompression, the baseline.

It prints a table (microseconds per batch, CPU time of this thread); nothing is written.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cramjam  # noqa: E402 - after the path is set

from broker.pulsar.codec import Payload, encode_batch, encode_metadata_and_payload  # noqa: E402
from broker.pulsar.compression import decompress  # noqa: E402
from broker.pulsar.entries import incoming_batch  # noqa: E402
from broker.service.validation import BatchLimits  # noqa: E402
from proto.pulsar import PulsarApi_pb2 as api  # noqa: E402

LIMITS = BatchLimits(max_message_bytes=5 * 1024 * 1024, max_messages=10_000)

PACKERS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "NONE": (api.NONE, bytes),
    "ZLIB": (api.ZLIB, zlib.compress),
    "LZ4": (api.LZ4, lambda raw: bytes(cramjam.lz4.compress_block(raw, store_size=False))),
    "ZSTD": (api.ZSTD, lambda raw: bytes(cramjam.zstd.compress(raw, level=3))),
    "SNAPPY": (api.SNAPPY, lambda raw: bytes(cramjam.snappy.compress_raw(raw))),
}


def batch_of_messages(count: int) -> bytes:
    rng = random.Random(1)
    messages = []
    for i in range(count):
        text = f'{{"id":{i},"user":"u{rng.randrange(10_000):05d}","v":{rng.random():.6f},"k":"'
        value = (text + "x" * 100)[:99].encode() + b"}"
        metadata = api.SingleMessageMetadata(partition_key=f"user-{i % 50}")
        messages.append((metadata, value))
    return encode_batch(messages)


def cpu_us_per_batch(step: Callable[[], object], batches: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(batches):
            step()
        best = min(best, time.thread_time() - start)
    return best / batches * 1e6


def opener(compression: int, packed: bytes, size: int) -> Callable[[], object]:
    view = memoryview(packed)
    return lambda: decompress(compression, view, size, LIMITS.max_message_bytes)


def sender(payload: Payload) -> Callable[[], object]:
    return lambda: incoming_batch(payload, sequence_id=1, highest_sequence_id=0, limits=LIMITS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--messages", type=int, default=1000)
    args = parser.parse_args()
    raw = batch_of_messages(args.messages)
    batches, rounds = args.batches, args.rounds
    print(f"one batch: {args.messages:,} messages of 100 B, {len(raw):,} B uncompressed")
    print("| codec | compressed | decode µs/batch | send check µs/batch |")
    print("|---|---:|---:|---:|")
    for name, (compression, pack) in PACKERS.items():
        packed = pack(raw)
        metadata = api.MessageMetadata(
            producer_name="bench",
            sequence_id=1,
            publish_time=1,
            compression=compression,  # type: ignore[arg-type]
            uncompressed_size=len(raw),
            num_messages_in_batch=args.messages,
        )
        body = encode_metadata_and_payload(metadata, packed)
        payload = Payload(metadata, body, memoryview(body)[len(body) - len(packed) :], 0)
        decode = "—"
        if compression != api.NONE:
            decode = (
                f"{cpu_us_per_batch(opener(compression, packed, len(raw)), batches, rounds):,.0f}"
            )
        check = cpu_us_per_batch(sender(payload), batches, rounds)
        print(f"| {name} | {len(packed):,} B | {decode} | {check:,.0f} |")


if __name__ == "__main__":
    main()
