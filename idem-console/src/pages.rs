//! The pages, as HTML. Every value goes in through maud's `( )`, which
//! escapes it; names go through [`shown`] first (or [`escaped`], whole,
//! where they are typed back: a filter box, a form's field), and every
//! message and report through [`escaped_lines`], so that what is escaped is
//! also legible and no page holds a hidden character ([`idem_runtime::shown`]).
//! Nothing here reads the database.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use idem_runtime::operations::{
    ClaimState, ClaimStep, ClaimView, OpenCount, OpenTotals, PageCursor, StoredValues,
};
use idem_runtime::schema::{Layout, Status};
use idem_runtime::shown::{escaped, escaped_lines};

use super::params::{Asked, ListParams, SlotParams, query};
use super::text::{Decoded, age, decode, instant, shown, shown_rendering, visible};

/// What every page of one request shares.
pub(super) struct Frame {
    /// Where the console is mounted, ending in `/`: every link starts here.
    pub root: String,
    /// Writes are allowed.
    pub writes: bool,
    /// The CSRF token its forms carry.
    pub csrf: String,
}

impl Frame {
    fn link(&self, path: &str, query: &str) -> String {
        if query.is_empty() {
            format!("{}{path}", self.root)
        } else {
            format!("{}{path}?{query}", self.root)
        }
    }

    fn claim_link(&self, account: &str, namespace: Option<&str>, address: &str) -> String {
        self.link(
            "claim",
            &query(&[
                ("account", Some(account)),
                ("address", Some(address)),
                ("namespace", namespace),
            ]),
        )
    }

    fn list_link(
        &self,
        state: Option<ClaimState>,
        account: Option<&str>,
        action: Option<&str>,
    ) -> String {
        self.link(
            "claims",
            &query(&[
                ("state", state.map(ClaimState::as_str)),
                ("account", account),
                ("action", action),
            ]),
        )
    }
}

/// The page around `body`.
fn page(frame: &Frame, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "idem · " (title) }
                link rel="stylesheet" href=(frame.link("assets/console.css", ""));
                script src=(frame.link("assets/console.js", "")) defer {}
            }
            body {
                header {
                    a.brand href=(frame.root) { "idem" }
                    nav {
                        a href=(frame.root) { "Overview" }
                        a href=(frame.list_link(Some(ClaimState::InDoubt), None, None)) { "In doubt" }
                        a href=(frame.list_link(Some(ClaimState::Pending), None, None)) { "Pending" }
                        a href=(frame.list_link(Some(ClaimState::Failed), None, None)) { "Kept failures" }
                        a href=(frame.link("claims", "")) { "All claims" }
                        a href=(frame.link("audit", "")) { "Audit" }
                    }
                    @if frame.writes {
                        span.mode.writes title="Resolving and releasing claims is allowed" { "writes allowed" }
                    } @else {
                        span.mode title="Start the console with writes allowed to resolve claims" { "read-only" }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, Html(markup.into_string())).into_response()
}

/// A page that only says no (or what went wrong), outside any frame: the
/// request may not have got in.
pub(super) fn refusal(status: StatusCode, title: &str, message: &str) -> Response {
    respond(
        status,
        html! {
            (DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "idem · " (title) } }
                body { h1 { (title) } p.refusal { (escaped_lines(message)) } }
            }
        },
    )
}

/// A page of the console that says what went wrong and what to do.
pub(super) fn problem(frame: &Frame, status: StatusCode, title: &str, message: &str) -> Response {
    respond(
        status,
        page(
            frame,
            title,
            html! { p.refusal role="alert" { (escaped_lines(message)) } },
        ),
    )
}

fn state_badge(state: ClaimState) -> Markup {
    html! { span class={ "state " (state.as_str()) } { (state.as_str()) } }
}

fn scope_cell(account: &str, namespace: Option<&str>) -> Markup {
    html! {
        span.account title="account" { (shown(account)) }
        @if let Some(namespace) = namespace {
            " / " span.namespace title="namespace" { (shown(namespace)) }
        }
    }
}

fn identity_cell(decoded: &Decoded) -> Markup {
    html! {
        @match &decoded.action {
            Some(action) => { span.action { (shown(action)) } " " code.parts { (shown_rendering(&decoded.parts)) } }
            None => { span.undecoded { (shown_rendering(&decoded.parts)) } }
        }
    }
}

/// What the overview shows.
pub(super) struct Overview<'a> {
    /// The groups of open claims the table has room for.
    pub open: &'a [OpenCount],
    /// More groups than `open` holds exist.
    pub open_cut: bool,
    /// Every open claim, counted: the totals, whatever `open` holds.
    pub totals: OpenTotals,
    pub rows_estimate: Option<i64>,
    /// The one account the overview is of; `None`: every one.
    pub account: Option<&'a str>,
    pub pending_threshold: &'a str,
    pub pending_past: &'a [ClaimView],
    pub pending_past_more: bool,
    pub in_doubt: &'a [ClaimView],
    pub in_doubt_more: bool,
    pub status: Result<Status, String>,
}

pub(super) fn overview(frame: &Frame, o: &Overview<'_>) -> Response {
    // Counted apart from the table, which may be cut: never a sum of the
    // groups shown.
    let total = |state: ClaimState| -> i64 { o.totals.of(state) };
    let body = html! {
        section.totals {
            @for state in [ClaimState::InDoubt, ClaimState::Pending, ClaimState::Failed] {
                a.total href=(frame.list_link(Some(state), o.account, None)) {
                    span.count { (total(state)) }
                    " " (state_badge(state))
                }
            }
            span.total {
                span.count { @match o.rows_estimate { Some(n) => { "≈ " (n) }, None => { "?" } } }
                " rows in idem_records (the planner's estimate, every kind)"
            }
        }
        section {
            h2 { "In doubt, oldest first" }
            @if o.in_doubt.is_empty() {
                p.empty { "No claim is in doubt." }
            } @else {
                (claims_table(frame, o.in_doubt, true))
                @if o.in_doubt_more {
                    p { a href=(frame.list_link(Some(ClaimState::InDoubt), o.account, None)) { "All claims in doubt →" } }
                }
            }
        }
        section {
            h2 { "Pending for more than " (shown(o.pending_threshold)) }
            form.inline method="get" action=(frame.root) {
                label { "Account " input name="account" value=(escaped(o.account.unwrap_or(""))) placeholder="every account"; }
                label { "Threshold " input name="pending_older_than" value=(escaped(o.pending_threshold)) size="6"; }
                button type="submit" { "Show" }
            }
            @if o.pending_past.is_empty() {
                p.empty { "No claim has been pending that long." }
            } @else {
                (claims_table(frame, o.pending_past, true))
                @if o.pending_past_more {
                    p { a href=(frame.link("claims", &query(&[("state", Some("pending")), ("account", o.account), ("older_than", Some(o.pending_threshold))]))) { "All of them →" } }
                }
            }
        }
        section {
            h2 { "Open claims by account and action" }
            @if o.open.is_empty() {
                p.empty { "Every claim is settled as a success." }
            } @else {
                table.open {
                    thead { tr { th { "account" } th { "action" } th { "state" } th.num { "claims" } th.num { "oldest" } } }
                    tbody {
                        @for c in o.open {
                            tr {
                                td { (shown(&c.account)) }
                                td { @match &c.action { Some(a) => (shown(a)), None => em { "not idem's format" } } }
                                td { (state_badge(c.state)) }
                                td.num { a href=(frame.list_link(Some(c.state), Some(&c.account), c.action.as_deref())) { (c.claims) } }
                                td.num { (age(c.oldest_age_seconds)) }
                            }
                        }
                    }
                }
                @if o.open_cut { p.note { "Only the first groups are shown; the totals above count every open claim, and each lists them all." } }
            }
        }
        section {
            h2 { "Schema" }
            @match &o.status {
                Ok(status) => (schema(status)),
                Err(error) => p.refusal { "The schema could not be read: " (escaped_lines(error)) },
            }
        }
    };
    respond(StatusCode::OK, page(frame, "Overview", body))
}

fn schema(status: &Status) -> Markup {
    let layout = match &status.layout {
        None => "no table".to_owned(),
        Some(Layout::Plain) => "one table".to_owned(),
        Some(Layout::Partitioned { key, partitions }) => {
            format!("partitioned by {key}, {partitions} partitions")
        }
        Some(Layout::Distributed {
            method,
            column,
            shards,
        }) => format!(
            "distributed by Citus ({method:?} on {}), {shards} shards",
            column.as_deref().unwrap_or("no column")
        ),
        Some(other) => format!("{other:?}"),
    };
    html! {
        dl.facts {
            dt { "table" } dd { (escaped_lines(status.table.as_deref().unwrap_or("not found"))) " (search_path " (escaped_lines(&status.search_path)) ")" }
            dt { "version" } dd { (status.version) " (this build expects " (status.expected_version) ")" }
            dt { "layout" } dd { (layout) }
            dt { "verification" }
            dd {
                @match &status.problems {
                    None => span.ok { "passes: the gate starts on this schema" },
                    Some(problems) => {
                        span.refusal { "fails: a gate refuses to start" }
                        ul { @for p in &problems.problems { li { (escaped_lines(&p.to_string())) } } }
                    }
                }
            }
            dt { "index of open claims" }
            dd {
                @if status.open_claims_index_present {
                    span.ok { "present" }
                } @else {
                    span.refusal { "absent" }
                    ": the lists of one open state, these counts and the reconciler read the \
                     whole table. Build it (docs/operations.md): "
                    code { (status.open_claims_index) }
                }
            }
        }
    }
}

/// A table of claims, each linked to its page.
fn claims_table(frame: &Frame, claims: &[ClaimView], show_age: bool) -> Markup {
    html! {
        table.claims {
            thead {
                tr {
                    th { "claim" } th { "scope" } th { "identity" } th { "state" }
                    th.num { "fence" }
                    @if show_age { th.num { "age" } } @else { th { "claimed" } }
                }
            }
            tbody {
                @for c in claims {
                    @let decoded = decode(&c.identity, &c.address);
                    tr {
                        td { a.address href=(frame.claim_link(&c.account, c.namespace.as_deref(), &c.address)) { (c.address) } }
                        td { (scope_cell(&c.account, c.namespace.as_deref())) }
                        td { (identity_cell(&decoded)) }
                        td {
                            (state_badge(c.state))
                            @if let Some(reason) = &c.state_reason { " " span.reason { (shown(reason)) } }
                        }
                        td.num { (c.fence) }
                        @if show_age { td.num { (age(c.age_seconds)) } } @else { td { (instant(c.created_micros)) } }
                    }
                }
            }
        }
    }
}

/// The list page.
pub(super) fn list(
    frame: &Frame,
    params: &ListParams,
    claims: &[ClaimView],
    next: Option<&PageCursor>,
) -> Response {
    let state = params.state;
    let oldest_first = matches!(
        state,
        Some(ClaimState::Pending | ClaimState::InDoubt | ClaimState::Failed)
    );
    let title = match state {
        Some(ClaimState::InDoubt) => "Claims in doubt",
        Some(ClaimState::Pending) => "Pending claims",
        Some(ClaimState::Failed) => "Kept failures",
        Some(ClaimState::Success) => "Successes",
        _ => "Claims",
    };
    let body = html! {
        form.filters method="get" action=(frame.link("claims", "")) {
            label { "state "
                select name="state" {
                    option value="" selected[state.is_none()] { "any" }
                    @for s in [ClaimState::InDoubt, ClaimState::Pending, ClaimState::Failed, ClaimState::Success] {
                        option value=(s.as_str()) selected[state == Some(s)] { (s.as_str()) }
                    }
                }
            }
            // Each name whole, as the page shows it: submitted unchanged, it
            // reads back as the name itself.
            label { "account " input name="account" value=(escaped(params.account.as_deref().unwrap_or(""))); }
            label { "namespace " input name="namespace" value=(escaped(params.namespace.as_deref().unwrap_or(""))); }
            label { input type="checkbox" name="without_namespace" value="1" checked[params.without_namespace]; " without namespace" }
            label { "action " input name="action" value=(escaped(params.action.as_deref().unwrap_or(""))); }
            label { "older than " input name="older_than" size="6" placeholder="2h" value=(escaped(params.older_than.as_ref().map_or("", |(t, _)| t.as_str()))); }
            button type="submit" { "Filter" }
        }
        p.note {
            @if oldest_first {
                "Oldest first" @if state == Some(ClaimState::InDoubt) { " (age: since it went in doubt)" } "."
            } @else {
                "By account and address: the order millions of claims can be paged in."
            }
        }
        @if claims.is_empty() {
            p.empty { "No claim matches." }
        } @else {
            (claims_table(frame, claims, oldest_first))
        }
        nav.pages {
            @if params.after.is_some() { a href=(frame.link("claims", &params.query(None))) { "← first page" } }
            @if let Some(next) = next { a.next href=(frame.link("claims", &params.query(Some(next)))) { "next page →" } }
        }
    };
    respond(StatusCode::OK, page(frame, title, body))
}

/// What the claim page shows besides the claim.
pub(super) struct ClaimExtras<'a> {
    pub steps: &'a [ClaimStep],
    pub values: Option<&'a StoredValues>,
    pub slot: &'a SlotParams,
}

pub(super) fn claim(frame: &Frame, c: &ClaimView, extras: &ClaimExtras<'_>) -> Response {
    let decoded = decode(&c.identity, &c.address);
    let opt_instant = |m: Option<i64>| m.map_or_else(|| "—".to_owned(), instant);
    let resolvable = matches!(c.state, ClaimState::Pending | ClaimState::InDoubt);
    let body = html! {
        dl.facts {
            dt { "address" } dd { code { (c.address) } }
            dt { "account" } dd { (shown(&c.account)) }
            dt { "namespace" } dd { @match &c.namespace { Some(n) => (shown(n)), None => em { "none" } } }
            dt { "action" } dd { @match &decoded.action { Some(a) => (shown(a)), None => em { "not in idem's format" } } }
            dt { "key parts" } dd { code { (shown_rendering(&decoded.parts)) } }
            dt { "address check" } dd {
                @if decoded.address_matches { span.ok { "the address is the digest of this identity" } }
                @else if idem_runtime::operations::is_compacted(&c.identity) { "compacted past its value's window: only a check of the identity is kept" }
                @else { span.refusal { "the address is not the digest of the stored identity" } }
            }
            dt { "state" } dd { (state_badge(c.state)) @if let Some(r) = &c.state_reason { " (" (shown(r)) ")" } }
            dt { "fence" } dd {
                (c.fence)
                @if let Some(first) = c.first_fence { @if first != c.fence { " (first claimed at " (first) "; taken over since)" } @else { " (never taken over)" } }
            }
            dt { "claimed" } dd { (instant(c.created_micros)) }
            dt { "settled" } dd { (opt_instant(c.settled_micros)) }
            dt { "in doubt since" } dd { (opt_instant(c.in_doubt_micros)) }
            dt { "resolved" } dd { (opt_instant(c.resolved_micros)) }
            dt { "lease" } dd {
                @match c.lease_expires_micros {
                    None => "none",
                    Some(m) => { @if c.lease_live { "live until " } @else { "ran out at " } (instant(m)) }
                }
            }
            dt { "stored output" } dd {
                @match c.output_bytes { Some(n) => { (n) " bytes" }, None => "none" }
                @if c.has_fingerprint { ", and a request fingerprint" }
                @if extras.values.is_none() && (c.output_bytes.is_some() || c.has_fingerprint) {
                    " · " a href=(frame.link("claim", &format!("{}&values=shown", extras.slot.query()))) { "show the values" }
                }
            }
        }
        @if let Some(values) = extras.values {
            section.values {
                h2 { "Stored values" }
                p.note { "What retries are answered with. Shown because you asked; they may hold personal or secret data." }
                h3 { "output" }
                pre { (values.output.as_deref().map_or_else(|| "none".to_owned(), visible)) }
                h3 { "fingerprint" }
                pre { (visible(values.fingerprint.as_deref().unwrap_or("none"))) }
            }
        }
        section {
            h2 { "Steps" }
            @if extras.steps.is_empty() {
                p.empty { "Its body ran no step (idem::step)." }
            } @else {
                table.steps {
                    thead { tr { th { "step" } th { "state" } th.num { "fence" } th { "begun" } th { "recorded" } th.num { "output" } } }
                    tbody {
                        @for s in extras.steps {
                            tr {
                                td { @match &s.name { Some(n) => (shown(n)), None => code { (s.address) } } }
                                td { (s.state.as_str()) }
                                td.num { (s.fence) }
                                td { (instant(s.created_micros)) }
                                td { (opt_instant(s.settled_micros)) }
                                td.num { @match s.output_bytes { Some(n) => { (n) " B" }, None => "—" } }
                            }
                        }
                    }
                }
            }
        }
        section.actions {
            h2 { "Resolve" }
            @if !resolvable {
                p.note { "A " (c.state.as_str()) " claim is settled: there is nothing to resolve." }
            } @else if c.lease_live {
                p.note { "Its lease is live: its holder is at work and may settle it at any moment. Resolve it only once the lease has run out." }
            } @else if !frame.writes {
                p.note { "This console is read-only: start it with writes allowed (idem console --allow-writes) to resolve claims." }
            } @else {
                p.note { "Find out first what happened to its effect (the provider's dashboard, its API). Each choice asks you to confirm." }
                @for asked in [Asked::Succeeded, Asked::Failed, Asked::Release] {
                    a class={ "button " (asked.as_str()) }
                      href=(frame.link("claim/resolve", &format!("{}&fence={}&state={}&as={}", extras.slot.query(), c.fence, c.state.as_str(), asked.as_str()))) {
                        (button_label(asked, c.state))
                    }
                }
            }
        }
    };
    respond(
        StatusCode::OK,
        page(frame, &format!("Claim {}", c.address), body),
    )
}

fn button_label(asked: Asked, state: ClaimState) -> &'static str {
    match (asked, state) {
        (Asked::Succeeded, _) => "It happened: settle as succeeded…",
        (Asked::Failed, _) => "It definitely failed: keep as failed…",
        (Asked::Release, ClaimState::Pending) => "Its holder is gone: release…",
        (Asked::Release, _) => "It did not happen: release…",
    }
}

/// What a resolution will do to the retries of the claim's action.
fn consequence(asked: Asked) -> &'static str {
    match asked {
        Asked::Succeeded => {
            "Retries will not run the action again, and are answered with the output below: \
             resolve it so only when its effect happened."
        }
        Asked::Failed => {
            "Retries will be refused (already failed), never run: resolve it so only when it \
             definitely failed."
        }
        Asked::Release => {
            "The claim is deleted and the next retry runs the action again (its finished steps \
             are replayed): resolve it so only when its effect did not happen, or it happens \
             twice."
        }
    }
}

fn what_changes(asked: Asked, c: &ClaimView) -> String {
    let from = c.state.as_str();
    match asked {
        Asked::Succeeded => format!("{from} → success, kept forever"),
        Asked::Failed => format!("{from} → failed, kept"),
        Asked::Release => format!("{from} → deleted"),
    }
}

/// The confirmation of a resolution; `error`: why the last try was not
/// taken, and the output it carried (shown again, not lost).
pub(super) fn confirm(
    frame: &Frame,
    c: &ClaimView,
    slot: &SlotParams,
    asked: Asked,
    error: Option<(&str, &str)>,
) -> Response {
    let decoded = decode(&c.identity, &c.address);
    let (status, message, output) = match error {
        Some((message, output)) => (StatusCode::BAD_REQUEST, Some(message), output),
        None => (StatusCode::OK, None, ""),
    };
    let body = html! {
        @if let Some(message) = message { p.refusal role="alert" { (escaped_lines(message)) } }
        p.confirm {
            "Claim " code { (c.address) } " of " (scope_cell(&c.account, c.namespace.as_deref())) ": "
            (identity_cell(&decoded)) ", fence " (c.fence) ", " (state_badge(c.state))
            " for " (age(c.age_seconds)) "."
        }
        p.change { strong { (what_changes(asked, c)) } }
        p.consequence { (consequence(asked)) }
        form.resolve method="post" action=(frame.link("claim/resolve", "")) {
            input type="hidden" name="account" value=(escaped(&slot.account));
            @if let Some(n) = &slot.namespace { input type="hidden" name="namespace" value=(escaped(n)); }
            input type="hidden" name="address" value=(slot.address);
            input type="hidden" name="fence" value=(c.fence);
            input type="hidden" name="state" value=(c.state.as_str());
            input type="hidden" name="as" value=(asked.as_str());
            input type="hidden" name="csrf" value=(frame.csrf);
            @if asked == Asked::Succeeded {
                label {
                    "Output its retries replay, as JSON (empty: none; for an action that replays, the value its Ok carried)"
                    textarea name="output" rows="4" cols="60" spellcheck="false" { (output) }
                }
            }
            p.note { "Only while it is still " (c.state.as_str()) " at fence " (c.fence) ": if it changed since this page was shown, nothing is changed." }
            button type="submit" class={ "button " (asked.as_str()) } { "Confirm: " (what_changes(asked, c)) }
            " "
            a href=(frame.link("claim", &slot.query())) { "Cancel" }
        }
    };
    respond(status, page(frame, "Confirm", body))
}

/// After a resolution: what it did, or why nothing changed.
pub(super) fn resolved(
    frame: &Frame,
    status: StatusCode,
    slot: &SlotParams,
    headline: &str,
    detail: &str,
) -> Response {
    let body = html! {
        p class=(if status.is_success() { "ok" } else { "refusal" }) role="status" { strong { (escaped_lines(headline)) } }
        p { (escaped_lines(detail)) }
        p { a href=(frame.link("claim", &slot.query())) { "Back to the claim" } " · " a href=(frame.root) { "Overview" } }
    };
    respond(status, page(frame, "Resolution", body))
}

pub(super) fn audit(frame: &Frame, findings: Option<Result<String, String>>) -> Response {
    let body = html! {
        @match findings {
            None => p.note { "No audit is configured here: the idem command's console (idem console) runs idem audit; run `idem audit` yourself otherwise." },
            Some(Ok(text)) => pre.audit { (escaped_lines(&text)) },
            Some(Err(error)) => p.refusal { "The audit could not run: " (escaped_lines(&error)) },
        }
    };
    respond(StatusCode::OK, page(frame, "Audit", body))
}
