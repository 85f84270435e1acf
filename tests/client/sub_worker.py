"""A consumer in its own process, for tests that kill it with SIGKILL while it holds messages.

``python sub_worker.py SERVICE_URL TOPIC SUBSCRIPTION TYPE NAME COUNT`` subscribes, receives
COUNT messages without acknowledging them, prints each as a JSON line ``{"value": ...,
"key": ..., "redelivery_count": ...}``, then prints ``HOLDING`` and waits to be killed.

An optional seventh argument ACK: acknowledge the first ACK messages with ack receipts (one by
one on shared and key_shared, cumulatively on exclusive and failover) before ``HOLDING``.
"""

from __future__ import annotations

import json
import sys
import time

import magnetar


def main() -> None:
    service_url, topic, subscription, sub_type, name, count = sys.argv[1:7]
    ack_first = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    client = magnetar.Client(service_url, operation_timeout_s=30)
    consumer = client.subscribe(
        topic,
        subscription,
        subscription_type=sub_type,  # type: ignore[arg-type]
        consumer_name=name,
        receiver_queue_size=int(count),
        initial_position="earliest",
        ack_receipts=ack_first > 0,
    )
    print("SUBSCRIBED", flush=True)
    received = []
    for _ in range(int(count)):
        message = consumer.receive(timeout_millis=60_000)
        received.append(message)
        line = {
            "value": message.data().decode(),
            "key": message.partition_key(),
            "redelivery_count": message.redelivery_count(),
        }
        print(json.dumps(line), flush=True)
    if ack_first and sub_type in ("shared", "key_shared"):
        for message in received[:ack_first]:
            consumer.acknowledge(message)  # returns once the broker persisted it
    elif ack_first:
        consumer.acknowledge_cumulative(received[ack_first - 1])
    print("HOLDING", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
