"""Pulsar's asyncio client (``pulsar.asyncio``, pulsar-client 3.9 and later): a producer with
key-based batching and a consumer, each send and receive its own task, as Pulsar's own
asyncio example does it."""

import asyncio

from pulsar import BatchingType
from pulsar.asyncio import Client, Consumer, Producer

NUM_MESSAGES = 100
TOPIC_NAME = "my-async-topic"
SUBSCRIPTION_NAME = "my-async-subscription"
SERVICE_URL = "pulsar://localhost:6650"


async def produce(producer: Producer, n: int) -> None:
    await producer.send(f"hello-{n}".encode(), None)
    await producer.flush()


async def consume(consumer: Consumer) -> None:
    msg = await consumer.receive()
    print(f"Received message '{msg.data().decode()}' id='{msg.message_id()}'")
    await consumer.acknowledge(msg)


async def main() -> None:
    client = Client(SERVICE_URL)
    consumer = await client.subscribe(
        TOPIC_NAME, SUBSCRIPTION_NAME, properties={"consumer-name": "example-consumer"}
    )
    producer = await client.create_producer(
        TOPIC_NAME,
        block_if_queue_full=True,
        batching_enabled=True,
        batching_max_publish_delay_ms=10,
        properties={"producer-name": "example-producer"},
        batching_type=BatchingType.KeyBased,
    )
    tasks = []
    for n in range(NUM_MESSAGES):
        tasks.append(asyncio.create_task(produce(producer, n)))
        tasks.append(asyncio.create_task(consume(consumer)))
    await asyncio.gather(*tasks)
    await producer.close()
    await consumer.close()
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
