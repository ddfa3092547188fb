//! Free loopback ports for servers, which restart on the port they had.

use std::net::{Ipv4Addr, TcpListener};

use crate::error::{Error, Result};

/// A free loopback port: bound and released. See [`free_ports`].
pub fn free_port() -> Result<u16> {
    free_ports(1)?.pop().ok_or_else(|| {
        Error::io(
            "cannot find a free port",
            std::io::ErrorKind::NotFound.into(),
        )
    })
}

/// `n` distinct free loopback ports, each bound and released (all are held until all are
/// chosen, so none is handed out twice). They are picked below the kernel's ephemeral range
/// where it leaves room, so that no outgoing connection takes one as its source port while its
/// server is down for a restart (a port from the ephemeral range could be, and the server could
/// not bind it again).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let ephemeral_from = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        held.push(bind_free(ephemeral_from).map_err(|e| Error::io("cannot find a free port", e))?);
    }
    held.iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| Error::io("cannot find a free port", e))
}

fn bind_free(ephemeral_from: u16) -> std::io::Result<TcpListener> {
    if ephemeral_from > 20_000 {
        for _ in 0..100 {
            let port = fastrand::u16(10_000..ephemeral_from);
            if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                return Ok(listener);
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A picked port is free when picked, not reserved: between the pick and a bind, another
    /// test (tests run side by side, starting servers on ports they picked) or another process
    /// may take it, and every server lives with that window too. So a port that is taken by
    /// then is not a failure; a pick that is never bindable is. Listeners are held until the
    /// end, so no two rounds check the same port.
    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let mut held = Vec::new();
        for _ in 0..20 {
            let bound = (0..3).find_map(|_| {
                let port = free_port().unwrap();
                assert!(low <= 20_000 || port < low, "{port}");
                TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()
            });
            held.push(bound.expect("three picks in a row were taken before they could be bound"));
        }
        let mut ports = free_ports(12).unwrap();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 12);
    }
}
