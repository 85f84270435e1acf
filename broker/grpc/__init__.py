"""The broker's gRPC adapter: protobuf <-> domain types, errors <-> status. Nothing else."""
