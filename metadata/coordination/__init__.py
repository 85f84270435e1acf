"""Coordination on top of the metadata API alone (so on any backend): sessions, resource locks,
leader election and cluster-unique id allocation."""

from metadata.coordination.election import LeaderElection
from metadata.coordination.ids import IdAllocator
from metadata.coordination.lock import LockManager, ResourceLock
from metadata.coordination.session import Session

__all__ = ["IdAllocator", "LeaderElection", "LockManager", "ResourceLock", "Session"]
