//! Replicated Redis deployments of a test's own, on loopback (`leasehold_servers`'s Sentinel
//! group and Redis Cluster, with short failure timeouts): everything is killed and removed on
//! drop, or by a watchdog should the test binary die without dropping them.

use std::time::Duration;

use leasehold_servers::{RedisCluster, SentinelGroup as Group};

/// Name the sentinels monitor the primary under.
pub const MASTER: &str = "leasemaster";

/// A primary, one replica and three sentinels (quorum 2, primary down after 500 ms).
pub struct SentinelGroup {
    /// The port of the primary it started with.
    pub primary: u16,
    /// The port of the replica.
    pub replica: u16,
    /// The ports of the three sentinels.
    pub sentinels: Vec<u16>,
    group: Group,
}

impl SentinelGroup {
    /// Starts a group whose sentinels need no password, and waits until the replica is in
    /// sync and the sentinels know it and each other.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A group whose sentinels require `password` (`requirepass`, and `sentinel sentinel-pass`
    /// so they can still talk to each other).
    pub fn start_with(sentinel_password: Option<&str>) -> Self {
        Self::start_with_passwords(sentinel_password, None)
    }

    /// A group whose sentinels require `sentinel_password` and whose primary and replica
    /// require `data_password` (`requirepass` and `masterauth`; the sentinels are told it with
    /// `sentinel auth-pass`).
    pub fn start_with_passwords(
        sentinel_password: Option<&str>,
        data_password: Option<&str>,
    ) -> Self {
        let mut builder = Group::builder()
            .master(MASTER)
            .down_after(Duration::from_millis(500));
        if let Some(pw) = sentinel_password {
            builder = builder.sentinel_password(pw);
        }
        if let Some(pw) = data_password {
            builder = builder.data_password(pw);
        }
        let group = builder.start().unwrap_or_else(|e| panic!("{e}"));
        Self {
            primary: group.primary_port(),
            replica: group.replica_port(),
            sentinels: group.sentinel_ports(),
            group,
        }
    }

    /// `redis+sentinel://` URL naming every sentinel.
    pub fn url(&self) -> String {
        self.group.url()
    }

    /// SIGKILLs the primary.
    pub fn kill_primary(&mut self) {
        self.group.kill_primary();
    }

    /// Freezes the replica (SIGSTOP), so it stops receiving the primary's writes.
    pub fn freeze_replica(&self) {
        self.group.freeze_replica();
    }

    /// Lets the frozen replica run again (SIGCONT).
    pub fn thaw_replica(&self) {
        self.group.thaw_replica();
    }

    /// The port of the primary a sentinel names now.
    pub fn named_primary(&self) -> Option<u16> {
        self.group.named_primary()
    }
}

/// Six nodes, three primaries with one replica each (node timeout 1 s).
pub struct Cluster {
    /// The nodes' client ports.
    pub ports: Vec<u16>,
    cluster: RedisCluster,
}

impl Cluster {
    /// Starts the nodes, creates the cluster with `redis-cli --cluster create` and waits until
    /// every node sees it whole.
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// A cluster whose nodes require `password` (`requirepass`, and `masterauth` so replicas
    /// can sync).
    pub fn start_with(password: Option<&str>) -> Self {
        let mut builder = RedisCluster::builder().node_timeout(Duration::from_secs(1));
        if let Some(pw) = password {
            builder = builder.password(pw);
        }
        let cluster = builder.start().unwrap_or_else(|e| panic!("{e}"));
        Self {
            ports: cluster.ports(),
            cluster,
        }
    }

    /// Waits until every replica has synced: one that never did refuses to fail over
    /// ("disconnected from master for longer than allowed").
    pub fn wait_for_replicas(&mut self) {
        self.cluster
            .wait_for_replicas()
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `redis+cluster://` URL with two seed nodes.
    pub fn url(&self) -> String {
        // Two seeds are enough: the client learns the rest from them.
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            self.ports[0], self.ports[3]
        )
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.cluster.kill(port);
    }

    /// The slot of `key`.
    pub fn slot(&self, key: &str) -> u16 {
        self.cluster.slot(key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The nodes that answer `GET key` with its value (the others redirect).
    pub fn nodes_holding(&self, key: &str) -> Vec<u16> {
        self.cluster.nodes_holding(key)
    }
}
