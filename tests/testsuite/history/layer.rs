//! The tower layer (feature `tower`): a real axum server on 127.0.0.1 with
//! `IdempotencyLayer`, and real HTTP clients (reqwest) that retry on 409,
//! 5xx and connection errors, and (in one run) give up on a request
//! mid-way, dropping it after a short random delay, as a client or a proxy
//! that times out does. The gate behind the layer goes through the fault
//! proxy, under the connection faults.
//!
//! Each HTTP attempt is an invocation of [`Entry::Http`]: its body is the
//! handler's run for that attempt (the handler is told its invocation by a
//! header), its answer what the client got, and its events what the gate
//! reported inside the server's service future (a middleware outside the
//! layer observes them, per request). A request whose client went away
//! has no such report (its future was dropped, or its guarded work went on
//! elsewhere); its events are what is known: its handler ran, so it won,
//! or it may hold its claim (`Abandoned`). Where the server reported
//! nothing for an answered request, its events are what the response
//! proves (see `judged`). The same rules, and rule 8: a request whose
//! client went away still runs to completion.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use idem::Gate;
use idem::http::IdempotencyLayer;
use idem_test_support::XorShift;
use idem_test_support::history::{
    self, ACTION, BodyLog, Entry, Event, Got, Guard, Invocation, Keys, Left, Plans, Run, Session,
    Target, Workload, count_from_env, http_key,
};
use tokio::net::TcpListener;

use super::{CONNECTIONS, SEED_VARIABLE, connection_faults, every_fault, faults};

/// The header the layer's scope reads the caller's account from.
const ACCOUNT: &str = "x-account";
/// The header that tells the handler which invocation it runs for.
const INVOCATION: &str = "x-invocation";
/// Attempts of one request before its client gives up.
const ATTEMPTS: usize = 6;
/// How long, at most, the handlers left running when the clients are done
/// are waited for.
const HANDLERS_WAIT: Duration = Duration::from_secs(10);

/// What the clients do.
#[derive(Debug, Clone, Copy)]
struct Shape {
    clients: usize,
    requests: usize,
    identities: usize,
    in_play: usize,
    /// Percent of handler runs that answer 500 (released by the layer).
    fail: u64,
    /// Longest work of a handler.
    work: Duration,
    /// Percent of attempts the client gives up on mid-way.
    disconnect: u64,
    seed: u64,
}

impl Shape {
    fn new(requests: usize, disconnect: u64) -> Shape {
        let requests = count_from_env("IDEM_HISTORY_REQUESTS", requests);
        Shape {
            clients: count_from_env("IDEM_HISTORY_CLIENTS", 8),
            requests,
            identities: (requests / 5).max(1),
            in_play: 6,
            fail: 20,
            work: Duration::from_millis(30),
            disconnect,
            seed: XorShift::seed_from_env(SEED_VARIABLE),
        }
    }

    fn workload(&self) -> Workload {
        Workload {
            tasks: self.clients,
            calls: self.requests,
            identities: self.identities,
            in_play: self.in_play,
            guards: vec![Guard::Fingerprint],
            entries: vec![Entry::Http],
            plans: Plans::succeed_or_fail(self.fail),
            metering: false,
            cached: 0,
            until: None,
            seed: self.seed,
        }
    }
}

/// What the handler of one attempt is to do, and where it logs its run.
#[derive(Clone)]
struct Planned {
    log: Arc<BodyLog>,
    fail: bool,
    work: Duration,
}

/// What the clients and the server share: each attempt's plan, and what
/// the gate reported inside each request the server finished.
#[derive(Default)]
struct Shared {
    planned: Mutex<HashMap<u64, Planned>>,
    reported: Mutex<HashMap<u64, Vec<Event>>>,
}

type Registry = Arc<Shared>;

fn invocation_of(headers: &HeaderMap) -> Option<u64> {
    let value = headers.get(INVOCATION)?.to_str().ok()?;
    value.parse().ok()
}

/// Outside the layer: what the gate reported inside one request.
async fn observed(
    State(registry): State<Registry>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let id = invocation_of(request.headers());
    let (response, events) = idem::testing::observe(next.run(request)).await;
    if let Some(id) = id {
        // What the store said of an outage, for when rule 4 finds no fault
        // near it: the cause (a pool timeout, a Citus worker's error) is
        // in no event the checker sees.
        for event in &events {
            if let idem::testing::GateEvent::Refused(rejected)
            | idem::testing::GateEvent::Unrecorded(rejected) = event
                && rejected.is_outage()
            {
                eprintln!(
                    "history (tower layer): #{id} unavailable: {:?}",
                    std::error::Error::source(rejected)
                );
            }
        }
        let events = events.iter().map(Event::from).collect();
        lock(&registry.reported).insert(id, events);
    }
    response
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The guarded handler: its run is the body; a 201 carries its
/// invocation's id, a 500 is its own failure.
async fn handler(State(registry): State<Registry>, headers: HeaderMap) -> (StatusCode, String) {
    let planned = invocation_of(&headers)
        .and_then(|id| Some((id, lock(&registry.planned).get(&id)?.clone())));
    let Some((id, planned)) = planned else {
        return (StatusCode::BAD_REQUEST, "no such invocation".to_owned());
    };
    let _inside = planned.log.enter();
    tokio::time::sleep(planned.work).await;
    if planned.fail {
        planned.log.leave(Left::Err);
        (StatusCode::INTERNAL_SERVER_ERROR, "failed".to_owned())
    } else {
        planned.log.leave(Left::Ok(id));
        (StatusCode::CREATED, id.to_string())
    }
}

/// The server: one route under the layer, claimed as [`ACTION`] in the
/// account the request's header names (an explicit scope).
async fn serve(gate: Gate, registry: Registry) -> String {
    let layer = IdempotencyLayer::new(gate)
        .route(|_| ACTION.to_owned())
        .scope(|parts| {
            let account = parts.headers.get(ACCOUNT)?.to_str().ok()?;
            Some(account.to_owned())
        });
    let app = Router::new()
        .route("/history", post(handler))
        .with_state(registry.clone())
        .layer(layer)
        .layer(axum::middleware::from_fn_with_state(registry, observed));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/history")
}

/// What a client got for one attempt.
#[derive(Debug)]
enum Answer {
    Response {
        status: u16,
        replayed: bool,
        body: String,
    },
    /// No answer: the client gave up on it, or the connection failed.
    Gone,
}

/// One attempt, until its invocation is recorded.
struct Attempt {
    id: u64,
    identity: usize,
    payload: u8,
    start: u64,
    end: u64,
    answer: Answer,
    log: Arc<BodyLog>,
}

async fn answer_of(request: reqwest::RequestBuilder) -> Answer {
    let Ok(response) = request.send().await else {
        return Answer::Gone;
    };
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    match response.text().await {
        Ok(body) => Answer::Response {
            status,
            replayed,
            body,
        },
        Err(_) => Answer::Gone,
    }
}

/// The clients, sharing a sliding window of identities.
struct Clients {
    session: Session,
    shape: Shape,
    url: String,
    registry: Registry,
    made: AtomicUsize,
    attempts: Mutex<Vec<Attempt>>,
}

impl Clients {
    fn identity(&self, rng: &mut XorShift) -> usize {
        let made = self.made.fetch_add(1, Ordering::Relaxed);
        let shape = &self.shape;
        let in_play = shape.in_play.clamp(1, shape.identities);
        let progress = (made as f64 / shape.requests as f64).min(1.0);
        let first = ((shape.identities - in_play) as f64 * progress) as usize;
        first + rng.below(in_play as u64) as usize
    }

    async fn client(self: Arc<Self>, seed: u64, requests: usize) {
        let mut rng = XorShift::new(seed);
        let client = reqwest::Client::new();
        for _ in 0..requests {
            if self.session.stopped() {
                break;
            }
            let identity = self.identity(&mut rng);
            let payload = [1, 1, 2][rng.below(3) as usize];
            for _ in 0..ATTEMPTS {
                let settled = self.attempt(&client, &mut rng, identity, payload).await;
                if settled {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5 + rng.below(40))).await;
            }
        }
    }

    /// One attempt; `true` when its answer is final (201, 422).
    async fn attempt(
        &self,
        client: &reqwest::Client,
        rng: &mut XorShift,
        identity: usize,
        payload: u8,
    ) -> bool {
        let recorder = self.session.recorder();
        let id = recorder.next_id();
        let log = BodyLog::new(recorder);
        let work = Duration::from_micros(rng.below(self.shape.work.as_micros() as u64 + 1));
        let planned = Planned {
            log: log.clone(),
            fail: rng.below(100) < self.shape.fail,
            work,
        };
        lock(&self.registry.planned).insert(id, planned);
        let give_up = (rng.below(100) < self.shape.disconnect)
            .then(|| Duration::from_micros(rng.below(2 * work.as_micros() as u64 + 2_000)));
        let request = client
            .post(&self.url)
            .header("idempotency-key", http_key(identity))
            .header(ACCOUNT, self.session.target().gate.account_name())
            .header(INVOCATION, id.to_string())
            .body(format!("payload-{payload}"));
        let start = recorder.now();
        let answer = match give_up {
            // Dropping the request future closes its connection mid-way.
            Some(after) => tokio::time::timeout(after, answer_of(request))
                .await
                .unwrap_or(Answer::Gone),
            None => answer_of(request).await,
        };
        let end = recorder.now();
        let last = matches!(
            answer,
            Answer::Response {
                status: 201 | 422,
                ..
            }
        );
        lock(&self.attempts).push(Attempt {
            id,
            identity,
            payload,
            start,
            end,
            answer,
            log,
        });
        last
    }

    /// Once the clients are done: waits for the handlers still running
    /// (a request given up on may go on), then records every attempt.
    async fn record(&self) {
        let deadline = tokio::time::Instant::now() + HANDLERS_WAIT;
        let open = || lock(&self.attempts).iter().any(|a| a.log.is_open());
        while open() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let recorder = self.session.recorder();
        for attempt in lock(&self.attempts).drain(..) {
            let body = attempt.log.take();
            let (got, proved) = judged(&attempt.answer, body.is_some());
            let reported = lock(&self.registry.reported).remove(&attempt.id);
            let events = reported
                .filter(|events| !events.is_empty())
                .unwrap_or(proved);
            recorder.push(Invocation {
                id: attempt.id,
                identity: attempt.identity,
                fingerprint: Some(attempt.payload),
                entry: Entry::Http,
                start: attempt.start,
                end: attempt.end,
                body,
                got,
                events,
            });
        }
    }
}

/// The answer and the events a response proves (see the module docs).
fn judged(answer: &Answer, ran: bool) -> (Got, Vec<Event>) {
    let (status, replayed, body) = match answer {
        Answer::Gone if ran => return (Got::Cancelled, vec![Event::Won]),
        Answer::Gone => return (Got::Cancelled, vec![Event::Abandoned]),
        Answer::Response {
            status,
            replayed,
            body,
        } => (*status, *replayed, body),
    };
    match (status, body.parse::<u64>()) {
        (201, Ok(value)) if replayed => return (Got::Value(value), vec![Event::Replayed]),
        // Settled, or its settle unrecorded (the caller is not told): the
        // checker's leniency for an unrecorded outcome, only near a fault.
        (201, Ok(value)) => return (Got::Value(value), vec![Event::Won]),
        // Released, unless a fault was near: see `outcomes_known`.
        (500, _) if ran && body == "failed" => return (Got::Failed, vec![Event::Won]),
        _ => {}
    }
    let problem: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let kind = problem["type"].as_str().unwrap_or_default();
    let reason = match kind.rsplit('/').next().unwrap_or_default() {
        "in-flight" => "in_flight",
        "key-reused" => "key_reused",
        "store-unavailable" => "unavailable",
        "already-succeeded" => "already_done",
        "outcome-in-doubt" => "in_doubt",
        // Never reported by the gate: the checker says so, with the answer.
        _ => return (Got::refused(unexpected(status, body)), Vec::new()),
    };
    let detail = problem["detail"].as_str().unwrap_or_default();
    let got = Got::Refused {
        reason,
        says_what_to_do: detail.contains("not run") || detail.contains("took effect"),
    };
    let events = if ran {
        vec![Event::Won, Event::Unrecorded(reason)]
    } else {
        vec![Event::Refused(reason)]
    };
    (got, events)
}

/// An answer the layer should never give here, named for the anomaly.
fn unexpected(status: u16, body: &str) -> &'static str {
    let what = format!(
        "unexpected_http_{status}: {}",
        body.chars().take(120).collect::<String>()
    );
    Box::leak(what.into_boxed_str())
}

/// Where the server reported nothing: a handler's own 500 was released,
/// and its 201 settled, by the layer, unless a fault was near to make it
/// unknowable (then the outcome is unrecorded as far as anyone knows).
fn outcomes_known(run: &mut Run) {
    let history = &mut run.history;
    let near: Vec<bool> = history
        .invocations
        .iter()
        .map(|call| history.fault_during(call.start, call.end))
        .collect();
    for (call, near) in history.invocations.iter_mut().zip(near) {
        let only_won = call.entry == Entry::Http && call.events == [Event::Won];
        match &call.got {
            Got::Failed if only_won && !near => call.events.push(Event::Released),
            Got::Value(_) if only_won && !near => call.events.push(Event::Settled),
            Got::Value(_) if only_won => call.events.push(Event::Unrecorded("unavailable")),
            _ => {}
        }
    }
}

async fn the_layer_keeps_every_promise(target: Target, shape: Shape, name: &str) {
    let registry = Registry::default();
    let url = serve(target.gate.clone(), registry.clone()).await;
    let guards = vec![Guard::Fingerprint; shape.identities];
    let faults = if target.cluster.is_some() {
        faults(every_fault())
    } else {
        faults(connection_faults())
    };
    let mut run = history::run_outside(
        &target,
        &shape.workload(),
        guards,
        Keys::Text,
        Some(&faults),
        |session| async move {
            let clients = Arc::new(Clients {
                session,
                shape,
                url,
                registry,
                made: AtomicUsize::new(0),
                attempts: Mutex::new(Vec::new()),
            });
            let mut seeds = XorShift::new(shape.seed ^ 0x4854_5450);
            let tasks: Vec<_> = (0..shape.clients)
                .map(|client| {
                    let share = shape.requests / shape.clients
                        + usize::from(client < shape.requests % shape.clients);
                    tokio::spawn(clients.clone().client(seeds.next_u64(), share))
                })
                .collect();
            for task in tasks {
                task.await.expect("a client panicked");
            }
            clients.record().await;
        },
    )
    .await;
    outcomes_known(&mut run);
    history::assert_no_anomalies(&run, name, SEED_VARIABLE);
    history::assert_recovers(&target).await;
}

/// Clients that retry on 409, 5xx and connection errors, none giving up
/// mid-way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrying_clients_through_the_layer_under_connection_faults_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    the_layer_keeps_every_promise(target, Shape::new(1_500, 0), "history (tower layer)").await;
}

/// The same, with clients that give up on a request mid-way: the guarded
/// work must run to completion whatever the client does, its outcome
/// recorded, the retry answered with it. On 4f59d0d hyper drops the
/// service future with the connection, and the handler with it: rule 8
/// (seed 1796183776689438908: 17 handlers cancelled mid-body, their claims
/// left pending, every retry refused in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_disconnect_through_the_layer_keep_every_promise() {
    let target = Target::proxied(CONNECTIONS).await;
    let name = "history (tower layer, disconnects)";
    the_layer_keeps_every_promise(target, Shape::new(1_500, 15), name).await;
}

/// The long run: `IDEM_HISTORY_REQUESTS`, `IDEM_HISTORY_CLIENTS`, and
/// `IDEM_HISTORY_DISCONNECT` (percent of attempts given up on; 0 until the
/// detached bodies land).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long history of the tower layer (minutes): run it with -- --ignored"]
async fn a_long_history_of_the_layer_under_every_fault_keeps_every_promise() {
    let target = Target::cluster(CONNECTIONS).await;
    let name = "history (tower layer, long, every fault)";
    let disconnect = count_from_env("IDEM_HISTORY_DISCONNECT", 10) as u64;
    the_layer_keeps_every_promise(target, Shape::new(30_000, disconnect), name).await;
}
