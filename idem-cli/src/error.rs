//! What can go wrong, what the user should do about it, and the exit status
//! each failure maps to.

/// A failure of one `idem` command. Every message says what to do next.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Neither `--database-url` nor `DATABASE_URL` was given.
    #[error(
        "no database to connect to: pass --database-url postgres://USER@HOST:PORT/DATABASE, \
         or set DATABASE_URL"
    )]
    NoDatabaseUrl,

    /// The URL does not parse.
    #[error(
        "{url} is not a PostgreSQL URL ({source}); write it as \
         postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )]
    BadDatabaseUrl {
        /// The URL, password hidden.
        url: String,
        /// Why it does not parse.
        source: sqlx::Error,
    },

    /// Nothing answered, or the server refused the connection.
    #[error(
        "cannot connect to PostgreSQL at {url}: {source}\n\
         Is the server running and reachable there? Check with `pg_isready -d <URL>`, \
         or pass the right --database-url (or DATABASE_URL)."
    )]
    Connect {
        /// The URL, password hidden.
        url: String,
        /// The connection error.
        source: sqlx::Error,
    },

    /// A statement failed.
    #[error("PostgreSQL could not {doing}: {source}")]
    Database {
        /// What we were doing, as a verb phrase.
        doing: &'static str,
        /// The database error.
        source: sqlx::Error,
    },

    /// The arguments cannot be acted on as given.
    #[error("{0}")]
    Usage(String),

    /// A destructive command was run without `--yes`; the message says what
    /// it would have done.
    #[error("{0}")]
    NeedsConfirmation(String),

    /// Nothing matched.
    #[error("{0}")]
    NotFound(String),

    /// The command refuses this target (a settled claim for `release`, a
    /// success or a kept failure for `resolve`).
    #[error("{0}")]
    Refused(String),

    /// A long command stopped at a Ctrl-C, between two steps that each
    /// committed whole; the message says how far it got and how to go on.
    #[error("{0}")]
    Interrupted(String),

    /// A long command stopped after the database failed a step (an outage
    /// once its retries were used up, or an error of the request at once),
    /// between two steps that each committed whole.
    #[error("PostgreSQL could not {doing}: {source}\nStopped: {progress}.\n{next}")]
    Stopped {
        /// What failed, as a verb phrase.
        doing: &'static str,
        /// The last error.
        source: idem_runtime::Error,
        /// How far the command got.
        progress: String,
        /// What to do: wait for the database, or fix the request; then run
        /// it again.
        next: String,
    },

    /// The report could not be written.
    #[error("cannot write the output: {0}")]
    Output(String),
}

impl CliError {
    /// Maps a database error to [`CliError::Database`], for `map_err`.
    pub fn database(doing: &'static str) -> impl FnOnce(sqlx::Error) -> CliError {
        move |source| CliError::Database { doing, source }
    }

    /// Maps an error of the runtime's store to [`CliError::Database`] when
    /// the database failed, and to [`CliError::Refused`] (its message says
    /// why) otherwise, for `map_err`.
    pub fn store(doing: &'static str) -> impl FnOnce(idem_runtime::Error) -> CliError {
        move |error| match error {
            idem_runtime::Error::Database(source) => CliError::Database { doing, source },
            other => CliError::Refused(other.to_string()),
        }
    }

    /// The process exit status: 1 when the command ran and found nothing to
    /// act on or refused the target, 2 for usage, connection and database
    /// errors (the command could not do its job), 130 when a Ctrl-C stopped
    /// it.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NotFound(_) | CliError::Refused(_) => 1,
            CliError::Interrupted(_) => crate::prune::INTERRUPTED_EXIT,
            CliError::NoDatabaseUrl
            | CliError::BadDatabaseUrl { .. }
            | CliError::Connect { .. }
            | CliError::Database { .. }
            | CliError::Stopped { .. }
            | CliError::Usage(_)
            | CliError::NeedsConfirmation(_)
            | CliError::Output(_) => 2,
        }
    }
}
