"""Magnetar: a Pulsar-style messaging system in Python.

``magnetar.Client`` is the synchronous client and ``magnetar.AdminClient`` its admin client (both
facades over the asyncio core in :mod:`magnetar.aio`); ``magnetar.MessageId`` and the errors of
:mod:`magnetar.common.errors` are here too. This package also holds the CLI (``magnetar.cli``),
the shared kernel (``magnetar.common``) and the public test kit (``magnetar.testing``).

The client names are imported on first use, so ``import magnetar`` (and the CLI's ``--help``)
stays fast.
"""

from importlib import import_module as _import_module
from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = _metadata.version("magnetar")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

if TYPE_CHECKING:
    from magnetar.aio.auth import AuthenticationTLS, AuthenticationToken
    from magnetar.aio.handoff import SendFuture
    from magnetar.aio.message import Message
    from magnetar.aio.message_id import MessageId
    from magnetar.aio.producer import SendReceipt
    from magnetar.aio.send_options import SendFields
    from magnetar.client import AdminClient, Client, Consumer, Producer, Reader
    from magnetar.common.errors import (
        AuthenticationError,
        AuthorizationError,
        ClientConnectionError,
        IncompatibleSubscriptionError,
        InvalidServiceUrlError,
        MagnetarError,
        MessageTooLargeError,
        OperationTimeoutError,
        ProducerQueueFullError,
        ReceiveTimeoutError,
        TlsError,
        TopicLookupError,
        TopicNotFoundError,
    )

_LAZY = {
    "AuthenticationTLS": "magnetar.aio.auth",
    "AuthenticationToken": "magnetar.aio.auth",
    "AuthenticationError": "magnetar.common.errors",
    "AuthorizationError": "magnetar.common.errors",
    "TlsError": "magnetar.common.errors",
    "AdminClient": "magnetar.client",
    "Client": "magnetar.client",
    "Consumer": "magnetar.client",
    "Producer": "magnetar.client",
    "Reader": "magnetar.client",
    "Message": "magnetar.aio.message",
    "MessageId": "magnetar.aio.message_id",
    "SendReceipt": "magnetar.aio.producer",
    "SendFuture": "magnetar.aio.handoff",
    "SendFields": "magnetar.aio.send_options",
    "ClientConnectionError": "magnetar.common.errors",
    "IncompatibleSubscriptionError": "magnetar.common.errors",
    "InvalidServiceUrlError": "magnetar.common.errors",
    "MagnetarError": "magnetar.common.errors",
    "MessageTooLargeError": "magnetar.common.errors",
    "OperationTimeoutError": "magnetar.common.errors",
    "ProducerQueueFullError": "magnetar.common.errors",
    "ReceiveTimeoutError": "magnetar.common.errors",
    "TopicLookupError": "magnetar.common.errors",
    "TopicNotFoundError": "magnetar.common.errors",
}

__all__ = [
    "AdminClient",
    "AuthenticationError",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AuthorizationError",
    "Client",
    "ClientConnectionError",
    "Consumer",
    "IncompatibleSubscriptionError",
    "InvalidServiceUrlError",
    "MagnetarError",
    "Message",
    "MessageId",
    "MessageTooLargeError",
    "OperationTimeoutError",
    "Producer",
    "ProducerQueueFullError",
    "Reader",
    "ReceiveTimeoutError",
    "SendFields",
    "SendFuture",
    "SendReceipt",
    "TlsError",
    "TopicLookupError",
    "TopicNotFoundError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'magnetar' has no attribute {name!r}")
    value = getattr(_import_module(module), name)
    globals()[name] = value
    return value
