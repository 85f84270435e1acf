"""The ledger client: ensembles, write/ack quorums, LAC, ensemble changes, recovery."""
