"""What opens every benchmark's results, made up for the report tests of the benchmarks."""

from __future__ import annotations

from typing import Any


def run_head(script: str) -> dict[str, Any]:
    """The head of the results of ``bench/<script> --tag test``, run on a made-up machine."""
    return {
        "date": "2026-01-01",
        "tag": "test",
        "command": f"bench/{script} --tag test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "elapsed_s": 10.0,
        "machine": {
            "cpu_count": 2,
            "cpu_model": "cpu",
            "memory_bytes": 2**30,
            "kernel": "6",
            "python": "3",
            "grpcio": "1",
            "git_commit": "0" * 40,
            "git_dirty": False,
            "filesystem": {
                "device": "/dev/x",
                "type": "ext4",
                "mount_point": "/",
                "free_bytes": 10**10,
                "total_bytes": 10**11,
            },
        },
    }
