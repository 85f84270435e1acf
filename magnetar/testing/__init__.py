"""Public test kit: real etcd servers and clusters, and local clusters of real bookie processes.

::

    from magnetar.testing import LocalCluster

    async with LocalCluster(tmp_path, bookies=3) as cluster:
        ...  # cluster.metadata_url, cluster.bookies[i].kill() / .restart()
"""

from magnetar.testing.cluster import BookieNode, LocalCluster
from magnetar.testing.etcd import EtcdCluster, EtcdServer

__all__ = ["BookieNode", "EtcdCluster", "EtcdServer", "LocalCluster"]
