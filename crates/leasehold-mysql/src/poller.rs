//! Release notifications without a server push: MySQL has no LISTEN/NOTIFY, so a release stamps
//! its row's `released_at` (indexed, NULL while the lease is held), and a poller per store handle
//! reads, on a connection of its own, the leases released since its last read: one index range
//! scan that is empty while nothing was released. What it reads goes to a [`ReleaseHub`].
//!
//! A release's stamp is taken before its commit, so a release can become visible after a later
//! one the poller already read. Each read therefore reaches back a little ([`Poller::margin`])
//! before the newest stamp seen, and every [`SLOW_EVERY`]th read reaches back a whole window
//! (the operation timeout, which bounds a release statement) behind the server's clock; what it
//! announced within the window it remembers, so each release is announced once. A release that
//! became visible later than the margin is announced by the next slow read, up to a second
//! late; one whose commit lagged its stamp by more than the window is not announced, and its
//! waiters retry at the lease's expiry. While nothing is released, every read is empty.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::store::ReleaseHub;
use leasehold_sql::lazy::Readiness;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::config::MySqlConfig;

/// Every how many reads one reaches back the whole window.
const SLOW_EVERY: u32 = 20;

/// 9999-12-31 23:59:59 in µs since the epoch: DATETIME's last second, after every release.
const FAR_FUTURE_US: i64 = 253_402_300_799_000_000;

/// Releases this store handle made and announced itself, by lease name, so its poller does not
/// announce them again. Entries older than [`LocalReleases::HORIZON`] are forgotten (the poller
/// missed them), so they never hide a later release by someone else.
#[derive(Debug, Default, Clone)]
pub(crate) struct LocalReleases(Arc<Mutex<HashMap<String, Vec<Instant>>>>);

impl LocalReleases {
    const HORIZON: Duration = Duration::from_secs(30);

    /// Notes a release of `name` made here.
    pub(crate) fn note(&self, name: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.to_owned()).or_default().push(Instant::now());
    }

    /// Whether a release of `name` the poller read was one made here (then it is forgotten).
    fn take(&self, name: &str) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, at| {
            at.retain(|t| t.elapsed() < Self::HORIZON);
            !at.is_empty()
        });
        match map.get_mut(name) {
            Some(at) => {
                at.remove(0);
                if at.is_empty() {
                    map.remove(name);
                }
                true
            }
            None => false,
        }
    }
}

/// The running poller: its hub, and whether its first attempt to read has ended.
pub(crate) struct Feed {
    pub(crate) hub: ReleaseHub,
    settled: watch::Receiver<bool>,
    _task: AbortOnDropHandle<()>,
}

impl Feed {
    /// Waits, up to `within`, until the poller has read once (or failed to), so a subscription
    /// taken after a connect hears every later release whenever the server allows it.
    pub(crate) async fn first_attempt(&self, within: Duration) {
        let mut settled = self.settled.clone();
        let _ = tokio::time::timeout(within, settled.wait_for(|s| *s)).await;
    }
}

/// Starts the poller in the background; it stops when the [`Feed`] is dropped.
pub(crate) fn start(
    opts: Opts,
    sql: String,
    config: &MySqlConfig,
    url: &str,
    local: LocalReleases,
    ready: watch::Receiver<Readiness>,
) -> Feed {
    let hub = ReleaseHub::new();
    let (settled_tx, settled) = watch::channel(false);
    let poller = Poller::new(opts, sql, config, url, hub.clone(), local);
    let task = tokio::spawn(async move {
        // The table it reads exists once the store's migration ran: polling before (a lazy
        // store on a fresh database) would only warn that the table does not exist.
        let mut ready = ready;
        if ready
            .wait_for(|r| matches!(r, Readiness::Ready))
            .await
            .is_ok()
        {
            poller.run(settled_tx).await;
        }
    });
    Feed {
        hub,
        settled,
        _task: AbortOnDropHandle::new(task),
    }
}

struct Poller {
    opts: Opts,
    /// [`Statements::releases_since`](crate::Statements::releases_since).
    sql: String,
    interval: Duration,
    window_us: i64,
    /// How far before the newest stamp seen each read reaches back: the poll interval, at least
    /// 100 ms.
    margin_us: i64,
    connect_timeout: Duration,
    max_delay: Duration,
    url: String,
    hub: ReleaseHub,
    local: LocalReleases,
    /// The server's clock at the first read: releases before it are not announced.
    floor: Option<i64>,
    /// The newest release stamp read, µs since the epoch.
    newest: i64,
    /// The server's clock at the last read.
    now: i64,
    /// Reads so far (every [`SLOW_EVERY`]th reaches back the whole window).
    reads: u32,
    /// Releases announced (or skipped as local) within the window.
    seen: HashSet<(String, i64)>,
}

impl Poller {
    /// A poller that has read nothing yet.
    fn new(
        opts: Opts,
        sql: String,
        config: &MySqlConfig,
        url: &str,
        hub: ReleaseHub,
        local: LocalReleases,
    ) -> Self {
        Self {
            opts,
            sql,
            interval: config.notify_poll_interval,
            window_us: i64::try_from(config.op_timeout.as_micros()).unwrap_or(i64::MAX),
            margin_us: i64::try_from(
                config
                    .notify_poll_interval
                    .max(Duration::from_millis(100))
                    .as_micros(),
            )
            .unwrap_or(i64::MAX),
            connect_timeout: config.connect_timeout,
            max_delay: config.max_reconnect_delay,
            url: url.to_owned(),
            hub,
            local,
            floor: None,
            newest: 0,
            now: 0,
            reads: 0,
            seen: HashSet::new(),
        }
    }

    async fn run(mut self, settled: watch::Sender<bool>) {
        let mut delay = Duration::from_millis(100);
        let mut failing = false;
        loop {
            let reason = match tokio::time::timeout(
                self.connect_timeout,
                Conn::new(self.opts.clone()),
            )
            .await
            {
                Err(_) => "connect timed out".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(mut conn)) => {
                    let reason = self.session(&mut conn, &settled, &mut failing).await;
                    let _ = tokio::time::timeout(self.connect_timeout, conn.disconnect()).await;
                    delay = Duration::from_millis(100);
                    reason
                }
            };
            settled.send_replace(true);
            if !std::mem::replace(&mut failing, true) {
                tracing::warn!(url = %self.url, "release poller lost its connection, waiters retry at expiry until it is back: {reason}");
            } else {
                tracing::debug!(url = %self.url, "release poller reconnect failed: {reason}");
            }
            let jitter = Duration::from_millis(fastrand::u64(..=delay.as_millis() as u64 / 2));
            tokio::time::sleep(delay + jitter).await;
            delay = (delay * 2).min(self.max_delay);
        }
    }

    /// Reads every interval until a read fails; returns why.
    async fn session(
        &mut self,
        conn: &mut Conn,
        settled: &watch::Sender<bool>,
        failing: &mut bool,
    ) -> String {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let since = self.since();
            let read = tokio::time::timeout(
                self.connect_timeout,
                conn.exec::<Row, _, _>(self.sql.as_str(), (since,)),
            )
            .await;
            let rows = match read {
                Err(_) => return "read timed out".to_owned(),
                Ok(Err(e)) => return e.to_string(),
                Ok(Ok(rows)) => rows,
            };
            if std::mem::replace(failing, false) {
                tracing::info!(url = %self.url, "release poller reconnected");
            }
            let rows = rows.iter().filter_map(|row| {
                let name = row.get_opt::<Option<String>, usize>(0)?.ok()?;
                let at = row.get_opt::<i64, usize>(1)?.ok()?;
                Some((name, at))
            });
            self.absorb(rows);
            settled.send_replace(true);
        }
    }

    /// Announces the releases among `rows` (`(name, stamp)`, and `(None, server now)`) not
    /// announced before, and moves the window. Returns the names it announced.
    fn absorb(&mut self, rows: impl IntoIterator<Item = (Option<String>, i64)>) -> Vec<String> {
        let mut now = None;
        let mut announced = Vec::new();
        for (name, at) in rows {
            match name {
                None => now = Some(at),
                Some(name) => {
                    self.newest = self.newest.max(at);
                    if self.floor.is_some_and(|f| at <= f) || !self.seen.insert((name.clone(), at))
                    {
                        continue;
                    }
                    if !self.local.take(&name) {
                        self.hub.publish(&name);
                        announced.push(name);
                    }
                }
            }
        }
        let Some(now) = now else {
            return announced;
        };
        self.floor.get_or_insert(now);
        self.now = now;
        self.reads = self.reads.wrapping_add(1);
        let window_start = now - self.window_us;
        self.seen.retain(|(_, at)| *at > window_start);
        announced
    }

    /// What the next read asks for: releases stamped after this (µs since the epoch).
    fn since(&self) -> i64 {
        // Before the first read nothing is asked for: only the server's clock.
        let Some(floor) = self.floor else {
            return FAR_FUTURE_US;
        };
        let window_start = self.now - self.window_us;
        // Never before the window: what lies there was forgotten, and would be announced again.
        let since = if self.reads.is_multiple_of(SLOW_EVERY) {
            window_start
        } else {
            (self.newest - self.margin_us).max(window_start)
        };
        since.max(floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1000;

    fn poller(local: LocalReleases) -> Poller {
        let config = MySqlConfig::new("mysql://h/db");
        let p = Poller::new(
            Opts::default(),
            String::new(),
            &config,
            "",
            ReleaseHub::new(),
            local,
        );
        Poller {
            window_us: 2000 * MS,
            margin_us: 100 * MS,
            ..p
        }
    }

    /// One read at server time `now` of the free leases `released` (name, stamp), as the
    /// server would answer it; returns the names announced.
    fn read(p: &mut Poller, now: i64, released: &[(&str, i64)]) -> Vec<String> {
        let since = p.since();
        let rows: Vec<(Option<String>, i64)> = released
            .iter()
            .filter(|(_, at)| *at > since)
            .map(|(n, at)| (Some((*n).to_owned()), *at))
            .chain([(None, now)])
            .collect();
        p.absorb(rows)
    }

    #[test]
    fn each_release_is_announced_once_and_late_commits_are_caught_up() {
        let local = LocalReleases::default();
        let mut p = poller(local.clone());
        let t = 1_800_000_000_000 * MS;
        // The first read only learns the server's clock: a release before it is not announced.
        assert_eq!(p.since(), FAR_FUTURE_US);
        assert!(read(&mut p, t, &[("a", t - 10 * MS)]).is_empty());
        // A release after it is announced, and not again while it is in the window.
        let rows = [("a", t - 10 * MS), ("b", t + 300 * MS)];
        assert_eq!(read(&mut p, t + 350 * MS, &rows), ["b"]);
        assert!(read(&mut p, t + 400 * MS, &rows).is_empty());
        // Committed late, stamped within the margin before the newest stamp: the next read.
        let rows = [("b", t + 300 * MS), ("c", t + 250 * MS)];
        assert_eq!(read(&mut p, t + 450 * MS, &rows), ["c"]);
        // Stamped before the margin: the next slow read (one in SLOW_EVERY) announces it.
        let late = [
            ("b", t + 300 * MS),
            ("c", t + 250 * MS),
            ("d", t + 150 * MS),
        ];
        let mut heard = Vec::new();
        let mut now = t + 500 * MS;
        for _ in 0..SLOW_EVERY {
            heard.extend(read(&mut p, now, &late));
            now += 50 * MS;
        }
        assert_eq!(heard, ["d"]);
        // Idle: the reads move with the server's clock and stay empty.
        now += 5000 * MS;
        assert!(read(&mut p, now, &late).is_empty());
        assert!(p.since() >= now - 2000 * MS, "{} vs {now}", p.since());
        // A release this handle made and announced itself is skipped once.
        local.note("a");
        assert!(read(&mut p, now + 50 * MS, &[("a", now + 10 * MS)]).is_empty());
        let rows = [("a", now + 10 * MS), ("a", now + 60 * MS)];
        assert_eq!(read(&mut p, now + 100 * MS, &rows), ["a"]);
    }
}
