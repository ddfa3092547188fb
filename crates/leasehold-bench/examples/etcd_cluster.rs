//! A loopback etcd cluster of its own to point `leasehold bench --stores etcd` at:
//!
//! ```text
//! cargo run --release -p leasehold-bench --example etcd_cluster -- 3
//! ```
//!
//! Starts the members (3 unless given; `leasehold_etcd::testing`, so `etcd` must be on PATH,
//! data on disk under the system temp dir), prints `--etcd-url` values with the leader first and
//! with a follower first, and keeps the cluster until stdin closes (Enter or Ctrl-D). The members
//! and their data go then, or through the cluster's watchdog if this process is killed.

use std::io::BufRead;

use anyhow::Context;
use leasehold_etcd::testing::EtcdCluster;

fn main() -> anyhow::Result<()> {
    let size: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("the member count")?,
        None => 3,
    };
    anyhow::ensure!(size > 0, "the member count must be at least 1");
    let cluster = EtcdCluster::start(size);
    let leader = cluster
        .wait_for_leader(std::time::Duration::from_secs(10))
        .context("no leader within 10 s")?;
    println!("leader first:   {}", cluster.url_starting_at(leader));
    if size > 1 {
        println!("follower first: {}", cluster.url_starting_at(leader + 1));
    }
    println!("(close stdin to stop the cluster)");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    drop(cluster);
    Ok(())
}
