//! An ordered event's place among its entity's events
//! ([`Guard::ordered`](crate::Guard::ordered)).

use std::time::{SystemTime, UNIX_EPOCH};

/// Where an event stands among the events of its entity: greater is newer.
/// An integer (a sequence number, a version, a counter the provider
/// stamps) or a time ([`SystemTime`], kept as microseconds since the Unix
/// epoch), as [`Guard::ordered`](crate::Guard::ordered) takes it.
///
/// Two events of equal order are not older than each other: both run
/// (each once, by its own key), so two events stamped in the same
/// microsecond, or the same second, are never dropped. Keep one kind of
/// order per entity: an integer and a time compare as the numbers they
/// are stored as.
///
/// ```
/// use idem_runtime::EventOrder;
/// use std::time::{Duration, UNIX_EPOCH};
///
/// assert!(EventOrder::from(8) > EventOrder::from(7));
/// assert_eq!(EventOrder::try_from(u64::MAX).ok(), None);
/// let at = UNIX_EPOCH + Duration::from_millis(1_500);
/// assert_eq!(EventOrder::from(at).get(), 1_500_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventOrder(i64);

impl EventOrder {
    /// The order `order`.
    pub const fn new(order: i64) -> EventOrder {
        EventOrder(order)
    }

    /// The order as it is stored: the integer, or a time's microseconds
    /// since the Unix epoch.
    pub const fn get(self) -> i64 {
        self.0
    }
}

macro_rules! from_integer {
    ($($integer:ty),*) => {$(
        impl From<$integer> for EventOrder {
            fn from(order: $integer) -> EventOrder {
                EventOrder(i64::from(order))
            }
        }
    )*};
}
from_integer!(i64, i32, i16, i8, u32, u16, u8);

/// An order that does not fit in an [`EventOrder`] (an `i64`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the order {0} is beyond what an event order holds (an i64, at most {max})", max = i64::MAX)]
pub struct OrderOutOfRange(String);

macro_rules! try_from_integer {
    ($($integer:ty),*) => {$(
        impl TryFrom<$integer> for EventOrder {
            type Error = OrderOutOfRange;

            fn try_from(order: $integer) -> Result<EventOrder, OrderOutOfRange> {
                i64::try_from(order)
                    .map(EventOrder)
                    .map_err(|_| OrderOutOfRange(order.to_string()))
            }
        }
    )*};
}
try_from_integer!(u64, usize, i128, u128);

/// A time, as microseconds since the Unix epoch (negative before it).
/// Times more than 292,000 years away from it hold the nearest order an
/// `i64` can.
impl From<SystemTime> for EventOrder {
    fn from(at: SystemTime) -> EventOrder {
        let saturating = |micros: u128| i64::try_from(micros).unwrap_or(i64::MAX);
        EventOrder(match at.duration_since(UNIX_EPOCH) {
            Ok(after) => saturating(after.as_micros()),
            Err(before) => -saturating(before.duration().as_micros()),
        })
    }
}
