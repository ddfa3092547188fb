#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod cluster;
mod dir;
mod error;
mod etcd;
mod mariadb;
mod pid;
mod port;
mod postgres;
mod process;
mod redis;
mod sentinel;

pub use cluster::{ClusterBuilder, Failover, RedisCluster};
pub use error::{Error, Result};
pub use etcd::{EtcdCluster, TlsFiles};
pub use mariadb::{MariaDb, MariaDbBuilder};
pub use port::{free_port, free_ports};
pub use postgres::{
    POSTGRES_PROGRAMS, Postgres, PostgresBuilder, find_postgres_bindir, is_postgres_bindir,
};
pub use redis::{Readiness, RedisBuilder, RedisServer, redis_cli};
pub use sentinel::{SentinelBuilder, SentinelGroup};
