"""Pulsar codec benchmark: frames per second through the framing layer and the Pulsar codec, in
one process with no I/O, as a connection would run them.

Run from the repository root::

    .venv/bin/python bench/pulsar_codec_bench.py            # about 30 seconds
    .venv/bin/python bench/pulsar_codec_bench.py --quick    # smoke test, a few seconds

It writes ``bench/results/pulsar-codec-<date>.json`` (every figure) and ``.md`` (the table);
``--quick`` writes ``pulsar-codec-<date>-quick.*``. Each case runs ``--rounds`` times and keeps
the best round, as the machine is shared and noisy: compare figures within one run only.

Cases (all over the same bytes a client sends; ``read`` is the size of the chunks the stream
hands over, so frames are split across chunks at arbitrary points):

- ``cut``: the framing layer alone, cutting SEND frames of a 100 B message out of the chunks;
- ``decode-send-100B``: cut and :func:`~broker.pulsar.codec.decode_frame` (command, checksum,
  metadata) of SEND frames of one 100 B message each;
- ``decode-send-batch``: the same for SEND frames of a batch of 100 messages of 100 B, then
  :func:`~broker.pulsar.codec.decode_batch` of each (messages/s counts the batched messages);
- ``encode-message-100B``: :func:`~broker.pulsar.codec.encode_payload_command` of MESSAGE frames
  around a stored ``metadata_and_payload``, with broker entry metadata, as a dispatch would.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from broker.pulsar import codec  # noqa: E402 - after the path is set
from proto.pulsar import PulsarApi_pb2 as api  # noqa: E402

Base = api.BaseCommand


def send_frames(count: int, batch: int) -> bytes:
    frames = []
    for sequence_id in range(count):
        send = Base(
            type=Base.SEND,
            send=api.CommandSend(producer_id=1, sequence_id=sequence_id, num_messages=batch),
        )
        metadata = api.MessageMetadata(
            producer_name="bench-producer", sequence_id=sequence_id, publish_time=1_700_000_000_000
        )
        if batch > 1:
            metadata.num_messages_in_batch = batch
            payload = codec.encode_batch(
                [(api.SingleMessageMetadata(payload_size=0), b"x" * 100)] * batch
            )
        else:
            payload = b"x" * 100
        frames.append(codec.encode_message(send, metadata, payload))
    return b"".join(frames)


def chunks(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def run_cut(parts: list[bytes]) -> int:
    decoder = codec.frame_decoder()
    return sum(len(decoder.feed(part)) for part in parts)


def run_decode(parts: list[bytes]) -> int:
    decoder = codec.frame_decoder()
    count = 0
    for part in parts:
        for body in decoder.feed(part):
            codec.decode_frame(body)
            count += 1
    return count


def run_decode_batches(parts: list[bytes]) -> int:
    decoder = codec.frame_decoder()
    messages = 0
    for part in parts:
        for body in decoder.feed(part):
            payload = codec.decode_frame(body).payload
            assert payload is not None
            messages += len(
                codec.decode_batch(payload.payload, payload.metadata.num_messages_in_batch)
            )
    return messages


def run_encode(count: int) -> Callable[[], int]:
    metadata = api.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1)
    stored = codec.encode_metadata_and_payload(metadata, b"x" * 100)
    entry = api.BrokerEntryMetadata(broker_timestamp=1_700_000_000_000, index=0)

    def encode() -> int:
        for i in range(count):
            message = Base(
                type=Base.MESSAGE,
                message=api.CommandMessage(
                    consumer_id=1, message_id=api.MessageIdData(ledgerId=7, entryId=i)
                ),
            )
            entry.index = i
            codec.encode_payload_command(message, stored, broker_entry_metadata=entry)
        return count

    return encode


def best_rate(run: Callable[[], int], rounds: int) -> tuple[float, int]:
    best = 0.0
    done = 0
    for _ in range(rounds):
        start = time.perf_counter()
        done = run()
        best = max(best, done / (time.perf_counter() - start))
    return best, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--read", type=int, default=64 * 1024, help="chunk size in bytes")
    args = parser.parse_args()
    singles = 2_000 if args.quick else 50_000
    batches = 200 if args.quick else 2_000
    rounds = 1 if args.quick else args.rounds

    single_stream = send_frames(singles, 1)
    batch_stream = send_frames(batches, 100)
    single_parts = chunks(single_stream, args.read)
    batch_parts = chunks(batch_stream, args.read)
    cases = {
        "cut": (lambda: run_cut(single_parts), len(single_stream), "frames"),
        "decode-send-100B": (lambda: run_decode(single_parts), len(single_stream), "frames"),
        "decode-send-batch": (
            lambda: run_decode_batches(batch_parts),
            len(batch_stream),
            "batched messages (100 a frame)",
        ),
        "encode-message-100B": (run_encode(singles), None, "frames"),
    }
    results = {}
    for name, (run, stream_bytes, unit) in cases.items():
        rate, done = best_rate(run, rounds)
        row: dict[str, object] = {"per_second": round(rate), "unit": unit, "count": done}
        if stream_bytes is not None:
            row["mb_per_second"] = round(rate * stream_bytes / done / 1e6, 1)
        results[name] = row
        print(f"{name:22} {rate:12,.0f} {unit}/s  {row.get('mb_per_second', '-')} MB/s")

    date = dt.date.today().isoformat()
    stem = f"pulsar-codec-{date}" + ("-quick" if args.quick else "")
    out = ROOT / "bench" / "results"
    report = {
        "command": " ".join(["bench/pulsar_codec_bench.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "read_size": args.read,
        "rounds": rounds,
        "load_average_1m": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
        "results": results,
    }
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"# Pulsar codec, {date}",
        "",
        (
            f"`{report['command']}`: Python {report['python']}, chunks of {args.read} bytes,"
            f" best of {rounds} rounds, load average {report['load_average_1m']} on"
            f" {report['cpus']} CPUs. A shared, noisy machine: compare within this run only."
        ),
        "",
        "| case | per second | of | MB/s of frames |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| `{name}` | {row['per_second']:,} | {row['unit']} | {row.get('mb_per_second', '-')} |"
        for name, row in results.items()
    ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
