//! One call of the guarded action, through an entry point (an
//! `#[idempotent]` function, the guard builder's `run` or `claim`, or their
//! transaction and replay forms), recorded as an [`Invocation`].

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use idem::sqlx::{PgConnection, Postgres, Transaction};
use idem::{
    Claim, Fingerprint, Gate, Identity, OnExpiry, OnUnavailable, OutcomeCommit, Rejected, TxClaim,
    idempotent, testing,
};

use super::body::{Body, Plan};
use super::record::{BodyLog, Recorder};
use super::{
    Entry, Event, Extension, Got, Guard, Invocation, LONG_LEASE, RECONCILED_LEASE, SHORT_LEASE,
    WAIT, identity,
};
use crate::error::JobError;
use crate::history;

/// The `#[idempotent]` functions, one per guard: the same action and key as
/// the [`Entry::Run`] and [`Entry::Claim`] paths, so all three meet in one
/// slot.
mod attribute {
    use super::{Body, Gate, JobError, Postgres, Transaction, idempotent};

    // `action = "history"` is ACTION: the attribute takes a literal.

    #[idempotent(key = "n", action = "history")]
    pub async fn plain(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", replay)]
    pub async fn replay(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", replay, fingerprint = "payload")]
    pub async fn fingerprint(
        gate: &Gate,
        n: u64,
        payload: u8,
        body: Body,
    ) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", lease = "80ms")]
    pub async fn short_lease(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", lease = "250ms")]
    pub async fn long_lease(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", wait = "300ms")]
    pub async fn wait(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", tx = tx)]
    pub async fn tx(
        gate: &Gate,
        tx: &mut Transaction<'_, Postgres>,
        n: u64,
        body: Body,
    ) -> Result<u64, JobError> {
        body.run(Some(&mut **tx)).await
    }

    #[idempotent(key = "n", action = "history", outcome_commit = "async")]
    pub async fn async_outcome(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    #[idempotent(key = "n", action = "history", on_unavailable = "run")]
    pub async fn fail_open(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }

    // An ordered event: `entity` and `order` are `history::entity_of(n)`
    // and `history::order_of(n)`, as the by-hand paths give them.
    #[idempotent(key = "n", action = "history", entity = "entity", order = "order")]
    pub async fn ordered(
        gate: &Gate,
        n: u64,
        entity: u64,
        order: i64,
        body: Body,
    ) -> Result<u64, JobError> {
        body.run(None).await
    }

    // The body's steps (`Body::stepped`) run under this claim.
    #[idempotent(key = "n", action = "history", lease = "80ms")]
    pub async fn stepped(gate: &Gate, n: u64, body: Body) -> Result<u64, JobError> {
        body.run(None).await
    }
}

/// One call, as drawn.
#[derive(Debug, Clone, Copy)]
pub(super) struct Call {
    pub(super) identity: usize,
    pub(super) guard: Guard,
    pub(super) fingerprint: Option<u8>,
    pub(super) entry: Entry,
    pub(super) plan: Plan,
    pub(super) work: Duration,
    /// Drop the call this long after its body was entered.
    pub(super) cancel_after: Option<Duration>,
}

/// Calls the gate through `call.entry` with `body`.
async fn dispatch(gate: &Gate, call: Call, body: Body) -> Result<u64, JobError> {
    match (call.entry, call.guard) {
        (Entry::Attribute, _) => by_attribute(gate, call, body).await,
        (_, Guard::Tx) => by_claim_in(gate, call, body).await,
        (entry, Guard::Ordered) => by_ordered(gate, call, entry, body).await,
        // Steps are recorded under the claim a guard's run makes ambient to
        // its body; a body between a hand claim and its settle has none.
        (Entry::Claim, guard) if !guard.replays() && guard != Guard::Stepped => {
            by_claim(gate, call, body).await
        }
        (_, guard) => {
            let id = identity(call.identity);
            guard.run(gate, &id, call.fingerprint, body.run(None)).await
        }
    }
}

// The guard's options change its type, so a mode drawn at run time cannot
// be one value handed to one call: each guard is matched to its own chain
// of options here, once, for every by-hand path to share.
impl Guard {
    /// Runs `body` through `gate.guard(id)` with this guard's options (and
    /// the payload's fingerprint, if any), replaying if it replays.
    pub(super) async fn run<F>(
        self,
        gate: &Gate,
        id: &Identity,
        fingerprint: Option<u8>,
        body: F,
    ) -> Result<u64, JobError>
    where
        F: Future<Output = Result<u64, JobError>>,
    {
        let guard = fingerprinted(gate.guard(id), fingerprint);
        match self {
            Guard::Plain => guard.run(body).await,
            Guard::Replay | Guard::Fingerprint => guard.replay().run(body).await,
            Guard::Lease(lease) => guard.lease(lease).run(body).await,
            Guard::Wait => guard.wait(WAIT).run(body).await,
            Guard::AsyncOutcome => guard.outcome_commit(OutcomeCommit::Async).run(body).await,
            Guard::FailOpen => guard.on_unavailable(OnUnavailable::Run).run(body).await,
            Guard::Reconciled => {
                guard
                    .lease(RECONCILED_LEASE)
                    .on_expiry(OnExpiry::InDoubt)
                    .replay()
                    .run(body)
                    .await
            }
            Guard::Stepped => guard.lease(SHORT_LEASE).run(body).await,
            // Its body writes through the transaction's connection.
            Guard::Tx => panic!("a tx guard runs on the caller's transaction, not on the pool"),
            Guard::Ordered => panic!("an ordered event is called through `by_ordered`"),
        }
    }

    /// Claims `id` on the pool with this guard's options (and the payload's
    /// fingerprint, if any). A replaying guard has no plain claim (it
    /// would be `claim_or_replay`), nor has a tx one (its claim is made on the transaction).
    pub(super) async fn claim(
        self,
        gate: &Gate,
        id: &Identity,
        fingerprint: Option<u8>,
    ) -> Result<Claim, Rejected> {
        let guard = fingerprinted(gate.guard(id), fingerprint);
        match self {
            Guard::Plain => guard.claim().await,
            Guard::Lease(lease) => guard.lease(lease).claim().await,
            Guard::Wait => guard.wait(WAIT).claim().await,
            Guard::AsyncOutcome => guard.outcome_commit(OutcomeCommit::Async).claim().await,
            Guard::FailOpen => guard.on_unavailable(OnUnavailable::Run).claim().await,
            Guard::Reconciled => {
                guard
                    .lease(RECONCILED_LEASE)
                    .on_expiry(OnExpiry::InDoubt)
                    .claim()
                    .await
            }
            Guard::Replay | Guard::Fingerprint | Guard::Tx | Guard::Stepped | Guard::Ordered => {
                panic!("no plain claim on the pool for {self:?}")
            }
        }
    }

    /// Claims `id` inside the transaction on `connection` (a tx guard's
    /// only option is the fingerprint).
    async fn claim_in(
        self,
        gate: &Gate,
        connection: &mut PgConnection,
        id: &Identity,
        fingerprint: Option<u8>,
    ) -> Result<TxClaim, Rejected> {
        assert_eq!(self, Guard::Tx, "only a tx guard claims in a transaction");
        fingerprinted(gate.guard(id).tx(connection), fingerprint)
            .claim()
            .await
    }
}

/// `guard` with the payload's fingerprint, if the call carries one.
fn fingerprinted<'a, R, D, P>(
    guard: idem::Guard<'a, R, D, P>,
    fingerprint: Option<u8>,
) -> idem::Guard<'a, R, D, P> {
    match fingerprint {
        Some(payload) => guard.fingerprint(Fingerprint::new().part(payload)),
        None => guard,
    }
}

async fn by_attribute(gate: &Gate, call: Call, body: Body) -> Result<u64, JobError> {
    let n = call.identity as u64;
    match call.guard {
        Guard::Plain => attribute::plain(gate, n, body).await,
        Guard::Replay => attribute::replay(gate, n, body).await,
        Guard::Fingerprint => match call.fingerprint {
            Some(payload) => attribute::fingerprint(gate, n, payload, body).await,
            None => attribute::replay(gate, n, body).await,
        },
        Guard::Lease(lease) if lease == SHORT_LEASE => attribute::short_lease(gate, n, body).await,
        Guard::Lease(lease) if lease == LONG_LEASE => attribute::long_lease(gate, n, body).await,
        Guard::Wait => attribute::wait(gate, n, body).await,
        Guard::Tx => {
            let mut tx = gate.pool().begin().await?;
            let output = attribute::tx(gate, &mut tx, n, body).await;
            commit_unless_refused(tx, output).await
        }
        Guard::AsyncOutcome => attribute::async_outcome(gate, n, body).await,
        Guard::FailOpen => attribute::fail_open(gate, n, body).await,
        Guard::Stepped => attribute::stepped(gate, n, body).await,
        Guard::Ordered => {
            let entity = history::entity_of(call.identity) as u64;
            attribute::ordered(gate, n, entity, history::order_of(call.identity), body).await
        }
        Guard::Lease(_) => panic!("no attribute function has the lease of {call:?}"),
        Guard::Reconciled => panic!("the reconciler's workload makes its own calls: {call:?}"),
    }
}

/// Commits a transaction whose claim was won (its settle or release is in
/// it), and lets a refused one roll back.
async fn commit_unless_refused(
    tx: Transaction<'_, Postgres>,
    output: Result<u64, JobError>,
) -> Result<u64, JobError> {
    if matches!(output, Ok(_) | Err(JobError::Failed)) {
        tx.commit().await?;
    }
    output
}

async fn by_claim_in(gate: &Gate, call: Call, body: Body) -> Result<u64, JobError> {
    let mut tx = gate.pool().begin().await?;
    let claim = call
        .guard
        .claim_in(gate, &mut tx, &identity(call.identity), call.fingerprint)
        .await?;
    let output = body.run(Some(&mut tx)).await;
    let recorded = match &output {
        Ok(_) => claim.settle(&mut tx).await,
        Err(JobError::Failed) => claim.release(&mut tx).await,
        // The effect could not be written: the transaction is lost anyway.
        Err(_) => return output,
    };
    recorded?;
    commit_unless_refused(tx, output).await
}

/// An ordered event, of `history::entity_identity(n)` at
/// `history::order_of(n)`, through `run` or through `claim` then `settle`
/// or `release`.
async fn by_ordered(gate: &Gate, call: Call, entry: Entry, body: Body) -> Result<u64, JobError> {
    let id = identity(call.identity);
    let entity = history::entity_identity(call.identity);
    let guard = gate
        .guard(&id)
        .ordered(&entity, history::order_of(call.identity));
    if entry != Entry::Claim {
        return guard.run(body.run(None)).await;
    }
    let claim = guard.claim().await?;
    match body.run(None).await {
        Ok(value) => claim.settle().await.map(|()| value).map_err(Into::into),
        Err(error) => {
            let _released = claim.release().await;
            Err(error)
        }
    }
}

async fn by_claim(gate: &Gate, call: Call, body: Body) -> Result<u64, JobError> {
    let claim = call
        .guard
        .claim(gate, &identity(call.identity), call.fingerprint)
        .await?;
    let log = body.log.clone();
    let output = match call.guard.lease() {
        Some(lease) => extending(&claim, lease, &log, body.run(None)).await,
        None => body.run(None).await,
    };
    match output {
        Ok(value) => claim.settle().await.map(|()| value).map_err(Into::into),
        Err(error) => {
            // The body's error is what its caller needs; the events say
            // whether the release was recorded.
            let _released = claim.release().await;
            Err(error)
        }
    }
}

/// Runs `body`, renewing the claim's lease every half lease meanwhile.
pub(super) async fn extending<F: Future>(
    claim: &idem::Claim,
    lease: Duration,
    log: &BodyLog,
    body: F,
) -> F::Output {
    let mut body = std::pin::pin!(body);
    loop {
        tokio::select! {
            output = &mut body => return output,
            () = tokio::time::sleep(lease / 2) => {
                let start = log.now();
                let renewed = claim.extend(lease).await.is_ok();
                log.extension(Extension { start, end: log.now(), renewed });
            }
        }
    }
}

/// How an invocation ended, seen from its caller.
pub(super) enum Ending {
    Returned(Result<u64, JobError>),
    Panicked,
    Cancelled,
}

pub(super) fn says_what_to_do(rejected: &Rejected) -> bool {
    let message = rejected.to_string();
    message.contains("did not run") || message.contains("check the side effect")
}

impl From<Ending> for Got {
    fn from(ending: Ending) -> Got {
        match ending {
            Ending::Returned(Ok(value)) => Got::Value(value),
            Ending::Returned(Err(JobError::Failed)) => Got::Failed,
            Ending::Returned(Err(JobError::Rejected(rejected))) => Got::Refused {
                reason: rejected.reason(),
                says_what_to_do: says_what_to_do(&rejected),
            },
            Ending::Returned(Err(JobError::Store(_))) => Got::StoreError,
            Ending::Panicked => Got::Panicked,
            Ending::Cancelled => Got::Cancelled,
        }
    }
}

/// A future whose panic is caught and returned as `Err`, so that the
/// future around it (here, the observed invocation) carries on.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_panic) => Poll::Ready(Err(())),
        }
    }
}

/// Makes one call and records it. A body's panic is caught inside the
/// observed future, as a spawned task would contain it, so that what the
/// gate reported before the panic is kept; a cancellation drops the gate's
/// future inside it for the same reason.
pub(super) async fn invoke(gate: &Gate, recorder: &Recorder, call: Call) -> Got {
    let id = recorder.next_id();
    let log = BodyLog::new(recorder);
    let body = Body {
        log: log.clone(),
        plan: call.plan,
        work: call.work,
        value: id,
        effect: (call.guard == Guard::Tx).then(|| (Arc::from(gate.account_name()), call.identity)),
        stepped: call.guard == Guard::Stepped,
    };
    let start = recorder.now();
    let (ending, events) = testing::observe(async {
        let call_made = CatchUnwind(Box::pin(dispatch(gate, call, body)));
        let returned = |caught: Result<Result<u64, JobError>, ()>| {
            caught.map_or(Ending::Panicked, Ending::Returned)
        };
        let Some(after) = call.cancel_after else {
            return returned(call_made.await);
        };
        tokio::select! {
            caught = call_made => returned(caught),
            () = async { log.entered.notified().await; tokio::time::sleep(after).await } => {
                Ending::Cancelled
            }
        }
    })
    .await;
    let got = Got::from(ending);
    recorder.push(Invocation {
        id,
        identity: call.identity,
        fingerprint: call.fingerprint,
        entry: call.entry,
        start,
        end: recorder.now(),
        body: log.take(),
        got: got.clone(),
        events: events.iter().map(Event::from).collect(),
    });
    got
}
