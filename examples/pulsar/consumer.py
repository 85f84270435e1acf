"""A plain Apache Pulsar consumer, as Pulsar's documentation shows it: it reads what
``producer.py`` sent (from the earliest message, so it may start after the producer) and stops
after ten messages."""

import pulsar

client = pulsar.Client("pulsar://localhost:6650")

consumer = client.subscribe(
    "my-topic", "my-subscription", initial_position=pulsar.InitialPosition.Earliest
)

for _ in range(10):
    msg = consumer.receive(timeout_millis=30000)
    try:
        print("Received message '{}' id='{}'".format(msg.data().decode("utf-8"), msg.message_id()))
        # Acknowledge successful processing of the message
        consumer.acknowledge(msg)
    except Exception:  # noqa: BLE001 - as Pulsar's documentation writes it
        # Message failed to be processed
        consumer.negative_acknowledge(msg)

client.close()
