//! The directory of servers of one's own, and what removes it and stops them whatever way their
//! owner ends:
//! - dropping the value that owns it (a failing test unwinds through the drop too) stops the
//!   servers, then removes the directory;
//! - an owner that is never dropped (kept in a static) or whose process dies without unwinding
//!   (exit, SIGKILL, `abort`) leaves it to the directory's watchdog: a shell in a process group
//!   of its own that waits for EOF on a pipe only the owning process holds, then stops the
//!   servers listed in the directory and removes it;
//! - should the watchdog die too, the next directory made removes those whose owning process is
//!   gone, and kills servers still running from them.
//!
//! A server is listed by its pid and its start time (from `/proc/PID/stat`), so a pid the
//! kernel has since given to another process is left alone.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use nix::sys::signal::Signal;

use crate::error::{Error, Result};
use crate::pid::{signal, start_time};

/// Every directory is named `leasehold-servers-PID-KIND-…`, PID being its owning process.
const PREFIX: &str = "leasehold-servers-";
/// The file in a directory listing its servers: `PID START_TIME SIGNAL` lines.
const PIDS: &str = "pids";

/// The signal that stops a server at once, for its watchdog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGKILL.
    Kill,
    /// SIGQUIT first: a PostgreSQL postmaster then ends its backends, which lead sessions of
    /// their own; SIGKILL two seconds later if it is still there.
    Quit,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Self::Kill => "KILL",
            Self::Quit => "QUIT",
        }
    }
}

/// A directory under the system temp dir (never `/dev/shm`: an etcd member preallocates 64 MB
/// write-ahead log files, which would sit in memory there) for servers' files. Its owner stops
/// its servers before dropping it (declares it after them); see the module's notes.
#[derive(Debug)]
pub(crate) struct ServerDir {
    /// The watchdog and the write end of its pipe (closed when this process dies).
    watchdog: Option<(Child, ChildStdin)>,
    dir: tempfile::TempDir,
}

impl ServerDir {
    /// Removes stale directories, makes a new one for servers of `kind` and arms its watchdog.
    pub(crate) fn new(kind: &str) -> Result<Self> {
        let base = std::env::temp_dir();
        remove_stale(&base);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-{kind}-", std::process::id()))
            .tempdir_in(&base)
            .map_err(|e| {
                let what = format!(
                    "cannot create a directory for {kind} under {}",
                    base.display()
                );
                Error::io(what, e)
            })?;
        let mut me = Self {
            watchdog: None,
            dir,
        };
        me.arm_watchdog()?;
        Ok(me)
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A subdirectory of `base` (this directory if `None`), made if missing.
    pub(crate) fn subdir(&self, base: Option<&Path>, name: &str) -> Result<PathBuf> {
        let dir = base.unwrap_or(self.path()).join(name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
        Ok(dir)
    }

    /// Lists the server `pid`, to be stopped with `stop` should this process die.
    pub(crate) fn note(&self, pid: u32, stop: Stop) -> Result<()> {
        let file = self.path().join(PIDS);
        let started = start_time(pid).unwrap_or_else(|| "-".to_owned());
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| writeln!(f, "{pid} {started} {}", stop.name()))
            .map_err(|e| Error::io(format!("cannot write {}", file.display()), e))
    }

    /// Starts the watchdog: once its stdin reaches EOF (this process closed the pipe by dying),
    /// it stops the servers listed and removes the directory. Its own process group keeps it
    /// alive when a test runner kills the test's group.
    fn arm_watchdog(&mut self) -> Result<()> {
        const SCRIPT: &str = r#"d=$1
started() { s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*") "}; set -- $s; echo "${20}"; }
read -r _
quit=
while read -r p t g; do
  [ "$(started "$p")" = "$t" ] || continue
  kill -"$g" "$p" 2>/dev/null
  [ "$g" = QUIT ] && quit=1
done <"$d/pids"
if [ -n "$quit" ]; then
  sleep 2
  while read -r p t g; do [ "$(started "$p")" = "$t" ] && kill -KILL "$p" 2>/dev/null; done <"$d/pids"
fi
rm -rf "$d" 2>/dev/null || { sleep 1; rm -rf "$d"; }"#;
        let mut child = Command::new("sh")
            .args(["-c", SCRIPT, "leasehold-servers-watchdog"])
            .arg(self.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| Error::spawn("the watchdog shell (sh)", "", e))?;
        match child.stdin.take() {
            Some(pipe) => {
                self.watchdog = Some((child, pipe));
                Ok(())
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                let missing = std::io::Error::other("no pipe to its stdin");
                Err(Error::spawn("the watchdog shell (sh)", "", missing))
            }
        }
    }
}

impl Drop for ServerDir {
    fn drop(&mut self) {
        // The servers are stopped: the watchdog is not needed, and the directory goes with
        // `dir`.
        if let Some((mut watchdog, _pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

/// Removes the directories under `base` whose owning process is gone, after killing servers
/// still running from them. Only where `/proc` tells which processes live.
fn remove_stale(base: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let dir = entry.path();
        let pids = std::fs::read_to_string(dir.join(PIDS)).unwrap_or_default();
        for line in pids.lines() {
            let mut fields = line.split_whitespace();
            if let (Some(pid), Some(started)) = (
                fields.next().and_then(|p| p.parse::<u32>().ok()),
                fields.next(),
            ) && start_time(pid).as_deref() == Some(started)
            {
                signal(pid, Signal::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::pid::finished;

    fn gone_within(pid: u32, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if finished(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A directory whose owner died and whose watchdog died with it: the next directory made
    /// kills the server listed in it (whose start time matches) and removes it, and leaves a
    /// process alone whose pid is listed with another start time.
    #[test]
    fn a_stale_directory_is_removed_and_its_server_killed() {
        let mut server = Command::new("sleep").arg("300").spawn().unwrap();
        let mut bystander = Command::new("sleep").arg("300").spawn().unwrap();
        // A pid no process has now: the owner that is gone.
        let mut owner = Command::new("true").spawn().unwrap();
        owner.wait().unwrap();
        let stale = std::env::temp_dir().join(format!("{PREFIX}{}-test-x", owner.id()));
        std::fs::create_dir_all(&stale).unwrap();
        std::fs::write(
            stale.join(PIDS),
            format!(
                "{} {} KILL\n{} 1 KILL\n",
                server.id(),
                start_time(server.id()).unwrap(),
                bystander.id()
            ),
        )
        .unwrap();
        let fresh = ServerDir::new("test").unwrap();
        assert!(!stale.exists());
        server.wait().unwrap();
        assert_eq!(bystander.try_wait().unwrap(), None);
        let _ = bystander.kill();
        let _ = bystander.wait();
        assert!(fresh.path().exists());
        let path = fresh.path().to_owned();
        drop(fresh);
        assert!(!path.exists());
    }

    /// The owner of a directory dies without dropping it (here: the watchdog's pipe closes as
    /// it would at the owner's death): the watchdog SIGQUITs the server listed with QUIT, kills
    /// it when it does not go, and removes the directory.
    #[test]
    fn the_watchdog_stops_the_servers_and_removes_the_directory() {
        let mut dir = ServerDir::new("test").unwrap();
        // Ignores SIGQUIT, as a server slow to go would.
        let mut server = Command::new("sh")
            .args(["-c", "trap '' QUIT; exec sleep 300"])
            .spawn()
            .unwrap();
        let pid = server.id();
        std::thread::sleep(Duration::from_millis(100));
        dir.note(pid, Stop::Quit).unwrap();
        let path = dir.path().to_owned();
        let (mut watchdog, pipe) = dir.watchdog.take().unwrap();
        drop(pipe);
        let status = server.wait().unwrap();
        assert!(!status.success());
        watchdog.wait().unwrap();
        assert!(!path.exists());
        assert!(gone_within(pid, Duration::from_secs(1)));
    }
}
