//! Release notifications without a server push: MySQL has no LISTEN/NOTIFY, so a release stamps
//! its row's `released_at` (indexed, NULL while the lease is held), and a poller per store handle
//! reads, on a connection of its own, the leases released since its last read: one index range
//! scan that is empty while nothing was released. What it reads goes to a [`ReleaseHub`].
//!
//! A release's stamp is taken before its commit, so a release can become visible after a later
//! one the poller already read. The poller therefore reads back a window (the operation
//! timeout, which bounds a release statement) behind the server's clock, and remembers what it
//! announced within it, so each release is announced once. A release whose commit lags its
//! stamp by more than the window is not announced; its waiters retry at the lease's expiry.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::store::ReleaseHub;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::config::MySqlConfig;

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
) -> Feed {
    let hub = ReleaseHub::new();
    let (settled_tx, settled) = watch::channel(false);
    let poller = Poller {
        opts,
        sql,
        interval: config.notify_poll_interval,
        window_us: i64::try_from(config.op_timeout.as_micros()).unwrap_or(i64::MAX),
        connect_timeout: config.connect_timeout,
        max_delay: config.max_reconnect_delay,
        url: url.to_owned(),
        hub: hub.clone(),
        local,
        floor: None,
        since: 0,
        seen: HashSet::new(),
    };
    let task = tokio::spawn(poller.run(settled_tx));
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
    connect_timeout: Duration,
    max_delay: Duration,
    url: String,
    hub: ReleaseHub,
    local: LocalReleases,
    /// The server's clock at the first read: releases before it are not announced.
    floor: Option<i64>,
    /// The next read asks for releases stamped after this (µs since the epoch).
    since: i64,
    /// Releases announced (or skipped as local) with stamps after `since`.
    seen: HashSet<(String, i64)>,
}

impl Poller {
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
            let since = match self.floor {
                // Before the first read nothing is asked for: only the server's clock.
                None => FAR_FUTURE_US,
                Some(_) => self.since,
            };
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
            self.absorb(&rows);
            settled.send_replace(true);
        }
    }

    /// Announces the releases in `rows` not announced before, and moves the window.
    fn absorb(&mut self, rows: &[Row]) {
        let mut now = None;
        for row in rows {
            let name = row
                .get_opt::<Option<String>, usize>(0)
                .and_then(Result::ok)
                .flatten();
            let Some(at) = row.get_opt::<i64, usize>(1).and_then(Result::ok) else {
                continue;
            };
            match name {
                None => now = Some(at),
                Some(name) => {
                    if self.floor.is_some_and(|f| at <= f) || !self.seen.insert((name.clone(), at))
                    {
                        continue;
                    }
                    if !self.local.take(&name) {
                        self.hub.publish(&name);
                    }
                }
            }
        }
        let Some(now) = now else { return };
        let floor = *self.floor.get_or_insert(now);
        self.since = (now - self.window_us).max(floor);
        let since = self.since;
        self.seen.retain(|(_, at)| *at > since);
    }
}
