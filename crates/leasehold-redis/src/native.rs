//! The server's native compare-and-set commands, where it has them: renew as one
//! `SET key tenure IFEQ tenure PX ttl` (Valkey ≥ 8.1, Redis ≥ 8.4) and release as
//! `DELIFEQ key tenure` (Valkey ≥ 9.0) or `DELEX key IFEQ tenure` (Redis ≥ 8.4), with the
//! release's `PUBLISH` pipelined behind it. Older servers keep the scripts.
//!
//! Why these keep every guarantee of the scripts they replace (`scripts::RENEW`, `RELEASE`):
//! - Renew: the script compares the lease key's value with `"<token> <holder>"` and, if equal,
//!   sets its expiry (`PEXPIRE`); it answers 1 or 0 and nothing else. `SET … IFEQ … PX` is that
//!   comparison and that expiry in one atomic command: it writes back the same value (so holder
//!   and token are unchanged) with the new ttl, answers `OK` or nil, and writes nothing when the
//!   key is missing or holds another tenure. Token and holder are both checked, since both are
//!   in the compared value.
//! - Release: the script deletes on the same comparison and then publishes the name. The delete
//!   is one atomic command here; the `PUBLISH` follows it in the same pipeline, so it is sent
//!   in the same round trip and served right after it. It is not conditional: a release that
//!   finds the lease not held (rare: the lease expired or was taken over) also announces the
//!   name, and the waiters it wakes find the lease busy and wait again. Notifications were only
//!   ever hints (waiters retry at the lease's expiry without them), so this loosens nothing.
//! - Errors: a key of another type or any other refusal sends the operation to its script,
//!   which reports it as before (naming the key). Every such refusal is made before the command
//!   changes anything, so running the script after it cannot apply the operation twice.
//!
//! The server is asked (`HELLO`, one round trip) once per connection: when the store connects,
//! and again after an I/O error, since the connection then reconnects, perhaps to another
//! server (a failover). A server that refuses a native command (unknown, a syntax error from an
//! older server, or an ACL without it) sends this store to the scripts until its next
//! reconnect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::conn::RedisConnection;

/// Not asked yet (or the connection broke since).
const UNKNOWN: u8 = 0;
/// Asked: the bits below say what it has.
const KNOWN: u8 = 1;
const SET_IFEQ: u8 = 2;
const DELIFEQ: u8 = 4;
const DELEX_IFEQ: u8 = 8;

/// What the server at the other end of the store's connection offers.
#[derive(Debug, Default)]
pub(crate) struct Server(AtomicU8);

/// How a lease is released natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NativeRelease {
    /// `DELIFEQ key value` (Valkey ≥ 9.0).
    DelIfEq,
    /// `DELEX key IFEQ value` (Redis ≥ 8.4).
    DelEx,
}

/// A snapshot of [`Server`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features(u8);

impl Features {
    pub(crate) fn known(self) -> bool {
        self.0 & KNOWN != 0
    }

    pub(crate) fn set_ifeq(self) -> bool {
        self.0 & SET_IFEQ != 0
    }

    pub(crate) fn release(self) -> Option<NativeRelease> {
        if self.0 & DELIFEQ != 0 {
            Some(NativeRelease::DelIfEq)
        } else if self.0 & DELEX_IFEQ != 0 {
            Some(NativeRelease::DelEx)
        } else {
            None
        }
    }
}

impl Server {
    pub(crate) fn features(&self) -> Features {
        Features(self.0.load(Ordering::Relaxed))
    }

    /// The connection broke: ask again on the next operation.
    pub(crate) fn forget(&self) {
        self.0.store(UNKNOWN, Ordering::Relaxed);
    }

    /// The server refused a native command: scripts until the next reconnect.
    pub(crate) fn scripts_only(&self) {
        self.0.store(KNOWN, Ordering::Relaxed);
    }

    /// Asks the server what it is (`HELLO`, without changing the protocol) and records what
    /// it offers. A server without `HELLO` (Redis < 6) or a user without it gets the scripts;
    /// an I/O error leaves the question open.
    pub(crate) async fn detect(&self, conn: &mut RedisConnection) -> Features {
        let bits = match redis::cmd("HELLO")
            .query_async::<HashMap<String, Value>>(conn)
            .await
        {
            Ok(hello) => {
                let field = |name: &str| match hello.get(name) {
                    Some(v) => redis::from_redis_value_ref::<String>(v).unwrap_or_default(),
                    None => String::new(),
                };
                let bits = offers(&field("server"), &field("version"));
                tracing::debug!(
                    server = %field("server"),
                    version = %field("version"),
                    native = bits != KNOWN,
                    "asked the redis server what it offers"
                );
                bits
            }
            Err(e) if e.is_io_error() || e.is_unrecoverable_error() || e.is_timeout() => UNKNOWN,
            Err(e) => {
                tracing::debug!(error = %e, "HELLO refused; renewing and releasing with scripts");
                KNOWN
            }
        };
        self.0.store(bits, Ordering::Relaxed);
        Features(bits)
    }
}

/// What a server named `server` at `version` offers (`HELLO`'s fields).
fn offers(server: &str, version: &str) -> u8 {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    match server {
        "valkey" if version >= (9, 0) => KNOWN | SET_IFEQ | DELIFEQ,
        "valkey" if version >= (8, 1) => KNOWN | SET_IFEQ,
        "redis" if version >= (8, 4) => KNOWN | SET_IFEQ | DELEX_IFEQ,
        _ => KNOWN,
    }
}

/// Whether `e` is the server refusing the command itself (unknown, a syntax it lacks, not
/// allowed to this user): then it never will, until a reconnect.
pub(crate) fn is_unsupported(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) => e
            .detail()
            .is_some_and(|d| d.contains("unknown command") || d.contains("syntax error")),
        _ => false,
    }
}

/// Whether `e` is an answer from the server (a refusal made before the command changed
/// anything), rather than a lost connection or a timeout: then the script may run instead.
pub(crate) fn is_refusal(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_offer_what_their_versions_have() {
        let f = |server, version| Features(offers(server, version));
        assert!(!f("redis", "7.0.15").set_ifeq());
        assert_eq!(f("redis", "7.0.15").release(), None);
        assert!(!f("redis", "8.2.1").set_ifeq());
        assert!(f("redis", "8.4.0").set_ifeq());
        assert_eq!(f("redis", "8.4.0").release(), Some(NativeRelease::DelEx));
        assert_eq!(f("redis", "10.0.0").release(), Some(NativeRelease::DelEx));
        assert!(!f("valkey", "8.0.2").set_ifeq());
        assert!(f("valkey", "8.1.0").set_ifeq());
        assert_eq!(f("valkey", "8.1.4").release(), None);
        assert_eq!(f("valkey", "9.1.2").release(), Some(NativeRelease::DelIfEq));
        assert!(f("keydb", "9.9.9").known() && !f("keydb", "9.9.9").set_ifeq());
        assert!(!f("valkey", "").set_ifeq());
    }
}
