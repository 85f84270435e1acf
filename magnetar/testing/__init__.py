"""Public test kit: real etcd servers and clusters, and local clusters of real bookie and
broker processes.

::

    from magnetar.testing import LocalCluster

    async with LocalCluster(tmp_path, bookies=3, brokers=2) as cluster:
        ...  # cluster.metadata_url, cluster.service_url, cluster.bookies[i].kill() / .restart()

    async with StandaloneNode(tmp_path / "data") as node:  # embedded metadata, one process
        ...  # node.service_url, node.kill() / .restart()
"""

from magnetar.testing.cluster import (
    BookieNode,
    BrokerNode,
    LocalCluster,
    ServerNode,
    StandaloneNode,
)
from magnetar.testing.etcd import EtcdCluster, EtcdServer

__all__ = [
    "BookieNode",
    "BrokerNode",
    "EtcdCluster",
    "EtcdServer",
    "LocalCluster",
    "ServerNode",
    "StandaloneNode",
]
