"""A plain Apache Pulsar producer, written as Pulsar's documentation shows it, with nothing
Magnetar-specific: it runs unchanged against ``magnetar standalone --pulsar-port 6650``."""

import pulsar

client = pulsar.Client("pulsar://localhost:6650")

producer = client.create_producer("my-topic")

for i in range(10):
    producer.send(f"hello-pulsar-{i}".encode(), properties={"n": str(i)})
    print(f"sent hello-pulsar-{i}")

client.close()
