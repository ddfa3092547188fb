//! Reading the scripts' replies into the core's types.

use leasehold::catalog::{InstanceRecord, TaskRecord, Versioned};

use super::*;

pub(super) fn ttl_millis(ttl: Duration) -> Arg<'static> {
    Arg::Int(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
}

/// A native renewal's answer: `OK` (renewed) or nil (the lease is not held by that tenure).
pub(super) fn renewal(op: Op<'_>, v: Option<&Value>) -> StoreResult<Renewal> {
    match v {
        Some(Value::Okay) => Ok(Renewal::Renewed),
        Some(Value::Nil) => Ok(Renewal::Lost),
        other => Err(corrupt(
            op,
            format_args!("unexpected reply {other:?} to SET IFEQ"),
        )),
    }
}

pub(super) fn corrupt(op: Op<'_>, what: impl fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{op}: {what}"))
}

pub(super) fn items(op: Op<'_>, v: Value) -> StoreResult<Vec<Value>> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(corrupt(
            op,
            format_args!("unexpected script reply {other:?}"),
        )),
    }
}

pub(super) fn int(op: Op<'_>, v: Option<&Value>) -> StoreResult<i64> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(corrupt(
            op,
            format_args!("expected an integer, got {other:?}"),
        )),
    }
}

pub(super) fn str_of<'v>(op: Op<'_>, v: Option<&'v Value>) -> StoreResult<&'v str> {
    match v {
        Some(Value::BulkString(b)) => {
            std::str::from_utf8(b).map_err(|_| corrupt(op, "a stored value is not UTF-8"))
        }
        Some(Value::SimpleString(s)) => Ok(s),
        other => Err(corrupt(
            op,
            format_args!("expected a string, got {other:?}"),
        )),
    }
}

pub(super) fn text(op: Op<'_>, v: Option<&Value>) -> StoreResult<String> {
    str_of(op, v).map(str::to_owned)
}

pub(super) fn token(op: Op<'_>, v: Option<&Value>) -> StoreResult<FencingToken> {
    let s = str_of(op, v)?;
    s.parse()
        .map(FencingToken)
        .map_err(|_| corrupt(op, format_args!("fencing token {s:?} is not a u64")))
}

/// A slot number the scripts answered.
pub(super) fn slot_number(op: Op<'_>, v: Option<&Value>) -> StoreResult<u64> {
    let s = str_of(op, v)?;
    s.parse()
        .map_err(|_| corrupt(op, format_args!("slot {s:?} is not a u64")))
}

pub(super) fn holder(op: Op<'_>, v: Option<&Value>) -> StoreResult<HolderId> {
    let s = str_of(op, v)?;
    HolderId::new(s).map_err(|_| corrupt(op, format_args!("holder {s:?} is not a holder id")))
}

pub(super) fn remaining(op: Op<'_>, v: Option<&Value>) -> StoreResult<Duration> {
    match int(op, v)? {
        -1 => Err(corrupt(op, "the lease key has no expiry")),
        ms => Ok(Duration::from_millis(ms.max(0) as u64)),
    }
}

/// An [`INSPECT`] reply.
pub(super) fn lease_state(op: Op<'_>, reply: Value) -> StoreResult<Option<LeaseState>> {
    if reply == Value::Nil {
        return Ok(None);
    }
    let reply = items(op, reply)?;
    let state = match int(op, reply.first())? {
        1 => LeaseState {
            token: token(op, reply.get(1))?,
            holder: Some(holder(op, reply.get(2))?),
            remaining: remaining(op, reply.get(3))?,
        },
        _ => LeaseState {
            token: token(op, reply.get(1))?,
            holder: None,
            remaining: Duration::ZERO,
        },
    };
    Ok(Some(state))
}

fn optional_text(op: Op<'_>, v: Option<&Value>) -> StoreResult<Option<String>> {
    match v {
        None | Some(Value::Nil) => Ok(None),
        some => text(op, some).map(Some),
    }
}

fn version(op: Op<'_>, v: Option<&Value>) -> StoreResult<Option<u64>> {
    optional_text(op, v)?
        .map(|v| {
            v.parse()
                .map_err(|_| corrupt(op, format_args!("control version {v:?} is not a u64")))
        })
        .transpose()
}

/// A control record from its version and value (both or neither).
pub(super) fn control_record(
    op: Op<'_>,
    version_v: Option<&Value>,
    value: Option<&Value>,
) -> StoreResult<Option<Versioned>> {
    let Some(version) = version(op, version_v)? else {
        return Ok(None);
    };
    let value = optional_text(op, value)?
        .ok_or_else(|| corrupt(op, "a control version without a control record"))?;
    Ok(Some(Versioned { version, value }))
}

/// A [`READ_TASK`] reply as [`Catalog::tasks`] lists it: `None` for a task without a control
/// record none of whose instances was seen within `forget_ms`.
pub(super) fn task_record(
    op: Op<'_>,
    task: &LeaseName,
    reply: Value,
    forget_ms: u64,
) -> StoreResult<Option<TaskRecord>> {
    let mut reply = items(op, reply)?.into_iter();
    let now = u64::try_from(int(op, reply.next().as_ref())?).unwrap_or(0);
    let fields = items(op, reply.next().unwrap_or(Value::Nil))?;
    let control = control_record(op, fields.get(1), fields.get(2))?;
    let mut instances = Vec::new();
    let entries = items(op, reply.next().unwrap_or(Value::Nil))?;
    for pair in entries.chunks(2) {
        let instance = holder(op, pair.first())?;
        let entry = text(op, pair.get(1))?;
        let (expiry, about) = entry
            .split_once(' ')
            .and_then(|(expiry, about)| Some((expiry.parse::<u64>().ok()?, about)))
            .ok_or_else(|| {
                corrupt(
                    op,
                    format_args!("the entry of instance {instance} is not \"<expiry> <about>\""),
                )
            })?;
        if expiry.saturating_add(forget_ms) > now {
            instances.push(InstanceRecord {
                instance,
                about: about.to_owned(),
                remaining: Duration::from_millis(expiry.saturating_sub(now)),
            });
        }
    }
    if control.is_none() && instances.is_empty() {
        return Ok(None);
    }
    instances.sort_by(|a, b| {
        (a.remaining.is_zero(), &a.instance).cmp(&(b.remaining.is_zero(), &b.instance))
    });
    Ok(Some(TaskRecord {
        task: task.clone(),
        definition: optional_text(op, fields.first())?,
        instances,
        control,
    }))
}
