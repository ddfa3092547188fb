//! Leases: a handle to acquire one ([`guard::Lease`]), the held lease that renews itself and
//! says the moment it is lost ([`guard::LeaseGuard`]), many leases renewed together
//! ([`session::LeaseSession`]), the one renewal loop both use ([`renewer::Renewer`]), the state a
//! tenure's guard and renewer share ([`tenure::Tenure`]), leader election ([`leader::Leader`]),
//! and their timing ([`config::LeaseConfig`]). Built on the `store` layer only.

pub(crate) mod config;
#[cfg(any(test, feature = "conformance"))]
pub(crate) mod conformance;
pub(crate) mod guard;
pub(crate) mod leader;
pub(crate) mod renewer;
pub(crate) mod session;
pub(crate) mod tenure;
