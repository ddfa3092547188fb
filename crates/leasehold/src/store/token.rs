//! Fencing tokens.

use std::fmt;

/// A number that strictly increases with every new acquisition of a lease name (not on renewal),
/// is never reused, and survives release and expiry.
///
/// Pass it along with every write the lease protects; a resource that remembers the highest token
/// it has seen can then reject a write from a holder that lost the lease while paused (see
/// `leasehold_postgres::Fence` for a ready-made PostgreSQL check).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}
