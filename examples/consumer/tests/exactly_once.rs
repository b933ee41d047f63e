//! At-least-once delivery in, each order's effect exactly once out: real
//! consumer processes against a real NATS JetStream and PostgreSQL, with
//! duplicates published three ways, JetStream's redeliveries, and
//! consumers killed mid-batch and restarted. Then the same workload
//! without idem (`--no-idem`), which must show duplicate effects: proof
//! that the first half could have failed.
//!
//! Each run has its own stream, subject, durable consumer, ledger table
//! and idem account, so it can run beside any other test.
//!
//! It needs a NATS server, so `cargo test` lists it as ignored, with the
//! command that runs it: `scripts/test-consumer` (it installs Debian's
//! nats-server when missing, then runs `-- --ignored`).

mod nats_server;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use idem::sqlx::PgPool;
use idem::testing;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use nats_server::NatsServer;

/// Distinct orders: the ledger must end with exactly one row each.
const ORDERS: usize = 400;
/// JetStream's duplicate window for the stream: a re-publish with the same
/// `Nats-Msg-Id` inside it is dropped by JetStream, after it is stored.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);
/// The consumer's ack wait: a killed consumer's messages come back after it.
const ACK_WAIT: Duration = Duration::from_secs(1);
/// SIGKILLs per run (besides one consumer aborting itself on cue).
const KILLS: usize = 5;
/// The longest a run may take to drain.
const DRAIN_LIMIT: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs nats-server (NATS with JetStream): run scripts/test-consumer"]
async fn each_order_is_entered_exactly_once_under_kills_and_duplicates() {
    let server = NatsServer::ensure();
    // The tests' PostgreSQL, found the one way every test finds it; the
    // consumer processes get the same URL.
    let database_url = testing::database_url();
    let pool = testing::pool().await;

    let guarded = run_workload(&server.url, &database_url, &pool, true).await;
    guarded.print("with idem");
    guarded.cleanup(&server.url, &pool).await;
    assert_eq!(
        guarded.duplicate_keys, 0,
        "with idem, some order was entered more than once: {} orders have several rows",
        guarded.duplicate_keys
    );
    assert_eq!(
        guarded.distinct_keys, ORDERS as i64,
        "an order was never entered"
    );
    assert_eq!(guarded.rows, ORDERS as i64, "one row per order, none more");
    assert_eq!(guarded.left, (0, 0), "nothing left unacknowledged");
    assert_eq!(
        guarded.claims,
        BTreeMap::from([("success".to_owned(), ORDERS as i64)]),
        "every claim settled (none pending, none in doubt)"
    );
    assert_eq!(
        guarded.js_absorbed, guarded.same_id_now,
        "JetStream drops a re-publish inside its window"
    );
    assert_eq!(
        guarded.late_absorbed, 0,
        "JetStream keeps a re-publish after its window"
    );
    assert!(
        guarded.kills >= 3,
        "the consumers were killed mid-run ({} kills)",
        guarded.kills
    );
    assert!(
        guarded.aborts >= 1,
        "a consumer aborted between its effects and their settle"
    );
    assert!(
        guarded.probe_succeeded >= 1,
        "the reconciler settled a claim whose effect a dead consumer had made ({:?})",
        guarded.probes
    );
    assert!(guarded.redeliveries > 0, "JetStream redelivered messages");

    let control = run_workload(&server.url, &database_url, &pool, false).await;
    control.print("control, --no-idem");
    control.cleanup(&server.url, &pool).await;
    assert_eq!(control.left, (0, 0), "nothing left unacknowledged");
    assert_eq!(
        control.distinct_keys, ORDERS as i64,
        "the control entered every order"
    );
    assert!(
        control.rows > ORDERS as i64 && control.duplicate_keys > 0,
        "without idem the same workload must enter some orders twice (it entered {} rows for {} orders): \
         otherwise this test could not tell idem from luck",
        control.rows,
        control.distinct_keys
    );
}

/// What kind of publication a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The order's first publication.
    Original,
    /// The same order and `Nats-Msg-Id` again at once: JetStream drops it.
    SameIdNow,
    /// The same order under another `Nats-Msg-Id`: stored; idem absorbs it.
    OtherId,
    /// The same order and `Nats-Msg-Id` after the duplicate window:
    /// stored; idem absorbs it.
    SameIdLate,
    /// The same order with another amount: stored; one of the two wins,
    /// the other's deliveries are refused `KeyReused` and terminated.
    KeyReused,
}

struct Publication {
    kind: Kind,
    order: usize,
    amount: i64,
    msg_id: String,
}

/// The publications: the originals with some immediate duplicates among
/// them, then (after the window) the late ones.
fn plan() -> (Vec<Publication>, Vec<Publication>) {
    let order_amount = |i: usize| 100 + i as i64;
    let mut early = Vec::new();
    let mut late = Vec::new();
    for i in 0..ORDERS {
        let publication = |kind, amount, msg_id: String| Publication {
            kind,
            order: i,
            amount,
            msg_id,
        };
        early.push(publication(
            Kind::Original,
            order_amount(i),
            format!("m-{i}"),
        ));
        match i % 20 {
            0 | 10 => early.push(publication(
                Kind::SameIdNow,
                order_amount(i),
                format!("m-{i}"),
            )),
            5 | 15 => early.push(publication(
                Kind::OtherId,
                order_amount(i),
                format!("m-{i}-again"),
            )),
            3 => late.push(publication(
                Kind::SameIdLate,
                order_amount(i),
                format!("m-{i}"),
            )),
            7 if i < 140 => late.push(publication(
                Kind::KeyReused,
                order_amount(i) + 1,
                format!("m-{i}-other"),
            )),
            _ => {}
        }
    }
    (early, late)
}

/// Publishes `publications`; for each, whether JetStream called it a duplicate.
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    publications: &[Publication],
) -> Vec<bool> {
    let mut acks = Vec::with_capacity(publications.len());
    for p in publications {
        let payload = serde_json::json!({"order": format!("o-{}", p.order), "amount": p.amount});
        let ack = js
            .send_publish(
                subject.to_owned(),
                PublishMessage::build()
                    .payload(payload.to_string().into())
                    .message_id(&p.msg_id),
            )
            .await
            .unwrap_or_else(|error| panic!("publish failed: {error}"));
        acks.push(ack);
    }
    let mut duplicates = Vec::with_capacity(acks.len());
    for ack in acks {
        let ack = ack
            .await
            .unwrap_or_else(|error| panic!("publish not acknowledged: {error}"));
        duplicates.push(ack.duplicate);
    }
    duplicates
}

/// Names of one run: nothing shared with any other.
struct Names {
    stream: String,
    subject: String,
    durable: String,
    ledger: String,
    account: String,
}

impl Names {
    fn new(guarded: bool) -> Names {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let run = format!(
            "{}_{nanos}_{}",
            std::process::id(),
            if guarded { "idem" } else { "control" }
        );
        Names {
            stream: format!("IDEMC_{run}"),
            subject: format!("idemc.{run}.orders"),
            durable: format!("ledger_{run}"),
            ledger: format!("idemc_ledger_{run}"),
            account: format!("idemc-{run}"),
        }
    }
}

/// The consumer processes of a run, and every line they printed.
struct Fleet {
    args: Vec<String>,
    children: Vec<Child>,
    lives: Vec<usize>,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Fleet {
    fn spawn(&mut self, slot: usize, extra: &[&str]) -> Child {
        let life = self.lives[slot];
        self.lives[slot] += 1;
        let name = format!("c{slot}.{life}");
        // c2 takes big batches: 40 bodies of 30 ms outlast the ack wait, so
        // JetStream redelivers them to the others while c2 still holds
        // their claims (refused InFlight, then AlreadyDone).
        let batch = if slot == 2 { "40" } else { "10" };
        let mut child = Command::new(env!("CARGO_BIN_EXE_consumer"))
            .args(&self.args)
            .args(["--name", &name, "--batch", batch])
            .args(extra)
            // A killed consumer's claims are reported at warn level when
            // their lease runs out, hundreds of lines per run: errors only,
            // unless CONSUMER_LOG asks for more.
            .env(
                "RUST_LOG",
                std::env::var("CONSUMER_LOG").unwrap_or_else(|_| "error".to_owned()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start the consumer: {error}"));
        if let Some(stdout) = child.stdout.take() {
            let lines = Arc::clone(&self.lines);
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if let Ok(value) = serde_json::from_str::<Value>(&line) {
                        lines.lock().unwrap_or_else(|e| e.into_inner()).push(value);
                    }
                }
            });
        }
        child
    }
}

/// A tiny deterministic generator (xorshift), seeded per run and printed,
/// so that a failing run's kill schedule can be read back.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What one run did and left.
#[derive(Debug, Default)]
struct Outcome {
    guarded: bool,
    names_stream: String,
    names_ledger: String,
    names_account: String,
    seed: u64,
    elapsed: Duration,
    published: usize,
    by_kind: BTreeMap<&'static str, usize>,
    same_id_now: usize,
    js_absorbed: usize,
    late_absorbed: usize,
    stored: u64,
    deliveries: u64,
    redeliveries: u64,
    kills: usize,
    aborts: usize,
    tallies: BTreeMap<String, u64>,
    probes: BTreeMap<String, u64>,
    probe_succeeded: u64,
    resolved: u64,
    left: (u64, u64),
    rows: i64,
    distinct_keys: i64,
    duplicate_keys: i64,
    claims: BTreeMap<String, i64>,
}

async fn run_workload(nats_url: &str, database_url: &str, pool: &PgPool, guarded: bool) -> Outcome {
    let started = Instant::now();
    let names = Names::new(guarded);
    let client = async_nats::connect(nats_url)
        .await
        .unwrap_or_else(|error| panic!("cannot connect to NATS at {nats_url}: {error}"));
    let js = jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: names.stream.clone(),
            subjects: vec![names.subject.clone()],
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|error| {
            panic!("cannot create the stream (is JetStream enabled?): {error}")
        });
    let _: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(names.durable.clone()),
            filter_subject: names.subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_deliver: -1,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|error| panic!("cannot create the durable consumer: {error}"));

    let mut args: Vec<String> = [
        "--nats-url",
        nats_url,
        "--stream",
        &names.stream,
        "--subject",
        &names.subject,
        "--durable",
        &names.durable,
        "--ack-wait",
        "1s",
        "--database-url",
        database_url,
        "--ledger-table",
        &names.ledger,
        "--account",
        &names.account,
        "--batch-wait",
        "100ms",
        "--lease",
        "3s",
        "--reconcile-every",
        "300ms",
        "--retry-delay",
        "300ms",
        "--work",
        "30ms",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if !guarded {
        args.push("--no-idem".to_owned());
    }
    let mut fleet = Fleet {
        args,
        children: Vec::new(),
        lives: vec![0; 3],
        lines: Arc::new(Mutex::new(Vec::new())),
    };
    for slot in 0..3 {
        // c1's first life aborts after its 15th effect, before its batch's
        // outcomes are recorded: the worst moment for a kill, on cue.
        let extra: &[&str] = if slot == 1 {
            &["--abort-after-effects", "15"]
        } else {
            &[]
        };
        let child = fleet.spawn(slot, extra);
        fleet.children.push(child);
    }

    let (early, late) = plan();
    let mut outcome = Outcome {
        guarded,
        names_stream: names.stream.clone(),
        names_ledger: names.ledger.clone(),
        names_account: names.account.clone(),
        ..Outcome::default()
    };
    for p in early.iter().chain(&late) {
        *outcome.by_kind.entry(kind_name(p.kind)).or_default() += 1;
    }
    outcome.published = early.len() + late.len();
    outcome.same_id_now = early.iter().filter(|p| p.kind == Kind::SameIdNow).count();

    // The publisher: the early messages now, the late ones once the
    // window has passed for every early one. The kills run meanwhile.
    let mut publisher = Some({
        let js = js.clone();
        let subject = names.subject.clone();
        tokio::spawn(async move {
            let early_dups = publish(&js, &subject, &early).await;
            tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_millis(500)).await;
            let late_dups = publish(&js, &subject, &late).await;
            let absorbed_now = early
                .iter()
                .zip(&early_dups)
                .filter(|(p, dup)| **dup && p.kind == Kind::SameIdNow)
                .count();
            let wrongly_absorbed = early
                .iter()
                .zip(&early_dups)
                .filter(|(p, dup)| **dup && p.kind != Kind::SameIdNow)
                .count();
            assert_eq!(
                wrongly_absorbed, 0,
                "JetStream dropped a message that was not a re-publish"
            );
            let absorbed_late = late_dups.iter().filter(|dup| **dup).count();
            (absorbed_now, absorbed_late)
        })
    });

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    outcome.seed = seed;
    let mut rng = Rng(seed);
    let mut consumer = stream
        .get_consumer::<consumer::pull::Config>(&names.durable)
        .await
        .unwrap_or_else(|error| panic!("cannot read the consumer back: {error}"));
    let mut published = None;
    let deadline = Instant::now() + DRAIN_LIMIT;
    let mut next_kill = Instant::now() + Duration::from_millis(600 + rng.below(400));
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            Instant::now() < deadline,
            "the run did not drain within {DRAIN_LIMIT:?}: {:?}",
            consumer
                .info()
                .await
                .map(|i| (i.num_pending, i.num_ack_pending))
                .ok()
        );
        if let Some(finished) = publisher.take_if(|handle| handle.is_finished()) {
            published = Some(
                finished
                    .await
                    .unwrap_or_else(|error| panic!("the publisher failed: {error}")),
            );
        }
        // A consumer that exited (the one aborting on cue) is restarted.
        for slot in 0..3 {
            if let Ok(Some(_)) = fleet.children[slot].try_wait() {
                outcome.aborts += 1;
                fleet.children[slot] = fleet.spawn(slot, &[]);
            }
        }
        let info = consumer
            .info()
            .await
            .unwrap_or_else(|error| panic!("consumer info: {error}"));
        let busy = info.num_pending > 0 || info.num_ack_pending > 0;
        if outcome.kills < KILLS && busy && Instant::now() >= next_kill {
            // SIGKILL, mid-batch: the bodies take 30 ms each, so a batch is
            // in hand nearly all the time.
            let mut slot = rng.below(3) as usize;
            // c1's first life is left to reach its abort on cue: a kill
            // before it would take the cue away, and the run would never
            // hit the moment between an effect and its settle.
            if slot == 1 && outcome.aborts == 0 {
                slot = if rng.below(2) == 0 { 0 } else { 2 };
            }
            let _ = fleet.children[slot].start_kill();
            let _ = fleet.children[slot].wait().await;
            outcome.kills += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            fleet.children[slot] = fleet.spawn(slot, &[]);
            next_kill = Instant::now() + Duration::from_millis(500 + rng.below(500));
            continue;
        }
        if published.is_some() && !busy {
            let state = stream_state(&js, &names.stream).await;
            if info.ack_floor.stream_sequence >= state.last_sequence {
                outcome.left = (info.num_pending, info.num_ack_pending as u64);
                outcome.stored = state.messages;
                outcome.deliveries = info.delivered.consumer_sequence;
                break;
            }
        }
    }
    let (absorbed_now, absorbed_late) = published.unwrap_or_default();
    outcome.js_absorbed = absorbed_now;
    outcome.late_absorbed = absorbed_late;
    outcome.redeliveries = outcome.deliveries.saturating_sub(outcome.stored);

    if guarded {
        // Every message is acknowledged; a settle that failed after its
        // effect (none without database faults) would leave its claim
        // pending until the reconciler settles it: give it the lease.
        // (Before the consumers stop: their reconcilers would do it.)
        let settled = BTreeMap::from([("success".to_owned(), ORDERS as i64)]);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let claims: Vec<(String, i64)> = idem::sqlx::query_as(
                "SELECT state, count(*) FROM idem_records WHERE account = $1 AND kind = 'claim' GROUP BY state",
            )
            .bind(&names.account)
            .fetch_all(pool)
            .await
            .unwrap_or_else(|error| panic!("cannot read idem_records: {error}"));
            outcome.claims = claims.into_iter().collect();
            if outcome.claims == settled || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Stop every consumer as an operator would (SIGTERM: the batch in hand
    // is finished first), so their reports are complete.
    for child in &mut fleet.children {
        if let Some(pid) = child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
    }
    for child in &mut fleet.children {
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let lines = std::mem::take(&mut *fleet.lines.lock().unwrap_or_else(|e| e.into_inner()));
    for line in &lines {
        match line["event"].as_str() {
            Some("batch") => {
                if let Some(tally) = line["tally"].as_object() {
                    for (key, value) in tally {
                        *outcome.tallies.entry(key.clone()).or_default() +=
                            value.as_u64().unwrap_or(0);
                    }
                }
            }
            Some("reconciled") => {
                outcome.resolved += line["resolved"].as_u64().unwrap_or(0);
            }
            Some("probe") => {
                let verdict = line["verdict"].as_str().unwrap_or("?");
                let verdict = verdict.split([' ', '{']).next().unwrap_or("?").to_owned();
                if verdict == "Succeeded" {
                    outcome.probe_succeeded += 1;
                }
                *outcome.probes.entry(verdict).or_default() += 1;
            }
            _ => {}
        }
    }

    let ledger = &names.ledger;
    let (rows, distinct): (i64, i64) = idem::sqlx::query_as(idem::sqlx::AssertSqlSafe(format!(
        "SELECT count(*), count(DISTINCT order_key) FROM {ledger}"
    )))
    .fetch_one(pool)
    .await
    .unwrap_or_else(|error| panic!("cannot read the ledger: {error}"));
    let duplicate_keys: i64 = idem::sqlx::query_scalar(idem::sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM (SELECT order_key FROM {ledger} GROUP BY order_key HAVING count(*) > 1) d"
    )))
    .fetch_one(pool)
    .await
    .unwrap_or_else(|error| panic!("cannot read the ledger: {error}"));
    outcome.rows = rows;
    outcome.distinct_keys = distinct;
    outcome.duplicate_keys = duplicate_keys;
    outcome.elapsed = started.elapsed();
    outcome
}

async fn stream_state(js: &jetstream::Context, name: &str) -> stream::State {
    let mut stream = js
        .get_stream(name)
        .await
        .unwrap_or_else(|error| panic!("cannot read the stream: {error}"));
    stream
        .info()
        .await
        .unwrap_or_else(|error| panic!("stream info: {error}"))
        .state
        .clone()
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Original => "original",
        Kind::SameIdNow => "same msg id, inside the window (JetStream drops it)",
        Kind::OtherId => "other msg id (idem absorbs it)",
        Kind::SameIdLate => "same msg id, after the window (idem absorbs it)",
        Kind::KeyReused => "same order, other amount (KeyReused: terminated)",
    }
}

impl Outcome {
    fn print(&self, title: &str) {
        let tally = |key: &str| self.tallies.get(key).copied().unwrap_or(0);
        eprintln!(
            "\n== consumer run, {title} ({:.1} s, kill seed {}) ==",
            self.elapsed.as_secs_f64(),
            self.seed
        );
        eprintln!(
            "published             {} messages for {ORDERS} orders",
            self.published
        );
        for (kind, n) in &self.by_kind {
            eprintln!("  {n:>4}  {kind}");
        }
        eprintln!(
            "absorbed by JetStream {} (Nats-Msg-Id inside the window)",
            self.js_absorbed
        );
        eprintln!("stored in the stream  {}", self.stored);
        eprintln!(
            "deliveries            {} ({} redeliveries)",
            self.deliveries, self.redeliveries
        );
        eprintln!(
            "left unacknowledged   {} pending, {} awaiting an ack (every message acked or terminated)",
            self.left.0, self.left.1
        );
        eprintln!(
            "kills                 {} SIGKILL + {} abort between effect and settle",
            self.kills, self.aborts
        );
        if self.guarded {
            eprintln!(
                "reported by batches   {} effects, {} AlreadyDone, {} InFlight, {} InDoubt, {} KeyReused/AlreadyFailed, {} other; {} acked, {} naked, {} terminated",
                tally("effects"),
                tally("already_done"),
                tally("in_flight"),
                tally("in_doubt"),
                tally("refused_for_good"),
                tally("other"),
                tally("acked"),
                tally("naked"),
                tally("termed")
            );
            eprintln!(
                "reconciler            {} claims resolved; probe answers {:?} (a claim may be asked by several consumers' reconcilers; one resolves it)",
                self.resolved, self.probes
            );
            eprintln!("claims left           {:?}", self.claims);
        } else {
            eprintln!(
                "reported by batches   {} effects, {} acked",
                tally("effects"),
                tally("acked")
            );
        }
        eprintln!(
            "ledger                {} rows for {} orders ({} orders with more than one row)",
            self.rows, self.distinct_keys, self.duplicate_keys
        );
    }

    async fn cleanup(&self, nats_url: &str, pool: &PgPool) {
        if let Ok(client) = async_nats::connect(nats_url).await {
            let _ = jetstream::new(client)
                .delete_stream(&self.names_stream)
                .await;
        }
        let ledger = &self.names_ledger;
        let _ = idem::sqlx::query(idem::sqlx::AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {ledger}"
        )))
        .execute(pool)
        .await;
        let _ = idem::sqlx::query("DELETE FROM idem_records WHERE account = $1")
            .bind(&self.names_account)
            .execute(pool)
            .await;
    }
}
