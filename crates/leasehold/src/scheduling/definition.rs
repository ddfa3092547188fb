//! How an instance describes a task it runs and itself in the store's catalog (the records
//! [`Registration`](crate::store::catalog::Registration) carries as JSON text).

use serde::{Deserialize, Serialize};

use crate::store::catalog::json_text;

/// Where a task's definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TaskSource {
    /// A [`Scheduler`](crate::Scheduler) in an application.
    Scheduler,
    /// `leasehold run` with a schedule.
    Run,
    /// The sidecar's ticks endpoint.
    Sidecar,
    /// A line of a crontab run by `leasehold crontab`.
    Crontab,
    /// Something this release does not know (written by a newer one).
    #[serde(other)]
    Other,
}

/// How a task's ticks are gated, as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDefinition {
    /// Where it was registered from.
    pub source: TaskSource,
    /// The schedule as written (`every 30s`, a cron expression).
    pub schedule: String,
    /// The schedule's time zone (IANA name), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The store-down policy (`fail-closed`, `fail-open`, `local`).
    pub on_store_down: String,
    /// The catch-up policy (`skip`, `latest`, `all`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
    /// Whether timer ticks go through the gate.
    pub gated: bool,
    /// The leader group the task's ticks are gated on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_group: Option<String>,
    /// The spread group the task is placed in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_group: Option<String>,
    /// Each run's time limit, ms, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// How many times a failed or timed-out run is tried again, if at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// At most how long each slot's start is put off, ms, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter_ms: Option<u64>,
    /// What a slot falling while a run is going does (`buffer-one`, `buffer-all`, `replace`,
    /// `allow`); absent: `skip`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// The schedule as run records carry it, for a reader to compute its slots (a backfill's
    /// range); absent from releases before backfill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot_schedule: Option<crate::scheduling::history::RecordedSchedule>,
}

/// What an instance says about itself when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceInfo {
    /// The leasehold release it runs.
    pub version: String,
    /// Its host name.
    #[serde(default)]
    pub host: String,
    /// Its process id (0: not known, for an instance a sidecar speaks for).
    #[serde(default)]
    pub pid: u32,
    /// For an application instance that a sidecar registers on its behalf (it ticks through
    /// that sidecar): the sidecar's own instance id. Host and version are then the sidecar's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl InstanceInfo {
    /// This process.
    pub fn current() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            host: crate::store::name::host_name().to_owned(),
            pid: std::process::id(),
            via: None,
        }
    }

    /// An application instance that this process (a sidecar registered as `sidecar`) speaks
    /// for: its pid is not known here.
    pub fn via(sidecar: &str) -> Self {
        Self {
            pid: 0,
            via: Some(sidecar.to_owned()),
            ..Self::current()
        }
    }
}

json_text!(
    TaskDefinition: "task definition",
    InstanceInfo: "instance record"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields a later release adds are ignored, and a source it adds reads as `Other`: two
    /// releases side by side read each other's records.
    #[test]
    fn definitions_from_a_newer_release_still_read() {
        let def = TaskDefinition::from_json(
            r#"{"source":"robot","schedule":"every 30s","on_store_down":"fail-closed","gated":true,"colour":"red"}"#,
        )
        .unwrap();
        assert_eq!(def.source, TaskSource::Other);
    }
}
