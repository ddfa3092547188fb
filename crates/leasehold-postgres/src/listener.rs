//! The release listener: one dedicated connection that LISTENs on the release channel, run by a
//! core [`ReleaseFeed`](leasehold::store::ReleaseFeed) that reconnects with backoff whenever the
//! connection drops. Notifications sent while it was disconnected are lost, so after each
//! reconnect it announces the leases released in the meantime (read from the lease table) as if
//! it had heard them.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use leasehold::store::{FeedLink, ReleaseFeed, ReleaseSource};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, NoTls, Socket};

use crate::config::{PgConfig, Tls};

/// What the listener's sessions need.
struct Listener {
    pg: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    /// [`Statements::recent_releases`](crate::Statements::recent_releases).
    recent_releases: String,
    keepalive: Duration,
    connect_timeout: Duration,
    url: String,
    /// When the last session that was listening ended (`None` before the first one).
    down_since: Option<Instant>,
}

/// Starts the listener in the background; see [`ReleaseFeed::first_attempt`] to wait for its
/// first LISTEN.
pub(crate) fn feed(
    mut pg: tokio_postgres::Config,
    tls: Tls,
    channel: String,
    recent_releases: String,
    config: &PgConfig,
    url: &str,
) -> ReleaseFeed {
    let app = format!(
        "{}-listen",
        pg.get_application_name().unwrap_or("leasehold")
    );
    pg.application_name(&app);
    let listener = Listener {
        pg,
        tls,
        channel,
        recent_releases,
        keepalive: config.keepalive,
        connect_timeout: config.connect_timeout,
        url: url.to_owned(),
        down_since: None,
    };
    ReleaseFeed::spawn(listener, config.max_reconnect_delay, url.to_owned())
}

impl ReleaseSource for Listener {
    async fn session(&mut self, link: &FeedLink<'_>) -> String {
        let reason = match &self.tls {
            Tls::None => session(self, NoTls, link).await,
            #[cfg(feature = "tls")]
            Tls::Rustls(t) => session(self, t.clone(), link).await,
        };
        if link.is_listening() {
            self.down_since = Some(Instant::now());
        }
        reason
    }
}

/// One connection's life: connect, LISTEN, catch up on releases missed since the last session
/// ended, forward notifications until the connection ends. Returns why it ended.
async fn session<T>(listener: &Listener, tls: T, link: &FeedLink<'_>) -> String
where
    T: MakeTlsConnect<Socket>,
    T::Stream: AsyncRead + AsyncWrite + Unpin + Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let limit = listener.connect_timeout;
    let (client, mut connection) =
        match tokio::time::timeout(limit * 2, listener.pg.connect(tls)).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return "connect timed out".to_owned(),
        };
    // Drives the connection: nothing reaches the server unless this is polled.
    let driver = async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => link.publish(n.payload()),
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
        "connection closed".to_owned()
    };
    let control = async {
        let listen = format!("LISTEN \"{}\"", listener.channel);
        match tokio::time::timeout(limit, client.batch_execute(&listen)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return e.to_string(),
            Err(_) => return "LISTEN timed out".to_owned(),
        }
        link.listening();
        tracing::debug!(url = %listener.url, channel = %listener.channel, "listening for releases");
        if let Some(since) = listener.down_since {
            catch_up(&client, listener, link, since).await;
        }
        loop {
            tokio::time::sleep(listener.keepalive).await;
            match tokio::time::timeout(limit, client.simple_query("SELECT 1")).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return e.to_string(),
                Err(_) => return "keepalive query timed out".to_owned(),
            }
        }
    };
    tokio::select! {
        reason = driver => reason,
        reason = control => reason,
    }
}

/// Announces the leases released while the listener was away, so their waiters retry now rather
/// than at the expiry they were told. LISTEN is already active, so a release is either heard or
/// found here (some may be both: a spurious wake-up only costs the waiter one acquire attempt).
///
/// The window reaches back past `down_since` by the time a dead connection can go unnoticed
/// (one keepalive period plus its timeout) and a second more.
async fn catch_up(
    client: &tokio_postgres::Client,
    listener: &Listener,
    link: &FeedLink<'_>,
    down_since: Instant,
) {
    let window = down_since.elapsed()
        + listener.keepalive
        + listener.connect_timeout
        + Duration::from_secs(1);
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let rows = tokio::time::timeout(
        listener.connect_timeout,
        client.query_typed(
            &listener.recent_releases,
            &[(&window_ms, tokio_postgres::types::Type::INT8)],
        ),
    )
    .await;
    match rows {
        Ok(Ok(rows)) => {
            for row in &rows {
                if let Ok(name) = row.try_get::<_, &str>(0) {
                    link.publish(name);
                }
            }
            tracing::debug!(url = %listener.url, released = rows.len(),
                "release listener caught up after reconnecting");
        }
        Ok(Err(e)) => tracing::warn!(url = %listener.url, error = %e,
            "release listener could not read the releases it missed; waiters retry at expiry"),
        Err(_) => tracing::warn!(url = %listener.url,
            "release listener timed out reading the releases it missed; waiters retry at expiry"),
    }
}
