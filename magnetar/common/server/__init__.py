"""The process kit every server process shares: the gRPC server options, reflection and run loop
(:mod:`~magnetar.common.server.serving`), the standard gRPC health service and its meaning
(:mod:`~magnetar.common.server.health`), the small HTTP server for ``/metrics`` and ``/health``
(:mod:`~magnetar.common.server.status_http`), and the collector tuning of the processes we own
(:mod:`~magnetar.common.server.gc_tuning`).

The storage engine, the managed ledger and the client library do not use it; ``magnetar bookie``,
``broker``, ``autorecovery``, ``standalone`` and ``perf`` do.
"""
