//! The opt-in partitioned form of `idem_records`: hash-partitioned on
//! `account` with PostgreSQL's declarative partitioning, so that each
//! partition (and its two partial unique indexes) holds a slice of the
//! accounts, and a large table can be vacuumed, indexed and pruned a slice
//! at a time.
//!
//! Every unique index of a partitioned table must include the partition
//! key; `account` leads both of idem's, so they are allowed as they are and
//! uniqueness per account stays exactly what it is on a plain table.

use sqlx::{PgConnection, PgPool};

use crate::error::Error;
use crate::store::catalog;

use super::layout::{Layout, layout_of};

/// The most partitions [`set_up_partitioned`] creates. More buys nothing a
/// claim can use (it touches one partition) and slows planning and DDL.
pub const MAX_PARTITIONS: u16 = 1024;

/// The SQL that creates `idem_records` hash-partitioned on `account` into
/// `partitions` partitions (`idem_records_p0`, `idem_records_p1`, ...),
/// followed by every migration: for users who apply the schema with their
/// own migration tool. Run it on a database where idem was never set up.
pub fn partitioned_sql(partitions: u16) -> Result<String, Error> {
    check_count(partitions)?;
    Ok(format!(
        "{}\n{}",
        catalog::partitioned_prelude(partitions),
        super::SCHEMA_SQL
    ))
}

fn check_count(partitions: u16) -> Result<(), Error> {
    if (1..=MAX_PARTITIONS).contains(&partitions) {
        Ok(())
    } else {
        Err(Error::Setup(format!(
            "{partitions} partitions: ask for 1 to {MAX_PARTITIONS} (16 suits most)"
        )))
    }
}

/// Sets the schema up with `idem_records` hash-partitioned on `account` into
/// `partitions` partitions, then brings it to the current version like
/// [`set_up`](super::set_up) does; [`Gate::connect`](crate::Gate::connect)
/// afterwards only verifies it.
///
/// Idempotent and safe when many processes start at once. It creates the
/// table only where there is none: on a table already partitioned this way
/// it just migrates; on a plain table, or one partitioned differently, it
/// changes nothing and says so (partitioning an existing table means copying
/// its rows, which is a maintenance operation to plan, not a start-up step).
pub async fn set_up_partitioned(pool: &PgPool, partitions: u16) -> Result<(), Error> {
    check_count(partitions)?;
    let mut conn = pool.acquire().await?;
    if let Some(existing) = layout_of(&mut conn).await? {
        check_matches(&existing, partitions)?;
        drop(conn);
        return super::set_up(pool).await;
    }
    let mut tx = catalog::begin_set_up(&mut conn).await?;
    // Another process may have created it while we waited for the lock.
    match layout_of(&mut tx).await? {
        Some(existing) => check_matches(&existing, partitions)?,
        None => {
            catalog::create_partitioned(&mut tx, partitions).await?;
            tracing::info!(target: "idem", partitions, "idem_records created, hash-partitioned on account");
        }
    }
    catalog::migrate_and_commit(tx).await?;
    Ok(())
}

fn check_matches(existing: &Layout, partitions: u16) -> Result<(), Error> {
    let wanted = Layout::Partitioned {
        key: "HASH (account)".to_owned(),
        partitions: usize::from(partitions),
    };
    if *existing == wanted {
        return Ok(());
    }
    Err(Error::Setup(format!(
        "idem_records already exists, {existing}; asked for {wanted}. Nothing was changed: \
         idem does not re-partition a table in place. Either keep the layout you have (drop the \
         partitions option), or create the partitioned table under another name, copy the rows \
         over (INSERT INTO ... SELECT) and swap the names in one transaction"
    )))
}

/// For a table partitioned by hash: the hash remainders no partition takes,
/// as `(modulus, remainders)` against the largest modulus in use. A claim
/// for an account that hashes there fails (closed), whatever its key.
pub(super) async fn uncovered_hash_remainders(
    conn: &mut PgConnection,
) -> Result<Option<(u32, Vec<u32>)>, sqlx::Error> {
    let bounds = catalog::hash_partition_bounds(conn).await?;
    let bounds: Vec<(u32, u32)> = bounds.iter().filter_map(|b| hash_bound(b)).collect();
    Ok(missing_remainders(&bounds))
}

/// `FOR VALUES WITH (modulus 16, remainder 3)` -> `(16, 3)`.
fn hash_bound(bound: &str) -> Option<(u32, u32)> {
    let number_after = |word: &str| -> Option<u32> {
        let rest = &bound[bound.find(word)? + word.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    Some((number_after("modulus")?, number_after("remainder")?))
}

/// Which remainders of the largest modulus no `(modulus, remainder)` bound
/// covers; `None` when there are no bounds. PostgreSQL requires every
/// modulus to divide the next larger one, so a value with remainder `r`
/// under the largest modulus `m` has remainder `r % k` under each modulus
/// `k`.
fn missing_remainders(bounds: &[(u32, u32)]) -> Option<(u32, Vec<u32>)> {
    let largest = bounds.iter().map(|&(modulus, _)| modulus).max()?;
    let missing = (0..largest)
        .filter(|r| {
            !bounds
                .iter()
                .any(|&(modulus, remainder)| modulus > 0 && r % modulus == remainder)
        })
        .collect();
    Some((largest, missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_bounds_are_read_from_the_catalog_s_text() {
        assert_eq!(
            hash_bound("FOR VALUES WITH (modulus 16, remainder 3)"),
            Some((16, 3))
        );
        assert_eq!(hash_bound("FOR VALUES IN ('a')"), None);
    }

    #[test]
    fn missing_remainders_take_every_modulus_into_account() {
        assert_eq!(missing_remainders(&[]), None);
        assert_eq!(
            missing_remainders(&[(4, 0), (4, 1), (4, 2), (4, 3)]),
            Some((4, vec![]))
        );
        // Modulus 2 remainder 0 covers 0 and 2 of modulus 4.
        assert_eq!(missing_remainders(&[(2, 0), (4, 1)]), Some((4, vec![3])));
        assert_eq!(missing_remainders(&[(4, 0), (4, 2)]), Some((4, vec![1, 3])));
    }

    #[test]
    fn the_partition_count_is_checked() {
        assert!(partitioned_sql(0).is_err());
        assert!(partitioned_sql(MAX_PARTITIONS + 1).is_err());
        let sql = partitioned_sql(16).expect("16 is fine");
        assert!(sql.contains("PARTITION BY HASH (account)"));
        assert!(sql.contains("0..16 - 1"));
        assert!(!sql.contains("{partitions}"));
        assert!(sql.ends_with(super::super::SCHEMA_SQL));
    }
}
