//! Duplicates: an identity that is already settled, refused.
//!
//! The group settles identities of the gate's own action up front, with
//! their real addresses and canonical bytes, then each operation refuses one
//! of them, round robin:
//!
//! - floor: one `SELECT` by address, the least any refusal costs;
//! - gate: the guarded function; its claim statement looks first and finds
//!   the settled row: one statement, `AlreadyDone`;
//! - fused claims, written by hand: look and insert in one statement, in
//!   either order ([`Fused`]); lookup-first is what the gate now runs.

use std::sync::Arc;

use idem::sqlx::{self, PgPool};
use idem::{Identity, Rejected};

use crate::BoxError;
use crate::accounts::{Accounts, Gates};
use crate::body::Body;
use crate::fused::{Fused, Outcome};
use crate::gated::{self, ACTION};

/// Identity numbers of the settled rows start here, far above anything
/// [`keys::next`](crate::keys::next) hands out.
const FIRST: u64 = 1 << 62;

/// Rows per bulk insert while settling.
const BATCH: usize = 10_000;

const INSERT_SETTLED: &str = "INSERT INTO idem_records \
       (account, kind, address, namespace, state, identity, settled_at) \
     SELECT account, 'claim', address, NULL, 'success', identity, now() \
     FROM unnest($1::text[], $2::text[], $3::bytea[]) AS settled(account, address, identity)";

const LOOKUP: &str = "SELECT state = 'success', identity FROM idem_records \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL";

/// The settled identities, by position: number `FIRST + i` is in account
/// `accounts.of(FIRST + i)`, with address `addresses[i]` and canonical
/// encoding `identities[i]`.
pub struct Settled {
    accounts: Arc<Accounts>,
    addresses: Vec<String>,
    identities: Vec<Vec<u8>>,
}

impl Settled {
    /// Settles `count` identities of [`ACTION`] in `idem_records`, each in
    /// its account of `accounts`.
    pub async fn insert(
        pool: &PgPool,
        count: u64,
        accounts: Arc<Accounts>,
    ) -> Result<Settled, BoxError> {
        let mut settled = Settled {
            accounts,
            addresses: Vec::new(),
            identities: Vec::new(),
        };
        let mut owners = Vec::new();
        for number in FIRST..FIRST + count {
            let identity = Identity::new(ACTION).part(number);
            owners.push(settled.accounts.of(number).to_owned());
            settled.addresses.push(identity.address());
            settled.identities.push(identity.canonical().to_vec());
        }
        for ((owners, addresses), identities) in owners
            .chunks(BATCH)
            .zip(settled.addresses.chunks(BATCH))
            .zip(settled.identities.chunks(BATCH))
        {
            sqlx::query(INSERT_SETTLED)
                .bind(owners)
                .bind(addresses)
                .bind(identities)
                .execute(pool)
                .await?;
        }
        Ok(settled)
    }

    /// The position of the settled identity that operation `n` refuses.
    fn pick(&self, n: u64) -> usize {
        // `addresses` is never empty (`--duplicates` is at least 1), and a
        // u64 remainder below its length fits a usize.
        (n % self.addresses.len() as u64) as usize
    }

    /// The floor: one `SELECT` by address, re-checking the stored identity
    /// as the gate does.
    pub async fn refuse_by_lookup(&self, pool: &PgPool, n: u64) -> Result<(), BoxError> {
        let at = self.pick(n);
        let found: Option<(bool, Vec<u8>)> = sqlx::query_as(LOOKUP)
            .bind(self.accounts.of(FIRST + at as u64))
            .bind(&self.addresses[at])
            .fetch_optional(pool)
            .await?;
        match found {
            Some((true, identity)) if identity == self.identities[at] => Ok(()),
            other => Err(self.not_refused(at, format!("the lookup found {other:?}"))),
        }
    }

    /// The gate, through the guarded function, scoped to the settled
    /// identity's account.
    pub async fn refuse_through_gate(&self, gates: &Gates, n: u64) -> Result<(), BoxError> {
        let at = self.pick(n);
        let number = FIRST + at as u64;
        match gated::guarded(gates.of(number), number, Body::NoOp).await {
            Err(Rejected::AlreadyDone) => Ok(()),
            other => Err(self.not_refused(at, format!("the gate answered {other:?}"))),
        }
    }

    /// The one-statement claim the runtime could run instead.
    pub async fn refuse_by_fused_claim(
        &self,
        pool: &PgPool,
        fused: Fused,
        n: u64,
    ) -> Result<(), BoxError> {
        let at = self.pick(n);
        let account = self.accounts.of(FIRST + at as u64);
        let (address, identity) = (&self.addresses[at], &self.identities[at]);
        match fused.claim(pool, account, address, identity).await? {
            Outcome::Held {
                settled: true,
                identity: stored,
            } if stored == *identity => Ok(()),
            Outcome::Won => Err(self.not_refused(at, "the fused claim won it".to_owned())),
            _ => Err(self.not_refused(at, "the fused claim found it unsettled".to_owned())),
        }
    }

    fn not_refused(&self, at: usize, what: String) -> BoxError {
        format!(
            "settled identity {} ({}) was not refused as already done: {what}",
            FIRST + at as u64,
            self.addresses[at]
        )
        .into()
    }
}
