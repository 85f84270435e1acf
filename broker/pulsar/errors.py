"""One table from Magnetar's error codes to Pulsar's ``ServerError``, as the Pulsar adapter sends
them in the response of the request that failed.

Pulsar's clients decide from the ``ServerError`` whether to retry: ``ServiceNotReady`` (and
``TooManyRequests``) is retried (the client looks the topic up again), the others fail the
operation for good. So every retriable Magnetar error, whatever its code, becomes
``ServiceNotReady``; so does a failure of what the broker stands on (metadata store, bookies,
the partition's managed ledger), which the next attempt, perhaps on another broker, may not
meet (as the gRPC adapter tells its clients); refusals of the request keep their meaning.
"""

from __future__ import annotations

from magnetar.common.errors import ErrorCode, MagnetarError
from proto.pulsar import PulsarApi_pb2 as api

_FINAL: dict[ErrorCode, api.ServerError.ValueType] = {
    ErrorCode.AUTHENTICATION_FAILED: api.AuthenticationError,
    ErrorCode.AUTHORIZATION_FAILED: api.AuthorizationError,
    ErrorCode.TOPIC_NOT_FOUND: api.TopicNotFound,
    ErrorCode.TENANT_NOT_FOUND: api.TopicNotFound,
    ErrorCode.INVALID_TOPIC_NAME: api.InvalidTopicName,
    ErrorCode.PRODUCER_BUSY: api.ProducerBusy,
    ErrorCode.PRODUCER_FENCED: api.ProducerFenced,
    ErrorCode.CONSUMER_BUSY: api.ConsumerBusy,
    ErrorCode.SUBSCRIPTION_BUSY: api.ConsumerBusy,
    ErrorCode.INCOMPATIBLE_SUBSCRIPTION: api.ConsumerBusy,
    ErrorCode.SUBSCRIPTION_NOT_FOUND: api.SubscriptionNotFound,
    ErrorCode.TOPIC_TERMINATED: api.TopicTerminatedError,
    ErrorCode.MANAGED_LEDGER_TERMINATED: api.TopicTerminatedError,
    ErrorCode.CHECKSUM_MISMATCH: api.ChecksumError,
    ErrorCode.PRODUCER_QUEUE_FULL: api.ProducerBlockedQuotaExceededError,
    ErrorCode.INVALID_ARGUMENT: api.NotAllowedError,
    ErrorCode.PROTOCOL_ERROR: api.NotAllowedError,
    ErrorCode.MESSAGE_TOO_LARGE: api.NotAllowedError,
    ErrorCode.TOPIC_BUSY: api.NotAllowedError,
}


def server_error(error: MagnetarError) -> api.ServerError.ValueType:
    """The ``ServerError`` that tells a Pulsar client what ``error`` tells a Magnetar one."""
    if error.retriable:
        return api.ServiceNotReady
    found = _FINAL.get(error.code)
    if found is not None:
        return found
    if 100 <= error.code < 500 or error.code == ErrorCode.INTERNAL:
        return api.ServiceNotReady
    return api.UnknownError
