#![doc = include_str!("../README.md")]
// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod args;
mod check;
mod error;
mod etcd_members;
mod harness;
mod pg_url;
mod procs;
mod proxy;
mod schedule;
mod servers;
mod svg;

pub use args::{ChaosArgs, StoreKind};
pub use check::{CheckReport, LossWindow, check};
pub use error::ChaosError;
pub use pg_url::PgUrlError;
pub use proxy::{FaultProxy, ProxyMode};
pub use schedule::{FaultKind, PlannedFault, plan};
pub use svg::{Marker, Span, Timeline};

/// Runs the chaos harness. Returns the exit status: 0 if every guarantee held, 1 otherwise.
pub async fn run(args: ChaosArgs) -> Result<u8, ChaosError> {
    harness::run(args).await
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `leasehold chaos`'s flags, for the tests that parse them.
    #[derive(Parser)]
    pub(crate) struct Cli {
        #[command(flatten)]
        pub(crate) args: ChaosArgs,
    }

    /// Flags the run cannot use are refused before it starts anything (no directory is made).
    #[tokio::test]
    async fn bad_flags_are_usage_errors() {
        let out = tempfile::tempdir().unwrap();
        let unmade = out.path().join("run");
        for (flag, value, said) in [
            ("--replicas", "1", "--replicas must be at least 2"),
            ("--ttl", "100ms", "--ttl must be at least 300ms"),
            ("--duration", "5s", "--duration must be at least 10s"),
        ] {
            let cli = Cli::try_parse_from([
                "chaos".as_ref(),
                "--store".as_ref(),
                "sqlite".as_ref(),
                "--out".as_ref(),
                unmade.as_os_str(),
                flag.as_ref(),
                value.as_ref(),
            ])
            .unwrap();
            let refused = run(cli.args).await.unwrap_err();
            assert!(
                matches!(&refused, ChaosError::Usage(m) if m.starts_with(said)),
                "{refused:?}"
            );
        }
        assert!(!unmade.exists());
    }
}
