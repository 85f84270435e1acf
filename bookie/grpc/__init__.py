"""The bookie's gRPC adapter: protobuf <-> domain types, errors <-> status. Nothing else."""
