//! Leases and group leadership for applications: acquire, keepalive, watch, release, state,
//! campaign, observe.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use leasehold::{
    FencingToken, HolderId, Lease, LeaseConfig, LeaseName, LeaseState, Store, TryAcquire,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::error::{ApiError, EndReason, in_range, not_null, parse};
use crate::held::{Entry, Found, Grant, ms};
use crate::sidecar::{Shared, Sidecar};

/// The longest ttl or keepalive: a day.
pub(crate) const MAX_TTL_MS: u64 = 86_400_000;
/// The shortest ttl: a lease must outlast an HTTP round trip plus the store's latency with room
/// to spare, or grants arrive already expired on a loaded machine.
pub(crate) const MIN_TTL_MS: u64 = 1_000;
/// The shortest keepalive: counted from the grant (see `Grant::granted`), so it only has to cover
/// the application's own call interval.
pub(crate) const MIN_KEEPALIVE_MS: u64 = 100;
const MAX_WAIT_MS: u64 = 300_000;
const MAX_WATCH_MS: u64 = 60_000;
const DEFAULT_WATCH_MS: u64 = 30_000;

/// A lease, group or task name from the request path (`{name}`, `{group}`, `{task}`, the
/// page's `/tasks/NAME`), which the router has percent-decoded. A `%2E` left after that stands
/// for a dot: a `.` or `..` segment is sent as `%252E` / `%252E%252E`, because browsers and
/// HTTP clients resolve those segments away, `%2E` included (WHATWG URL), before the request
/// is sent. Names never hold `%`, so this reads no name two ways; nothing else is decoded again,
/// so any other `%` is refused as before.
pub(crate) fn lease_name(field: &str, segment: &str) -> Result<LeaseName, ApiError> {
    let name = if segment.contains('%') {
        Cow::Owned(segment.replace("%2E", ".").replace("%2e", "."))
    } else {
        Cow::Borrowed(segment)
    };
    name_field(field, &name)
}

/// A name from a request body, exactly as given.
pub(crate) fn name_field(field: &str, name: &str) -> Result<LeaseName, ApiError> {
    LeaseName::new(name).map_err(|e| ApiError::field(field, format!("{field}: {e}")))
}

/// The application instance a request speaks for (`instance`): the one rule for text an
/// operator reads ([`leasehold::text::INSTANCE`]), and no whitespace, as a holder id.
pub(crate) fn instance_field(text: &str) -> Result<HolderId, ApiError> {
    let field = leasehold::text::INSTANCE;
    field
        .check(text)
        .map_err(|e| ApiError::field(field.name, e.to_string()))?;
    HolderId::new(text).map_err(|_| {
        ApiError::field(
            field.name,
            "instance must be 1 to 100 bytes without whitespace",
        )
    })
}

pub(crate) fn token(text: &str) -> Result<FencingToken, ApiError> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApiError::field(
            "token",
            "token must be a decimal number as granted (a string)",
        ));
    }
    text.parse::<u64>()
        .map(FencingToken)
        .map_err(|_| ApiError::field("token", "token is larger than any token granted"))
}

/// A lease config for `ttl_ms`, with the ttl's range checked.
pub(crate) fn lease_config(ttl_ms: u64) -> Result<LeaseConfig, ApiError> {
    let ttl = in_range("ttl_ms", ttl_ms, MIN_TTL_MS..=MAX_TTL_MS)?;
    let config = LeaseConfig::new(Duration::from_millis(ttl));
    config
        .validate()
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
    Ok(config)
}

pub(crate) fn keepalive(keepalive_ms: Option<u64>, ttl_ms: u64) -> Result<Duration, ApiError> {
    let ms = in_range(
        "keepalive_ms",
        keepalive_ms.unwrap_or(ttl_ms),
        MIN_KEEPALIVE_MS..=MAX_TTL_MS,
    )?;
    Ok(Duration::from_millis(ms))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireRequest {
    ttl_ms: u64,
    #[serde(default)]
    wait_ms: u64,
    #[serde(default, deserialize_with = "not_null")]
    keepalive_ms: Option<u64>,
    #[serde(default, deserialize_with = "not_null")]
    holder: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    instance: Option<String>,
}

#[derive(Serialize)]
pub(crate) struct AcquireResponse {
    acquired: bool,
    name: String,
    holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    valid_for_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keepalive_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining_ms: Option<u64>,
}

pub(crate) async fn acquire(
    State(sidecar): State<Sidecar>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AcquireResponse>, ApiError> {
    take(&sidecar.0, ("name", &name), body).await
}

/// A term of a group is a lease named after the group.
pub(crate) async fn campaign(
    State(sidecar): State<Sidecar>,
    Path(group): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AcquireResponse>, ApiError> {
    take(&sidecar.0, ("group", &group), body).await
}

/// Acquire and campaign: `(field, name)` is the path's lease name and what to call it.
async fn take(
    shared: &Arc<Shared>,
    (field, name): (&str, &str),
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AcquireResponse>, ApiError> {
    let arrival = Instant::now();
    let name = lease_name(field, name)?;
    let request: AcquireRequest = parse(body)?;
    let config = lease_config(request.ttl_ms)?;
    let keepalive = keepalive(request.keepalive_ms, request.ttl_ms)?;
    let wait = Duration::from_millis(in_range("wait_ms", request.wait_ms, 0..=MAX_WAIT_MS)?)
        .min(shared.max_wait);
    if let Some(label) = &request.holder {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b"._:@/-".contains(&b);
        if label.is_empty() || label.len() > 100 || !label.bytes().all(allowed) {
            return Err(ApiError::field(
                "holder",
                "holder must be 1 to 100 of A-Z a-z 0-9 . _ : @ / -",
            ));
        }
    }
    let instance = request
        .instance
        .as_deref()
        .map(instance_field)
        .transpose()?;
    // The holder names the application instance first: `LABEL@INSTANCE@SIDECAR#N`.
    let label = match (&request.holder, &instance) {
        (Some(label), Some(instance)) => Some(format!("{label}@{instance}")),
        (label, instance) => label
            .clone()
            .or_else(|| instance.as_ref().map(|i| i.to_string())),
    };
    let holder = shared.holder_id(label.as_deref());
    let lease = Lease::held_as(shared.store.clone(), name.clone(), config, holder)
        .map_err(|e| ApiError::field("ttl_ms", e.to_string()))?;
    let attempt = lease.try_acquire().await;
    shared.saw_store(matches!(&attempt, Err(e) if e.is_transient()));
    let guard = match attempt {
        Ok(TryAcquire::Acquired(guard)) => guard,
        Ok(TryAcquire::Busy { holder, remaining }) if wait.is_zero() => {
            return Ok(Json(busy(&name, Some(holder.to_string()), remaining)));
        }
        Ok(TryAcquire::Busy { .. }) => {
            let left = wait.saturating_sub(arrival.elapsed());
            match tokio::time::timeout(left, lease.acquire()).await {
                Ok(Ok(guard)) => guard,
                Ok(Err(e)) => return Err(ApiError::store(&e)),
                Err(_) => {
                    let state = inspect(shared, &name).await.ok().flatten();
                    let (holder, remaining) = state
                        .map(|s| (s.holder.map(|h| h.to_string()), s.remaining))
                        .unwrap_or((None, Duration::ZERO));
                    return Ok(Json(busy(&name, holder, remaining)));
                }
            }
        }
        Err(e) => return Err(ApiError::store(&e)),
    };
    let holder = guard.holder().to_string();
    let entry = shared.registry.insert(Grant {
        guard,
        keepalive,
        stop_margin: config.stop_margin,
        granted: Instant::now(),
        run: None,
        timeout: None,
    });
    // A grant that is no longer valid by the time it can be answered (a ttl too short for the
    // store's latency) is given back, as the core treats a late reply.
    let Ok(valid_for_ms) = entry.valid_for_ms(arrival) else {
        let _ = entry.end(EndReason::Expired).await;
        return Err(ApiError::store_down(format!(
            "the lease was granted but had no validity left when the answer was ready \
             (ttl {} ms is too short for this store's latency)",
            request.ttl_ms
        )));
    };
    Ok(Json(AcquireResponse {
        acquired: true,
        name: name.to_string(),
        holder: Some(holder),
        token: Some(entry.token.to_string()),
        valid_for_ms: Some(valid_for_ms),
        ttl_ms: Some(request.ttl_ms),
        keepalive_ms: Some(ms(keepalive)),
        remaining_ms: None,
    }))
}

fn busy(name: &LeaseName, holder: Option<String>, remaining: Duration) -> AcquireResponse {
    AcquireResponse {
        acquired: false,
        name: name.to_string(),
        holder,
        token: None,
        valid_for_ms: None,
        ttl_ms: None,
        keepalive_ms: None,
        remaining_ms: Some(ms(remaining)),
    }
}

async fn inspect(shared: &Shared, name: &LeaseName) -> Result<Option<LeaseState>, ApiError> {
    let limit = Duration::from_secs(5);
    let result = tokio::time::timeout(limit, shared.store.inspect(name))
        .await
        .unwrap_or(Err(leasehold::StoreError::Timeout(limit)));
    shared.saw_store(matches!(&result, Err(e) if e.is_transient()));
    result.map_err(|e| ApiError::store(&e.into()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenRequest {
    token: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchRequest {
    token: String,
    #[serde(default, deserialize_with = "not_null")]
    wait_ms: Option<u64>,
}

#[derive(Serialize)]
pub(crate) struct Held {
    held: bool,
    token: String,
    valid_for_ms: u64,
}

fn held(entry: &Entry, arrival: Instant) -> Result<Json<Held>, ApiError> {
    let valid_for_ms = entry.valid_for_ms(arrival).map_err(ApiError::lost)?;
    Ok(Json(Held {
        held: true,
        token: entry.token.to_string(),
        valid_for_ms,
    }))
}

fn find(shared: &Shared, name: &str, token: &str) -> Result<Arc<Entry>, ApiError> {
    let name = lease_name("name", name)?;
    let token = self::token(token)?;
    match shared.registry.get(&name, token) {
        Found::Live(entry) => Ok(entry),
        Found::Ended(reason) => Err(ApiError::lost(reason)),
        Found::Unknown => Err(ApiError::lost(EndReason::Unknown)),
    }
}

pub(crate) async fn keepalive_lease(
    State(sidecar): State<Sidecar>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Held>, ApiError> {
    let arrival = Instant::now();
    let request: TokenRequest = parse(body)?;
    let entry = find(&sidecar.0, &name, &request.token)?;
    entry.touch(arrival).map_err(ApiError::lost)?;
    held(&entry, arrival)
}

pub(crate) async fn watch(
    State(sidecar): State<Sidecar>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Held>, ApiError> {
    let arrival = Instant::now();
    let request: WatchRequest = parse(body)?;
    let wait = in_range(
        "wait_ms",
        request.wait_ms.unwrap_or(DEFAULT_WATCH_MS),
        0..=MAX_WATCH_MS,
    )?;
    let entry = find(&sidecar.0, &name, &request.token)?;
    entry.touch(arrival).map_err(ApiError::lost)?;
    // Answer in time for the next call to keep the lease: a frozen application cannot hold a
    // lease through an open request.
    let wait = Duration::from_millis(wait)
        .min(entry.keepalive / 4)
        .min(sidecar.0.max_wait);
    tokio::select! {
        () = entry.end_signal() => {}
        () = tokio::time::sleep(wait) => {}
    }
    held(&entry, arrival)
}

#[derive(Serialize)]
pub(crate) struct Released {
    released: bool,
}

pub(crate) async fn release(
    State(sidecar): State<Sidecar>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Released>, ApiError> {
    let request: TokenRequest = parse(body)?;
    let released = match find(&sidecar.0, &name, &request.token) {
        Ok(entry) => entry.end(EndReason::Released).await.map_err(|e| {
            ApiError::store_down(format!(
                "stopped renewing, but the store could not be told ({e}): the lease expires there after its ttl"
            ))
        })?,
        // A name or token that cannot be valid is a bad request; an unknown one was not ours.
        Err(e) if e.is_bad_request() => return Err(e),
        Err(_) => false,
    };
    Ok(Json(Released { released }))
}

pub(crate) fn released(released: bool) -> Json<Released> {
    Json(Released { released })
}

#[derive(Serialize)]
pub(crate) struct LeaseStateBody {
    name: String,
    held: bool,
    holder: Option<String>,
    token: Option<String>,
    remaining_ms: u64,
}

pub(crate) async fn state(
    State(sidecar): State<Sidecar>,
    Path(name): Path<String>,
) -> Result<Json<LeaseStateBody>, ApiError> {
    let name = lease_name("name", &name)?;
    let state = inspect(&sidecar.0, &name).await?;
    let (held, holder, token, remaining) = match state {
        None => (false, None, None, Duration::ZERO),
        Some(s) => (
            s.holder.is_some(),
            s.holder.map(|h| h.to_string()),
            Some(s.token.to_string()),
            s.remaining,
        ),
    };
    Ok(Json(LeaseStateBody {
        name: name.to_string(),
        held,
        holder,
        token,
        remaining_ms: ms(remaining),
    }))
}

#[derive(Serialize, PartialEq)]
pub(crate) struct GroupState {
    group: String,
    leader: Option<String>,
    token: Option<String>,
    remaining_ms: u64,
}

async fn group_state(shared: &Shared, group: &LeaseName) -> Result<GroupState, ApiError> {
    let state = inspect(shared, group).await?;
    let (leader, token, remaining) = match state {
        Some(LeaseState {
            holder: Some(holder),
            token,
            remaining,
            ..
        }) => (Some(holder.to_string()), Some(token.to_string()), remaining),
        _ => (None, None, Duration::ZERO),
    };
    Ok(GroupState {
        group: group.to_string(),
        leader,
        token,
        remaining_ms: ms(remaining),
    })
}

pub(crate) async fn leader(
    State(sidecar): State<Sidecar>,
    Path(group): Path<String>,
) -> Result<Json<GroupState>, ApiError> {
    let group = lease_name("group", &group)?;
    group_state(&sidecar.0, &group).await.map(Json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ObserveRequest {
    token: Option<String>,
    #[serde(default, deserialize_with = "not_null")]
    wait_ms: Option<u64>,
}

/// How often an observer re-reads the group while nothing wakes it.
const OBSERVE_POLL: Duration = Duration::from_millis(250);

pub(crate) async fn observe(
    State(sidecar): State<Sidecar>,
    Path(group): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<GroupState>, ApiError> {
    let arrival = Instant::now();
    let group = lease_name("group", &group)?;
    let request: ObserveRequest = parse(body)?;
    let known = request.token.as_deref().map(token).transpose()?;
    let wait = Duration::from_millis(in_range(
        "wait_ms",
        request.wait_ms.unwrap_or(DEFAULT_WATCH_MS),
        0..=MAX_WATCH_MS,
    )?)
    .min(sidecar.0.max_wait);
    let shared = &sidecar.0;
    let mut releases = shared.store.subscribe_releases();
    loop {
        let state = group_state(shared, &group).await?;
        let now = state.token.as_deref().map(token).transpose()?;
        let left = wait.saturating_sub(arrival.elapsed());
        if now != known || left.is_zero() {
            return Ok(Json(state));
        }
        // A term ends by release (notified where the store can) or by expiry (its remaining
        // time), whichever is first; poll in between for a takeover by a new term.
        let nap = left
            .min(OBSERVE_POLL)
            .min(Duration::from_millis(state.remaining_ms.saturating_add(1)));
        match releases.as_mut() {
            Some(sub) => tokio::select! {
                () = sub.released(&group) => {}
                () = tokio::time::sleep(nap) => {}
            },
            None => tokio::time::sleep(nap).await,
        }
    }
}
