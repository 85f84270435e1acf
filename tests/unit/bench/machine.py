"""What ``harness.machine_info`` gives, made up: the report tests render results with it."""

from __future__ import annotations

from typing import Any


def fake_machine() -> dict[str, Any]:
    """A 2-core machine with an ext4 data file system, in ``machine_info``'s shape."""
    return {
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
    }
