"""Pulsar's binary protocol: a second adapter beside ``broker/grpc/``, over the same service.

:mod:`broker.pulsar.codec` is the wire format, :mod:`broker.pulsar.listener` the TCP listener,
:mod:`broker.pulsar.connection` one client's commands, :mod:`broker.pulsar.entries` entries as
a Pulsar producer sent them and :mod:`broker.pulsar.errors` Magnetar's errors as Pulsar's. What
works and what does not yet: ``docs/pulsar-compatibility.md`` (issue 26).
"""
