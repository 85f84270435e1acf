"""Autorecovery: bring every ledger back to Qw copies after a bookie is lost.

One instance at a time is active, elected through the metadata store. It runs inside bookies
started with ``--autorecovery``, or on its own as ``magnetar autorecovery``. The active instance
repeats three steps:

1. **Audit.** Every bookie the cluster knows (``/magnetar/bookies/cookies/``) that has been
   missing from ``/magnetar/bookies/available/`` for longer than ``lost_bookie_grace_s`` is
   lost. Every ledger fragment (segment) that names a lost bookie and whose end is known is
   recorded as under-replicated at ``/magnetar/underreplicated/<ledger>``. A known end means a
   sealed segment, or the last segment of a closed ledger: an open ledger's tail belongs to its
   writer or to the recovery that closes it.
2. **Replicate.** For each recorded ledger and each such fragment, pick a replacement bookie,
   copy every entry of the fragment that the lost bookie held from a surviving replica to the
   replacement (recovery adds: accepted even on a fenced ledger), then swap the bookie in that
   segment with a compare-and-swap on the ledger's metadata.
3. **Clear.** A ledger's record is removed once none of its fragments names a lost bookie.

The records are the progress (``magnetar cluster under-replicated`` lists them), and they are
what makes a restart mid-way safe. A new active instance picks the work up where it stopped;
copies are idempotent, so redoing part of one costs time, not correctness.

``magnetar autorecovery`` (:func:`~bookie.autorecovery.process.run_autorecovery`) also serves
``/health`` and ``/metrics`` over HTTP on ``http_port``, from what the instance already knows
(:meth:`~bookie.autorecovery.worker.Autorecovery.health`, :mod:`bookie.autorecovery.metrics`): a
probe or a scrape never reads the metadata store. An instance a bookie runs inside itself serves
nothing of its own.

The modules, each importing only those listed after it (an import-linter contract says so):

- :mod:`~bookie.autorecovery.process`: ``magnetar autorecovery``, one instance with its HTTP server;
- :mod:`~bookie.autorecovery.metrics`: the Prometheus metrics, read from an instance;
- :mod:`~bookie.autorecovery.worker`: :class:`~bookie.autorecovery.worker.Autorecovery`, the
  instance (election, audit, replication);
- :mod:`~bookie.autorecovery.records`: what it keeps in the metadata store (the under-replicated
  records and the election key), and :mod:`~bookie.autorecovery.config`: its settings.
"""
