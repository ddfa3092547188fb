//! `--store etcd`: the harness's own 3-member cluster on loopback (`leasehold-servers`'s), and
//! its store-restart fault.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_servers::EtcdCluster;

use crate::error::{ChaosError, Result};
use crate::procs::epoch_ms;

/// How long the cluster may take to be healthy again after a restart.
const HEALTHY_WITHIN: Duration = Duration::from_secs(20);

/// The cluster; its members are killed and its data directory removed when it is dropped, or
/// by its own watchdog should the harness die.
pub(crate) struct EtcdMembers {
    cluster: EtcdCluster,
}

impl EtcdMembers {
    /// Starts three members and waits until they elect a leader.
    pub(crate) fn start() -> Result<Self> {
        Ok(Self {
            cluster: EtcdCluster::start(3)?,
        })
    }

    /// The URL of every member.
    pub(crate) fn url(&self) -> String {
        self.cluster.url()
    }

    /// The `n`-th store restart, in turn: the leader, kept down for `down`; the leader and a
    /// follower together (no quorum: every operation fails until they are back), kept down for
    /// `down`; a follower, restarted at once. Returns when the members were killed, when
    /// the cluster was healthy again (ms since the epoch), and what was done.
    pub(crate) async fn restart(&mut self, n: usize, down: Duration) -> Result<(u64, u64, String)> {
        let cluster = &mut self.cluster;
        let leader = tokio::task::block_in_place(|| cluster.leader()).unwrap_or(0);
        let follower = (leader + 1) % 3;
        let (victims, down, what) = match n % 3 {
            0 => (vec![leader], down, format!("leader m{leader}")),
            1 => (
                vec![leader, follower],
                down,
                format!("leader m{leader} and follower m{follower} (no quorum)"),
            ),
            _ => (
                vec![follower],
                Duration::ZERO,
                format!("follower m{follower}"),
            ),
        };
        let killed = epoch_ms();
        tokio::task::block_in_place(|| {
            for &m in &victims {
                cluster.kill(m);
            }
        });
        tokio::time::sleep(down).await;
        let healthy = tokio::task::block_in_place(|| {
            for &m in &victims {
                cluster.restart(m)?;
            }
            let deadline = Instant::now() + HEALTHY_WITHIN;
            while Instant::now() < deadline {
                if cluster.healthy() {
                    return Ok(true);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok::<_, ChaosError>(false)
        })?;
        if !healthy {
            return Err(ChaosError::timeout(
                format!("etcd cluster healthy again after restarting {what}"),
                HEALTHY_WITHIN,
            ));
        }
        let ready = epoch_ms();
        let now_leading = tokio::task::block_in_place(|| cluster.leader())
            .map_or("?".to_owned(), |l| format!("m{l}"));
        let detail = format!(
            "etcd {what} SIGKILLed, kept down {} ms, restarted on its data (unhealthy {} ms in all; leader now {now_leading})",
            down.as_millis(),
            ready - killed
        );
        Ok((killed, ready, detail))
    }

    /// Copies the members' logs into `logs` (their directory goes with the cluster), then stops
    /// the members (blocking: dropping the cluster waits for them).
    pub(crate) fn stop(self, logs: &Path) {
        for m in 0..3 {
            let _ = std::fs::copy(self.cluster.log(m), logs.join(format!("etcd-m{m}.log")));
        }
    }
}
