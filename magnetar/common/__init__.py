"""The shared kernel: errors with codes, configuration loading, logging, the clock, names, keys,
framing, and the security settings and tokens.

Kept free of every server package. The core of it (errors, config, log, clock, names, keys,
framing, files, peer limits, security settings, authentication and tokens) imports neither gRPC
nor protobuf, so every layer, the storage engine included, can use it. gRPC lives in these
modules only, each a bridge that adapters, processes or the client use:

- ``grpc_errors``: the one map between the error tree and gRPC status and details;
- ``grpc_decoding``: the servers' interceptor that decodes requests and bounds connections;
- ``security.tls`` and ``security.grpc_credentials``: TLS and credentials for gRPC servers and
  channels;
- ``server``: the process kit (server options, reflection, run loop, health service, the HTTP
  status server, collector tuning).

An import-linter contract in ``pyproject.toml`` holds the rest of the kernel to this.
"""
