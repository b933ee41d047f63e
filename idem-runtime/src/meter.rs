//! Usage metering by address: a re-sent batch deduplicates instead of
//! double counting.
//!
//! Each usage event carries its own identifier. Its row in `idem_records`
//! (kind `meter_event`) lives at an address derived from that identifier, so
//! the same partial unique indexes that guard claims make a re-sent event land
//! on the row it already has: the address is the constraint.
//!
//! # Semantics
//!
//! - **One round trip per batch**, whatever its size: one statement over
//!   arrays, `INSERT ... ON CONFLICT ... DO UPDATE ... RETURNING`, which
//!   returns every event's stored row and whether this statement inserted it.
//!   (The update writes nothing new; it locks and returns the stored row, so a
//!   re-sender learns what is stored even when another re-sender inserted it
//!   a moment before.)
//! - **Identical re-sends deduplicate.** An event whose identifier is already
//!   stored with the same meter, quantity and time is reported
//!   [`Deduplicated`](EventOutcome::Deduplicated) and counted once.
//! - **A re-sent identifier with different content is a conflict**, never a
//!   second count: the stored event stays as it is, and the outcome
//!   [`Conflict`](EventOutcome::Conflict) carries it so the caller can see
//!   what differs. The same holds for an identifier repeated inside one batch.
//! - **Accounts are separate**: the gate's account (and namespace) scopes the
//!   events, the deduplication and the totals; one account never sees
//!   another's events, and the same identifier in two accounts is two events.
//! - **Identifiers of any content** work (any [`KeyPart`]: text with NUL,
//!   bytes, integers, UUIDs): the address is a digest, and the full identity
//!   is stored and re-checked, so a digest collision is reported
//!   ([`Collision`](EventOutcome::Collision)), never merged.
//! - Times are stored with microsecond precision (PostgreSQL `timestamptz`);
//!   an event is compared with its stored self at that precision.
//! - Events that cannot be stored (a meter name that is empty or holds NUL, a
//!   time before 4713 BC, a `None` identifier) are reported
//!   [`Invalid`](EventOutcome::Invalid) and not sent; the rest of the batch is.
//!   So is every event of a gate whose account or namespace cannot be stored
//!   (NUL, or longer than [`Gate::MAX_SCOPE_NAME_BYTES`]).
//! - Concurrent re-senders of overlapping batches cannot deadlock: every
//!   batch writes its rows in address order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;
use crate::gate::Gate;
use crate::identity::{Identity, KeyPart};
use crate::retry::{self, SERIALIZATION_BACKOFF};
use crate::store::Scope;
use crate::store::metering::{self, EventColumns};

/// The action name under which event identifiers are encoded. Part of every
/// event's address: stable forever, like the identity encoding.
const EVENT_ACTION: &str = "idem.meter_event";
/// The prefix of every event address.
pub const EVENT_ADDRESS_PREFIX: &str = "event_";
/// PostgreSQL's earliest `timestamptz`, 4713-11-24 BC, in microseconds
/// since the Unix epoch.
const EARLIEST_MICROS: i64 = -210_866_803_200_000_000;

/// Records usage events of one account (and namespace). Made by
/// [`Gate::meter`]; cheap to clone.
///
/// ```no_run
/// # async fn demo(gate: idem_runtime::Gate) -> Result<(), idem_runtime::Error> {
/// use std::time::{Duration, SystemTime};
/// use idem_runtime::meter::Event;
///
/// let now = SystemTime::now();
/// let batch = [
///     Event::new("evt_1", "api_calls", 3, now),
///     Event::new("evt_2", "api_calls", 1, now),
/// ];
/// let meter = gate.meter();
/// assert_eq!(meter.record(&batch).await?.inserted, 2);
/// // The client timed out and sends the batch again: nothing is counted twice.
/// assert_eq!(meter.record(&batch).await?.deduplicated, 2);
/// let hour = now - Duration::from_secs(3600)..now + Duration::from_secs(1);
/// assert_eq!(meter.total("api_calls", hour).await?.quantity, 4);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Meter {
    gate: Gate,
}

impl Gate {
    /// Usage metering in this gate's account and namespace.
    pub fn meter(&self) -> Meter {
        Meter { gate: self.clone() }
    }
}

/// One usage event: its own identifier, the meter it counts on, a quantity
/// and when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    id: Identity,
    meter: String,
    quantity: i64,
    occurred_at: SystemTime,
}

impl Event {
    /// An event identified by `id` (any [`KeyPart`]).
    pub fn new(
        id: impl KeyPart,
        meter: impl Into<String>,
        quantity: i64,
        occurred_at: SystemTime,
    ) -> Event {
        Event {
            id: Identity::new(EVENT_ACTION).part(id),
            meter: meter.into(),
            quantity,
            occurred_at,
        }
    }

    /// The event's identity (its identifier, encoded canonically).
    pub fn id(&self) -> &Identity {
        &self.id
    }

    /// Where the event is stored: `event_` + 24 hex digits of the sha1 of
    /// its identity.
    pub fn address(&self) -> String {
        self.id.address_with_prefix(EVENT_ADDRESS_PREFIX)
    }

    /// The meter it counts on.
    pub fn meter(&self) -> &str {
        &self.meter
    }

    /// How much it counts.
    pub fn quantity(&self) -> i64 {
        self.quantity
    }

    /// When it happened.
    pub fn occurred_at(&self) -> SystemTime {
        self.occurred_at
    }

    /// The event as it would be stored (its time at microsecond
    /// precision), or why it cannot be.
    fn to_recorded(&self) -> Result<Recorded, String> {
        if self.id.is_absent() {
            return Err("the event identifier is None".to_owned());
        }
        if self.meter.is_empty() {
            return Err("the meter name is empty".to_owned());
        }
        if self.meter.contains('\0') {
            return Err(
                "the meter name contains NUL, which PostgreSQL text cannot hold".to_owned(),
            );
        }
        let occurred_micros = micros_since_epoch(self.occurred_at)
            .ok_or_else(|| "the time is outside PostgreSQL's timestamptz range".to_owned())?;
        Ok(Recorded {
            meter: self.meter.clone(),
            quantity: self.quantity,
            occurred_micros,
        })
    }
}

/// An event as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The meter it counts on.
    pub meter: String,
    /// How much it counts.
    pub quantity: i64,
    /// When it happened, at microsecond precision.
    pub occurred_at: SystemTime,
}

/// What happened to one event of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventOutcome {
    /// New: stored and counted.
    Inserted,
    /// Already stored, identical: counted once, as before.
    Deduplicated,
    /// Its identifier is already stored with other content (meter, quantity
    /// or time). Not counted again; the stored event is unchanged.
    Conflict {
        /// What the store holds under this identifier.
        stored: RecordedEvent,
    },
    /// A different identifier holds this address (a digest collision). Not
    /// stored.
    Collision,
    /// Not sent: the event cannot be stored as it is.
    Invalid {
        /// What is wrong with it.
        reason: String,
    },
}

/// What a batch did: counts, and an outcome per event in the batch's order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Events stored for the first time.
    pub inserted: usize,
    /// Events already stored identically (re-sent).
    pub deduplicated: usize,
    /// Events whose identifier is stored with other content.
    pub conflicts: usize,
    /// Events that were not stored: invalid, or a digest collision.
    pub rejected: usize,
    /// One outcome per event, in the order of the batch.
    pub outcomes: Vec<EventOutcome>,
}

impl BatchReport {
    fn from_outcomes(outcomes: Vec<EventOutcome>) -> BatchReport {
        let count = |keep: fn(&EventOutcome) -> bool| outcomes.iter().filter(|o| keep(o)).count();
        BatchReport {
            inserted: count(|o| matches!(o, EventOutcome::Inserted)),
            deduplicated: count(|o| matches!(o, EventOutcome::Deduplicated)),
            conflicts: count(|o| matches!(o, EventOutcome::Conflict { .. })),
            rejected: count(|o| {
                matches!(o, EventOutcome::Collision | EventOutcome::Invalid { .. })
            }),
            outcomes,
        }
    }
}

/// The sum of a meter's events over a time range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Total {
    /// The sum of their quantities.
    pub quantity: i128,
    /// How many events.
    pub events: u64,
}

/// An event's stored content, compared at the store's precision.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Recorded {
    meter: String,
    quantity: i64,
    occurred_micros: i64,
}

impl Recorded {
    fn into_public(self) -> RecordedEvent {
        RecordedEvent {
            meter: self.meter,
            quantity: self.quantity,
            occurred_at: time_from_micros(self.occurred_micros),
        }
    }
}

impl Meter {
    /// Records a batch of events in one round trip and reports, per event,
    /// whether it was new, a re-send, or a conflict.
    ///
    /// Fails only when the store does ([`Error::is_outage`] tells an outage
    /// from an error of the request). The batch is one statement, so it is
    /// stored whole or not at all, but a failed call cannot always say
    /// which: when the connection dies after the commit (the reply is lost
    /// on the wire), the call fails and the batch **is** stored. Send it
    /// again either way: totals stay exact, since every event already there
    /// is reported [`EventOutcome::Deduplicated`] instead of counted again.
    /// So after a failed call, `Deduplicated` on the re-send means "stored
    /// by the call that failed", not "sent twice by the client".
    pub async fn record(&self, events: &[Event]) -> Result<BatchReport, Error> {
        // An account or namespace that can never be stored makes every event
        // invalid: say why, rather than fail as if the store were down.
        if let Err(rejected) = self.gate.check_scope() {
            let reason = rejected.to_string();
            let outcomes = events
                .iter()
                .map(|_| EventOutcome::Invalid {
                    reason: reason.clone(),
                })
                .collect();
            return Ok(BatchReport::from_outcomes(outcomes));
        }
        let prepared: Vec<Result<(String, Recorded), String>> = events
            .iter()
            .map(|event| {
                event
                    .to_recorded()
                    .map(|recorded| (event.address(), recorded))
            })
            .collect();
        // Only the first occurrence of an address is sent; a repeat within
        // the batch is judged against what ends up stored.
        let mut batch = Batch::with_capacity(events.len());
        let mut sent = HashSet::with_capacity(events.len());
        for (event, prepared) in events.iter().zip(&prepared) {
            if let Ok((address, recorded)) = prepared
                && sent.insert(address)
            {
                batch.push(address, event.id.canonical(), recorded);
            }
        }

        let stored = self.write(batch).await?;
        let mut reported_inserted = HashSet::new();
        let outcomes = events
            .iter()
            .zip(prepared)
            .map(|(event, prepared)| match prepared {
                Err(reason) => EventOutcome::Invalid { reason },
                Ok((address, recorded)) => match stored.get(&address) {
                    // The statement returns every row it was sent.
                    None => EventOutcome::Invalid {
                        reason: "the store did not return this event".to_owned(),
                    },
                    Some(row) if row.identity != event.id.canonical() => EventOutcome::Collision,
                    Some(row) if row.inserted && reported_inserted.insert(address) => {
                        EventOutcome::Inserted
                    }
                    Some(row) if row.recorded == recorded => EventOutcome::Deduplicated,
                    Some(row) => EventOutcome::Conflict {
                        stored: row.recorded.clone().into_public(),
                    },
                },
            })
            .collect();
        Ok(BatchReport::from_outcomes(outcomes))
    }

    async fn write(&self, batch: Batch) -> Result<HashMap<String, StoredRow>, Error> {
        if batch.addresses.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = retry::repeat!(
            SERIALIZATION_BACKOFF,
            retry::is_serialization_failure,
            |_, _| {},
            metering::record(self.gate.pool(), self.scope(), batch.columns()).await,
        )?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let stored = StoredRow {
                    inserted: row.inserted,
                    identity: row.identity,
                    recorded: Recorded {
                        meter: row.meter,
                        quantity: row.quantity,
                        occurred_micros: row.occurred_micros,
                    },
                };
                (row.address, stored)
            })
            .collect())
    }

    /// The sum of `meter`'s events that happened in `range` (start included,
    /// end excluded).
    pub async fn total(&self, meter: &str, range: Range<SystemTime>) -> Result<Total, Error> {
        let totals = self.totals_where(Some(meter), range).await?;
        Ok(totals.get(meter).copied().unwrap_or_default())
    }

    /// The sum of every meter's events that happened in `range`, by meter.
    pub async fn totals(&self, range: Range<SystemTime>) -> Result<BTreeMap<String, Total>, Error> {
        self.totals_where(None, range).await
    }

    async fn totals_where(
        &self,
        meter: Option<&str>,
        range: Range<SystemTime>,
    ) -> Result<BTreeMap<String, Total>, Error> {
        let clamp = |time| micros_since_epoch(time).unwrap_or(EARLIEST_MICROS);
        let totals = metering::totals(
            self.gate.pool(),
            self.scope(),
            meter,
            clamp(range.start),
            clamp(range.end),
        )
        .await?;
        Ok(totals
            .into_iter()
            .map(|total| {
                let events = u64::try_from(total.events).unwrap_or_default();
                let quantity = total.quantity;
                (total.meter, Total { quantity, events })
            })
            .collect())
    }

    /// The gate's account and namespace, as the store takes them.
    fn scope(&self) -> Scope<'_> {
        Scope {
            account: self.gate.account_name(),
            namespace: self.gate.namespace_name(),
        }
    }
}

/// The columns of a batch, as arrays for `unnest`.
struct Batch {
    addresses: Vec<String>,
    identities: Vec<Vec<u8>>,
    meters: Vec<String>,
    quantities: Vec<i64>,
    occurred_micros: Vec<i64>,
}

impl Batch {
    fn with_capacity(n: usize) -> Batch {
        Batch {
            addresses: Vec::with_capacity(n),
            identities: Vec::with_capacity(n),
            meters: Vec::with_capacity(n),
            quantities: Vec::with_capacity(n),
            occurred_micros: Vec::with_capacity(n),
        }
    }

    fn columns(&self) -> EventColumns<'_> {
        EventColumns {
            addresses: &self.addresses,
            identities: &self.identities,
            meters: &self.meters,
            quantities: &self.quantities,
            occurred_micros: &self.occurred_micros,
        }
    }

    fn push(&mut self, address: &str, identity: &[u8], recorded: &Recorded) {
        self.addresses.push(address.to_owned());
        self.identities.push(identity.to_vec());
        self.meters.push(recorded.meter.clone());
        self.quantities.push(recorded.quantity);
        self.occurred_micros.push(recorded.occurred_micros);
    }
}

/// A row the batch statement returned.
struct StoredRow {
    inserted: bool,
    identity: Vec<u8>,
    recorded: Recorded,
}

/// Microseconds since the Unix epoch, truncated toward the past; `None`
/// outside PostgreSQL's `timestamptz` range.
fn micros_since_epoch(time: SystemTime) -> Option<i64> {
    let micros = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_micros()).ok()?,
        Err(before) => {
            let before = before.duration();
            // Truncate toward the past, as PostgreSQL does not round.
            let whole = i64::try_from(before.as_micros()).ok()?;
            let partial = i64::from(before.as_nanos() % 1_000 != 0);
            -(whole.checked_add(partial)?)
        }
    };
    (micros >= EARLIEST_MICROS).then_some(micros)
}

fn time_from_micros(micros: i64) -> SystemTime {
    let magnitude = Duration::from_micros(micros.unsigned_abs());
    if micros >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_at_microsecond_precision() {
        for micros in [
            0,
            1,
            -1,
            1_700_000_000_123_456,
            -86_400_000_001,
            EARLIEST_MICROS,
        ] {
            assert_eq!(micros_since_epoch(time_from_micros(micros)), Some(micros));
        }
        let with_nanos = UNIX_EPOCH + Duration::from_nanos(1_500);
        assert_eq!(micros_since_epoch(with_nanos), Some(1));
        let before_with_nanos = UNIX_EPOCH - Duration::from_nanos(1_500);
        assert_eq!(micros_since_epoch(before_with_nanos), Some(-2));
        assert_eq!(
            micros_since_epoch(time_from_micros(EARLIEST_MICROS) - Duration::from_micros(1)),
            None
        );
    }

    #[test]
    fn event_addresses_are_derived_from_the_identifier_alone() {
        let at = UNIX_EPOCH;
        let a = Event::new("evt_1", "api_calls", 1, at);
        let b = Event::new("evt_1", "storage", 9, at + Duration::from_secs(1));
        assert_eq!(a.address(), b.address());
        assert!(a.address().starts_with("event_"));
        assert_eq!(a.address().len(), "event_".len() + 24);
        assert_ne!(
            a.address(),
            Event::new("evt_2", "api_calls", 1, at).address()
        );
    }

    #[test]
    fn unstorable_events_say_why() {
        let at = UNIX_EPOCH;
        assert!(Event::new(None::<&str>, "m", 1, at).to_recorded().is_err());
        assert!(Event::new("e", "", 1, at).to_recorded().is_err());
        assert!(Event::new("e", "a\0b", 1, at).to_recorded().is_err());
        assert!(Event::new("e\0", "m", 1, at).to_recorded().is_ok());
    }
}
