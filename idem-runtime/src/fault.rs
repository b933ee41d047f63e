//! Whose fault a store error is: the store's (an outage) or the request's.
//!
//! The difference decides what the gate may do. An outage (the server is
//! down, restarting, out of connections or unreachable) is reported as
//! [`Rejected::Unavailable`](crate::Rejected::Unavailable): retrying later
//! may succeed, and an action that opted in may fail open. Anything else is
//! an error of the request (a permission, a missing table, a value the
//! store cannot hold, a constraint): retrying meets it again, and failing
//! open on it would run the body unguarded on every call while the store is
//! perfectly healthy. So it is [`Rejected::StoreRefused`](crate::Rejected::StoreRefused),
//! with what to fix, and never fails open. Errors nobody foresaw are
//! counted as the request's: the safe side is to refuse.

/// The class of a store error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The store could not be reached or could not serve: retry later.
    Outage,
    /// The store refused this statement: `fix` says what to change.
    Request { fix: &'static str },
}

/// What to fix for each class of request error, by SQLSTATE prefix or code.
/// The first match wins, so exact codes come before their classes.
const FIXES: &[(&str, &str)] = &[
    (
        "42501",
        "the role idem connects as lacks a privilege, or a row-level security policy refuses \
         this account: GRANT SELECT, INSERT, UPDATE, DELETE ON idem_records and GRANT USAGE ON \
         SEQUENCE idem_records_fence_seq to it, or claim in an account its policy allows \
         (docs/operations.md, least privilege)",
    ),
    (
        "42P01",
        "idem's table is missing where the connection's search_path looks: run `idem migrate` \
         (or Gate::connect with a role that may run DDL), or fix search_path",
    ),
    (
        "42703",
        "idem's schema is older than this build: run `idem migrate` (or Gate::connect with a \
         role that may run DDL)",
    ),
    (
        "42",
        "the statement does not fit the schema it met: run `idem migrate`, and check that \
         search_path finds idem's own idem_records",
    ),
    (
        "0A000",
        "the database does not support a statement idem needs (docs/distributed-engines.md lists \
         what each engine can run)",
    ),
    (
        "22",
        "a value could not be stored as given (a data exception): check the key, scope and \
         options passed to the gate",
    ),
    (
        "23",
        "a constraint of idem_records refused the row: check constraints or triggers added to \
         the table",
    ),
    (
        "54",
        "a value is larger than PostgreSQL can take (a program limit): use smaller values",
    ),
    (
        "P0",
        "a trigger or function on idem_records raised an error: check what was added to the \
         table",
    ),
];

/// Said of a request error with no entry in [`FIXES`].
const UNFORESEEN: &str =
    "the database refused idem's statement for a reason idem does not know: read the error";

/// Classifies `error`.
pub(crate) fn classify(error: &sqlx::Error) -> Fault {
    match error {
        // A connection that asks for TLS from a build without it: no retry
        // mends that (sqlx says so only in its message).
        sqlx::Error::Tls(why) if why.to_string().contains("without TLS support") => {
            Fault::Request { fix: NO_TLS }
        }
        // A closed pool counts as the store being out of reach: to this gate
        // it is (no statement can run), and it is how an application that
        // shuts its pool down mid-request, or a test, takes the store away.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Fault::Outage,
        sqlx::Error::Database(db) => match db.code() {
            Some(code) if is_outage_code(&code) => Fault::Outage,
            Some(code) => Fault::Request {
                fix: FIXES
                    .iter()
                    .find(|(prefix, _)| code.starts_with(prefix))
                    .map_or(UNFORESEEN, |(_, fix)| fix),
            },
            None => Fault::Request { fix: UNFORESEEN },
        },
        // Encoding, decoding, a missing column in a row: a mismatch between
        // this build and the schema, which no retry mends.
        _ => Fault::Request {
            fix: "the row idem read does not match this build: run `idem migrate`",
        },
    }
}

/// What to do about a connection that asks for TLS of a build without it.
const NO_TLS: &str = "the connection asks for TLS (sslmode=require or verify-*), and this build \
     has none: connect without it (sslmode=disable or prefer), or enable a TLS feature of the \
     sqlx that idem is built with";

/// SQLSTATEs of a server that cannot serve now, whatever the request:
/// 08 connection exception; 53 insufficient resources (too many
/// connections, disk full, out of memory); 57P01-57P05 shutdown, crash,
/// starting up, idle session timeout; 57014 a statement cancelled (by
/// `statement_timeout` or an operator); 58 system error (I/O); 55P03 lock
/// not available (`lock_timeout`); 25006 a read-only server (a primary
/// demoted by a fail-over); 40001/40P01 serialization failure and deadlock,
/// rolled back whole; XX000 internal error.
fn is_outage_code(code: &str) -> bool {
    ["08", "53", "57P", "58"]
        .iter()
        .any(|class| code.starts_with(class))
        || ["57014", "55P03", "25006", "40001", "40P01", "XX000"].contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_the_classes_of_a_server_that_cannot_serve() {
        for code in [
            "08006", "08001", "53300", "53100", "57P01", "57P03", "58030", "57014", "40001",
            "40P01", "25006",
        ] {
            assert!(is_outage_code(code), "{code}");
        }
        for code in [
            "42501", "42P01", "22003", "22008", "54000", "23505", "23514", "0A000", "P0001",
        ] {
            assert!(!is_outage_code(code), "{code}");
        }
    }

    #[test]
    fn every_request_error_says_what_to_fix() {
        let fix = |code: &str| {
            FIXES
                .iter()
                .find(|(prefix, _)| code.starts_with(prefix))
                .map(|(_, fix)| *fix)
        };
        assert!(fix("42501").is_some_and(|f| f.contains("GRANT")));
        assert!(fix("42P01").is_some_and(|f| f.contains("idem migrate")));
        assert!(fix("22008").is_some_and(|f| f.contains("data exception")));
        assert!(fix("54000").is_some_and(|f| f.contains("program limit")));
        assert_eq!(
            classify(&sqlx::Error::PoolTimedOut),
            Fault::Outage,
            "the pool waited its whole acquire timeout"
        );
        assert_eq!(classify(&sqlx::Error::PoolClosed), Fault::Outage);
    }
}
