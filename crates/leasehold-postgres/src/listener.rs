//! The release listener: one dedicated connection that LISTENs on the release channel and feeds
//! a [`ReleaseHub`], reconnecting with backoff whenever the connection drops. Notifications sent
//! while it was disconnected are lost, so after each reconnect it announces the leases released
//! in the meantime (read from the lease table) as if it had heard them.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use leasehold::store::ReleaseHub;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Socket};

use crate::config::{PgConfig, Tls};

/// Settings the listener task needs.
struct Settings {
    channel: String,
    /// [`Statements::recent_releases`](crate::Statements::recent_releases).
    recent_releases: String,
    hub: ReleaseHub,
    keepalive: Duration,
    connect_timeout: Duration,
    max_delay: Duration,
    url: String,
}

/// Starts the listener and waits (up to the connect timeout) until its first LISTEN is active,
/// so a subscription taken right after `connect` hears every later release. If that first
/// attempt fails the task keeps retrying in the background.
pub(crate) fn spawn(
    mut pg: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    recent_releases: String,
    hub: ReleaseHub,
    config: &PgConfig,
    url: &str,
) -> (AbortHandle, oneshot::Receiver<()>) {
    let app = format!(
        "{}-listen",
        pg.get_application_name().unwrap_or("leasehold")
    );
    pg.application_name(&app);
    let settings = Settings {
        channel,
        recent_releases,
        hub,
        keepalive: config.keepalive,
        connect_timeout: config.connect_timeout,
        max_delay: config.max_reconnect_delay,
        url: url.to_owned(),
    };
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::spawn(run(pg, tls, settings, ready_tx));
    (task.abort_handle(), ready_rx)
}

async fn run(pg: tokio_postgres::Config, tls: Tls, settings: Settings, ready: oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut delay = Duration::from_millis(100);
    // When the last session that was listening ended (`None` before the first one).
    let mut down_since: Option<Instant> = None;
    loop {
        let result = match &tls {
            Tls::None => session(&pg, NoTls, &settings, &mut ready, down_since).await,
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => session(&pg, t.clone(), &settings, &mut ready, down_since).await,
        };
        match result {
            Ok(()) => {
                down_since = Some(Instant::now());
                // The session was up, so start the backoff afresh.
                delay = Duration::from_millis(100);
                tracing::warn!(url = %settings.url, "release listener connection closed; reconnecting");
            }
            Err(message) => {
                tracing::warn!(url = %settings.url, error = %message, retry_in = ?delay,
                    "release listener could not listen; retrying");
            }
        }
        tokio::time::sleep(delay + Duration::from_millis(fastrand::u64(0..100))).await;
        delay = (delay * 2).min(settings.max_delay);
    }
}

/// One connection's life: connect, LISTEN, catch up on releases missed since `down_since`,
/// forward notifications until the connection ends. `Ok` if LISTEN was established (the
/// connection dropped later), `Err` if it never was.
async fn session<T>(
    pg: &tokio_postgres::Config,
    tls: T,
    settings: &Settings,
    ready: &mut Option<oneshot::Sender<()>>,
    down_since: Option<Instant>,
) -> Result<(), String>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: AsyncRead + AsyncWrite + Unpin + Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) =
        match tokio::time::timeout(settings.connect_timeout * 2, pg.connect(tls)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("connect timed out".to_owned()),
        };
    let hub = settings.hub.clone();
    // Drives the connection: nothing reaches the server unless this is polled.
    let driver = async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => hub.publish(n.payload()),
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
        "connection closed".to_owned()
    };
    let mut listening = false;
    let control = async {
        let listen = format!("LISTEN \"{}\"", settings.channel);
        match tokio::time::timeout(settings.connect_timeout, client.batch_execute(&listen)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return "LISTEN timed out".to_owned(),
        }
        listening = true;
        tracing::debug!(url = %settings.url, channel = %settings.channel, "listening for releases");
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        if let Some(since) = down_since {
            catch_up(&client, settings, since).await;
        }
        loop {
            tokio::time::sleep(settings.keepalive).await;
            match tokio::time::timeout(settings.connect_timeout, client.simple_query("SELECT 1"))
                .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return "keepalive query timed out".to_owned(),
            }
        }
    };
    let reason = tokio::select! {
        reason = driver => reason,
        reason = control => reason,
    };
    if listening {
        tracing::debug!(reason = %reason, "release listener session ended");
        Ok(())
    } else {
        Err(reason)
    }
}

/// Announces the leases released while the listener was away, so their waiters retry now rather
/// than at the expiry they were told. LISTEN is already active, so a release is either heard or
/// found here (some may be both: a spurious wake-up only costs the waiter one acquire attempt).
///
/// The window reaches back past `down_since` by the time a dead connection can go unnoticed
/// (one keepalive period plus its timeout) and a second more.
async fn catch_up(client: &tokio_postgres::Client, settings: &Settings, down_since: Instant) {
    let window = down_since.elapsed()
        + settings.keepalive
        + settings.connect_timeout
        + Duration::from_secs(1);
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let rows = tokio::time::timeout(
        settings.connect_timeout,
        client.query_typed(
            &settings.recent_releases,
            &[(&window_ms, tokio_postgres::types::Type::INT8)],
        ),
    )
    .await;
    match rows {
        Ok(Ok(rows)) => {
            for row in &rows {
                if let Ok(name) = row.try_get::<_, &str>(0) {
                    settings.hub.publish(name);
                }
            }
            tracing::debug!(url = %settings.url, released = rows.len(),
                "release listener caught up after reconnecting");
        }
        Ok(Err(e)) => tracing::warn!(url = %settings.url, error = %e,
            "release listener could not read the releases it missed; waiters retry at expiry"),
        Err(_) => tracing::warn!(url = %settings.url,
            "release listener timed out reading the releases it missed; waiters retry at expiry"),
    }
}
