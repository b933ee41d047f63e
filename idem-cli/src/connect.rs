//! Connecting: which database, which schema, and errors that name both.

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::shown;
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
    // Every password hidden (main hides any the errors echo).
    let shown = shown::redacted(url).into_owned();
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

/// `name` as a double-quoted identifier, always: for a `search_path` value,
/// where quoting is never wrong and keeps mixed case and spaces.
pub fn quote_always(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_path_schemas_are_always_quoted() {
        assert_eq!(quote_always("public"), r#""public""#);
        assert_eq!(quote_always(r#"My "Schema""#), r#""My ""Schema""""#);
    }
}
