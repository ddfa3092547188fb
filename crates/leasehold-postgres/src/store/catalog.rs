//! The fleet catalog: task registrations, control records and the lease listing.

use std::time::Duration;

use leasehold::catalog::{ControlRead, LeaseRecord, Registration, TaskRecord, Versioned};
use leasehold::store::StoreResult;
use leasehold::{Catalog, HolderId, LeaseName, StoreError};
use leasehold_sql::column;
use tokio_postgres::Row;

use super::{Op, PgStore, get, to_i64};

/// The control record in columns `at` (version) and `at + 1` (value) of `row`.
fn control_of(row: &Row, at: usize) -> StoreResult<Option<Versioned>> {
    column::control(get(row, at)?, get(row, at + 1)?)
}

fn millis_of(d: Duration) -> i64 {
    d.as_millis().clamp(0, i64::MAX as u128) as i64
}

/// Each operation one statement, timed by `clock_timestamp()`.
impl Catalog for PgStore {
    async fn register(&self, r: &Registration<'_>) -> StoreResult<Option<Versioned>> {
        let op = Op::new("register", Some(r.task));
        let ttl_ms = r.ttl.as_millis().clamp(1, i64::MAX as u128) as i64;
        let rows = self
            .query(
                op,
                &self.inner.sql.register,
                &[
                    &r.task.as_str(),
                    &r.definition,
                    &r.instance.as_str(),
                    &r.about,
                    &ttl_ms,
                    &millis_of(r.forget_after),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt(format!("{op} returned no row")))?;
        control_of(row, 0)
    }

    async fn unregister(&self, task: &LeaseName, instance: &HolderId) -> StoreResult<()> {
        let op = Op::new("unregister", Some(task));
        self.query(
            op,
            &self.inner.sql.unregister,
            &[&task.as_str(), &instance.as_str()],
        )
        .await?;
        Ok(())
    }

    async fn tasks(&self, forget_after: Duration) -> StoreResult<Vec<TaskRecord>> {
        let op = Op::new("tasks", None);
        let rows = self
            .query(op, &self.inner.sql.tasks, &[&millis_of(forget_after)])
            .await?;
        let mut tasks: Vec<TaskRecord> = Vec::new();
        for row in &rows {
            let task: String = get(row, 0)?;
            if tasks.last().is_none_or(|t| t.task.as_str() != task) {
                tasks.push(TaskRecord {
                    task: column::name(task)?,
                    definition: get(row, 1)?,
                    instances: Vec::new(),
                    control: control_of(row, 2)?,
                });
            }
            let (Some(record), Some(instance)) = (tasks.last_mut(), get::<Option<String>>(row, 4)?)
            else {
                continue;
            };
            record
                .instances
                .push(column::instance(instance, get(row, 5)?, get(row, 6)?)?);
        }
        Ok(tasks)
    }

    async fn control(&self, task: &LeaseName) -> StoreResult<ControlRead> {
        let op = Op::new("control", Some(task));
        let rows = self
            .query(op, &self.inner.sql.control, &[&task.as_str()])
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt(format!("{op} returned no row")))?;
        Ok(ControlRead {
            now_ms: column::clock_ms(get(row, 0)?)?,
            control: control_of(row, 1)?,
        })
    }

    async fn set_control(
        &self,
        task: &LeaseName,
        expected: Option<u64>,
        value: &str,
    ) -> StoreResult<Option<u64>> {
        let op = Op::new("set_control", Some(task));
        let rows = match expected.map(to_i64) {
            None => {
                self.query(
                    op,
                    &self.inner.sql.create_control,
                    &[&task.as_str(), &value],
                )
                .await?
            }
            Some(Some(expected)) => {
                self.query(
                    op,
                    &self.inner.sql.update_control,
                    &[&task.as_str(), &expected, &value],
                )
                .await?
            }
            // No version beyond a bigint was ever written.
            Some(None) => return Ok(None),
        };
        rows.first()
            .map(|row| column::version(get(row, 0)?))
            .transpose()
    }

    async fn leases(&self, limit: usize) -> StoreResult<Vec<LeaseRecord>> {
        let op = Op::new("leases", None);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(op, &self.inner.sql.leases, &[&limit]).await?;
        rows.iter()
            .map(|row| {
                let name = column::name(get(row, 0)?)?;
                Ok(LeaseRecord {
                    state: self.lease_state(&name, get(row, 1)?, get(row, 2)?, get(row, 3)?)?,
                    name,
                })
            })
            .collect()
    }
}
