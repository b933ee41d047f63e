//! A NATS JetStream consumer that enters each order in a ledger exactly
//! once, however often its message is published or delivered: the inbox
//! pattern with idem's batch guard.
//!
//! JetStream delivers at least once: a consumer that dies, or acks late,
//! sees its messages again, and a publisher that retries may publish one
//! order twice. This consumer pulls a batch, claims every message's
//! business key in one statement (`gate.guard_batch(batch).run(..)`), runs
//! the bodies of the keys it won, records their outcomes, and then acks,
//! naks or terminates each message as its result says (`decide.rs`).
//!
//! A consumer killed between its effects and their settle leaves claims
//! `pending` under a lease with `OnExpiry::InDoubt`; the reconciler that
//! runs in every consumer process probes each such claim once its lease
//! ran out by looking for the order's ledger row, and settles it (there)
//! or releases it (absent), so the redelivery is answered `AlreadyDone` or
//! runs the effect. See `README.md` beside this file.

mod consume;
mod decide;
mod ledger;
mod message;

use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use clap::Parser;
use futures_util::StreamExt;
use idem::Gate;
use idem::reconcile::{Reconciler, Verdict};
use idem::sqlx::PgPool;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::consume::Applier;
use crate::decide::Delays;
use crate::ledger::{Ledger, effect_bound};
use crate::message::ACTION;

/// Pulls orders from a JetStream stream and enters each in a ledger table
/// exactly once. Runs until SIGTERM or Ctrl-C (it finishes and acks the
/// batch in hand first).
#[derive(Debug, Parser)]
#[command(name = "consumer", version)]
struct Args {
    /// The NATS server.
    #[arg(long, env = "NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The stream (created, over --subject, when missing).
    #[arg(long, default_value = "ORDERS")]
    stream: String,
    /// The subject the orders are published on.
    #[arg(long, default_value = "orders")]
    subject: String,
    /// The durable pull consumer, shared by every consumer process
    /// (created when missing).
    #[arg(long, default_value = "ledger")]
    durable: String,
    /// The ack wait of the durable consumer, when this process creates it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ack_wait: Duration,
    /// The database of idem's claims and of the ledger.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// The ledger table (created when missing).
    #[arg(long, default_value = "ledger")]
    ledger_table: String,
    /// idem's account for the claims: keeps this ledger's claims, and the
    /// reconciler that probes them, apart from any other's in the database.
    #[arg(long, default_value = "orders")]
    account: String,
    /// Messages per batch.
    #[arg(long, default_value_t = 50)]
    batch: usize,
    /// How long a pull waits for a full batch before taking what came.
    #[arg(long, default_value = "250ms", value_parser = parse_duration)]
    batch_wait: Duration,
    /// Each claim's lease: must cover a whole batch's bodies. A consumer
    /// that vanished holds its claims this long; then the reconciler
    /// resolves them.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    lease: Duration,
    /// Bodies of a batch run at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// How often the reconciler looks for claims to resolve.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    reconcile_every: Duration,
    /// How long a nak'ed message waits before JetStream redelivers it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    retry_delay: Duration,
    /// Simulated work before each effect (for demonstrations and tests).
    #[arg(long, default_value = "0ms", value_parser = parse_duration)]
    work: Duration,
    /// This process's name in the ledger rows.
    #[arg(long, default_value = "consumer")]
    name: String,
    /// Apply every delivery without idem: the control that shows what
    /// at-least-once delivery does to the ledger on its own.
    #[arg(long)]
    no_idem: bool,
    /// For tests: abort right after this many effects, before their
    /// batch's outcomes are recorded (a kill at the worst moment, on cue).
    #[arg(long, hide = true)]
    abort_after_effects: Option<usize>,
}

/// Reads `250ms`, `2s`, `1m` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number = u64::from_str(number).map_err(|_| format!("not a duration: {text:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(number)),
        "s" => Ok(Duration::from_secs(number)),
        "m" => Ok(Duration::from_secs(number * 60)),
        _ => Err(format!("not a duration: {text:?} (use ms, s or m)")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("consumer: {error}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn run(args: Args) -> Result<(), BoxError> {
    if args.lease < Duration::from_secs(1) {
        return Err("--lease must be at least 1s".into());
    }
    let ledger = Ledger::new(&args.ledger_table)?;

    // Two pools on the one database: the application's, for the ledger,
    // and idem's, for the claims. Every effect is over (committed, or
    // definitely not) within a quarter of the lease: the pool gives up
    // acquiring after an eighth, the server cancels the statement after
    // another eighth. With the work before it (at most a quarter), a body
    // that starts with half its lease left (a batch renews a claim that
    // has less) ends before the lease runs out, so the reconciler, which
    // probes a pending claim only then, never looks for a row that is
    // still on its way. idem's statements get no such timeout: a settle
    // cut short would only hold its claim until the reconciler settles it.
    if args.work > args.lease / 4 {
        return Err("--work must be at most a quarter of --lease".into());
    }
    let bound = effect_bound(args.lease);
    let options = PgConnectOptions::from_str(&args.database_url)?;
    // One connection per body that may run at once, and one for the probe.
    let effect_connections = u32::try_from(args.concurrency.clamp(1, 64)).unwrap_or(64) + 1;
    let pool = PgPoolOptions::new()
        .max_connections(effect_connections)
        .acquire_timeout(bound)
        .connect_with(
            options
                .clone()
                .options([("statement_timeout", format!("{}ms", bound.as_millis()))]),
        )
        .await?;
    let idem_pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options)
        .await?;
    ledger.create(&pool).await?;

    let nats = async_nats::connect(args.nats_url.as_str()).await?;
    let js = jetstream::new(nats.clone());
    let stream = js
        .get_or_create_stream(stream::Config {
            name: args.stream.clone(),
            subjects: vec![args.subject.clone()],
            ..Default::default()
        })
        .await?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &args.durable,
            consumer::pull::Config {
                durable_name: Some(args.durable.clone()),
                filter_subject: args.subject.clone(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: args.ack_wait,
                // Never give up on a message: a nak'ed one waits for the
                // claim's holder or the reconciler, however long.
                max_deliver: -1,
                ..Default::default()
            },
        )
        .await?;

    let stop = Arc::new(AtomicBool::new(false));
    spawn_signal_watch(Arc::clone(&stop))?;

    let gate = if args.no_idem {
        None
    } else {
        Some(
            Gate::connect(idem_pool.clone())
                .await?
                .account(&args.account),
        )
    };
    let (stop_reconciler, reconciler_stopped) = tokio::sync::oneshot::channel::<()>();
    let reconciler = gate.as_ref().map(|_| {
        let reconciler = reconciler(&idem_pool, &pool, &ledger, &args);
        tokio::spawn(reconcile(
            reconciler,
            args.reconcile_every,
            args.name.clone(),
            reconciler_stopped,
        ))
    });

    let applier = Applier {
        name: args.name.clone(),
        gate,
        pool,
        ledger,
        lease: args.lease,
        concurrency: args.concurrency,
        work: args.work,
        delays: Delays {
            retry: args.retry_delay,
            misconfigured: Duration::from_secs(30),
        },
        abort_after_effects: args.abort_after_effects.map(AtomicUsize::new),
    };
    emit(json!({"event": "ready", "name": args.name, "idem": !args.no_idem}));

    while !stop.load(Ordering::SeqCst) {
        let messages = match pull(&consumer, args.batch, args.batch_wait).await {
            Ok(messages) => messages,
            Err(error) => {
                tracing::warn!(%error, "pull failed; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let tally = applier.apply(messages).await;
        // Acks are published without a reply; flush so that the batch's
        // acks are on the wire before the next pull.
        if let Err(error) = nats.flush().await {
            tracing::warn!(%error, "flushing acks failed");
        }
        emit(json!({"event": "batch", "name": args.name, "tally": tally}));
    }

    let _ = stop_reconciler.send(());
    if let Some(task) = reconciler {
        task.await.ok();
    }
    emit(json!({"event": "stopped", "name": args.name}));
    Ok(())
}

/// One pull: up to `batch` messages, waiting at most `wait` for them.
async fn pull(
    consumer: &consumer::PullConsumer,
    batch: usize,
    wait: Duration,
) -> Result<Vec<jetstream::Message>, BoxError> {
    let mut pulled = consumer
        .batch()
        .max_messages(batch)
        .expires(wait)
        .messages()
        .await?;
    let mut messages = Vec::with_capacity(batch);
    while let Some(message) = pulled.next().await {
        messages.push(message?);
    }
    Ok(messages)
}

/// The reconciler of this consumer's claims: its probe asks the ledger
/// whether the order's row is there. There: the effect happened, settle.
/// Absent: it did not, and (its holder gone, its effect bounded within
/// the lease) never will; release, so the redelivery runs it.
fn reconciler(idem_pool: &PgPool, pool: &PgPool, ledger: &Ledger, args: &Args) -> Reconciler {
    let (pool, ledger, name) = (pool.clone(), ledger.clone(), args.name.clone());
    Reconciler::new(idem_pool.clone())
        .account(&args.account)
        .interval(args.reconcile_every)
        .probe_timeout(Duration::from_secs(10))
        .probe(ACTION, move |doubt| {
            let (pool, ledger, name) = (pool.clone(), ledger.clone(), name.clone());
            async move {
                let order = doubt
                    .identity
                    .parts()
                    .next()
                    .and_then(|part| part.as_text().map(str::to_owned));
                let Some(order) = order else {
                    return Verdict::Unknown;
                };
                let verdict = match ledger.contains(&pool, &order).await {
                    Ok(true) => Verdict::succeeded(),
                    Ok(false) => Verdict::NotHappened,
                    Err(error) => {
                        tracing::warn!(%error, order, "probe failed; asked again later");
                        Verdict::Unknown
                    }
                };
                emit(json!({
                    "event": "probe",
                    "name": name,
                    "order": order,
                    "state": doubt.state.to_string(),
                    "verdict": format!("{verdict:?}"),
                }));
                verdict
            }
        })
}

/// The reconciler's loop: a pass every `every` until `stopped`, each
/// pass that found something reported as one line. (`Reconciler::run`
/// does the same with back-off after store errors, but reports nothing.)
/// Every consumer process runs one; two that probe the same claim resolve
/// it once (a compare-and-swap on its fence): the other counts it `lost`.
async fn reconcile(
    reconciler: Reconciler,
    every: Duration,
    name: String,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(every) => {}
        }
        match reconciler.reconcile_once().await {
            Ok(pass) if pass.probed > 0 => emit(json!({
                "event": "reconciled",
                "name": name,
                "probed": pass.probed,
                "resolved": pass.resolved,
                "unknown": pass.unknown,
                "lost": pass.lost,
            })),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "reconciler pass failed; trying again"),
        }
    }
}

/// Sets `stop` on SIGTERM or Ctrl-C: the batch in hand is finished and
/// acknowledged, then the process exits.
fn spawn_signal_watch(stop: Arc<AtomicBool>) -> Result<(), BoxError> {
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        stop.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// One JSON line on stdout: what the process did, for whoever watches it.
fn emit(line: serde_json::Value) {
    println!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("2h").is_err());
        assert!(parse_duration("ms").is_err());
    }
}
