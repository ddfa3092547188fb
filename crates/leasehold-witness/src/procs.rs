//! Processes: the replicas (`leasehold run`) the demo and the chaos harness start, and the
//! signals and `/proc` readings both use on them and on what runs under them.

use std::io;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Milliseconds since the Unix epoch.
pub fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn pid(raw: u32) -> Pid {
    Pid::from_raw(i32::try_from(raw).unwrap_or(i32::MAX))
}

/// Sends `sig` to a process; false if it is gone.
pub fn signal(raw: u32, sig: Signal) -> bool {
    kill(pid(raw), sig).is_ok()
}

/// Whether a process exists (signal 0).
pub fn signal_exists(raw: u32) -> bool {
    kill(pid(raw), None).is_ok()
}

/// Sends `sig` to the process group led by `raw` (the runner starts each command as the leader
/// of its own group); false if it is gone.
pub fn signal_group(raw: u32, sig: Signal) -> bool {
    killpg(pid(raw), sig).is_ok()
}

/// The direct children of a process, from `/proc/<pid>/task/*/children`, or by scanning
/// `/proc/*/stat` where the kernel has no such file.
pub fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut found_file = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                found_file = true;
                out.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<u32>().ok()),
                );
            }
        }
    }
    if found_file {
        return out;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(child) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if parent_of(child) == Some(parent) {
            out.push(child);
        }
    }
    out
}

/// The parent pid from `/proc/<pid>/stat`.
fn parent_of(raw: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{raw}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may contain spaces, so split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a process is a zombie or gone (its state in `/proc/<pid>/stat`).
pub fn finished(raw: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{raw}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next().map(str::to_owned));
    matches!(state.as_deref(), None | Some("Z") | Some("X"))
}

/// How many threads a process has (`Threads:` in `/proc/<pid>/status`); 0 if it is gone.
pub fn threads_of(raw: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{raw}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One variable of a process's environment.
pub fn env_of(raw: u32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{raw}/environ")).ok()?;
    let prefix = format!("{key}=");
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        kv.strip_prefix(&prefix).map(str::to_owned)
    })
}

/// A replica: one `leasehold run` process.
#[derive(Debug)]
pub struct Replica {
    /// Its row in the timeline (a replacement takes the row of the replica it replaces).
    pub row: usize,
    /// How many replicas had this row before it.
    pub generation: usize,
    /// Its holder id (`r<row>.<generation>`).
    pub holder: String,
    /// Its pid.
    pub pid: u32,
    /// When it started, ms since the Unix epoch.
    pub started_ms: u64,
    /// When it was seen to exit, ms since the Unix epoch.
    pub ended_ms: Option<u64>,
    /// Its exit status, once it exited.
    pub exit: Option<String>,
    child: Child,
}

impl Replica {
    /// The chaos harness's holder id of a replica in `row`, generation `generation`.
    pub fn holder_id(row: usize, generation: usize) -> String {
        format!("r{row}.{generation}")
    }

    /// The timeline row of a holder id made by [`holder_id`](Self::holder_id).
    pub fn row_of(holder: &str) -> Option<usize> {
        holder.strip_prefix('r')?.split('.').next()?.parse().ok()
    }

    /// Starts `command` (a `leasehold run … --holder HOLDER` with its arguments, environment
    /// and process group set) as the replica `holder` in `row`, its stdout and stderr written to
    /// a new file `log`, with `LEASEHOLD_LOG=info`; it is killed if dropped while running.
    pub fn spawn(
        row: usize,
        generation: usize,
        holder: String,
        mut command: Command,
        log: &Path,
    ) -> io::Result<Self> {
        let out = std::fs::File::create(log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("LEASEHOLD_LOG", "info")
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| io::Error::other("the replica exited at once"))?;
        Ok(Self {
            row,
            generation,
            holder,
            pid,
            started_ms: epoch_ms(),
            ended_ms: None,
            exit: None,
            child,
        })
    }

    /// Whether it is still running (reaps it and records its status if not).
    pub fn alive(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                self.exited(status.to_string());
                false
            }
            Err(e) => {
                self.exited(format!("unknown ({e})"));
                false
            }
        }
    }

    fn exited(&mut self, status: String) {
        self.exit = Some(status);
        self.ended_ms = Some(epoch_ms());
    }

    /// The process groups of the commands it is running right now: `leasehold run` starts each
    /// command under a supervisor that leads the command's group.
    pub fn command_groups(&self) -> Vec<u32> {
        if self.exit.is_some() {
            return Vec::new();
        }
        children_of(self.pid)
    }

    /// SIGKILL of its commands' process groups and of the replica itself.
    pub fn kill_all(&mut self) {
        for g in self.command_groups() {
            signal_group(g, Signal::SIGKILL);
        }
        let _ = self.child.start_kill();
    }

    /// Waits for it to exit, up to `limit`; true if it did.
    pub async fn wait(&mut self, limit: Duration) -> bool {
        if self.exit.is_some() {
            return true;
        }
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.exited(status.to_string());
                true
            }
            Ok(Err(e)) => {
                self.exited(format!("unknown ({e})"));
                true
            }
            Err(_) => false,
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.exit.is_none() {
            // Commands first: they are in their own process groups and would outlive us.
            for c in children_of(self.pid) {
                signal_group(c, Signal::SIGCONT);
                signal_group(c, Signal::SIGKILL);
            }
            let _ = self.child.start_kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_name_their_row() {
        let h = Replica::holder_id(3, 2);
        assert_eq!(h, "r3.2");
        assert_eq!(Replica::row_of(&h), Some(3));
        assert_eq!(Replica::row_of("host:1:abc"), None);
    }

    #[tokio::test]
    async fn children_and_environment_are_read_from_proc() {
        let mut child = Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .env("CHAOS_PROBE", "42")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        // The parent can resume before exec has set up the new environment in /proc.
        let mut probe = None;
        for _ in 0..100 {
            probe = env_of(pid, "CHAOS_PROBE");
            if probe.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(probe.as_deref(), Some("42"));
        let mut kids = Vec::new();
        for _ in 0..100 {
            kids = children_of(pid);
            if !kids.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kids.len(), 1);
        assert_eq!(parent_of(kids[0]), Some(pid));
        assert!(!finished(pid));
        assert_eq!(threads_of(pid), 1);
        for k in kids {
            signal(k, Signal::SIGKILL);
        }
        child.wait().await.unwrap();
        assert!(finished(pid));
    }
}
