"""The shared kernel: errors with codes, configuration loading, logging, the clock.

Kept free of every server package, and (except ``grpc_errors``, the one bridge adapters and the
client use, and ``security.tls``, TLS for gRPC servers and channels) free of gRPC, so every layer,
the storage engine included, can use it.
"""
