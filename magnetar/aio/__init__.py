"""The asyncio client library (the core the sync ``magnetar.Client`` wraps).

::

    import magnetar.aio

    async with magnetar.aio.Client("magnetar://localhost:6650") as client:
        producer = await client.create_producer("my-topic")
        await producer.send(b"hello", partition_key="k1", properties={"a": "b"})

        consumer = await client.subscribe("my-topic", "my-sub", initial_position="earliest")
        msg = await consumer.receive(timeout_millis=5000)
        await consumer.acknowledge(msg)

Errors are the :mod:`magnetar.common.errors` tree (re-exported here for the ones a client user
meets); each has a ``retriable`` flag. See ``docs/client.md``.
"""

from magnetar.aio.admin import AdminClient
from magnetar.aio.auth import Authentication, AuthenticationTLS, AuthenticationToken
from magnetar.aio.client import Client
from magnetar.aio.config import ClientConfig, ConsumerConfig, ProducerConfig
from magnetar.aio.consumer import Consumer, MessageListener
from magnetar.aio.message import Message
from magnetar.aio.message_id import MessageId
from magnetar.aio.producer import ManyCallback, Producer, SendCallback, SendReceipt
from magnetar.aio.reader import Reader
from magnetar.aio.send_options import SendFields, SendOptions
from magnetar.common.errors import (
    AuthenticationError,
    AuthorizationError,
    ClientClosedError,
    ClientConnectionError,
    ClientError,
    ConsumerBusyError,
    ConsumerClosedError,
    IncompatibleSubscriptionError,
    InvalidServiceUrlError,
    InvalidTopicNameError,
    MagnetarError,
    MessageTooLargeError,
    OperationTimeoutError,
    ProducerBusyError,
    ProducerClosedError,
    ProducerQueueFullError,
    ReceiveTimeoutError,
    TlsError,
    TopicLookupError,
    TopicNotFoundError,
)

__all__ = [
    "AdminClient",
    "Authentication",
    "AuthenticationError",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AuthorizationError",
    "Client",
    "ClientClosedError",
    "ClientConfig",
    "ClientConnectionError",
    "ClientError",
    "Consumer",
    "ConsumerBusyError",
    "ConsumerClosedError",
    "ConsumerConfig",
    "IncompatibleSubscriptionError",
    "InvalidServiceUrlError",
    "InvalidTopicNameError",
    "MagnetarError",
    "ManyCallback",
    "Message",
    "MessageId",
    "MessageListener",
    "MessageTooLargeError",
    "OperationTimeoutError",
    "Producer",
    "ProducerBusyError",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerQueueFullError",
    "Reader",
    "ReceiveTimeoutError",
    "SendCallback",
    "SendFields",
    "SendOptions",
    "SendReceipt",
    "TlsError",
    "TopicLookupError",
    "TopicNotFoundError",
]
