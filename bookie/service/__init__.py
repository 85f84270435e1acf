"""The bookie's service layer: fencing, LAC tracking and long-poll, read-only mode, registration."""
