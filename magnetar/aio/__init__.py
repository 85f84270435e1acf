"""The asyncio client library (the core the sync `magnetar.Client` wraps)."""
