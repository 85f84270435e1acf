"""Pulsar's binary protocol: a second adapter beside ``broker/grpc/``, over the same service.

So far it holds the wire format only (:mod:`broker.pulsar.codec`); the listener and the commands
come next (issue 26).
"""
