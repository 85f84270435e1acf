"""Security every server and the client share: settings, tokens, authentication, TLS.

- :mod:`~magnetar.common.security.config`: the settings groups servers inherit
  (``tls_cert_file``, ``authentication_enabled``, ``token_secret_key_file`` ...).
- :mod:`~magnetar.common.security.tokens`: JWT keys and tokens (``magnetar tokens``).
- :mod:`~magnetar.common.security.authentication`: credentials to a role, or a refusal.
- :mod:`~magnetar.common.security.tls`: gRPC TLS credentials that reload from disk, and checked
  client channels (imports gRPC, like :mod:`magnetar.common.grpc_errors`).

Authorization (tenants, namespaces, permissions) is the broker's: :mod:`broker.service`.
"""
