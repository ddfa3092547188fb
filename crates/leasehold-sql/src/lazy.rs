//! A store that connects in the background (`connect_lazy`): it is handed out at once, and
//! answers every operation as far as connecting has got, so a service starts while its
//! database is down and its first answers already tell a refusal from an outage.

use std::sync::Weak;
use std::time::Duration;

use leasehold::StoreError;
use leasehold::store::{Operation, SetupError, StoreResult, StoreSetupError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Causes;

/// How far a lazily connecting store has got. Operations wait while the first attempt is
/// under way ([`check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The first connection attempt has not ended.
    Connecting,
    /// The last attempt could not reach the server: operations are `Unavailable`.
    Unreachable,
    /// The last attempt was refused (credentials, no such database, no privilege): operations
    /// are `Rejected` with this reason while attempts go on.
    Refused(String),
    /// The tables cannot be used, or the server refused their migration: every operation is
    /// `Rejected` with this reason, for good.
    Unusable(String),
    /// Connected, and the tables checked.
    Ready,
}

/// Why an attempt to connect failed, as [`spawn`]'s loop acts on it.
#[derive(Debug)]
pub enum Failure {
    /// The server refused the connection: operations are `Rejected` with its message while
    /// attempts go on, so a fix on the server is picked up.
    Refused(StoreError),
    /// The store can never work (the reason, already logged by the store): attempts stop.
    Unusable(String),
    /// The server could not be reached (the reason, for the log): attempts go on.
    Unreachable(String),
}

/// Waits for the first attempt to end, then answers for `op` on the store at `url`: `Ok` once
/// connected, else the error the store's [`Readiness`] calls for.
pub async fn check(
    ready: &watch::Receiver<Readiness>,
    op: Operation<'_>,
    url: &str,
) -> StoreResult<()> {
    let mut ready = ready.clone();
    // An error means the connecting task is gone (its store is being dropped).
    let _ = ready.wait_for(|r| *r != Readiness::Connecting).await;
    let readiness = ready.borrow().clone();
    match readiness {
        Readiness::Ready => Ok(()),
        Readiness::Refused(refusal) | Readiness::Unusable(refusal) => Err(StoreError::Rejected {
            message: format!("{op}: {refusal}"),
            source: None,
        }),
        Readiness::Connecting | Readiness::Unreachable => Err(StoreError::Unavailable {
            message: format!("{op}: not connected to {url} yet"),
            source: None,
        }),
    }
}

/// Connects in the background until an attempt succeeds or finds the store unusable, with
/// backoff from 100 ms up to `max_delay` (plus up to 100 ms of jitter), publishing each
/// outcome on `ready`. `attempt` gets the store's shared state for the start of each attempt
/// (it keeps none of it: the loop ends once the store is dropped); `judge` says what a failed
/// attempt means. `server` (`mysql`, `postgres`) and `url` name the server in the log.
pub fn spawn<I, E, F, Fut, J>(
    store: Weak<I>,
    ready: watch::Sender<Readiness>,
    server: &'static str,
    url: String,
    max_delay: Duration,
    mut attempt: F,
    mut judge: J,
) -> JoinHandle<()>
where
    I: Send + Sync + 'static,
    E: Send + 'static,
    F: FnMut(&I) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), E>> + Send,
    J: FnMut(E) -> Failure + Send + 'static,
{
    tokio::spawn(async move {
        let mut delay = Duration::from_millis(100);
        let mut warned = false;
        loop {
            let Some(outcome) = store.upgrade().map(|s| attempt(&s)) else {
                return;
            };
            let outcome = outcome.await;
            if store.strong_count() == 0 {
                return;
            }
            match outcome.map_err(&mut judge) {
                Ok(()) => {
                    tracing::info!(url = %url, "connected to {server}");
                    ready.send_replace(Readiness::Ready);
                    return;
                }
                Err(Failure::Refused(source)) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(url = %url, error = %source, "{server} refuses the connection; operations are refused until it accepts it; retrying in the background");
                    }
                    let reason = match &source {
                        StoreError::Rejected { message, .. } => message.clone(),
                        other => other.to_string(),
                    };
                    ready.send_replace(Readiness::Refused(format!(
                        "{server} refused the connection: {reason}"
                    )));
                }
                Err(Failure::Unusable(reason)) => {
                    ready.send_replace(Readiness::Unusable(reason));
                    return;
                }
                Err(Failure::Unreachable(reason)) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(url = %url, error = %reason, "{server} not reachable yet; retrying in the background");
                    }
                    ready.send_replace(Readiness::Unreachable);
                }
            }
            tokio::time::sleep(delay + Duration::from_millis(fastrand::u64(0..100))).await;
            delay = (delay * 2).min(max_delay);
        }
    })
}

/// How [`spawn`]'s loop acts on a SQL store's failed setup: a refused connection or a missing
/// database is `Refused` (a fix on the server is picked up); any other error that waiting cannot
/// mend (a refused migration, tables it cannot use, a newer release's data) is `Unusable`,
/// logged once; the rest is `Unreachable`.
pub fn judge<E: StoreSetupError>(
    server: &'static str,
    url: String,
) -> impl FnMut(SetupError<E>) -> Failure + Send + 'static {
    move |e| match e {
        SetupError::Connect { source, .. } if !source.is_transient() => Failure::Refused(source),
        SetupError::MissingDatabase { source, .. } => Failure::Refused(source),
        e if !e.is_transient() => {
            let reason = Causes(&e).to_string();
            tracing::error!(url = %url, error = %reason, "{server} store unusable; every operation will be refused");
            Failure::Unusable(reason)
        }
        e => Failure::Unreachable(Causes(&e).to_string()),
    }
}

/// The [`Readiness`] channel of a store about to connect in the background: `Connecting`
/// until [`spawn`]'s first attempt ends. Fails (with the message for the store's configuration
/// error) outside a Tokio runtime, where nothing could connect.
pub fn channel() -> Result<(watch::Sender<Readiness>, watch::Receiver<Readiness>), String> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err("connect_lazy must be called within a Tokio runtime".to_owned());
    }
    Ok(watch::channel(Readiness::Connecting))
}

/// The [`Readiness`] channel of a store that is connected already (from `connect`).
pub fn ready() -> watch::Receiver<Readiness> {
    watch::channel(Readiness::Ready).1
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn op() -> Operation<'static> {
        Operation::new("renew", None)
    }

    #[tokio::test]
    async fn operations_answer_as_connecting_has_got() {
        let (tx, rx) = watch::channel(Readiness::Unreachable);
        let e = check(&rx, op(), "mysql://h:3306/db").await.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        assert!(
            e.to_string()
                .contains("not connected to mysql://h:3306/db yet"),
            "{e}"
        );
        tx.send_replace(Readiness::Refused("bad password".to_owned()));
        let e = check(&rx, op(), "u").await.unwrap_err();
        assert!(
            matches!(e, StoreError::Rejected { .. })
                && e.to_string().contains("renew: bad password"),
            "{e}"
        );
        tx.send_replace(Readiness::Unusable("wrong columns".to_owned()));
        assert!(matches!(
            check(&rx, op(), "u").await,
            Err(StoreError::Rejected { .. })
        ));
        assert!(check(&ready(), op(), "u").await.is_ok());
    }

    #[test]
    fn a_lazy_store_needs_a_runtime() {
        let e = channel().unwrap_err();
        assert!(e.contains("within a Tokio runtime"), "{e}");
    }

    /// Attempts go on past outages and refusals, and stop once connected (or unusable) or
    /// once the store is gone.
    #[tokio::test]
    async fn the_loop_retries_until_connected() {
        let store = Arc::new(AtomicUsize::new(0));
        let (tx, mut rx) = watch::channel(Readiness::Connecting);
        let task = spawn(
            Arc::downgrade(&store),
            tx,
            "mysql",
            "mysql://h:3306/db".to_owned(),
            Duration::from_millis(150),
            |tries: &AtomicUsize| {
                let n = tries.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 => Err("unreachable"),
                        1 => Err("refused"),
                        _ => Ok(()),
                    }
                }
            },
            |e: &str| match e {
                "refused" => Failure::Refused(StoreError::Rejected {
                    message: "access denied".to_owned(),
                    source: None,
                }),
                other => Failure::Unreachable(other.to_owned()),
            },
        );
        rx.wait_for(|r| *r == Readiness::Unreachable).await.unwrap();
        rx.wait_for(|r| matches!(r, Readiness::Refused(m) if m == "mysql refused the connection: access denied"))
            .await
            .unwrap();
        rx.wait_for(|r| *r == Readiness::Ready).await.unwrap();
        task.await.unwrap();
        assert_eq!(store.load(Ordering::SeqCst), 3);

        let (tx, rx) = watch::channel(Readiness::Connecting);
        let task = spawn(
            Arc::downgrade(&store),
            tx,
            "postgres",
            String::new(),
            Duration::from_millis(150),
            |_: &AtomicUsize| async { Err(()) },
            |()| Failure::Unusable("migration refused".to_owned()),
        );
        task.await.unwrap();
        assert_eq!(
            *rx.borrow(),
            Readiness::Unusable("migration refused".to_owned())
        );

        let gone = Arc::new(AtomicUsize::new(0));
        let (tx, _rx) = watch::channel(Readiness::Connecting);
        let weak = Arc::downgrade(&gone);
        drop(gone);
        spawn(
            weak,
            tx,
            "mysql",
            String::new(),
            Duration::from_millis(150),
            |_: &AtomicUsize| async { Ok::<(), ()>(()) },
            |()| Failure::Unreachable(String::new()),
        )
        .await
        .unwrap();
    }
}
