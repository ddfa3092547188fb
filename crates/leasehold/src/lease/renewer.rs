//! The renewal of held leases, written once for a [`Lease`](crate::Lease)'s guard and a
//! [`LeaseSession`](crate::LeaseSession)'s: a renewer task keeps a set of members (one tenure
//! each), renews the live ones on one cadence, tells a member's work to stop a stop margin before
//! its local deadline while renewal is overdue, ends it at that deadline or when the store says
//! it is no longer ours, and releases it in the store when its guard lets go. A `Lease`'s guard
//! is a set of one, renewed with [`Store::renew`]; a session's set is renewed with
//! [`Store::renew_many`] and purged hourly ([`Members`] says how).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use crate::lease::config::LeaseConfig;
use crate::lease::tenure::{LossReason, Tenure};
use crate::store::answers::{Release, Renewal};
use crate::store::error::{StoreError, StoreResult};
use crate::store::name::{HolderId, LeaseName};
use crate::store::token::FencingToken;
use crate::store::traits::Store;

/// Where a release's answer goes.
pub(crate) type ReleaseReply = oneshot::Sender<Result<Release, StoreError>>;

/// One member's answer to a renewal round; a failed store call is shared by every lease it
/// carried.
pub(crate) type Reply = Result<Renewal, Arc<StoreError>>;

/// The id of a lone guard's member, the only one of its set.
pub(crate) const LONE: u64 = 0;

/// One held lease, as its renewer keeps it.
pub(crate) struct Member {
    pub(crate) id: u64,
    pub(crate) name: LeaseName,
    pub(crate) token: FencingToken,
    tenure: Arc<Tenure>,
    /// The renewer's own copy of the tenure's deadline, read without the tenure's lock.
    deadline: Instant,
}

impl Member {
    pub(crate) fn new(id: u64, name: LeaseName, token: FencingToken, tenure: Arc<Tenure>) -> Self {
        let deadline = tenure.deadline();
        Self {
            id,
            name,
            token,
            tenure,
            deadline,
        }
    }

    /// Renewed and timed by its renewer: not lost. A lost member stays in its set until its
    /// guard lets go, so that the guard's release still reaches the store.
    fn is_live(&self) -> bool {
        self.tenure.loss_reason().is_none()
    }

    /// When its work is told to stop if no renewal is confirmed before.
    fn stop_at(&self, config: &LeaseConfig) -> Instant {
        self.deadline
            .checked_sub(config.stop_margin)
            .unwrap_or(self.deadline)
    }

    /// A renewal interval after its acquire (or tick) was sent: the deadline is measured from
    /// that instant.
    fn first_renewal(&self, config: &LeaseConfig) -> Instant {
        self.deadline + config.drift_margin - config.ttl + config.renew_interval
    }
}

/// A renewer's members, and how they are renewed.
pub(crate) trait Members<S: Store>: Send + 'static {
    /// Every member, live or lost.
    fn iter(&self) -> impl Iterator<Item = &Member>;

    fn get_mut(&mut self, id: u64) -> Option<&mut Member>;

    fn insert(&mut self, member: Member);

    fn remove(&mut self, id: u64) -> Option<Member>;

    /// One renewal round of `leases` (id, name, token), each store call given up at
    /// `deadline`: an answer for every id.
    fn renew(
        store: S,
        holder: HolderId,
        leases: Vec<(u64, LeaseName, FencingToken)>,
        ttl: Duration,
        deadline: Instant,
    ) -> impl Future<Output = Vec<(u64, Reply)>> + Send + 'static;

    /// Member `id`, still in the set, stops being renewed here (lost, or let go while live):
    /// called once for each.
    fn ended(&mut self, id: u64) {
        let _ = id;
    }

    /// When [`chore`](Self::chore) is due next; `None`: never.
    fn chore_at(&self) -> Option<Instant> {
        None
    }

    /// Housekeeping beside the renewals; it sets the next [`chore_at`](Self::chore_at).
    fn chore(&mut self, store: &S) {
        let _ = store;
    }
}

/// What guards and handles tell a renewer.
pub(crate) enum Command {
    Add(Member),
    Release(u64, ReleaseReply),
    Drop(u64),
}

/// Where a renewer's commands come from: a session's channel, or a lone guard's one release or
/// drop.
pub(crate) trait Inbox: Send + 'static {
    /// The next command; `None` once no guard or handle can send one.
    fn next_command(&mut self) -> impl Future<Output = Option<Command>> + Send;
}

impl Inbox for mpsc::UnboundedReceiver<Command> {
    fn next_command(&mut self) -> impl Future<Output = Option<Command>> + Send {
        self.recv()
    }
}

/// A lone guard's inbox: its release, or its drop (the sender dropped unused). A channel of
/// one message, where a session's is a queue: a lone guard is the common case, and a queue's
/// first block alone would cost more than the rest of the guard.
pub(crate) struct LoneInbox(Option<oneshot::Receiver<ReleaseReply>>);

impl Inbox for LoneInbox {
    async fn next_command(&mut self) -> Option<Command> {
        let release = self.0.as_mut()?;
        let command = match release.await {
            Ok(reply) => Command::Release(LONE, reply),
            Err(_) => Command::Drop(LONE),
        };
        self.0 = None;
        Some(command)
    }
}

/// A guard's line to its renewer, which releases its lease when the guard lets go.
pub(crate) enum Link {
    /// Its own renewer: sending is its release, dropping the sender its drop.
    Lone(oneshot::Sender<ReleaseReply>),
    /// A session's renewer, shared with the session's other guards.
    Member {
        id: u64,
        tx: mpsc::UnboundedSender<Command>,
    },
}

impl Link {
    /// A lone guard's line, and its renewer's end of it.
    pub(crate) fn lone() -> (Self, LoneInbox) {
        let (tx, rx) = oneshot::channel();
        (Self::Lone(tx), LoneInbox(Some(rx)))
    }

    /// Asks the renewer to release the lease; where its answer comes, `None` if the renewer is
    /// gone.
    pub(crate) fn release(self) -> Option<oneshot::Receiver<Result<Release, StoreError>>> {
        let (reply, answer) = oneshot::channel();
        let sent = match self {
            Self::Lone(tx) => tx.send(reply).is_ok(),
            Self::Member { id, tx } => tx.send(Command::Release(id, reply)).is_ok(),
        };
        sent.then_some(answer)
    }

    /// Tells the renewer its guard is gone, so it releases the lease best-effort.
    pub(crate) fn dropped(self) {
        // A lone renewer learns it from its channel closing.
        if let Self::Member { id, tx } = self {
            let _ = tx.send(Command::Drop(id));
        }
    }
}

/// A renewal round on its way: when it was sent, and per member the store's answer.
type InFlight = Pin<Box<dyn Future<Output = (Instant, Vec<(u64, Reply)>)> + Send>>;

/// The task that renews a set of members (see the module's documentation).
pub(crate) struct Renewer<S, M> {
    store: S,
    holder: HolderId,
    config: LeaseConfig,
    members: M,
    /// When the live members are renewed next: one cadence for all, started by the first
    /// member's first renewal.
    next_renewal: Instant,
    /// Failed renewal rounds not yet said (one warning per [`SAY_FAILURES_EVERY`]), and when
    /// the last was said.
    unsaid: u64,
    said_at: Option<Instant>,
}

/// While renewals keep failing (a store that is down, retried every retry interval), how often
/// that is said: once at the first failure, then once per this with the count in between.
const SAY_FAILURES_EVERY: Duration = Duration::from_secs(5);

impl<S: Store, M: Members<S>> Renewer<S, M> {
    /// A renewer of no member yet.
    pub(crate) fn new(store: S, holder: HolderId, config: LeaseConfig, members: M) -> Self {
        Self {
            store,
            holder,
            config,
            members,
            next_renewal: Instant::now(),
            unsaid: 0,
            said_at: None,
        }
    }

    /// Takes `member` on. The first live member starts the cadence; later ones ride it (each
    /// is due at most a renewal interval after it joins, well before its deadline).
    pub(crate) fn add(&mut self, member: Member) {
        if self.live().next().is_none() {
            self.next_renewal = member.first_renewal(&self.config);
        }
        self.members.insert(member);
    }

    /// Renews until no guard or handle is left to send a command.
    pub(crate) async fn run(mut self, mut inbox: impl Inbox) {
        // The renewal runs beside the timer rather than inside it, so a store that never answers
        // still lets the stop margin and the deadline fire on time.
        let mut in_flight: Option<InFlight> = None;
        loop {
            let renewing = in_flight.is_some();
            let wake = self.next_wake(renewing);
            tokio::select! {
                biased;
                // First, so after a pause an overdue deadline wins over a command or a reply.
                () = sleep_until(wake.unwrap_or(self.next_renewal)), if wake.is_some() => {
                    self.on_time(&mut in_flight);
                }
                command = inbox.next_command() => match command {
                    Some(command) => self.command(command),
                    None => return,
                },
                (sent, replies) = in_flight_reply(&mut in_flight), if renewing => {
                    in_flight = None;
                    self.renewed(sent, replies);
                }
            }
        }
    }

    fn live(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|member| member.is_live())
    }

    /// The earliest of the live members' stop margins and deadlines, the next renewal (unless
    /// one is in flight) and the next chore.
    fn next_wake(&self, renewing: bool) -> Option<Instant> {
        let mut wake = self.members.chore_at();
        let mut live = false;
        for member in self.live() {
            live = true;
            let at = if member.tenure.is_expiring() {
                member.deadline
            } else {
                member.stop_at(&self.config)
            };
            wake = Some(wake.map_or(at, |wake| wake.min(at)));
        }
        if live && !renewing {
            wake = Some(wake.map_or(self.next_renewal, |wake| wake.min(self.next_renewal)));
        }
        wake
    }

    /// Whatever is due, deadlines first: after a pause, an overdue deadline wins over a due
    /// renewal.
    fn on_time(&mut self, in_flight: &mut Option<InFlight>) {
        let now = Instant::now();
        let overdue: Vec<u64> = self
            .live()
            .filter(|member| member.deadline <= now)
            .map(|member| member.id)
            .collect();
        for id in overdue {
            self.lose(id, LossReason::Expired);
        }
        self.warn_overdue(now);
        if self.live().next().is_none() {
            // Nothing left to apply its answer to.
            *in_flight = None;
        } else if in_flight.is_none() && self.next_renewal <= now {
            *in_flight = Some(self.send_renewals());
        }
        if self.members.chore_at().is_some_and(|at| at <= now) {
            self.members.chore(&self.store);
        }
    }

    /// Tells the work of every live member past its stop margin to stop; one log line for
    /// them all.
    fn warn_overdue(&self, now: Instant) {
        let mut told = 0;
        let mut first = None;
        for member in self.live() {
            if !member.tenure.is_expiring() && member.stop_at(&self.config) <= now {
                member.tenure.warn_expiring();
                told += 1;
                first.get_or_insert(member);
            }
        }
        match first {
            Some(member) if told == 1 => tracing::warn!(
                lease = %member.name,
                token = %member.token,
                "renewal overdue; telling the work to stop before the lease can expire"
            ),
            Some(_) => tracing::warn!(
                leases = told,
                "renewal overdue; telling the work to stop before the leases can expire"
            ),
            None => {}
        }
    }

    /// Renews every live member; each store call is given up at the earliest deadline.
    fn send_renewals(&self) -> InFlight {
        let leases: Vec<(u64, LeaseName, FencingToken)> = self
            .live()
            .map(|member| (member.id, member.name.clone(), member.token))
            .collect();
        let earliest = self.live().map(|member| member.deadline).min();
        let (store, holder, ttl) = (self.store.clone(), self.holder.clone(), self.config.ttl);
        Box::pin(async move {
            let sent = Instant::now();
            let deadline = earliest.unwrap_or(sent + ttl);
            let replies = M::renew(store, holder, leases, ttl, deadline).await;
            (sent, replies)
        })
    }

    /// Applies a round's answers and sets the next renewal.
    fn renewed(&mut self, sent: Instant, replies: Vec<(u64, Reply)>) {
        let now = Instant::now();
        let mut failures = 0;
        let mut failure = None;
        for (id, reply) in replies {
            // Gone: released meanwhile.
            let Some(member) = self.members.get_mut(id) else {
                continue;
            };
            // A reply read after the member's deadline (this task was late to run) is not
            // trusted; the timer ends the member.
            if !member.is_live() || now >= member.deadline {
                continue;
            }
            match reply {
                Ok(Renewal::Renewed) => {
                    member.deadline = sent + self.config.ttl - self.config.drift_margin;
                    member.tenure.set_deadline(member.deadline);
                }
                Ok(Renewal::Lost) => self.lose(id, LossReason::TakenOver),
                Err(e) => {
                    failures += 1;
                    failure.get_or_insert((member.name.clone(), e));
                }
            }
        }
        self.next_renewal = match failure {
            None => {
                if self.said_at.is_some() {
                    tracing::info!(unsaid_failures = self.unsaid, "renewals succeed again");
                }
                (self.unsaid, self.said_at) = (0, None);
                sent + self.config.renew_interval
            }
            Some((name, e)) => {
                if self.said_at.is_some_and(|at| now < at + SAY_FAILURES_EVERY) {
                    self.unsaid += 1;
                    tracing::debug!(leases = failures, error = %e, "renewal failed; retrying");
                } else {
                    let since = std::mem::take(&mut self.unsaid);
                    if failures == 1 {
                        tracing::warn!(lease = %name, error = %e, failed_rounds_since_last_said = since, "renewal failed; retrying");
                    } else {
                        tracing::warn!(leases = failures, error = %e, failed_rounds_since_last_said = since, "renewal failed; retrying");
                    }
                    self.said_at = Some(now);
                }
                now + self.config.retry_interval
            }
        };
    }

    /// Records a live member's loss; it stays in the set until its guard lets go.
    fn lose(&mut self, id: u64, reason: LossReason) {
        let Some(member) = self.members.get_mut(id) else {
            return;
        };
        if member.tenure.end(reason) {
            metrics::counter!("leasehold_leases_lost_total", "reason" => reason.as_str())
                .increment(1);
            tracing::warn!(lease = %member.name, token = %member.token, %reason, "lease lost");
        }
        self.members.ended(id);
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Add(member) => self.add(member),
            Command::Release(id, reply) => {
                let Some(member) = self.take(id) else {
                    let _ = reply.send(Ok(Release::NotHeld));
                    return;
                };
                // Answered from its own task: many releases at once must not hold up renewals.
                let release = self.releasing(member);
                tokio::spawn(async move {
                    let _ = reply.send(release.await);
                });
            }
            Command::Drop(id) => {
                if let Some(member) = self.take(id) {
                    tokio::spawn(self.releasing(member));
                }
            }
        }
    }

    /// Takes a member out for its release: its work is told to stop first.
    fn take(&mut self, id: u64) -> Option<Member> {
        if self.members.get_mut(id)?.is_live() {
            self.members.ended(id);
        }
        let member = self.members.remove(id)?;
        member.tenure.stop();
        Some(member)
    }

    /// Frees a member's lease in the store, waiting at most a ttl. Also after a local loss: if
    /// the store still lists us (the deadline passed here first), others need not wait for its
    /// expiry; a tenure the store ended or gave to someone else answers [`Release::NotHeld`].
    fn releasing(
        &self,
        member: Member,
    ) -> impl Future<Output = Result<Release, StoreError>> + Send + 'static {
        let (store, holder, ttl) = (self.store.clone(), self.holder.clone(), self.config.ttl);
        async move {
            let release = store.release(&member.name, &holder, member.token);
            let result = tokio::time::timeout(ttl, release)
                .await
                .unwrap_or(Err(StoreError::Timeout(ttl)));
            match &result {
                Ok(outcome) => {
                    tracing::debug!(lease = %member.name, token = %member.token, ?outcome, "lease released");
                }
                Err(e) => tracing::warn!(lease = %member.name, error = %e, "release failed"),
            }
            result
        }
    }
}

/// `call`, given up at `deadline`.
pub(crate) async fn within<T>(
    deadline: Instant,
    call: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let start = Instant::now();
    tokio::time::timeout_at(deadline, call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::Timeout(
                deadline.saturating_duration_since(start),
            ))
        })
}

/// The in-flight round's answer; never completes when none is in flight (its select arm is
/// disabled then anyway).
async fn in_flight_reply<T>(in_flight: &mut Option<Pin<Box<dyn Future<Output = T> + Send>>>) -> T {
    match in_flight.as_mut() {
        Some(round) => round.await,
        None => std::future::pending().await,
    }
}
