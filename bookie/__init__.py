"""The bookie: Magnetar's durable storage node, and the ledger client that writes to bookies."""
