//! Child processes: the watchdog of the replicas; the replicas and the signals and `/proc`
//! readings on what runs under them are leasehold-witness's, the store servers
//! leasehold-servers's.

use std::path::{Path, PathBuf};
use std::process::Stdio;

pub use leasehold_witness::procs::{
    Replica, children_of, env_of, epoch_ms, finished, signal, signal_group, threads_of,
};
use tokio::process::{Child, Command};

use crate::error::{ChaosError, Result};

/// The watchdog: a shell that leads the process group of every replica the harness starts.
/// Should the harness die without cleaning up (SIGKILL), it kills that group, and the process
/// groups of paused commands listed in its file. (The store servers have watchdogs of their
/// own, leasehold-servers's.)
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    group: i32,
    paused: PathBuf,
}

impl Watchdog {
    /// Starts the watchdog of this process; `paused` is the file of paused process groups.
    pub fn start(paused: &Path) -> Result<Self> {
        const SCRIPT: &str = r#"h=$1; f=$2
while kill -0 "$h" 2>/dev/null; do sleep 0.5; done
for g in $(cat "$f" 2>/dev/null); do kill -CONT -"$g"; kill -KILL -"$g"; done 2>/dev/null
kill -KILL 0"#;
        let child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg("leasehold-chaos-watchdog")
            .arg(std::process::id().to_string())
            .arg(paused)
            // Its `sleep` outlives a killed shell by up to half a second: it must not hold the
            // harness's stdout or stderr open.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ChaosError::spawn("the watchdog shell (sh)", "", e))?;
        let group = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| {
                let gone = std::io::Error::other("it exited at once");
                ChaosError::spawn("the watchdog shell (sh)", "", gone)
            })?;
        Ok(Self {
            child,
            group,
            paused: paused.to_owned(),
        })
    }

    /// The process group children join.
    pub fn group(&self) -> i32 {
        self.group
    }

    /// Records a process group about to be paused, so the watchdog can end it.
    pub fn note_paused(&self, group: u32) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.paused)
        {
            let _ = writeln!(f, "{group}");
        }
    }

    /// Forgets the paused groups (they were resumed; their ids may be reused).
    pub fn clear_paused(&self) {
        let _ = std::fs::write(&self.paused, "");
    }

    /// Stops the watchdog (its group's members are left alone).
    pub fn stop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// What the tests of the store-restart fault share.
#[cfg(test)]
pub(crate) mod testing {
    use std::time::Duration;

    use leasehold::{HolderId, LeaseName, Store, store::Acquisition};

    /// Takes a lease on `store`, runs `crash` (a crash and restart of its server), and checks
    /// that once the store has reconnected the lease is there as it was.
    pub(crate) async fn a_lease_survives(store: &impl Store, crash: impl AsyncFnOnce()) {
        let (name, holder) = (
            LeaseName::new("crash").unwrap(),
            HolderId::new("h").unwrap(),
        );
        let ttl = Duration::from_secs(600);
        let Acquisition::Acquired { token } = store.acquire(&name, &holder, ttl).await.unwrap()
        else {
            panic!("a fresh lease is free");
        };
        crash().await;
        // The store's pooled connections broke with the crash; a retry gets a new one.
        let mut state = None;
        for _ in 0..50 {
            if let Ok(s) = store.inspect(&name).await {
                state = s;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let state = state.expect("the lease survived the crash");
        assert_eq!(state.token, token);
        assert_eq!(state.holder.as_ref(), Some(&holder));
    }
}
