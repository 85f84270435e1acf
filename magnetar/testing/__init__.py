"""Public test kit: real etcd servers, and (later) a LocalCluster of real bookie and broker
processes."""
