"""What a user does right after ``pip install magnetar``, run by tests/install in a virtualenv
that holds nothing but Magnetar and its runtime dependencies (and not the checkout).

Imports Magnetar, its client libraries, every generated protocol module and the etcd metadata
backend with warnings as errors; starts ``magnetar standalone`` (the virtualenv's command) on free
ports; produces a few messages with keys and properties with the sync client, receives them and
acknowledges them; a new consumer of the subscription then gets nothing, and the admin client's
topic stats show it. Prints one JSON line: the versions it ran with and where magnetar was
imported from.

    python roundtrip.py DATA_DIR
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import pkgutil
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

READY = re.compile(r"^magnetar standalone ready in [0-9.]+ s: service URL (?P<url>magnetar://\S+)")
VERSIONS_OF = (
    "grpcio",
    "grpcio-health-checking",
    "grpcio-reflection",
    "protobuf",
    "structlog",
    "cryptography",
)


def import_everything() -> None:
    import magnetar  # noqa: PLC0415 - importing is what is being tested
    import magnetar.aio  # noqa: PLC0415
    import metadata.etcd  # noqa: F401, PLC0415 - brokers and bookies against etcd (aetcd)
    import proto  # noqa: PLC0415

    for module in pkgutil.walk_packages(proto.__path__, "proto."):
        if module.name.endswith(("_pb2", "_pb2_grpc")):
            importlib.import_module(module.name)
    magnetar.Client  # noqa: B018 - the lazily imported client API resolves


def round_trip(url: str) -> None:
    import magnetar  # noqa: PLC0415

    sent = [(f"message {i}".encode(), f"key-{i % 2}", {"i": str(i)}) for i in range(5)]
    with magnetar.Client(url) as client:
        producer = client.create_producer("install-check")
        for data, key, properties in sent:
            producer.send(data, partition_key=key, properties=properties)
        consumer = client.subscribe(
            "install-check", "check", initial_position="earliest", ack_receipts=True
        )
        for data, key, properties in sent:
            message = consumer.receive(timeout_millis=20_000)
            got = (message.data(), message.partition_key(), message.properties())
            assert got == (data, key, properties), f"sent {(data, key, properties)}, got {got}"
            consumer.acknowledge(message)
        consumer.close()
        again = client.subscribe("install-check", "check")
        try:
            extra = again.receive(timeout_millis=500)
        except magnetar.ReceiveTimeoutError:
            pass
        else:
            raise AssertionError(f"an acknowledged message came again: {extra.data()!r}")
        # the admin client reads its answers through protobuf's descriptors
        stats = client.admin().topic_stats("install-check")
        assert "check" in str(stats), stats


def main() -> int:
    warnings.simplefilter("error")
    data_dir = Path(sys.argv[1])
    import_everything()
    command = Path(sys.executable).parent / "magnetar"
    server = subprocess.Popen(
        [
            command,
            "standalone",
            "--data-dir",
            data_dir,
            "--port",
            "0",
            "--http-port",
            "0",
            "--pulsar-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=(data_dir.parent / "standalone.log").open("wb"),
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        ready = READY.match(line)
        assert ready, f"magnetar standalone printed no ready line; got {line!r}"
        round_trip(ready["url"])
    finally:
        server.send_signal(signal.SIGINT)
        code = server.wait(60)
    assert code == 0, f"magnetar standalone stopped with exit code {code} after Ctrl-C"
    import magnetar  # noqa: PLC0415

    versions = {name: importlib.metadata.version(name) for name in VERSIONS_OF}
    print(json.dumps({"magnetar": str(Path(magnetar.__file__).parent), "versions": versions}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
