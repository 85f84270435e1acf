"""Magnetar's wire protocol (bookie, broker, admin services) and persisted formats.

The .proto sources are a buf module rooted here, each file in the folder of its protobuf package
(``proto/magnetar/broker/v1/broker.proto`` for ``magnetar.broker.v1``); their generated modules
live in ``proto/broker/v1/`` and so on. Regenerate them with `python scripts/genproto.py`.
Nothing in here imports any other Magnetar package."""
