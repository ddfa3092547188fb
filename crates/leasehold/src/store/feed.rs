//! [`ReleaseFeed`]: a store's release listener, the part every store with a notification channel
//! shares: a background task that keeps one connection listening, reconnecting with backoff
//! whenever it ends, and feeds what it hears to a [`ReleaseHub`]. The store supplies only the
//! connection's life ([`ReleaseSource`]).
//!
//! Releases announced while the feed is reconnecting are missed unless the source catches up on
//! them; waiters then fall back to retrying at the lease's expiry.
//!
//! A feed [on demand](ReleaseFeed::spawn_on_demand) connects only while someone holds a
//! subscription (a waiter waits), and closes its connection once nobody has for a while, so
//! a fleet whose processes mostly hold or do nothing does not wake every process on every
//! release. Its first subscriber is in the same gap as after a reconnect until the connection
//! listens.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use crate::store::notify::{ReleaseHub, ReleaseSubscription};

/// The first pause before reconnecting; it doubles after each attempt that did not get to
/// listen, up to the feed's maximum, and starts afresh once a connection listened.
const MIN_DELAY: Duration = Duration::from_millis(100);

/// The store-specific half of a [`ReleaseFeed`]: what one connection does.
pub trait ReleaseSource: Send + 'static {
    /// One connection's life: connect, start listening, call [`FeedLink::listening`] once
    /// releases are heard, then [`publish`](FeedLink::publish) each released name until the
    /// connection ends. Returns why it ended (or why it never listened), for the log. The feed
    /// calls it again after a pause.
    fn session(&mut self, link: &FeedLink<'_>) -> impl Future<Output = String> + Send;
}

/// What a [`ReleaseSource`] session reports to its feed.
pub struct FeedLink<'a> {
    hub: &'a ReleaseHub,
    live: &'a watch::Sender<bool>,
    settled: &'a watch::Sender<bool>,
    listening: AtomicBool,
    /// Whether the feed had been failing before this session (then regaining it is logged).
    after_failure: bool,
    describe: &'a str,
}

impl FeedLink<'_> {
    /// The session listens now: releases from here on are heard. Resets the reconnect backoff
    /// and ends a [`ReleaseFeed::first_attempt`] wait.
    pub fn listening(&self) {
        let already = self.listening.swap(true, Ordering::Relaxed);
        self.live.send_replace(true);
        if self.after_failure && !already {
            tracing::info!(store = %self.describe, "release notifications restored");
        }
        self.settled.send_replace(true);
    }

    /// Whether [`listening`](Self::listening) was called in this session.
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// Announces that `name` was released.
    pub fn publish(&self, name: &str) {
        self.hub.publish(name);
    }
}

/// A store's release notifications: a [`ReleaseHub`] fed by a background task that runs a
/// [`ReleaseSource`]'s sessions one after another, pausing with exponential backoff (and
/// jitter) between them. Dropping the feed stops the task.
pub struct ReleaseFeed {
    hub: ReleaseHub,
    settled: watch::Receiver<bool>,
    _task: AbortOnDropHandle<()>,
}

impl fmt::Debug for ReleaseFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseFeed")
            .field("settled", &*self.settled.borrow())
            .finish_non_exhaustive()
    }
}

impl ReleaseFeed {
    /// Starts running `source`'s sessions in a background task; the pause between two of them
    /// grows up to `max_delay`. `describe` names the store in log lines (no password). Must be
    /// called within a Tokio runtime.
    pub fn spawn(source: impl ReleaseSource, max_delay: Duration, describe: String) -> Self {
        Self::start(source, max_delay, describe, None)
    }

    /// Like [`spawn`](Self::spawn), but a session runs only while someone holds a
    /// subscription: the first subscription starts one, and it is ended (its connection
    /// closed) once nobody has held one for `linger`, checked every `linger`.
    /// [`first_attempt`](Self::first_attempt) does not wait for a feed that nobody wants.
    pub fn spawn_on_demand(
        source: impl ReleaseSource,
        max_delay: Duration,
        describe: String,
        linger: Duration,
    ) -> Self {
        Self::start(source, max_delay, describe, Some(linger))
    }

    fn start(
        source: impl ReleaseSource,
        max_delay: Duration,
        describe: String,
        linger: Option<Duration>,
    ) -> Self {
        let (live, live_rx) = watch::channel(false);
        let hub = ReleaseHub::with_live(live_rx);
        let (settled_tx, settled) = watch::channel(false);
        let run = run(
            source,
            hub.clone(),
            live,
            settled_tx,
            max_delay,
            describe,
            linger,
        );
        let task = tokio::spawn(run);
        Self {
            hub,
            settled,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// Starts listening for releases. Events published before this call are not seen.
    pub fn subscribe(&self) -> ReleaseSubscription {
        self.hub.subscribe()
    }

    /// Waits, up to `within`, until the first session listens or has ended without listening,
    /// so a subscription taken after a connect hears every later release whenever the server
    /// allows it. The feed goes on trying in the background either way.
    pub async fn first_attempt(&self, within: Duration) {
        let mut settled = self.settled.clone();
        let _ = tokio::time::timeout(within, settled.wait_for(|s| *s)).await;
    }
}

async fn run(
    mut source: impl ReleaseSource,
    hub: ReleaseHub,
    live: watch::Sender<bool>,
    settled: watch::Sender<bool>,
    max_delay: Duration,
    describe: String,
    linger: Option<Duration>,
) {
    let mut delay = MIN_DELAY;
    // Whether the feed is down and has said so (then only its return is logged, once).
    let mut failing = false;
    loop {
        if linger.is_some() && !hub.has_subscribers() {
            // Nobody waits: nothing for a first attempt to wait for either.
            settled.send_replace(true);
            hub.wanted().await;
        }
        let link = FeedLink {
            hub: &hub,
            live: &live,
            settled: &settled,
            listening: AtomicBool::new(false),
            after_failure: failing,
            describe: &describe,
        };
        let reason = match linger {
            None => source.session(&link).await,
            Some(linger) => tokio::select! {
                reason = source.session(&link) => reason,
                () = unwanted(&hub, linger) => {
                    live.send_replace(false);
                    // Dropping the session closed its connection.
                    tracing::debug!(store = %describe, "nobody waits for a release: listener closed");
                    delay = MIN_DELAY;
                    continue;
                }
            },
        };
        live.send_replace(false);
        let listened = link.is_listening();
        settled.send_replace(true);
        if listened {
            delay = MIN_DELAY;
            tracing::warn!(store = %describe, "release notification connection closed, reconnecting: {reason}");
            failing = true;
        } else if !failing {
            tracing::warn!(store = %describe, "release notifications unavailable, waiters poll until they come back; reconnecting: {reason}");
            failing = true;
        } else {
            tracing::debug!(store = %describe, "release listener reconnect failed: {reason}");
        }
        let jitter = fastrand::u64(..=delay.as_millis() as u64 / 2);
        tokio::time::sleep(delay + Duration::from_millis(jitter)).await;
        delay = (delay * 2).min(max_delay);
    }
}

/// Returns once nobody has held a subscription at two checks `linger` apart.
async fn unwanted(hub: &ReleaseHub, linger: Duration) {
    let mut idle_checks = 0;
    loop {
        tokio::time::sleep(linger).await;
        idle_checks = if hub.has_subscribers() {
            0
        } else {
            idle_checks + 1
        };
        if idle_checks == 2 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;
    use crate::store::name::LeaseName;

    /// Session 1 listens, announces `a` and ends; session 2 fails; session 3 listens for good.
    /// Records when each began.
    struct Scripted {
        began: Arc<Mutex<Vec<Instant>>>,
        /// Dropped with the source, so a test sees when the feed's task is gone.
        _alive: Arc<()>,
    }

    impl ReleaseSource for Scripted {
        async fn session(&mut self, link: &FeedLink<'_>) -> String {
            let n = {
                let mut began = self.began.lock().unwrap();
                began.push(Instant::now());
                began.len()
            };
            match n {
                1 => {
                    link.listening();
                    link.publish("a");
                    "closed".into()
                }
                2 => "refused".into(),
                _ => {
                    link.listening();
                    std::future::pending().await
                }
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reconnects_with_backoff_and_stops_when_dropped() {
        let began = Arc::new(Mutex::new(Vec::new()));
        let alive = Arc::new(());
        let source = Scripted {
            began: began.clone(),
            _alive: alive.clone(),
        };
        let feed = ReleaseFeed::spawn(source, Duration::from_secs(5), "test".into());
        // The task has not run yet: this subscription hears the first session's release.
        let mut sub = feed.subscribe();
        feed.first_attempt(Duration::from_secs(1)).await;
        tokio::time::timeout(
            Duration::from_millis(1),
            sub.released(&LeaseName::new("a").unwrap()),
        )
        .await
        .expect("the first session's release reached the subscriber");

        tokio::time::sleep(Duration::from_secs(2)).await;
        let began = began.lock().unwrap().clone();
        assert_eq!(began.len(), 3, "{began:?}");
        // After a session that listened, the shortest pause (plus up to half of it as jitter).
        let first_pause = began[1] - began[0];
        assert!(
            first_pause >= MIN_DELAY && first_pause <= MIN_DELAY * 3 / 2,
            "{first_pause:?}"
        );
        // After one that did not, twice that.
        let second_pause = began[2] - began[1];
        assert!(
            second_pause >= MIN_DELAY * 2 && second_pause <= MIN_DELAY * 3,
            "{second_pause:?}"
        );

        assert_eq!(Arc::strong_count(&alive), 2, "the task runs session 3");
        drop(feed);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            Arc::strong_count(&alive),
            1,
            "dropping the feed ended its task"
        );
    }

    /// Counts sessions begun, and a running session holds a clone of `running` (besides the
    /// source's own and the test's).
    struct Counted {
        begun: Arc<Mutex<usize>>,
        running: Arc<()>,
    }

    impl ReleaseSource for Counted {
        async fn session(&mut self, link: &FeedLink<'_>) -> String {
            *self.begun.lock().unwrap() += 1;
            let _running = self.running.clone();
            link.listening();
            std::future::pending().await
        }
    }

    /// On demand: no session until someone subscribes, one while anyone does, none again
    /// between one and two lingers after the last subscription is dropped, and another for
    /// the next subscriber.
    #[tokio::test(start_paused = true)]
    async fn on_demand_listens_only_while_someone_subscribes() {
        let (begun, running) = (Arc::new(Mutex::new(0)), Arc::new(()));
        let source = Counted {
            begun: begun.clone(),
            running: running.clone(),
        };
        let linger = Duration::from_secs(5);
        let feed =
            ReleaseFeed::spawn_on_demand(source, Duration::from_secs(5), "test".into(), linger);
        let started = Instant::now();
        feed.first_attempt(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "nobody wants the feed");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(*begun.lock().unwrap(), 0, "no session without a subscriber");

        let sub = feed.subscribe();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(*begun.lock().unwrap(), 1);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            Arc::strong_count(&running),
            3,
            "one session while subscribed"
        );

        drop(sub);
        tokio::time::sleep(linger).await;
        assert_eq!(
            Arc::strong_count(&running),
            3,
            "lingers after the last waiter"
        );
        tokio::time::sleep(linger * 2).await;
        assert_eq!(Arc::strong_count(&running), 2, "closed once nobody waits");
        assert_eq!(*begun.lock().unwrap(), 1, "and not started again");

        let _sub = feed.subscribe();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(*begun.lock().unwrap(), 2, "the next waiter starts another");
    }

    /// A first session that fails ends the wait at once rather than at its bound.
    #[tokio::test(start_paused = true)]
    async fn first_attempt_ends_when_the_first_session_fails() {
        struct Refused;
        impl ReleaseSource for Refused {
            async fn session(&mut self, _link: &FeedLink<'_>) -> String {
                tokio::time::sleep(Duration::from_millis(30)).await;
                "refused".into()
            }
        }
        let feed = ReleaseFeed::spawn(Refused, Duration::from_secs(5), "test".into());
        let started = Instant::now();
        feed.first_attempt(Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_millis(30));
    }
}
