//! A Redis Cluster of one's own: six nodes, three primaries with one replica each, and the
//! failover of the shard that holds a key.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::dir::ServerDir;
use crate::error::{Error, Result};
use crate::port::free_ports;
use crate::process::{Process, wait_until};
use crate::redis::{NodeSpec, Readiness, RedisNode, cli};

/// How many nodes: three primaries with one replica each.
const NODES: usize = 6;
/// How long the cluster may take to form, or to fail over.
const LIMIT: Duration = Duration::from_secs(30);
/// How often the waits ask (each question is a `redis-cli` run per node).
const EVERY: Duration = Duration::from_millis(50);
const SERVER: &str = "redis-cluster";

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

/// One failover, as [`RedisCluster::fail_over`] saw it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Failover {
    /// The slot of the key given.
    pub slot: u16,
    /// Whether the other key given was served by the killed primary too.
    pub other_in_shard: bool,
    /// The killed primary's port.
    pub killed_port: u16,
    /// The promoted replica's port.
    pub promoted_port: u16,
    /// When the primary was killed.
    pub killed: SystemTime,
    /// When the replica answered `ROLE` as a primary.
    pub promoted: SystemTime,
    /// When every live node reported `cluster_state:ok` again (until then, with the default
    /// `cluster-require-full-coverage yes`, nodes that flagged the primary as failed refuse
    /// every key with `CLUSTERDOWN`).
    pub serving: SystemTime,
    /// When the killed node was back as the promoted node's replica, in sync, and every node
    /// saw the cluster whole again.
    pub ready: SystemTime,
}

/// How to start a [`RedisCluster`]: `RedisCluster::builder().start()`.
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    program: PathBuf,
    node_timeout: Duration,
    password: Option<String>,
    files: Option<PathBuf>,
}

impl Default for ClusterBuilder {
    fn default() -> Self {
        Self {
            program: "redis-server".into(),
            node_timeout: Duration::from_secs(2),
            password: None,
            files: None,
        }
    }
}

impl ClusterBuilder {
    /// The server program [default: `redis-server` on `PATH`].
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = program.into();
        self
    }

    /// How long a primary may not answer before the others flag it as failed and its replica
    /// takes over (`cluster-node-timeout`) [default: 2 s]. Short settings fail over a live
    /// primary that stalls on a loaded machine, while clients still reach it.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The nodes' `requirepass` (and `masterauth`, so replicas can sync).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Where the nodes' working directories (their `nodes.conf`) and logs go, to be kept
    /// [default: the cluster's directory under the system temp dir, removed with it].
    pub fn files_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.files = Some(dir.into());
        self
    }

    /// Starts six nodes, makes them one cluster (`redis-cli --cluster create`, one replica per
    /// primary) and waits until every node sees it whole and every replica is in sync.
    pub fn start(self) -> Result<RedisCluster> {
        let dir = ServerDir::new("cluster")?;
        let files = self.files.clone().unwrap_or_else(|| dir.path().to_owned());
        let all = free_ports(NODES * 2)?;
        let (ports, buses) = all.split_at(NODES);
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            works: Vec::new(),
            buses: buses.to_vec(),
            node_timeout: self.node_timeout,
            password: self.password,
            dir,
        };
        for (i, &port) in ports.iter().enumerate() {
            let work = cluster
                .dir
                .subdir(Some(&files), &format!("cluster-node-{i}"))?;
            let spec = NodeSpec {
                program: self.program.clone(),
                port,
                work: work.clone(),
                log: files.join(format!("cluster-node-{i}.log")),
                leading: Vec::new(),
                args: cluster.node_args(&work, buses[i]),
                readiness: Readiness::Ping,
            };
            cluster.nodes.push(RedisNode::start(spec, &cluster.dir)?);
            cluster.works.push(work);
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut create = Command::new("redis-cli");
        if let Some(pw) = &cluster.password {
            create.args(["--no-auth-warning", "-a", pw]);
        }
        let out = create
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::spawn("redis-cli", " (is Redis installed?)", e))?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !said.contains("All 16384 slots covered") {
            return Err(Error::server(
                SERVER,
                format!(
                    "redis-cli --cluster create failed ({}): {said}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        cluster.wait_ready()?;
        Ok(cluster)
    }
}

/// Six redis-server nodes of one's own on loopback, three primaries with one replica each,
/// persisting nothing but their `nodes.conf`; killed on drop, their directory removed (see
/// [`ClusterBuilder::files_in`]).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisNode>,
    /// Each node's working directory (its `nodes.conf`) and bus port, to restart it as itself.
    works: Vec<PathBuf>,
    buses: Vec<u16>,
    node_timeout: Duration,
    password: Option<String>,
    // Last: removed once the servers are stopped.
    dir: ServerDir,
}

impl RedisCluster {
    /// How to start one.
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    /// The arguments of a node working in `work`, with its bus on `bus`.
    fn node_args(&self, work: &Path, bus: u16) -> Vec<String> {
        let mut args = vec![
            "--cluster-enabled".to_owned(),
            "yes".into(),
            "--cluster-config-file".into(),
            work.join("nodes.conf").display().to_string(),
            "--cluster-port".into(),
            bus.to_string(),
            "--cluster-node-timeout".into(),
            self.node_timeout.as_millis().to_string(),
        ];
        if let Some(pw) = &self.password {
            args.extend(["--requirepass", pw, "--masterauth", pw].map(String::from));
        }
        args
    }

    /// The nodes' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisNode::port).collect()
    }

    /// The directory the cluster removes when dropped.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `redis+cluster://` URL naming every node, so a client finds the cluster whichever
    /// nodes are down.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        cli(port, self.password.as_deref(), args)
    }

    /// Waits until `ready`, failing at once should a live node exit.
    fn wait(&mut self, what: &str, ready: impl FnMut() -> bool) -> Result<()> {
        let mut watched: Vec<&mut Process> = self
            .nodes
            .iter_mut()
            .filter(|n| n.pid().is_some())
            .map(RedisNode::process)
            .collect();
        wait_until(what, LIMIT, EVERY, &mut watched, ready)
    }

    /// Every node reports `cluster_state:ok` with six known nodes, sees three primaries serving
    /// slots, each with one replica, and flags none as failing; every replica is in sync. Only
    /// then can any primary be failed over (a replica that never synced refuses to).
    fn wait_ready(&mut self) -> Result<()> {
        let (ports, password) = (self.ports(), self.password.clone());
        self.wait("redis-cluster: every node seeing the whole cluster", || {
            ports
                .iter()
                .all(|&port| node_sees_it_whole(port, password.as_deref()))
        })
    }

    /// Waits until every replica has synced: one that never did refuses to fail over
    /// ("disconnected from master for longer than allowed").
    pub fn wait_for_replicas(&mut self) -> Result<()> {
        let (ports, password) = (self.ports(), self.password.clone());
        self.wait("redis-cluster: every replica in sync", || {
            ports.iter().all(|&p| {
                let info = cli(p, password.as_deref(), &["INFO", "replication"]);
                info.contains("role:master") || info.contains("master_link_status:up")
            })
        })
    }

    /// SIGKILLs the node on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == port) {
            node.kill();
        }
    }

    /// The slot of `key`, as the first node that answers says.
    pub fn slot(&self, key: &str) -> Result<u16> {
        self.ports()
            .into_iter()
            .find_map(|port| {
                self.cli(port, &["CLUSTER", "KEYSLOT", key])
                    .trim()
                    .parse()
                    .ok()
            })
            .ok_or_else(|| Error::server(SERVER, "no node answered CLUSTER KEYSLOT"))
    }

    /// The nodes that answer `GET key` with its value (the others redirect).
    pub fn nodes_holding(&self, key: &str) -> Vec<u16> {
        self.ports()
            .into_iter()
            .filter(|&p| {
                let reply = self.cli(p, &["GET", key]);
                !reply.trim().is_empty() && !reply.contains("MOVED")
            })
            .collect()
    }

    /// The cluster as the first node that answers sees it.
    fn topology(&self) -> Result<Vec<NodeLine>> {
        self.ports()
            .into_iter()
            .map(|port| parse_nodes(&self.cli(port, &["CLUSTER", "NODES"])))
            .find(|nodes| nodes.len() == NODES)
            .ok_or_else(|| {
                Error::server(SERVER, format!("no node lists the cluster's {NODES} nodes"))
            })
    }

    /// The slot of `key` and the ports of the primary serving it and of that primary's replica;
    /// and whether that primary serves `other`'s slot too.
    fn shard_of(&self, key: &str, other: &str) -> Result<(u16, u16, u16, bool)> {
        let slot = self.slot(key)?;
        let other = self.slot(other)?;
        let nodes = self.topology()?;
        let serves = |n: &NodeLine, slot: u16| n.slots.iter().any(|&(a, b)| a <= slot && slot <= b);
        let primary = nodes
            .iter()
            .find(|n| n.primary && serves(n, slot))
            .ok_or_else(|| Error::server(SERVER, format!("no primary serves slot {slot}")))?;
        let replica = nodes
            .iter()
            .find(|n| n.replica_of.as_deref() == Some(primary.id.as_str()))
            .ok_or_else(|| {
                Error::server(SERVER, format!("the primary of slot {slot} has no replica"))
            })?;
        Ok((slot, primary.port, replica.port, serves(primary, other)))
    }

    /// SIGKILLs the primary serving `key`'s slot, waits until the cluster has promoted its
    /// replica and every live node serves again, then restarts the killed node on its
    /// `nodes.conf` (it rejoins as the promoted node's replica) and waits until the cluster could
    /// fail over again. Reports whether `other` was in the killed shard as well.
    pub fn fail_over(&mut self, key: &str, other: &str) -> Result<Failover> {
        let (slot, old_port, new_port, other_in_shard) = self.shard_of(key, other)?;
        let old = self
            .nodes
            .iter()
            .position(|n| n.port() == old_port)
            .ok_or_else(|| {
                Error::server(
                    SERVER,
                    "the slot's primary is not one of the cluster's nodes",
                )
            })?;
        let killed = SystemTime::now();
        self.nodes[old].kill();
        let password = self.password.clone();
        self.wait("redis-cluster: promotion of the replica", || {
            cli(new_port, password.as_deref(), &["ROLE"]).starts_with("master")
        })?;
        let promoted = SystemTime::now();
        let live: Vec<u16> = self
            .ports()
            .into_iter()
            .filter(|&p| p != old_port)
            .collect();
        self.wait("redis-cluster: every live node serving again", || {
            live.iter().all(|&port| {
                cli(port, password.as_deref(), &["CLUSTER", "INFO"]).contains("cluster_state:ok")
            })
        })?;
        let serving = SystemTime::now();
        let args = self.node_args(&self.works[old], self.buses[old]);
        self.nodes[old].respawn(&self.dir, Some(args))?;
        self.wait_ready()?;
        let role = self.cli(old_port, &["ROLE"]);
        if !role.starts_with("slave") {
            return Err(Error::server(
                SERVER,
                format!("the restarted node {old_port} did not rejoin as a replica: {role}"),
            ));
        }
        Ok(Failover {
            slot,
            other_in_shard,
            killed_port: old_port,
            promoted_port: new_port,
            killed,
            promoted,
            serving,
            ready: SystemTime::now(),
        })
    }
}

/// Whether the node on `port` reports `cluster_state:ok` with every node known, three
/// primaries serving slots with one replica each, none flagged as failing, and is a primary or
/// a replica in sync.
fn node_sees_it_whole(port: u16, password: Option<&str>) -> bool {
    let info = cli(port, password, &["CLUSTER", "INFO"]);
    if !info.contains("cluster_state:ok") || !info.contains(&format!("cluster_known_nodes:{NODES}"))
    {
        return false;
    }
    let nodes = parse_nodes(&cli(port, password, &["CLUSTER", "NODES"]));
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
    let info = cli(port, password, &["INFO", "replication"]);
    whole && (info.contains("role:master") || info.contains("master_link_status:up"))
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

    /// Needs redis-server and redis-cli. The shard holding a key fails over, with a password:
    /// its replica is promoted, the killed node rejoins as its replica, and the key's slot is
    /// served by the promoted node.
    #[test]
    fn the_shard_of_a_key_fails_over_and_its_old_primary_rejoins() {
        let mut cluster = RedisCluster::builder()
            .node_timeout(Duration::from_millis(1000))
            .password("pw")
            .start()
            .unwrap();
        let port = cluster.ports()[0];
        // Written where it belongs: `-c` follows the redirect.
        assert_eq!(cli(port, Some("pw"), &["-c", "SET", "k", "v"]).trim(), "OK");
        let holders = cluster.nodes_holding("k");
        assert_eq!(holders.len(), 1, "{holders:?}");
        let f = cluster.fail_over("k", "k").unwrap();
        assert_eq!(f.killed_port, holders[0]);
        assert!(f.other_in_shard);
        assert_eq!(f.slot, cluster.slot("k").unwrap());
        assert!(f.killed <= f.promoted && f.promoted <= f.serving && f.serving <= f.ready);
        let role = cli(f.promoted_port, Some("pw"), &["ROLE"]);
        assert!(role.starts_with("master"), "{role}");
        let dir = cluster.dir().to_owned();
        drop(cluster);
        assert!(!dir.exists());
    }
}
