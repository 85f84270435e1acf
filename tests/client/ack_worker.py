"""A consumer in its own process that acknowledges messages and is then killed (SIGKILL).

``python ack_worker.py SERVICE_URL TOPIC SUBSCRIPTION COUNT MODE`` receives COUNT messages with
the sync client, acknowledges each as it comes (``MODE`` ``grouped``: acks are grouped and never
flushed before the kill, the group time and size being huge; ``receipts``: each acknowledgement
waits for the broker, ``ack_receipts=True``), prints ``ACKED <value>`` after each
acknowledgement returned, then ``HOLDING``, and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import magnetar


def main() -> None:
    service_url, topic, subscription, count, mode = sys.argv[1:6]
    client = magnetar.Client(service_url, operation_timeout_s=30)
    grouped = mode == "grouped"
    consumer = client.subscribe(
        topic,
        subscription,
        initial_position="earliest",
        ack_receipts=not grouped,
        ack_group_time_ms=600_000 if grouped else 10,
        ack_group_max_ids=1_000_000 if grouped else 100,
    )
    for _ in range(int(count)):
        message = consumer.receive(timeout_millis=60_000)
        consumer.acknowledge(message)
        print(f"ACKED {message.data().decode()}", flush=True)
    print("HOLDING", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
