//! A loopback TCP fault proxy between the replicas and the store: pass, delay, blackhole, and
//! dropping every connection.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How the proxy treats traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forwards everything at once.
    Pass,
    /// Forwards every chunk after this extra latency, each way.
    Delay(Duration),
    /// Accepts connections but forwards nothing; held bytes flow again after repair (like a
    /// healed partition: TCP would retransmit them).
    Blackhole,
}

/// A running proxy. Dropping it closes the listener and every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    drops: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (which must be loopback).
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the fault proxy only forwards to loopback addresses, not {upstream}"),
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, _) = watch::channel(ProxyMode::Pass);
        let (drops, _) = watch::channel(0u64);
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            drops.subscribe(),
        ));
        Ok(Self {
            addr,
            mode,
            drops,
            accept,
        })
    }

    /// The address replicas connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Closes every open connection (new ones are accepted as usual).
    pub fn drop_connections(&self) {
        self.drops.send_modify(|g| *g += 1);
    }

    /// Stops forwarding until [`repair`](Self::repair).
    pub fn blackhole(&self) {
        self.mode.send_replace(ProxyMode::Blackhole);
    }

    /// Adds `latency` to every chunk, each way, until [`repair`](Self::repair).
    pub fn delay(&self, latency: Duration) {
        self.mode.send_replace(ProxyMode::Delay(latency));
    }

    /// Back to forwarding at once.
    pub fn repair(&self) {
        self.mode.send_replace(ProxyMode::Pass);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.drop_connections();
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    drops: watch::Receiver<u64>,
) {
    // Connections live in this set, so aborting the accept task ends them all.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let _ = client.set_nodelay(true);
                let (mode, mut drops) = (mode.clone(), drops.clone());
                drops.mark_unchanged();
                conns.spawn(async move {
                    tokio::select! {
                        _ = connection(client, upstream, mode) => {}
                        _ = drops.changed() => {}
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
) -> io::Result<()> {
    // A blackholed link does not even reach the server.
    wait_open(&mut mode).await;
    let server = TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::try_join!(pump(cr, sw, mode.clone()), pump(sr, cw, mode))?;
    Ok(())
}

async fn wait_open(mode: &mut watch::Receiver<ProxyMode>) {
    let _ = mode.wait_for(|m| *m != ProxyMode::Blackhole).await;
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        wait_open(&mut mode).await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.shutdown().await?;
            return Ok(());
        }
        // Bytes read just before a blackhole are held until repair.
        wait_open(&mut mode).await;
        let latency = match *mode.borrow() {
            ProxyMode::Delay(d) => Some(d),
            _ => None,
        };
        if let Some(d) = latency {
            tokio::time::sleep(d).await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// Sends `msg` and reads the echo, or `None` when nothing comes back within `within`.
    async fn round_trip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut got = vec![0u8; msg.len()];
        match tokio::time::timeout(within, s.read_exact(&mut got)).await {
            Ok(Ok(_)) => Some(got),
            _ => None,
        }
    }

    async fn setup() -> (FaultProxy, TcpStream) {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let client = TcpStream::connect(proxy.addr()).await.unwrap();
        (proxy, client)
    }

    const SOON: Duration = Duration::from_secs(2);

    #[tokio::test]
    async fn passes_traffic_through() {
        let (proxy, mut c) = setup().await;
        assert!(proxy.addr().ip().is_loopback());
        assert_eq!(
            round_trip(&mut c, b"ping", SOON).await.as_deref(),
            Some(&b"ping"[..])
        );
        assert_eq!(proxy.mode(), ProxyMode::Pass);
    }

    #[tokio::test]
    async fn refuses_non_loopback_upstreams() {
        let err = FaultProxy::start("192.0.2.1:6379".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[tokio::test]
    async fn delay_adds_latency_each_way_until_repaired() {
        let (proxy, mut c) = setup().await;
        proxy.delay(Duration::from_millis(150));
        let t = Instant::now();
        assert!(round_trip(&mut c, b"slow", SOON).await.is_some());
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        proxy.repair();
        let t = Instant::now();
        assert!(round_trip(&mut c, b"fast", SOON).await.is_some());
        assert!(
            t.elapsed() < Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn blackhole_forwards_nothing_until_repaired() {
        let (proxy, mut c) = setup().await;
        assert!(round_trip(&mut c, b"a", SOON).await.is_some());
        proxy.blackhole();
        assert_eq!(
            round_trip(&mut c, b"held", Duration::from_millis(300)).await,
            None
        );
        // New connections are accepted but go nowhere either.
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut fresh, b"new", Duration::from_millis(300)).await,
            None
        );
        proxy.repair();
        let mut got = [0u8; 4];
        tokio::time::timeout(SOON, c.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"held");
        let mut got = [0u8; 3];
        tokio::time::timeout(SOON, fresh.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got, b"new");
    }

    #[tokio::test]
    async fn drop_closes_open_connections_and_accepts_new_ones() {
        let (proxy, mut c) = setup().await;
        assert!(round_trip(&mut c, b"x", SOON).await.is_some());
        proxy.drop_connections();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(SOON, c.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut again, b"y", SOON).await.as_deref(),
            Some(&b"y"[..])
        );
    }

    #[tokio::test]
    async fn dropping_the_proxy_ends_its_connections() {
        let (proxy, mut c) = setup().await;
        assert!(round_trip(&mut c, b"x", SOON).await.is_some());
        drop(proxy);
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(SOON, c.read(&mut buf)).await.unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}
