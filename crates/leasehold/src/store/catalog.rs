//! What a store's [`Catalog`](crate::Catalog) keeps: the tasks instances run (each instance's registration with a
//! heartbeat), and each task's control record (pause, a pending manual trigger), written by
//! compare-and-set so the CLI, the sidecar and the library can all act on it at once.
//!
//! Like run history, the records are opaque text to a store: this module defines what the text
//! is ([`TaskDefinition`](crate::catalog::TaskDefinition), [`InstanceInfo`](crate::catalog::InstanceInfo), [`Control`], as JSON). Fields are only ever added,
//! and readers ignore fields they do not know, so two releases side by side read each other's
//! records.

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::store::answers::Versioned;
use crate::store::answers::{Answer, LeaseState};
use crate::store::name::{HolderId, LeaseName};

/// How long the catalog remembers an instance that stopped heartbeating (and a task none of
/// whose instances has been seen for that long, unless it has a control record).
pub const CATALOG_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// One instance's registration of a task, as [`Catalog::tasks`](crate::Catalog::tasks) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceRecord {
    /// The instance (its holder id).
    pub instance: HolderId,
    /// What it said about itself ([`InstanceInfo`](crate::catalog::InstanceInfo) as JSON).
    pub about: String,
    /// Time left on its heartbeat on the store's clock; zero once it expired.
    pub remaining: Duration,
}

/// A task in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    /// The task's name.
    pub task: LeaseName,
    /// Its definition ([`TaskDefinition`](crate::catalog::TaskDefinition) as JSON) as the last instance to register wrote it;
    /// `None` when only a control record exists (paused before any instance ran it).
    pub definition: Option<String>,
    /// The instances that registered it and were seen within the retention, live ones first,
    /// each group sorted by instance.
    pub instances: Vec<InstanceRecord>,
    /// Its control record, if one was ever written.
    pub control: Option<Versioned>,
}

/// A lease record, as [`Catalog::leases`](crate::Catalog::leases) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The lease's name.
    pub name: LeaseName,
    /// Its state, as [`Store::inspect`](crate::Store::inspect) would answer.
    pub state: LeaseState,
}

/// The store's clock and a task's control record, read in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRead {
    /// The store's clock, ms since the Unix epoch.
    pub now_ms: u64,
    /// The task's control record, if any.
    pub control: Option<Versioned>,
}

/// What [`Catalog::forget`](crate::Catalog::forget) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgetting {
    /// The task's definition, instances and control record are gone (and its history, if
    /// asked).
    Forgotten,
    /// The catalog held nothing for the task (its history is removed all the same, if asked).
    Unknown,
    /// Nothing was removed: this many instances' heartbeats are live on the store's clock.
    Live {
        /// How many.
        instances: u64,
    },
}

impl Answer for Forgetting {
    fn label(&self) -> &'static str {
        match self {
            Self::Forgotten => "forgotten",
            Self::Unknown => "unknown",
            Self::Live { .. } => "live",
        }
    }
}

impl Answer for Vec<TaskRecord> {}
impl Answer for Vec<LeaseRecord> {}
impl Answer for ControlRead {}

/// What one registration writes: see [`Catalog::register`](crate::Catalog::register).
#[derive(Debug, Clone, Copy)]
pub struct Registration<'a> {
    /// The task.
    pub task: &'a LeaseName,
    /// Its definition ([`TaskDefinition`](crate::catalog::TaskDefinition) as JSON); the last writer's is kept.
    pub definition: &'a str,
    /// The registering instance.
    pub instance: &'a HolderId,
    /// What the instance says about itself ([`InstanceInfo`](crate::catalog::InstanceInfo) as JSON).
    pub about: &'a str,
    /// The heartbeat's ttl: the instance is live until this long from now on the store's clock.
    pub ttl: Duration,
    /// Instances of this task whose heartbeat expired longer ago than this are dropped.
    pub forget_after: Duration,
}

/// A task's control record: fleet-wide pause, and a pending manual trigger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Control {
    /// Set while the task is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    /// A manual run asked for and not yet taken by an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerRequest>,
}

/// Who paused a task, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// Who asked (free text: a user, a host).
    pub by: String,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When, on the store's clock (ms).
    pub at_ms: u64,
}

/// A manual run asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerRequest {
    /// The run's id: the history record of the run carries it.
    pub id: String,
    /// Who asked.
    pub by: String,
    /// When, on the store's clock (ms).
    pub at_ms: u64,
    /// After this (store clock, ms) no instance takes it any more.
    pub expires_ms: u64,
    /// For a backfill (`leasehold trigger --slots`): the range of the task's slots to run, each
    /// that has no ok run in the task's history. Absent: one manual run. (A release before it
    /// ignores the field and takes the request as one manual run.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<SlotRange>,
}

/// The slots of a backfill: every slot of the task's schedule in `[from_ms, to_ms]` (store
/// clock, ms since the Unix epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRange {
    /// The first time of the range.
    pub from_ms: u64,
    /// The last time of the range (included).
    pub to_ms: u64,
}

/// `to_json` and `from_json` for records kept as JSON text.
macro_rules! json_text {
    ($($ty:ident: $what:literal),*) => {$(
        impl $ty {
            /// The record as the store keeps it.
            pub fn to_json(&self) -> String {
                // Strings, numbers and enums always serialize.
                serde_json::to_string(self).unwrap_or_default()
            }

            /// Reads a record the store kept.
            pub fn from_json(text: &str) -> Result<Self, $crate::store::error::StoreError> {
                serde_json::from_str(text).map_err(|e| {
                    $crate::store::error::StoreError::Corrupt(format!(concat!("unreadable ", $what, ": {}"), e))
                })
            }
        }
    )*};
}

pub(crate) use json_text;

json_text!(Control: "control record");

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields a later release adds are ignored: two releases side by side read each other's
    /// records.
    #[test]
    fn records_from_a_newer_release_still_read() {
        let control =
            Control::from_json(r#"{"paused":{"by":"ops","at_ms":5,"until_ms":9}}"#).unwrap();
        assert_eq!(control.paused.unwrap().by, "ops");
        assert!(Control::from_json("\"paused\"").is_err());
    }
}
