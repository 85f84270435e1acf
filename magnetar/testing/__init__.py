"""Public test kit: real etcd servers and clusters, and local clusters of real bookie and
broker processes.

::

    from magnetar.testing import LocalCluster

    async with LocalCluster(tmp_path, bookies=3, brokers=2) as cluster:
        ...  # cluster.metadata_url, cluster.service_url, cluster.bookies[i].kill() / .restart()

    async with StandaloneNode(tmp_path / "data") as node:  # embedded metadata, one process
        ...  # node.service_url, node.kill() / .restart()

    # network partitions and full disks (root only; netns_unsupported_reason() says why not)
    async with LocalCluster(tmp_path, brokers=1, isolated_brokers=1, bookie_tmpfs_mb=64) as c:
        await c.isolated_host.cut("etcd")  # or "bookies", "clients"; then .heal(...)
        c.bookies[0].fill_disk()  # then .free_disk()
"""

from magnetar.testing.cluster import (
    BookieNode,
    BrokerNode,
    LocalCluster,
    ServerNode,
    StandaloneNode,
    Tmpfs,
)
from magnetar.testing.etcd import EtcdCluster, EtcdServer
from magnetar.testing.netns import IsolatedHost, netns_unsupported_reason

__all__ = [
    "BookieNode",
    "BrokerNode",
    "EtcdCluster",
    "EtcdServer",
    "IsolatedHost",
    "LocalCluster",
    "ServerNode",
    "StandaloneNode",
    "Tmpfs",
    "netns_unsupported_reason",
]
