//! Throwaway etcd clusters on loopback for tests (feature `testing`): `leasehold-servers`'s
//! [`EtcdCluster`](leasehold_servers::EtcdCluster), which `leasehold chaos` uses too, with
//! the failures a test wants as panics. Members are `etcd` processes of Debian's `etcd-server`
//! package (`scripts/stores.sh` installs it) on free loopback ports, with data on disk in a
//! directory of their own under the system temp dir; dropping the cluster kills them and
//! removes it, and a watchdog does so should the test process end without dropping it (a
//! cluster kept in a static, a process killed).

// Test support: a failed expectation here is a failed test.
#![allow(clippy::panic)]

use std::ops::{Deref, DerefMut};

pub use leasehold_servers::TlsFiles;

/// A running etcd cluster of its own; every method of
/// [`leasehold_servers::EtcdCluster`] through `Deref`, those that can fail panicking here.
#[derive(Debug)]
pub struct EtcdCluster(leasehold_servers::EtcdCluster);

impl EtcdCluster {
    /// Starts `size` members (1 or 3 are usual) and waits until every member answers a
    /// linearizable read (a leader is elected). Panics if they do not within 30 s, or if etcd
    /// or etcdctl is missing.
    pub fn start(size: usize) -> Self {
        Self(leasehold_servers::EtcdCluster::start(size).unwrap_or_else(|e| panic!("{e}")))
    }

    /// [`start`](Self::start), the members serving clients over TLS only; [`url`] is then an
    /// `etcds://` URL trusting `tls.ca`.
    ///
    /// [`url`]: leasehold_servers::EtcdCluster::url
    pub fn start_tls(size: usize, tls: TlsFiles) -> Self {
        Self(leasehold_servers::EtcdCluster::start_tls(size, tls).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Runs `etcdctl` with `args` against every member, as root when `root_password` is given,
    /// and panics with its output if it fails.
    pub fn etcdctl(&self, root_password: Option<&str>, args: &[&str]) -> String {
        self.0
            .etcdctl(root_password, args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts member `index` again (after [`kill`]) on its ports and data; panics if it
    /// cannot.
    ///
    /// [`kill`]: leasehold_servers::EtcdCluster::kill
    pub fn restart(&mut self, index: usize) {
        self.0.restart(index).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Deref for EtcdCluster {
    type Target = leasehold_servers::EtcdCluster;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for EtcdCluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}
