//! The handlers: read the request, ask the store through
//! [`operations`](idem_runtime::operations), hand the answer to a page. The only
//! write is [`resolve`], through the same operation as `idem claims
//! resolve`, with the same refusals.

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use idem_runtime::Error;
use idem_runtime::operations::{self, ClaimState, Resolved, Resolver};
use idem_runtime::{Disposition, Outcome};

use super::State as ConsoleState;
use super::pages::{self, ClaimExtras, Frame, Overview};
use super::params::{Asked, BadParam, ListParams, Params, SlotParams};
use super::security::{self, Csrf};
use super::text::{parse_duration, shown};

type Shared = State<Arc<ConsoleState>>;

/// What every handler reads of its request besides its body.
pub(super) struct Ctx {
    frame: Frame,
    query: Option<String>,
    headers: HeaderMap,
    csrf: Csrf,
    who: String,
}

impl FromRequestParts<Arc<ConsoleState>> for Ctx {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<ConsoleState>,
    ) -> Result<Self, Self::Rejection> {
        let base = security::mount(&parts.uri, &parts.extensions);
        // Set by the guard, which every route passes through; a token no
        // form can match otherwise.
        let csrf = parts.extensions.get::<Csrf>().cloned().unwrap_or(Csrf {
            token: String::new(),
            from_request: false,
        });
        Ok(Ctx {
            frame: Frame {
                root: format!("{base}/"),
                writes: state.writes,
                csrf: csrf.token.clone(),
            },
            query: parts.uri.query().map(str::to_owned),
            headers: parts.headers.clone(),
            who: security::who(&state.access, &parts.extensions),
            csrf,
        })
    }
}

impl Ctx {
    fn bad(&self, BadParam(message): BadParam) -> Response {
        pages::problem(
            &self.frame,
            StatusCode::BAD_REQUEST,
            "Not understood",
            &message,
        )
    }

    /// The database failed: an outage of the store, said so (503); or it
    /// refused a value of the request (SQLSTATE class 22, a data
    /// exception: 400, the request's error, never reported as an outage);
    /// or it refused the statement (a schema not current: 500).
    fn failed(&self, error: &Error) -> Response {
        let code = match error {
            Error::Database(sqlx::Error::Database(db)) => db.code().map(|c| c.into_owned()),
            _ => None,
        };
        if let Some(code) = code.as_deref()
            && code.starts_with("22")
        {
            return pages::problem(
                &self.frame,
                StatusCode::BAD_REQUEST,
                "Not understood",
                &format!("The database refused a value of this request: {error}."),
            );
        }
        if !error.is_outage() && code.is_some() {
            return pages::problem(
                &self.frame,
                StatusCode::INTERNAL_SERVER_ERROR,
                "The database refused the statement",
                &format!(
                    "{error}. Nothing was changed. Is idem's schema current? `idem migrate \
                     --check` says."
                ),
            );
        }
        pages::problem(
            &self.frame,
            StatusCode::SERVICE_UNAVAILABLE,
            "The database failed",
            &format!(
                "{error}. Nothing was changed by this page; try again once the database answers \
                 (`idem migrate --check` says whether the schema is current)."
            ),
        )
    }

    fn read_only(&self) -> Response {
        pages::problem(
            &self.frame,
            StatusCode::FORBIDDEN,
            "Read-only",
            "This console does not resolve claims: start it with writes allowed (idem console \
             --allow-writes, or Console::allow_writes) to do so.",
        )
    }
}

/// How many claims each of the overview's lists shows.
const OVERVIEW_LIST: u32 = 20;
/// How many groups of open claims the overview shows (its totals count
/// every open claim, whatever this cuts).
const OVERVIEW_GROUPS: u32 = 500;

pub(super) async fn overview(State(state): Shared, ctx: Ctx) -> Response {
    let params = match Params::parse(ctx.query.as_deref(), &["account", "pending_older_than"]) {
        Ok(params) => params,
        Err(bad) => return ctx.bad(bad),
    };
    // As the overview's own form writes them (idem_runtime::shown::escaped).
    let (threshold, account) = match (params.text("pending_older_than"), params.text("account")) {
        (Ok(threshold), Ok(account)) => (
            threshold
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| "5m".to_owned()),
            account.filter(|a| !a.is_empty()),
        ),
        (Err(bad), _) | (_, Err(bad)) => return ctx.bad(bad),
    };
    let threshold_age = match parse_duration(&threshold) {
        Ok(age) => age,
        Err(message) => return ctx.bad(BadParam(message)),
    };
    let account = account.as_deref();
    let scope = operations::ScopeFilter::new().account(account);
    let pool = &state.pool;
    let open = operations::open_counts(pool, account, OVERVIEW_GROUPS + 1);
    let totals = operations::open_totals(pool, account);
    let estimate = operations::row_estimate(pool);
    let pending_filter = operations::BrowseFilter::new()
        .scope(scope)
        .state(ClaimState::Pending)
        .older_than(threshold_age)
        .limit(OVERVIEW_LIST);
    let pending = operations::browse(pool, &pending_filter);
    let in_doubt_filter = operations::BrowseFilter::new()
        .scope(scope)
        .state(ClaimState::InDoubt)
        .limit(OVERVIEW_LIST);
    let in_doubt = operations::browse(pool, &in_doubt_filter);
    let (open, totals, estimate, pending, in_doubt) = match (
        open.await,
        totals.await,
        estimate.await,
        pending.await,
        in_doubt.await,
    ) {
        (Ok(o), Ok(t), Ok(e), Ok(p), Ok(d)) => (o, t, e, p, d),
        (Err(error), ..)
        | (_, Err(error), ..)
        | (_, _, Err(error), ..)
        | (.., Err(error), _)
        | (.., Err(error)) => {
            return ctx.failed(&error);
        }
    };
    let status = idem_runtime::schema::status(pool)
        .await
        .map_err(|error| error.to_string());
    let open_cut = open.len() > OVERVIEW_GROUPS as usize;
    let open = &open[..open.len().min(OVERVIEW_GROUPS as usize)];
    pages::overview(
        &ctx.frame,
        &Overview {
            open,
            open_cut,
            totals,
            rows_estimate: estimate,
            account,
            pending_threshold: &threshold,
            pending_past: &pending.claims,
            pending_past_more: pending.next.is_some(),
            in_doubt: &in_doubt.claims,
            in_doubt_more: in_doubt.next.is_some(),
            status,
        },
    )
}

pub(super) async fn claims(State(state): Shared, ctx: Ctx) -> Response {
    let list = match Params::parse(ctx.query.as_deref(), ListParams::NAMES)
        .and_then(|params| ListParams::read(&params))
    {
        Ok(list) => list,
        Err(bad) => return ctx.bad(bad),
    };
    match operations::browse(&state.pool, &list.filter()).await {
        Ok(page) => pages::list(&ctx.frame, &list, &page.claims, page.next.as_ref()),
        Err(error) => ctx.failed(&error),
    }
}

/// The claim a page is about, or the page that says there is none.
async fn find(
    state: &ConsoleState,
    ctx: &Ctx,
    slot: &SlotParams,
) -> Result<operations::ClaimView, Response> {
    match operations::describe(&state.pool, slot.slot()).await {
        Ok(Some(claim)) => Ok(claim),
        Ok(None) => Err(pages::problem(
            &ctx.frame,
            StatusCode::NOT_FOUND,
            "No such claim",
            &format!(
                "No claim is at {} in account {}{}: it was never made, or was released, or \
                 pruned.",
                slot.address,
                shown(&slot.account),
                slot.namespace
                    .as_deref()
                    .map(|n| format!(", namespace {}", shown(n)))
                    .unwrap_or_else(|| ", without a namespace".into()),
            ),
        )),
        Err(error) => Err(ctx.failed(&error)),
    }
}

pub(super) async fn claim(State(state): Shared, ctx: Ctx) -> Response {
    let read = Params::parse(
        ctx.query.as_deref(),
        &["account", "namespace", "address", "values"],
    )
    .and_then(|params| {
        let values = match params.get("values") {
            None | Some("") | Some("hidden") => false,
            Some("shown") => true,
            Some(other) => {
                return Err(BadParam(format!(
                    "values is shown or hidden, not \"{}\"",
                    shown(other)
                )));
            }
        };
        Ok((SlotParams::read(&params)?, values))
    });
    let (slot, show_values) = match read {
        Ok(read) => read,
        Err(bad) => return ctx.bad(bad),
    };
    let claim = match find(&state, &ctx, &slot).await {
        Ok(claim) => claim,
        Err(response) => return response,
    };
    let steps = match operations::steps(&state.pool, slot.slot()).await {
        Ok(steps) => steps,
        Err(error) => return ctx.failed(&error),
    };
    let values = if show_values {
        match operations::stored_values(&state.pool, slot.slot()).await {
            Ok(values) => values,
            Err(error) => return ctx.failed(&error),
        }
    } else {
        None
    };
    pages::claim(
        &ctx.frame,
        &claim,
        &ClaimExtras {
            steps: &steps,
            values: values.as_ref(),
            slot: &slot,
        },
    )
}

/// Why `claim` cannot be resolved now, as a page; `None`: it can. `state`:
/// the state the page that led here showed, if it said.
fn unresolvable(
    ctx: &Ctx,
    claim: &operations::ClaimView,
    fence: i64,
    state: Option<ClaimState>,
) -> Option<Response> {
    let (title, message) = if !matches!(claim.state, ClaimState::Pending | ClaimState::InDoubt) {
        (
            "Nothing to resolve",
            format!(
                "It is {} now: a success is kept forever and a kept failure is already \
                 resolved.",
                claim.state
            ),
        )
    } else if claim.fence != fence {
        (
            "It changed",
            format!(
                "Its fence is {} now, not {fence}: it was taken over, or released and claimed \
                 anew. Look at it again before deciding.",
                claim.fence
            ),
        )
    } else if let Some(shown) = state
        && shown != claim.state
    {
        (
            "It changed",
            format!(
                "It is {} now, not {shown}: {} Look at it again before deciding.",
                claim.state,
                changed_state(claim.state)
            ),
        )
    } else if claim.lease_live {
        (
            "Its holder is at work",
            "Its lease is live: its holder may settle it at any moment. Resolve it only once \
             the lease has run out."
                .to_owned(),
        )
    } else {
        return None;
    };
    Some(pages::problem(
        &ctx.frame,
        StatusCode::CONFLICT,
        title,
        &message,
    ))
}

fn read_fence(params: &Params) -> Result<i64, BadParam> {
    let text = params.required("fence")?;
    text.parse()
        .map_err(|_| BadParam(format!("fence is a number, not \"{}\"", shown(text))))
}

/// The state a page showed the claim in (`state`), if it said.
fn read_state(params: &Params) -> Result<Option<ClaimState>, BadParam> {
    params
        .get("state")
        .map(|text| {
            ClaimState::parse(text).ok_or_else(|| {
                BadParam(format!(
                    "state is pending or in_doubt, not \"{}\"",
                    shown(text)
                ))
            })
        })
        .transpose()
}

/// What it means that a claim is in `now`, when it was shown in the other
/// state a resolution starts from.
fn changed_state(now: ClaimState) -> &'static str {
    match now {
        ClaimState::InDoubt => {
            "its outcome became unknown (its body said so, or its lease ran out and a retry \
             turned it in doubt), so what was decided for it pending may not hold."
        }
        _ => "it is not what the page showed.",
    }
}

pub(super) async fn confirm(State(state): Shared, ctx: Ctx) -> Response {
    if !state.writes {
        return ctx.read_only();
    }
    let read = Params::parse(
        ctx.query.as_deref(),
        &["account", "namespace", "address", "fence", "as", "state"],
    )
    .and_then(|params| {
        Ok((
            SlotParams::read(&params)?,
            read_fence(&params)?,
            Asked::read(&params)?,
            read_state(&params)?,
        ))
    });
    let (slot, fence, asked, shown_state) = match read {
        Ok(read) => read,
        Err(bad) => return ctx.bad(bad),
    };
    let claim = match find(&state, &ctx, &slot).await {
        Ok(claim) => claim,
        Err(response) => return response,
    };
    if let Some(refusal) = unresolvable(&ctx, &claim, fence, shown_state) {
        return refusal;
    }
    pages::confirm(&ctx.frame, &claim, &slot, asked, None)
}

/// The form a resolution posts: the claim, and the fence and state its
/// confirmation showed (the write is matched on both).
const RESOLVE_FORM: &[&str] = &[
    "account",
    "namespace",
    "address",
    "fence",
    "state",
    "as",
    "output",
    "csrf",
];

/// The audit line of a write refused before it reached the store: who
/// asked, for which claim, what, and why not. Every value is recorded with
/// `Debug`, so a name cannot end the line and forge another.
fn refused(ctx: &Ctx, form: &[(String, String)], why: &str) {
    let field = |name: &str| {
        form.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    tracing::warn!(
        target: "idem::console::audit",
        operator = ?ctx.who,
        account = ?field("account"),
        namespace = ?field("namespace"),
        address = ?field("address"),
        fence = ?field("fence"),
        state = ?field("state"),
        asked = ?field("as"),
        why,
        "resolution refused"
    );
}

/// The resolution: [`resolve_and_audit`], its response marked as audited
/// (the guard writes no second line).
pub(super) async fn resolve(state: Shared, ctx: Ctx, body: String) -> Response {
    super::audit_log::audited(resolve_and_audit(state, ctx, body).await)
}

/// The resolution asked for by `body`, and its one audit line, whatever the
/// answer.
async fn resolve_and_audit(State(state): Shared, ctx: Ctx, body: String) -> Response {
    // Read leniently for the audit line alone: every write asked for is
    // logged, the refused ones too.
    let form: Vec<(String, String)> = serde_urlencoded::from_str(&body).unwrap_or_default();
    if !state.writes {
        refused(&ctx, &form, "read-only console");
        return ctx.read_only();
    }
    let params = match Params::parse(Some(&body), RESOLVE_FORM) {
        Ok(params) => params,
        Err(bad) => {
            refused(&ctx, &form, &bad.0);
            return ctx.bad(bad);
        }
    };
    if let Some(why) = security::forged(&ctx.headers, &ctx.csrf, params.get("csrf").unwrap_or("")) {
        refused(&ctx, &form, &format!("forged: {why}"));
        return pages::problem(
            &ctx.frame,
            StatusCode::FORBIDDEN,
            "Refused",
            &format!("This write is refused: {why}. Nothing was changed."),
        );
    }
    let read = (|| {
        let shown_state = read_state(&params)?.ok_or_else(|| {
            BadParam(
                "parameter state is required: the form says which state its confirmation \
                 showed (a page of an older console says nothing: open the claim again)"
                    .into(),
            )
        })?;
        Ok::<_, BadParam>((
            SlotParams::read(&params)?,
            read_fence(&params)?,
            shown_state,
            Asked::read(&params)?,
        ))
    })();
    let (slot, fence, shown_state, asked) = match read {
        Ok(read) => read,
        Err(bad) => {
            refused(&ctx, &form, &bad.0);
            return ctx.bad(bad);
        }
    };
    let output = params
        .get("output")
        .map(str::trim)
        .filter(|o| !o.is_empty() && asked == Asked::Succeeded);
    if let Some(output) = output
        && let Err(error) = serde_json::from_str::<serde::de::IgnoredAny>(output)
    {
        refused(&ctx, &form, "the output is not JSON");
        // Nothing lost: the form comes back with the output as typed,
        // unless the claim changed since its confirmation was shown.
        return match find(&state, &ctx, &slot).await {
            Ok(claim) => match unresolvable(&ctx, &claim, fence, Some(shown_state)) {
                Some(refusal) => refusal,
                None => pages::confirm(
                    &ctx.frame,
                    &claim,
                    &slot,
                    asked,
                    Some((&format!("The output is not JSON: {error}."), output)),
                ),
            },
            Err(response) => response,
        };
    }
    let resolution = match asked {
        Asked::Succeeded => Outcome::Succeeded(output),
        Asked::Failed => Outcome::Failed(Disposition::Keep),
        Asked::Release => Outcome::Failed(Disposition::Release),
    };
    // Everything the confirmation showed: a claim shown pending that went in
    // doubt at the same fence is not what the operator decided about.
    let resolver = Resolver::new("operator")
        .expected_fence(fence)
        .expected_state(shown_state);
    let outcome = operations::resolve_as(&state.pool, slot.slot(), resolution, resolver).await;
    let audit = |result: &str| {
        tracing::info!(
            target: "idem::console::audit",
            operator = ?ctx.who,
            account = ?slot.account,
            namespace = ?slot.namespace,
            address = %slot.address,
            fence,
            state = shown_state.as_str(),
            asked = asked.as_str(),
            result,
            "resolution"
        );
    };
    let conflict = |headline: &str, detail: String| {
        pages::resolved(&ctx.frame, StatusCode::CONFLICT, &slot, headline, &detail)
    };
    match outcome {
        Ok(Resolved::Changed { before, after }) => {
            let now = after.map_or("deleted (released)", ClaimState::as_str);
            audit(now);
            pages::resolved(
                &ctx.frame,
                StatusCode::OK,
                &slot,
                &format!("Resolved: {} → {now}", before.state),
                &format!(
                    "Claim {} was {} at fence {}; it is {now}.",
                    before.address, before.state, before.fence
                ),
            )
        }
        Ok(Resolved::Missing) => {
            audit("missing");
            conflict(
                "Nothing changed: the claim is gone",
                "It was released, resolved and released, or pruned since the page was shown."
                    .into(),
            )
        }
        Ok(Resolved::NotResolvable(now)) => {
            audit("not resolvable");
            conflict(
                "Nothing changed: it is settled",
                format!("It is {} now: nothing resolves a settled claim.", now.state),
            )
        }
        Ok(Resolved::FenceMoved { current, .. }) => {
            audit("fence moved");
            conflict(
                "Nothing changed: it moved on",
                format!(
                    "Its fence is {} now, not {fence}: it was taken over, or released and \
                     claimed anew. Look at it again before deciding.",
                    current.fence
                ),
            )
        }
        Ok(Resolved::StateChanged { current, .. }) => {
            audit("state changed");
            conflict(
                "Nothing changed: its state changed",
                format!(
                    "It is {} now, not {shown_state} as the confirmation showed, at the same \
                     fence {fence}: {} Look at it again before deciding.",
                    current.state,
                    changed_state(current.state)
                ),
            )
        }
        Ok(Resolved::LeaseLive(_)) => {
            audit("lease live");
            conflict(
                "Nothing changed: its holder is at work",
                "Its lease is live: its holder may settle it at any moment.".into(),
            )
        }
        // A kind of answer a later idem-runtime may add: nothing this
        // console knows was changed by it, so say so.
        Ok(other) => {
            audit("not changed");
            conflict("Nothing changed", format!("{other:?}"))
        }
        Err(error) => {
            audit("database failed");
            pages::problem(
                &ctx.frame,
                StatusCode::SERVICE_UNAVAILABLE,
                "The database failed",
                &format!(
                    "{error}. The resolution may or may not have been applied: look at the \
                     claim again. Trying again is safe: a resolution is matched on the fence \
                     it was confirmed at, so it is applied at most once."
                ),
            )
        }
    }
}

pub(super) async fn audit(State(state): Shared, ctx: Ctx) -> Response {
    if let Err(bad) = Params::parse(ctx.query.as_deref(), &[]) {
        return ctx.bad(bad);
    }
    let findings = match &state.audit {
        Some(audit) => Some(audit.findings(&state.pool).await),
        None => None,
    };
    pages::audit(&ctx.frame, findings)
}
