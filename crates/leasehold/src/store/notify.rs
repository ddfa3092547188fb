//! Release notifications, shared by every store that can push them (Redis pub/sub, PostgreSQL
//! LISTEN/NOTIFY, the in-memory store).

use std::sync::Arc;

use tokio::sync::{Notify, broadcast, watch};

use crate::store::name::LeaseName;

/// Fan-out of "lease `name` was released" events inside one process. A store feeds it from its
/// notification channel; every waiter holds a [`ReleaseSubscription`].
#[derive(Debug, Clone)]
pub struct ReleaseHub {
    tx: broadcast::Sender<Arc<str>>,
    /// Whether releases are heard now (`None`: always, as in one process).
    live: Option<watch::Receiver<bool>>,
    /// Woken by each new subscription (an on-demand feed waits on it).
    demand: Arc<Notify>,
}

impl Default for ReleaseHub {
    fn default() -> Self {
        Self::new()
    }
}

impl ReleaseHub {
    /// A hub with room for 1024 undelivered events per subscriber; a subscriber that falls
    /// further behind is woken as if its lease had been released, so nothing is missed.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(1024).0,
            live: None,
            demand: Arc::new(Notify::new()),
        }
    }

    /// A hub whose releases are heard only while `live` says so (a feed's connection listens).
    pub(crate) fn with_live(live: watch::Receiver<bool>) -> Self {
        Self {
            live: Some(live),
            ..Self::new()
        }
    }

    /// Announces that `name` was released.
    pub fn publish(&self, name: &str) {
        // No subscribers is fine: nobody is waiting.
        let _ = self.tx.send(name.into());
    }

    /// Starts listening. Events published before this call are not seen.
    pub fn subscribe(&self) -> ReleaseSubscription {
        let rx = self.tx.subscribe();
        self.demand.notify_one();
        ReleaseSubscription {
            rx,
            live: self.live.clone(),
        }
    }

    /// Whether anyone holds a subscription now.
    pub fn has_subscribers(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// Returns once someone holds a subscription (at once if someone does).
    pub async fn wanted(&self) {
        // A subscription taken between the check and the wait leaves a permit: no lost wakeup.
        while !self.has_subscribers() {
            self.demand.notified().await;
        }
    }
}

/// One waiter's view of a [`ReleaseHub`].
#[derive(Debug)]
pub struct ReleaseSubscription {
    rx: broadcast::Receiver<Arc<str>>,
    live: Option<watch::Receiver<bool>>,
}

impl ReleaseSubscription {
    /// Whether releases are heard now. A store that connects its listener only while someone
    /// waits is not live at first, nor while it reconnects: a release in that gap is missed,
    /// so a waiter that saw the lease busy before the listener was live asks again once it is.
    pub fn is_live(&self) -> bool {
        self.live.as_ref().is_none_or(|live| *live.borrow())
    }

    /// Waits until releases are heard (at once where they always are).
    pub async fn live(&mut self) {
        if let Some(live) = &mut self.live {
            // A dropped feed never listens again.
            if live.wait_for(|l| *l).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits until `name` is released (or until events were lost, which counts as a release so
    /// the caller retries). If the store's notification channel closes, this never returns: the
    /// caller's own timeout (the lease's remaining time) then decides.
    pub async fn released(&mut self, name: &LeaseName) {
        loop {
            match self.rx.recv().await {
                Ok(n) if *n == *name.as_str() => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}
