//! The opt-in modes, each under concurrency against a real PostgreSQL:
//! replay, fingerprint, lease with fencing, in-transaction, wait, and
//! failing open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::sqlx::{self, Postgres, Transaction};
use idem::testing::{self, race};
use idem::{Gate, Identity, Rejected, idempotent};
use idem_test_support::{Captured, JobError, rows};
use serde::{Deserialize, Serialize};

// The helpers below (a provider that counts its charges, its receipt) and
// the imports are the submodules' through `use super::*`.
mod dispositions;
mod fail_open;
mod fingerprint;
mod lease;
mod on_expiry_at_the_edges;
pub(crate) mod outcome_commit;
mod replay;
mod replay_values;
mod transaction;
mod wait;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    amount_cents: i64,
    serial: usize,
}

/// Counts the bodies that ran, and numbers each receipt.
#[derive(Default)]
struct Provider(AtomicUsize);

impl Provider {
    fn runs(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    fn charge(&self, order: &str, amount_cents: i64) -> Receipt {
        let serial = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Receipt {
            order: order.to_owned(),
            amount_cents,
            serial,
        }
    }
}

fn rejected(result: &Result<Receipt, JobError>) -> Option<&Rejected> {
    match result {
        Err(JobError::Rejected(rejected)) => Some(rejected),
        _ => None,
    }
}
