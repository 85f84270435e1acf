"""The managed ledger: a partition as an ordered list of ledgers plus cursors.

A library over the ledger-client and metadata APIs; it knows nothing of the broker.
"""
