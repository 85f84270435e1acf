"""Credentials on gRPC calls, both ends: what a call presents, and how a client presents them.

A token travels in the call's metadata as ``authorization: Bearer <token>`` (gRPC's usual
header); a client certificate is what the TLS handshake verified, read from the call's auth
context. Every server adapter (broker, bookie) reads them with :func:`credentials_of`; unary
calls that are refused fail with UNAUTHENTICATED or PERMISSION_DENIED and the error's detail,
streams refuse in band. Imports gRPC, like :mod:`magnetar.common.grpc_errors`.
"""

from __future__ import annotations

from typing import Any

import grpc.aio

from magnetar.common.security.authentication import Credentials

__all__ = ["AUTHORIZATION_HEADER", "bearer_metadata", "credentials_of"]

AUTHORIZATION_HEADER = "authorization"
_BEARER = "bearer "


def credentials_of(context: grpc.aio.ServicerContext[Any, Any]) -> Credentials:
    """The credentials a call presented (none, a token, a verified certificate, or both)."""
    token: str | None = None
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_HEADER and isinstance(value, str):
            # anything but "Bearer <token>" is kept as a token that fails as malformed
            token = value[len(_BEARER) :].strip() if value.lower().startswith(_BEARER) else value
            break
    common_name: str | None = None
    names = list(context.auth_context().get("x509_common_name") or ())
    if names:
        common_name = names[0].decode("utf-8", errors="replace")
    return Credentials(context.peer(), token, common_name)


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """The metadata that presents ``token`` on a call (None: no token)."""
    return None if token is None else ((AUTHORIZATION_HEADER, f"Bearer {token}"),)
