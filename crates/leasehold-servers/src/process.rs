//! One server process, and the waits on it: started (again) from a command its launcher builds,
//! its output appended to its log, which failures quote; SIGKILLed on drop.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::dir::{ServerDir, Stop};
use crate::error::{Error, Result};
use crate::pid::signal;

/// Where a server's log is, and its last lines (on one line: this ends up in an error message).
pub(crate) fn see_log(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    format!("see {} (last lines: {tail})", log.display())
}

/// `log` opened for appending, twice: a process's standard output and error.
pub(crate) fn append_to(log: &Path) -> Result<(File, File)> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|f| Ok((f.try_clone()?, f)))
        .map_err(|e| Error::io(format!("cannot open {}", log.display()), e))
}

/// A server process of one's own; `None` between a stop and the next start.
#[derive(Debug)]
pub(crate) struct Process {
    /// What the server is called in errors: `redis-server`, `postgres`, …
    server: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    pub(crate) fn new(server: &'static str, log: PathBuf) -> Self {
        Self {
            server,
            log,
            child: None,
        }
    }

    pub(crate) fn log(&self) -> &Path {
        &self.log
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `command` with no standard input and its output appended to the log, and lists it
    /// in `dir` for the watchdog; `note` goes after the program's name if it cannot start.
    pub(crate) fn spawn(
        &mut self,
        mut command: Command,
        dir: &ServerDir,
        stop: Stop,
        note: &str,
    ) -> Result<()> {
        let (out, err) = append_to(&self.log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::spawn(command.get_program(), note, e))?;
        let pid = child.id();
        self.child = Some(child);
        dir.note(pid, stop)
    }

    /// Its exit status, if it has exited (it is then forgotten).
    fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Sends `sig`; false if it is not running.
    pub(crate) fn signal(&self, sig: Signal) -> bool {
        self.pid().is_some_and(|pid| signal(pid, sig))
    }

    /// SIGKILL, and waits for it to end.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `grace` for it to end (it was told to); SIGKILLs it if it does not. Whether
    /// it ended within `grace`.
    pub(crate) fn wait_for_exit(&mut self, grace: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !matches!(child.try_wait(), Ok(None)) {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Asks `ready` every `every` until it says yes: an error quoting the log of any of `watched`
/// that exits first, or, after `limit`, naming `what` and where the logs are.
pub(crate) fn wait_until(
    what: &str,
    limit: Duration,
    every: Duration,
    watched: &mut [&mut Process],
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        for process in watched.iter_mut() {
            if let Some(status) = process.exited() {
                let problem = format!(
                    "exited with {status} (waiting for {what}); {}",
                    see_log(&process.log)
                );
                return Err(Error::server(process.server, problem));
            }
        }
        if ready() {
            return Ok(());
        }
        if start.elapsed() > limit {
            let log = match watched {
                [] => None,
                [one] => Some(see_log(&one.log)),
                [first, ..] => first
                    .log
                    .parent()
                    .map(|dir| format!("see the logs in {}", dir.display())),
            };
            return Err(Error::Timeout {
                what: what.to_owned(),
                waited: limit,
                log,
            });
        }
        std::thread::sleep(every);
    }
}

/// Runs a tool to its end, for at most `limit` (then it is killed): its exit status, if it
/// ended in time.
pub(crate) fn run_within(
    command: &mut Command,
    limit: Duration,
    note: &str,
) -> Result<Option<ExitStatus>> {
    let mut child = command
        .spawn()
        .map_err(|e| Error::spawn(command.get_program(), note, e))?;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| Error::io(format!("cannot wait for {:?}", command.get_program()), e))?
        {
            return Ok(Some(status));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pid::finished;

    /// A server that exits while it is waited for is reported at once with the end of its
    /// log; one that never gets ready, after the limit with the end of its log.
    #[test]
    fn waits_quote_the_log_of_a_server_that_exits_or_never_gets_ready() {
        let dir = ServerDir::new("test").unwrap();
        let log = dir.path().join("server.log");
        let mut process = Process::new("test-server", log.clone());
        let mut command = Command::new("sh");
        command.args(["-c", "echo starting; echo 'bad config line 3' >&2; exit 3"]);
        process.spawn(command, &dir, Stop::Kill, "").unwrap();
        let started = Instant::now();
        let err = wait_until(
            "it to answer",
            Duration::from_secs(30),
            Duration::from_millis(20),
            &mut [&mut process],
            || false,
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let said = err.to_string();
        assert!(
            said.starts_with("test-server: exited with exit status: 3"),
            "{said}"
        );
        assert!(
            said.ends_with("(last lines: starting | bad config line 3)"),
            "{said}"
        );
        assert!(said.contains(&log.display().to_string()), "{said}");

        let mut command = Command::new("sh");
        command.args(["-c", "echo still loading; exec sleep 300"]);
        process.spawn(command, &dir, Stop::Kill, "").unwrap();
        let pid = process.pid().unwrap();
        let err = wait_until(
            "it to answer",
            Duration::from_millis(200),
            Duration::from_millis(20),
            &mut [&mut process],
            || false,
        )
        .unwrap_err();
        let said = err.to_string();
        assert!(
            said.starts_with("it to answer did not happen within 200ms; see "),
            "{said}"
        );
        assert!(said.ends_with("| still loading)"), "{said}");
        drop(process);
        assert!(finished(pid));
    }

    #[test]
    fn a_program_that_cannot_start_is_named() {
        let dir = ServerDir::new("test").unwrap();
        let mut process = Process::new("x", dir.path().join("x.log"));
        let err = process
            .spawn(
                Command::new("/nonexistent/redis-server"),
                &dir,
                Stop::Kill,
                " (is Redis installed?)",
            )
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot start /nonexistent/redis-server (is Redis installed?)"
        );
    }
}
