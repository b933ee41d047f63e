//! Connecting: which database, which schema, and errors that name both.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::error::CliError;

/// How long to wait for the server before saying it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A one-connection pool on `url` (from `--database-url` or `DATABASE_URL`),
/// with `search_path` set to `schema` when one is given.
///
/// One connection: every command runs its statements one after another, and
/// a pool is what the runtime's schema functions take.
pub async fn connect(url: Option<&str>, schema: Option<&str>) -> Result<PgPool, CliError> {
    connect_with(url, schema, 1).await
}

/// [`connect`], with a pool of up to `max_connections`: for `idem console`,
/// which answers several browsers' requests at once.
pub async fn connect_with(
    url: Option<&str>,
    schema: Option<&str>,
    max_connections: u32,
) -> Result<PgPool, CliError> {
    let url = url.ok_or(CliError::NoDatabaseUrl)?;
    let shown = redact_password(url);
    let mut options =
        PgConnectOptions::from_str(url).map_err(|source| CliError::BadDatabaseUrl {
            url: shown.clone(),
            source,
        })?;
    options = options.application_name("idem");
    if let Some(schema) = schema {
        options = options.options([("search_path", quote_always(schema))]);
    }
    // One direct connection first: a pool retries until its timeout and then
    // reports only "pool timed out", hiding why.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await;
    let connect_error = |source| CliError::Connect {
        url: shown.clone(),
        source,
    };
    match probe {
        Ok(Ok(connection)) => {
            // Closing is a courtesy; the pool opens its own connection.
            let _ = connection.close().await;
        }
        Ok(Err(source)) => return Err(connect_error(source)),
        Err(_) => return Err(connect_error(sqlx::Error::PoolTimedOut)),
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(connect_error)
}

/// The URL with any password replaced by `***`, for messages.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// `name` as a double-quoted identifier, always: for a `search_path` value,
/// where quoting is never wrong and keeps mixed case and spaces.
pub fn quote_always(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_everything_else_kept() {
        assert_eq!(
            redact_password("postgres://app:s3cr%40t@db:5432/app?sslmode=require"),
            "postgres://app:***@db:5432/app?sslmode=require"
        );
        assert_eq!(
            redact_password("postgres://postgres@127.0.0.1:5432/postgres"),
            "postgres://postgres@127.0.0.1:5432/postgres"
        );
        assert_eq!(redact_password("not a url"), "not a url");
        assert_eq!(
            redact_password("postgresql://u:p@h/db/x@y"),
            "postgresql://u:***@h/db/x@y"
        );
    }

    #[test]
    fn search_path_schemas_are_always_quoted() {
        assert_eq!(quote_always("public"), r#""public""#);
        assert_eq!(quote_always(r#"My "Schema""#), r#""My ""Schema""""#);
    }
}
