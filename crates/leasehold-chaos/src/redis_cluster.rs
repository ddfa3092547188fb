//! `--store redis-cluster`: a six-node Redis Cluster (three primaries, one replica each) the
//! harness runs itself. Its store-restart fault is a failover of the shard that holds the task:
//! the primary owning the task lease's slot is SIGKILLed, the cluster promotes its replica, and
//! the killed node comes back (on its `nodes.conf`) as the promoted node's replica.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::error::{ChaosError, Result};
use crate::procs::{RedisServer, epoch_ms, free_port, redis_cli as cli, wait_until};

/// How long a primary may not answer before the others flag it as failed and its replica takes
/// over. Not shorter, for the reason Sentinel's `down-after-milliseconds` is 2000 ms there: a
/// live primary that stalls past it on a loaded machine is failed over while clients still
/// reach it, and both accept writes until it learns of the promotion.
pub(crate) const NODE_TIMEOUT_MS: u32 = 2000;

/// How many nodes: three primaries with one replica each.
const NODES: usize = 6;

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    primary: bool,
    /// Flagged `fail` or `fail?` by the node asked.
    failing: bool,
    /// The id of its primary, for a replica.
    replica_of: Option<String>,
    /// The slot ranges it serves (inclusive).
    slots: Vec<(u16, u16)>,
}

/// Parses `CLUSTER NODES`: `id ip:port@bus[,host] flags primary ping pong epoch link slot…`.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let addr = f.get(1)?.split(['@', ',']).next()?;
            let port = addr.rsplit_once(':')?.1.parse().ok()?;
            let flags: Vec<&str> = f.get(2)?.split(',').collect();
            let slots = f
                .get(8..)
                .unwrap_or_default()
                .iter()
                // `[slot->-id]` and `[slot-<-id]`: a slot being migrated, not served here.
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: (*f.first()?).to_owned(),
                port,
                primary: flags.contains(&"master"),
                failing: flags.iter().any(|f| f.starts_with("fail")),
                replica_of: f.get(3).filter(|m| **m != "-").map(|m| (*m).to_owned()),
                slots,
            })
        })
        .collect()
}

/// The arguments of a cluster node working in `dir`, with its bus on `bus`.
fn node_args(dir: &Path, bus: u16) -> Vec<String> {
    let conf = dir.join("nodes.conf").display().to_string();
    [
        "--dir",
        &dir.display().to_string(),
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &conf,
        "--cluster-port",
        &bus.to_string(),
        "--cluster-node-timeout",
        &NODE_TIMEOUT_MS.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// `n` distinct free ports.
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let mut ports = BTreeSet::new();
    for _ in 0..n * 20 {
        if ports.len() == n {
            break;
        }
        ports.insert(free_port()?);
    }
    if ports.len() < n {
        let problem = format!("cannot find {n} distinct free ports");
        return Err(ChaosError::server("redis-cluster", problem));
    }
    let mut ports: Vec<u16> = ports.into_iter().collect();
    fastrand::shuffle(&mut ports);
    Ok(ports)
}

/// One failover, as [`ClusterGroup::fail_over`] saw it; times in ms since the Unix epoch.
#[derive(Debug, Clone)]
pub(crate) struct Failover {
    /// The slot of the key given.
    pub(crate) slot: u16,
    /// Whether the other key given was served by the killed primary too.
    pub(crate) other_in_shard: bool,
    /// The killed primary's port and the promoted replica's.
    pub(crate) killed_port: u16,
    pub(crate) promoted_port: u16,
    pub(crate) killed_ms: u64,
    /// The replica answered `ROLE` as a primary.
    pub(crate) promoted_ms: u64,
    /// Every live node reported `cluster_state:ok` again (until then, with the default
    /// `cluster-require-full-coverage yes`, nodes that flagged the primary as failed refuse
    /// every key with `CLUSTERDOWN`).
    pub(crate) serving_ms: u64,
    /// The killed node was back as the promoted node's replica, in sync, and every node saw the
    /// cluster whole again.
    pub(crate) ready_ms: u64,
}

/// The cluster's processes; they are in the watchdog's process group, so a killed harness does
/// not leave them behind.
#[derive(Debug)]
pub struct ClusterGroup {
    nodes: Vec<RedisServer>,
    /// Each node's working directory (its `nodes.conf`) and bus port, to restart it as itself.
    dirs: Vec<PathBuf>,
    buses: Vec<u16>,
}

impl ClusterGroup {
    /// Starts six nodes with their data and logs in `dir`, makes them one cluster (`redis-cli
    /// --cluster create`, one replica per primary) and waits until every node sees it whole.
    pub async fn start(program: &Path, dir: &Path, group: i32) -> Result<Self> {
        let ports = free_ports(NODES * 2)?;
        let (ports, buses) = ports.split_at(NODES);
        let mut nodes = Vec::new();
        let mut dirs = Vec::new();
        for (i, (&port, &bus)) in ports.iter().zip(buses).enumerate() {
            let d = dir.join(format!("cluster-node-{i}"));
            std::fs::create_dir_all(&d)
                .map_err(|e| ChaosError::io(format!("cannot create {}", d.display()), e))?;
            let log = dir.join(format!("cluster-node-{i}.log"));
            nodes.push(
                RedisServer::start_with(program, &log, group, port, node_args(&d, bus)).await?,
            );
            dirs.push(d);
        }
        let me = Self {
            nodes,
            dirs,
            buses: buses.to_vec(),
        };
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| ChaosError::spawn("redis-cli", " (is redis-cli on PATH?)", e))?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !said.contains("All 16384 slots covered") {
            return Err(ChaosError::server(
                "redis-cluster",
                format!(
                    "redis-cli --cluster create failed ({}): {said}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        me.wait_ready(Duration::from_secs(30)).await?;
        Ok(me)
    }

    fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The store URL: every node, so a client finds the cluster whichever nodes are down.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node reports `cluster_state:ok` with six known nodes, sees three primaries serving
    /// slots, each with one replica, and flags none as failing; every replica is in sync. Only
    /// then can any primary be failed over (a replica that never synced refuses to).
    async fn wait_ready(&self, limit: Duration) -> Result<()> {
        let ports = self.ports();
        wait_until(
            "redis-cluster: every node seeing the whole cluster",
            limit,
            || {
                let ports = ports.clone();
                async move {
                    for &port in &ports {
                        let info = cli(port, &["CLUSTER", "INFO"]).await;
                        if !info.contains("cluster_state:ok")
                            || !info.contains(&format!("cluster_known_nodes:{NODES}"))
                        {
                            return false;
                        }
                        let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]).await);
                        let primaries: Vec<&NodeLine> = nodes
                            .iter()
                            .filter(|n| n.primary && !n.slots.is_empty())
                            .collect();
                        let whole = nodes.len() == NODES
                            && nodes.iter().all(|n| !n.failing)
                            && primaries.len() == NODES / 2
                            && primaries.iter().all(|p| {
                                nodes
                                    .iter()
                                    .filter(|r| r.replica_of.as_deref() == Some(p.id.as_str()))
                                    .count()
                                    == 1
                            });
                        if !whole {
                            return false;
                        }
                        let info = cli(port, &["INFO", "replication"]).await;
                        if !info.contains("role:master") && !info.contains("master_link_status:up")
                        {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await
    }

    /// The cluster as the first node that answers sees it.
    async fn topology(&self) -> Result<Vec<NodeLine>> {
        for port in self.ports() {
            let nodes = parse_nodes(&cli(port, &["CLUSTER", "NODES"]).await);
            if nodes.len() == NODES {
                return Ok(nodes);
            }
        }
        Err(ChaosError::server(
            "redis-cluster",
            format!("no node lists the cluster's {NODES} nodes"),
        ))
    }

    async fn slot_of(&self, key: &str) -> Result<u16> {
        for port in self.ports() {
            if let Ok(s) = cli(port, &["CLUSTER", "KEYSLOT", key]).await.trim().parse() {
                return Ok(s);
            }
        }
        Err(ChaosError::server(
            "redis-cluster",
            "no node answered CLUSTER KEYSLOT",
        ))
    }

    /// The slot of `key` and the ports of the primary serving it and of that primary's replica;
    /// and whether that primary serves `other`'s slot too.
    async fn shard_of(&self, key: &str, other: &str) -> Result<(u16, u16, u16, bool)> {
        let slot = self.slot_of(key).await?;
        let other = self.slot_of(other).await?;
        let nodes = self.topology().await?;
        let serves = |n: &NodeLine, slot: u16| n.slots.iter().any(|&(a, b)| a <= slot && slot <= b);
        let primary = nodes
            .iter()
            .find(|n| n.primary && serves(n, slot))
            .ok_or_else(|| {
                ChaosError::server("redis-cluster", format!("no primary serves slot {slot}"))
            })?;
        let replica = nodes
            .iter()
            .find(|n| n.replica_of.as_deref() == Some(primary.id.as_str()))
            .ok_or_else(|| {
                let problem = format!("the primary of slot {slot} has no replica");
                ChaosError::server("redis-cluster", problem)
            })?;
        Ok((slot, primary.port, replica.port, serves(primary, other)))
    }

    /// SIGKILLs the primary serving `key`'s slot, waits until the cluster has promoted its
    /// replica and every live node serves again, then restarts the killed node on its
    /// `nodes.conf` (it rejoins as the promoted node's replica) and waits until the cluster could
    /// fail over again. Reports whether `other` was in the killed shard as well.
    pub(crate) async fn fail_over(&mut self, key: &str, other: &str) -> Result<Failover> {
        let (slot, old_port, new_port, other_in_shard) = self.shard_of(key, other).await?;
        let old = self
            .nodes
            .iter()
            .position(|n| n.port() == old_port)
            .ok_or_else(|| {
                let problem = "the slot's primary is not one of the harness's nodes";
                ChaosError::server("redis-cluster", problem)
            })?;
        let killed_ms = epoch_ms();
        self.nodes[old].stop().await;
        wait_until(
            "redis-cluster: promotion of the replica",
            Duration::from_secs(30),
            || async move { cli(new_port, &["ROLE"]).await.starts_with("master") },
        )
        .await?;
        let promoted_ms = epoch_ms();
        let live: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|&p| p != old_port)
            .collect();
        wait_until(
            "redis-cluster: every live node serving again",
            Duration::from_secs(30),
            || {
                let live = live.clone();
                async move {
                    for port in live {
                        if !cli(port, &["CLUSTER", "INFO"])
                            .await
                            .contains("cluster_state:ok")
                        {
                            return false;
                        }
                    }
                    true
                }
            },
        )
        .await?;
        let serving_ms = epoch_ms();
        let args = node_args(&self.dirs[old], self.buses[old]);
        self.nodes[old].respawn_with(args).await?;
        self.wait_ready(Duration::from_secs(30)).await?;
        let role = cli(old_port, &["ROLE"]).await;
        if !role.starts_with("slave") {
            return Err(ChaosError::server(
                "redis-cluster",
                format!("the restarted node {old_port} did not rejoin as a replica: {role}"),
            ));
        }
        Ok(Failover {
            slot,
            other_in_shard,
            killed_port: old_port,
            promoted_port: new_port,
            killed_ms,
            promoted_ms,
            serving_ms,
            ready_ms: epoch_ms(),
        })
    }

    /// Stops every node.
    pub async fn stop(&mut self) {
        for n in &mut self.nodes {
            n.stop().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_parsed() {
        let text = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 7000 [5461->-b1]
b1 127.0.0.1:7001@17001,host master,fail - 1 2 2 connected 5461-10922
c1 127.0.0.1:7002@17002 slave,fail? a1 0 3 1 connected
garbage
";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 3);
        assert_eq!(
            nodes[0],
            NodeLine {
                id: "a1".into(),
                port: 7000,
                primary: true,
                failing: false,
                replica_of: None,
                slots: vec![(0, 5460), (7000, 7000)],
            }
        );
        assert!(nodes[1].primary && nodes[1].failing && nodes[1].port == 7001);
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert!(!nodes[2].primary && nodes[2].failing);
        assert_eq!(nodes[2].replica_of.as_deref(), Some("a1"));
        assert!(nodes[2].slots.is_empty());
    }
}
