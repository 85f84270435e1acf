"""Magnetar's wire protocol (bookie, broker, admin services) and persisted formats.

The .proto sources live beside their generated modules; regenerate them with
`python scripts/genproto.py`.
Nothing in here imports any other Magnetar package."""
