"""The bookie's storage engine: segment files, group commit, index, compaction.

No gRPC, no metadata: it reports durability by completing futures.
"""
