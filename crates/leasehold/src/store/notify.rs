//! Release notifications, shared by every store that can push them (Redis pub/sub, PostgreSQL
//! LISTEN/NOTIFY, the in-memory store).

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::store::name::LeaseName;

/// Fan-out of "lease `name` was released" events inside one process. A store feeds it from its
/// notification channel; every waiter holds a [`ReleaseSubscription`].
#[derive(Debug, Clone)]
pub struct ReleaseHub {
    tx: broadcast::Sender<Arc<str>>,
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
        }
    }

    /// Announces that `name` was released.
    pub fn publish(&self, name: &str) {
        // No subscribers is fine: nobody is waiting.
        let _ = self.tx.send(name.into());
    }

    /// Starts listening. Events published before this call are not seen.
    pub fn subscribe(&self) -> ReleaseSubscription {
        ReleaseSubscription {
            rx: self.tx.subscribe(),
        }
    }
}

/// One waiter's view of a [`ReleaseHub`].
#[derive(Debug)]
pub struct ReleaseSubscription {
    rx: broadcast::Receiver<Arc<str>>,
}

impl ReleaseSubscription {
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
