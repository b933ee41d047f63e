//! Which account each operation claims in. The single-PostgreSQL matrix
//! claims everything in the gate's default account, as its figures always
//! have; the Citus comparison spreads operations over many accounts,
//! because `idem_records` is distributed by account: one account is one
//! shard on one worker, and a service with one account would leave every
//! worker but one idle.

use idem::Gate;

/// The accounts operations are spread over: operation `n` (and settled or
/// pre-filled row `n`) belongs to account `n mod len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accounts {
    names: Vec<String>,
}

impl Accounts {
    /// Everything in [`Gate::DEFAULT_ACCOUNT`].
    pub fn default_only() -> Accounts {
        Accounts {
            names: vec![Gate::DEFAULT_ACCOUNT.to_owned()],
        }
    }

    /// `count` accounts, `account_0` to `account_{count - 1}` (at least one).
    pub fn spread(count: u32) -> Accounts {
        Accounts {
            names: (0..count.max(1)).map(|k| format!("account_{k}")).collect(),
        }
    }

    /// Every name, in order: what the pre-fill spreads its rows over.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The account of operation (or row) `n`.
    pub fn of(&self, n: u64) -> &str {
        &self.names[self.index(n)]
    }

    /// A gate for each account, cloned from `gate`: the gate of operation
    /// `n` is then a lookup, not a new `Gate` per operation.
    pub fn gates(&self, gate: &Gate) -> Gates {
        Gates {
            gates: self.names.iter().map(|name| gate.account(name)).collect(),
        }
    }

    fn index(&self, n: u64) -> usize {
        // `names` is never empty, and a remainder below its length fits a
        // usize.
        (n % self.names.len() as u64) as usize
    }
}

/// One run's gate, scoped to each of [`Accounts`] in the same order.
pub struct Gates {
    gates: Vec<Gate>,
}

impl Gates {
    /// The gate of operation (or settled row) `n`: the one scoped to
    /// [`Accounts::of`]`(n)`.
    pub fn of(&self, n: u64) -> &Gate {
        // Built from an `Accounts` of the same, non-zero length.
        &self.gates[(n % self.gates.len() as u64) as usize]
    }
}
