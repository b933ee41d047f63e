//! The claim and the lookup that explains a refusal, in one statement: a
//! refused duplicate then costs one round trip, not two (an `INSERT` that
//! conflicts, then a `SELECT`, as the gate ran until it adopted the
//! lookup-first form below with its modes' columns). Hand-written SQL, in
//! two forms:
//!
//! - insert first: the `INSERT ... ON CONFLICT DO NOTHING` runs, and only
//!   when it inserted nothing does the `SELECT` look for the row in the way;
//!   a new claim costs what it costs today, a refusal probes the index twice;
//! - lookup first: the `SELECT` runs, and the `INSERT` only when it found
//!   nothing; a refusal probes the index once, a new claim once more than
//!   today. The `INSERT` still decides: the lookup is an early-out that
//!   costs no round trip.
//!
//! Either way, a row committed after the statement's snapshot was taken
//! (the `INSERT` waited for its inserter, then did nothing) comes back as no
//! row at all, which the gate already treats as "the slot changed hands:
//! try again".

use idem::sqlx::{self, PgPool, Row};

/// Which of the two forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fused {
    InsertFirst,
    LookupFirst,
}

/// What the statement's one row (or its absence) says.
pub enum Outcome {
    /// This statement inserted the claim.
    Won,
    /// Somebody holds the slot.
    Held { settled: bool, identity: Vec<u8> },
    /// The row in the way was committed after the statement's snapshot.
    Retry,
}

const INSERT_FIRST: &str = "WITH claimed AS ( \
         INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
         VALUES ($1, 'claim', $2, NULL, 'pending', $3) \
         ON CONFLICT DO NOTHING \
         RETURNING true AS won \
     ) \
     SELECT true AS won, NULL::boolean AS settled, NULL::bytea AS identity FROM claimed \
     UNION ALL \
     SELECT false, state = 'success', identity FROM idem_records \
     WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
       AND NOT EXISTS (SELECT 1 FROM claimed)";

const LOOKUP_FIRST: &str = "WITH existing AS ( \
         SELECT state = 'success' AS settled, identity FROM idem_records \
         WHERE account = $1 AND kind = 'claim' AND address = $2 AND namespace IS NULL \
     ), claimed AS ( \
         INSERT INTO idem_records (account, kind, address, namespace, state, identity) \
         SELECT $1, 'claim', $2, NULL, 'pending', $3 \
         WHERE NOT EXISTS (SELECT 1 FROM existing) \
         ON CONFLICT DO NOTHING \
         RETURNING true AS won \
     ) \
     SELECT true AS won, NULL::boolean AS settled, NULL::bytea AS identity FROM claimed \
     UNION ALL \
     SELECT false, settled, identity FROM existing";

impl Fused {
    /// The statement.
    pub fn sql(self) -> &'static str {
        match self {
            Fused::InsertFirst => INSERT_FIRST,
            Fused::LookupFirst => LOOKUP_FIRST,
        }
    }

    /// Claims `address` (without a namespace) in `account` for `identity`,
    /// or finds who holds it.
    pub async fn claim(
        self,
        pool: &PgPool,
        account: &str,
        address: &str,
        identity: &[u8],
    ) -> Result<Outcome, sqlx::Error> {
        let row = sqlx::query(self.sql())
            .bind(account)
            .bind(address)
            .bind(identity)
            .fetch_optional(pool)
            .await?;
        let Some(row) = row else {
            return Ok(Outcome::Retry);
        };
        if row.try_get::<bool, _>(0)? {
            return Ok(Outcome::Won);
        }
        Ok(Outcome::Held {
            settled: row.try_get(1)?,
            identity: row.try_get(2)?,
        })
    }
}
