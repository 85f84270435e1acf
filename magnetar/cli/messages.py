"""``magnetar produce`` and ``magnetar consume``: send messages from the command line, a file or
stdin, and receive (and acknowledge) them."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

from magnetar.cli.client import (
    CLIENT_COMMANDS,
    add_options,
    add_property_option,
    format_time,
    int_at_least,
    positive_seconds,
    print_json,
    sync_client,
)
from magnetar.cli.support import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
)

if TYPE_CHECKING:
    from magnetar.aio.message import Message
    from magnetar.aio.message_id import MessageId
    from magnetar.common.errors import MagnetarError

MESSAGE_IDS_LISTED = 1000
"""``produce --json`` lists the ids of the messages among the first this many sent (the first
and last ids are always given)."""


def add_produce_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``produce`` parser."""
    produce = commands.add_parser(
        "produce",
        help=CLIENT_COMMANDS["produce"],
        description="Publish messages: each -m, or each line of FILE, or each line of stdin"
        " (when neither is given, or FILE is '-'). Line endings are removed; empty lines are"
        " sent as empty messages.",
    )
    add_options(produce)
    produce.set_defaults(handler=_produce, parser=produce)
    produce.add_argument("topic")
    source = produce.add_mutually_exclusive_group()
    source.add_argument(
        "-m",
        "--message",
        dest="messages",
        action="append",
        metavar="MSG",
        help="a message (repeatable)",
    )
    source.add_argument("-f", "--file", metavar="FILE", help="one message per line; '-': stdin")
    produce.add_argument("-k", "--key", help="partition key of every message")
    add_property_option(produce, "a property of every message (repeatable)")
    produce.add_argument(
        "-n",
        "--repeat",
        type=int_at_least(1),
        default=1,
        metavar="N",
        help="send each message N times in a row (default 1)",
    )
    produce.add_argument(
        "--deliver-after-ms",
        type=int_at_least(0),
        metavar="MS",
        help="shared and key_shared subscriptions receive the messages no earlier than this"
        " many ms from now (exclusive and failover ones at once)",
    )


def add_consume_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``consume`` parser."""
    consume = commands.add_parser(
        "consume",
        help=CLIENT_COMMANDS["consume"],
        description="Receive messages on a subscription, print each and acknowledge it (or"
        " read them with --reader, no subscription). Exits 4 when --timeout passes before -n"
        " messages arrived.",
    )
    add_options(consume)
    consume.set_defaults(handler=_consume, parser=consume)
    consume.add_argument("topic")
    consume.add_argument("-s", "--subscription", help="subscription name (not with --reader)")
    consume.add_argument(
        "-t",
        "--subscription-type",
        choices=["exclusive", "failover", "shared", "key_shared"],
        default="exclusive",
        help="default exclusive",
    )
    consume.add_argument(
        "-n",
        "--num-messages",
        type=int_at_least(0),
        default=1,
        metavar="NUM",
        help="stop after NUM messages (default 1; 0: until Ctrl-C or --timeout)",
    )
    consume.add_argument(
        "--position",
        choices=["earliest", "latest"],
        default="latest",
        help="where a new subscription or a reader starts (default latest)",
    )
    consume.add_argument(
        "--timeout",
        type=positive_seconds,
        metavar="SECONDS",
        help="stop waiting after this long in all (default: wait for ever)",
    )
    consume.add_argument("--no-ack", action="store_true", help="do not acknowledge")
    consume.add_argument(
        "--reader", action="store_true", help="read from --position without a subscription"
    )


class Progress:
    """A progress line on a terminal's stderr, at most once per ``interval_s``; silent when the
    stream is not a terminal (a pipe, a file, a test)."""

    def __init__(
        self,
        stream: IO[str],
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool | None = None,
    ) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._clock = clock
        self._enabled = stream.isatty() if enabled is None else enabled
        self._started = clock()
        self._next = self._started + interval_s
        self._shown = False

    def due(self) -> bool:
        """Whether a line should be shown now (never when disabled)."""
        return self._enabled and self._clock() >= self._next

    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def show(self, text: str) -> None:
        """Replace the progress line with ``text``."""
        self._next = self._clock() + self._interval_s
        self._stream.write(f"\r{text}\x1b[K")
        self._stream.flush()
        self._shown = True

    def done(self) -> None:
        """End the progress line (so that what follows starts on a line of its own)."""
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = False


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-1]  # noqa: PLW2901 - the line without its ending
            if line.endswith(b"\r"):
                line = line[:-1]  # noqa: PLW2901
        yield line


def _payloads(args: argparse.Namespace) -> Iterator[bytes]:
    if args.messages is not None:
        for text in args.messages:
            yield os.fsencode(text)  # the bytes the user typed, even when not valid UTF-8
        return
    if args.file is None or args.file == "-":
        if sys.stdin.isatty():
            print(
                "magnetar produce: reading messages from stdin, one per line; Ctrl-D ends",
                file=sys.stderr,
            )
        yield from _lines(sys.stdin.buffer)
        return
    try:
        stream = open(args.file, "rb")  # noqa: SIM115 - closed below, also on errors
    except OSError as e:
        from magnetar.common.errors import InvalidArgumentError  # noqa: PLC0415

        raise InvalidArgumentError(f"cannot read {args.file}: {e.strerror}") from None
    with stream:
        yield from _lines(stream)


class _Tally:
    """What the broker answered, kept by send callbacks on the client's thread."""

    def __init__(self) -> None:
        self.confirmed = 0
        self.failed = 0
        self.first_error: MagnetarError | None = None
        self.listed: dict[int, str] = {}
        self.first_index = -1
        self.first_id = ""
        self.last_index = -1
        self.last_id = ""

    def callback(self, index: int) -> Callable[[MagnetarError | None, MessageId | None], None]:
        def done(error: MagnetarError | None, message_id: MessageId | None) -> None:
            if error is not None:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = error
                return
            self.confirmed += 1
            text = str(message_id)
            if index < MESSAGE_IDS_LISTED:
                self.listed[index] = text
            if index > self.last_index:
                self.last_index, self.last_id = index, text
            if self.first_index < 0 or index < self.first_index:
                self.first_index, self.first_id = index, text

        return done


def _produce(args: argparse.Namespace) -> int:
    properties = dict(args.properties)
    tally = _Tally()
    sent = 0
    progress = Progress(sys.stderr)
    interrupted = False
    with sync_client(args) as client:
        producer = client.create_producer(args.topic)
        topic = producer.topic()
        try:
            for payload in _payloads(args):
                for _ in range(args.repeat):
                    producer.send_async(
                        payload,
                        tally.callback(sent),
                        properties=properties or None,
                        partition_key=args.key,
                        deliver_after_ms=args.deliver_after_ms,
                    )
                    sent += 1
                if progress.due():
                    rate = sent / max(progress.elapsed_s(), 1e-9)
                    progress.show(
                        f"magnetar produce: {sent} sent, {tally.confirmed} confirmed,"
                        f" {rate:.0f} msg/s"
                    )
            producer.flush()
        except KeyboardInterrupt:
            interrupted = True
            producer.flush()  # what was handed to the producer still goes out
        finally:
            progress.done()
    listed = [tally.listed[i] for i in sorted(tally.listed)]
    if args.json:
        print_json(
            {
                "topic": topic,
                "published": tally.confirmed,
                "failed": tally.failed,
                "first_message_id": tally.first_id or None,
                "last_message_id": tally.last_id or None,
                "message_ids": listed,
            }
        )
    elif tally.confirmed:
        print(f"published {tally.confirmed} message(s) to {topic}; last message id {tally.last_id}")
    else:
        print(f"published no messages to {topic}")
    if tally.failed:
        error = tally.first_error
        assert error is not None
        print(
            f"magnetar produce: {tally.failed} of {sent} message(s) failed; first error:"
            f" {error.message} ({type(error).__name__})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if interrupted:
        print(f"magnetar produce: interrupted after {sent} message(s)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def format_value(data: bytes) -> tuple[str, str]:
    """``(text, encoding)``: the payload as UTF-8 text, or base64 when it is not UTF-8."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def message_document(message: Message) -> dict[str, Any]:
    """One consumed message as ``consume --json`` prints it."""
    value, encoding = format_value(message.data())
    return {
        "topic": message.topic_name(),
        "offset": message.offset(),
        "message_id": str(message.message_id()),
        "key": message.partition_key(),
        "properties": message.properties(),
        "publish_time_ms": message.publish_timestamp(),
        "event_time_ms": message.event_timestamp(),
        "redelivery_count": message.redelivery_count(),
        "producer_name": message.producer_name(),
        "value": value,
        "encoding": encoding,
    }


def render_message(message: Message) -> str:
    """One consumed message for humans: a header line, then the value (hex when binary)."""
    header = [
        f"offset={message.offset()}",
        f"id={message.message_id()}",
        f"topic={message.topic_name()}",
        f"published={format_time(message.publish_timestamp())}",
    ]
    key = message.partition_key()
    if key is not None:
        header.append(f"key={key!r}")
    properties = message.properties()
    if properties:
        header.append(f"properties={json.dumps(properties, sort_keys=True)}")
    if message.redelivery_count():
        header.append(f"redeliveries={message.redelivery_count()}")
    data = message.data()
    try:
        value = data.decode("utf-8")
    except UnicodeDecodeError:
        value = f"<{len(data)} bytes, not UTF-8> {data.hex()}"
    return "----- " + " ".join(header) + "\n" + value


def _consume(args: argparse.Namespace) -> int:
    from magnetar.common.errors import ReceiveTimeoutError  # noqa: PLC0415

    parser: argparse.ArgumentParser = args.parser
    if args.reader and args.subscription:
        parser.error("--reader reads without a subscription; leave out -s/--subscription")
    if not args.reader and not args.subscription:
        parser.error("give a subscription with -s/--subscription (or read with --reader)")
    wanted = args.num_messages
    received = 0
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    topic = args.topic
    with sync_client(args) as client:
        # prefetch no more than asked for, so a shared subscription's other consumers get the rest
        queue = min(wanted, 1000) if wanted else 1000
        source: Any = None
        # Ctrl-C ends the command the same way wherever it lands, even while it subscribes
        try:
            if args.reader:
                source = client.create_reader(args.topic, args.position, receiver_queue_size=queue)
                receive = source.read_next
            else:
                source = client.subscribe(
                    args.topic,
                    args.subscription,
                    args.subscription_type,
                    initial_position=args.position,
                    receiver_queue_size=queue,
                )
                receive = source.receive
            topic = source.topic()
            while wanted == 0 or received < wanted:
                timeout_ms: int | None = None
                if deadline is not None:
                    timeout_ms = max(0, int((deadline - time.monotonic()) * 1000))
                try:
                    message = receive(timeout_ms)
                except ReceiveTimeoutError:
                    break
                if args.json:
                    print(json.dumps(message_document(message)), flush=True)
                else:
                    print(render_message(message), flush=True)
                received += 1
                if not args.reader and not args.no_ack:
                    source.acknowledge(message)
        except KeyboardInterrupt:
            if wanted:
                print(
                    f"magnetar consume: interrupted after {received} of {wanted} message(s)",
                    file=sys.stderr,
                )
                return EXIT_INTERRUPTED
        finally:
            if source is not None:
                source.close()  # flushes the acknowledgements
    print(f"magnetar consume: received {received} message(s) from {topic}", file=sys.stderr)
    if wanted and received < wanted:
        print(
            f"magnetar consume: timed out after {args.timeout:g} s with {received} of {wanted}"
            " message(s)",
            file=sys.stderr,
        )
        return EXIT_TIMEOUT
    return EXIT_OK
