//! `idem claims list | show | release | resolve`: reading, resolving and
//! releasing claim rows (`kind = 'claim'`) through the
//! runtime's [`operations`], which hold every statement; this module decides
//! what to ask, what to refuse and what to say.
//!
//! Every change is guarded in its own `WHERE`: `release` deletes one claim
//! only while it is `pending`, `resolve` changes one only while it is
//! `pending` or `in_doubt` under the fence it showed (`idem prune`, in
//! `crate::prune`, deletes only `success` claims). Each refuses to run
//! without `--yes` and then says what it would do.

mod render;

use idem_runtime::operations::{self, ClaimState, ClaimStep, Resolved, Resolver};
use idem_runtime::{Disposition, Outcome};
use sqlx::PgPool;

use crate::cli::ResolveArgs;
use crate::error::CliError;
use crate::output::name;
use crate::timestamps;

pub use idem_runtime::operations::{ClaimRow, ListFilter, NamespaceFilter, ScopeFilter};
pub use render::{render_claim, render_count, render_list, render_released, render_resolved};

/// Fails, saying what to do, when `idem_records` is not on the search path.
pub async fn ensure_table(pool: &PgPool) -> Result<(), CliError> {
    let location = idem_runtime::__internal::locate(pool)
        .await
        .map_err(CliError::database("look for idem_records"))?;
    match location.table {
        Some(_) => Ok(()),
        None => Err(CliError::Usage(format!(
            "there is no idem_records table on the search_path ({}): run \
             `idem migrate` to create it, or pass --schema with the schema that holds it",
            location.search_path
        ))),
    }
}

/// Refuses text that cannot be a claim address, before asking the database.
pub fn check_address(address: &str) -> Result<(), CliError> {
    if operations::is_address(address) {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "{address:?} is not a claim address: addresses are claim_ followed by 24 lowercase \
             hex digits; `idem claims list` shows them"
        )))
    }
}

/// Claims matching `filter`, newest first.
pub async fn list(pool: &PgPool, filter: &ListFilter<'_>) -> Result<Vec<ClaimRow>, CliError> {
    operations::list(pool, filter)
        .await
        .map_err(CliError::store("list the claims"))
}

/// How many claims match `filter`, whatever its limit.
pub async fn count(pool: &PgPool, filter: &ListFilter<'_>) -> Result<u64, CliError> {
    operations::count(pool, filter)
        .await
        .map_err(CliError::store("count the claims"))
}

/// The claims [`list`] returned, and how many match in all when that is
/// more: the list stopped at its limit.
#[derive(Debug)]
pub struct Listed {
    pub claims: Vec<ClaimRow>,
    /// `Some(total)` only when the list stopped at its limit.
    pub total_beyond_limit: Option<u64>,
}

impl Listed {
    /// The line that says the list was cut, and how to see it all.
    pub fn cut_note(&self) -> Option<String> {
        let total = self.total_beyond_limit?;
        Some(format!(
            "showing {} of {total} claims (newest first); pass --limit {total} to see them all, \
             or --count for the number alone",
            self.claims.len()
        ))
    }
}

/// [`list`], and when it filled its limit, [`count`]: whether more match.
pub async fn list_counted(pool: &PgPool, filter: &ListFilter<'_>) -> Result<Listed, CliError> {
    let claims = list(pool, filter).await?;
    let total_beyond_limit = if claims.len() as u64 >= u64::from(filter.limit) {
        // Counted after the list: a claim made in between makes the total
        // larger, never smaller than what was shown.
        let total = count(pool, filter).await?;
        (total > claims.len() as u64).then_some(total)
    } else {
        None
    };
    Ok(Listed {
        claims,
        total_beyond_limit,
    })
}

/// The one claim at `address` in `scope`: an error when there is none, or
/// when the address is claimed in several scopes and `scope` does not say
/// which.
pub async fn find(
    pool: &PgPool,
    address: &str,
    scope: &ScopeFilter<'_>,
) -> Result<ClaimRow, CliError> {
    let mut claims = operations::find(pool, address, scope)
        .await
        .map_err(CliError::store("look up the claim"))?;
    match claims.len() {
        0 => Err(CliError::NotFound(format!(
            "no claim has address {address}{}; `idem claims list` shows the claims there are",
            match (scope.account, scope.namespace) {
                (None, NamespaceFilter::Any) => String::new(),
                (account, namespace) => format!(" in {}", describe_filter(account, namespace)),
            }
        ))),
        1 => Ok(claims.remove(0)),
        n => {
            let scopes: Vec<String> = claims
                .iter()
                .map(|c| format!("  {}", describe_scope(&c.account, c.namespace.as_deref())))
                .collect();
            Err(CliError::Usage(format!(
                "address {address} is claimed in {n} scopes:\n{}\nsay which with --account and \
                 --namespace NAME (or --no-namespace)",
                scopes.join("\n")
            )))
        }
    }
}

/// The steps of `claim` (`idem::step`), in the order they were begun.
pub async fn steps(pool: &PgPool, claim: &ClaimRow) -> Result<Vec<ClaimStep>, CliError> {
    operations::steps(pool, claim.slot())
        .await
        .map_err(CliError::store("list the claim's steps"))
}

/// Releases the pending claim at `address` in `scope`, after `yes`. Its
/// steps are kept: a retry replays the finished ones.
pub async fn release(
    pool: &PgPool,
    address: &str,
    scope: &ScopeFilter<'_>,
    yes: bool,
) -> Result<ClaimRow, CliError> {
    let claim = find(pool, address, scope).await?;
    let what = render::describe_claim(&claim);
    match claim.state {
        ClaimState::Pending => {}
        ClaimState::InDoubt => {
            return Err(CliError::Refused(format!(
                "{what}: it is in doubt{}: its action may have taken effect, and a release would \
                 let a retry run it a second time. Find out what happened, then `idem claims \
                 resolve {} --succeeded | --failed | --release`.",
                reason_in_parentheses(&claim),
                claim.address,
            )));
        }
        _ => {
            return Err(CliError::Refused(format!(
                "{what}: it is settled ({}{}), and idem never releases a settled claim, because \
                 a retry would then run its action a second time. To forget settled claims, see \
                 `idem prune`.",
                claim.state,
                claim
                    .settled_micros
                    .map(|m| format!(" since {}", timestamps::instant_to_second(m)))
                    .unwrap_or_default(),
            )));
        }
    }
    if !yes {
        return Err(CliError::NeedsConfirmation(format!(
            "would release pending {what}.\nReleasing lets the next retry run the action again: \
             do it only when the invocation holding the claim is gone (crashed, killed, \
             cancelled). Re-run with --yes to release it."
        )));
    }
    let released = operations::release_pending(pool, claim.slot())
        .await
        .map_err(CliError::store("release the claim"))?;
    match released {
        Some(released) => Ok(released),
        // Still pending, and not released: made with on_expiry = "in_doubt",
        // its lease run out (the release refuses such a claim).
        None if expires_in_doubt(&claim)
            && find(pool, address, scope)
                .await
                .is_ok_and(|now| now.state == ClaimState::Pending && now.fence == claim.fence) =>
        {
            Err(CliError::Refused(format!(
                "{what}: its lease ran out under on_expiry = \"in_doubt\", so it is in doubt: \
                 its holder is gone and may have done the action, and a release would let a \
                 retry run it a second time. Find out what happened, then `idem claims resolve \
                 {} --succeeded | --failed | --release`.",
                claim.address,
            )))
        }
        None => Err(CliError::Refused(format!(
            "{what}, changed while we looked (it settled, or was released): nothing released; \
             `idem claims show {}` shows it now",
            claim.address
        ))),
    }
}

/// Whether `claim` was made with `on_expiry = "in_doubt"` (its lease, run
/// out, holds it in doubt).
fn expires_in_doubt(claim: &ClaimRow) -> bool {
    claim.other_columns.get("expires_in_doubt") == Some(&serde_json::Value::Bool(true))
}

/// The resolution `args` ask for; `--output` must be JSON.
pub fn resolution(args: &ResolveArgs) -> Result<Outcome<Option<&str>>, CliError> {
    if let Some(output) = &args.output
        && let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(output)
    {
        return Err(CliError::Usage(format!(
            "--output must be JSON, the value a replaying action returns to its retries \
             (e.g. '{{\"receipt\":\"r_1\"}}', '\"text\"' or 'null'): {error}"
        )));
    }
    Ok(match (args.succeeded, args.failed) {
        (true, _) => Outcome::Succeeded(args.output.as_deref()),
        (false, true) => Outcome::Failed(Disposition::Keep),
        (false, false) => Outcome::Failed(Disposition::Release),
    })
}

/// What `claims resolve` did: the claim as it was, and what it became.
#[derive(Debug)]
pub struct ResolvedClaim {
    /// The claim just before.
    pub before: ClaimRow,
    /// Its state now; `None`: released (deleted).
    pub after: Option<ClaimState>,
}

/// Resolves the claim at `address` in `scope` as `resolution` says, after
/// `yes`, only while it is pending or in doubt under the fence it had when
/// we looked.
pub async fn resolve(
    pool: &PgPool,
    address: &str,
    scope: &ScopeFilter<'_>,
    resolution: Outcome<Option<&str>>,
    yes: bool,
) -> Result<ResolvedClaim, CliError> {
    let claim = find(pool, address, scope).await?;
    let what = format!(
        "{} {}, fence {}{}",
        claim.state,
        render::describe_claim(&claim),
        claim.fence,
        reason_in_parentheses(&claim),
    );
    if let Some(why) = unresolvable(&claim) {
        return Err(CliError::Refused(format!("{what}: {why}")));
    }
    if !yes {
        return Err(CliError::NeedsConfirmation(format!(
            "would resolve {what}: {}.
{} Re-run with --yes to resolve it.",
            describe_resolution(&resolution),
            consequence(&resolution),
        )));
    }
    // The state and the fence it was read in, as the confirmation showed
    // them: a claim read pending that went in doubt meanwhile is not what
    // the operator decided about.
    let resolver = Resolver::new("operator")
        .expected_fence(claim.fence)
        .expected_state(claim.state);
    let resolved = operations::resolve_as(pool, claim.slot(), resolution, resolver)
        .await
        .map_err(CliError::store("resolve the claim"))?;
    let changed = |now: &str| {
        CliError::Refused(format!(
            "{what}, changed while we looked: {now}; nothing resolved. `idem claims show {}` \
             shows it now",
            claim.address
        ))
    };
    match resolved {
        Resolved::Changed { before, after } => Ok(ResolvedClaim { before, after }),
        Resolved::Missing => Err(changed("it is gone (released, or resolved and released)")),
        Resolved::NotResolvable(now) => Err(changed(&format!("it is {} now", now.state))),
        Resolved::FenceMoved { current, .. } => Err(changed(&format!(
            "its fence is {} now (taken over, or released and claimed anew)",
            current.fence
        ))),
        Resolved::StateChanged { current, .. } => Err(changed(&format!(
            "it is {} now, at the same fence",
            current.state
        ))),
        Resolved::LeaseLive(_) => Err(CliError::Refused(format!(
            "{what}: its lease is live, so its holder is at work and may settle it at any \
             moment; nothing resolved. Resolve it only once its lease has run out (`idem claims \
             show {}` shows it)",
            claim.address
        ))),
        other => Err(changed(&format!("{other:?}"))),
    }
}

/// Why `claim` cannot be resolved, if it cannot: only claims in doubt or
/// pending can.
fn unresolvable(claim: &ClaimRow) -> Option<String> {
    match claim.state {
        state if state.is_resolvable() => None,
        ClaimState::Success => Some(format!(
            "it succeeded{}, and a success is kept forever: there is nothing to resolve",
            claim
                .settled_micros
                .map(|m| format!(" (settled {})", timestamps::instant_to_second(m)))
                .unwrap_or_default(),
        )),
        ClaimState::Failed => Some(
            "it is a kept failure, already resolved: retries of it are refused. There is \
             nothing to resolve"
                .to_owned(),
        ),
        state => Some(format!(
            "it is {state}; only claims in doubt or pending are resolved"
        )),
    }
}

/// "as a success, keeping output {...}" and its kin.
fn describe_resolution(resolution: &Outcome<Option<&str>>) -> String {
    match resolution {
        Outcome::Succeeded(Some(output)) => format!("as a success, replaying {output}"),
        Outcome::Succeeded(None) => "as a success, with no output".to_owned(),
        Outcome::Failed(Disposition::Keep) => "as failed".to_owned(),
        Outcome::Failed(_) => "by releasing it".to_owned(),
    }
}

/// What a resolution means for the retries of the claim's action.
fn consequence(resolution: &Outcome<Option<&str>>) -> &'static str {
    match resolution {
        Outcome::Succeeded(_) => {
            "Retries will not run the action again: resolve it so only when its effect happened."
        }
        Outcome::Failed(Disposition::Keep) => {
            "Retries will be refused, never run: resolve it so only when it definitely failed."
        }
        Outcome::Failed(_) => {
            "The next retry runs the action again: resolve it so only when its effect did not \
             happen, or you would do it twice."
        }
    }
}

/// " (body_in_doubt)" when the claim says how it got to its state.
fn reason_in_parentheses(claim: &ClaimRow) -> String {
    claim
        .state_reason
        .as_deref()
        .map(|reason| format!(" ({})", name(reason)))
        .unwrap_or_default()
}

/// "account acme, no namespace" / "account acme, namespace live".
pub(crate) fn describe_scope(account: &str, namespace: Option<&str>) -> String {
    let account = name(account);
    match namespace {
        Some(namespace) => format!("account {account}, namespace {}", name(namespace)),
        None => format!("account {account}, no namespace"),
    }
}

fn describe_filter(account: Option<&str>, namespace: NamespaceFilter<'_>) -> String {
    let account = account.map_or_else(
        || "any account".to_owned(),
        |a| format!("account {}", name(a)),
    );
    match namespace {
        NamespaceFilter::Any => account,
        NamespaceFilter::Without => format!("{account}, no namespace"),
        NamespaceFilter::Named(n) => format!("{account}, namespace {}", name(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_before_any_query() {
        assert!(check_address("claim_0123456789abcdef01234567").is_ok());
        for bad in ["", "Claim_X", "claim-1", "claim_1; DROP TABLE x"] {
            assert!(check_address(bad).is_err(), "{bad}");
        }
    }
}
