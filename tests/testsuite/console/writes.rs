//! The console's one write, a resolution: only when writes are allowed,
//! only from the console's own form (CSRF), through `resolve_as` under the
//! fence the operator confirmed, exactly once however many confirmations
//! race, never over a live lease, and a mistyped output loses nothing.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use idem::console::Console;
use idem::{Gate, Identity, OnExpiry, Rejected, testing};
use tokio::sync::Barrier;

use super::support::{Page, get, in_doubt, post, row, send, set_state, slot_query, writable};

/// The confirmation page of resolving `id` in `gate`'s scope `as`, and the
/// form body its button posts (with `extra` appended).
async fn confirmation(
    console: &axum::Router,
    gate: &idem::Gate,
    id: &Identity,
    fence: i64,
    asked: &str,
) -> (Page, String) {
    let slot = slot_query(gate.account_name(), gate.namespace_name(), &id.address());
    let page = get(
        console,
        &format!("/claim/resolve?{slot}&fence={fence}&as={asked}"),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let csrf = page.csrf_field().expect("the form carries a token");
    let state = page
        .hidden("state")
        .expect("the form carries the state it shows");
    let form = format!("{slot}&fence={fence}&as={asked}&state={state}&csrf={csrf}");
    (page, form)
}

#[tokio::test]
async fn a_read_only_console_shows_no_form_and_refuses_every_write() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part(1);
    let fence = in_doubt(&gate, &id).await;
    let console = Console::new(gate.pool().clone()).router();
    let slot = slot_query(gate.account_name(), None, &id.address());
    let page = get(&console, &format!("/claim?{slot}")).await;
    assert!(page.body.contains("read-only"));
    assert!(
        !page.body.contains("claim/resolve?"),
        "a read-only page offers to resolve"
    );
    let confirm = get(
        &console,
        &format!("/claim/resolve?{slot}&fence={fence}&as=failed"),
    )
    .await;
    assert_eq!(confirm.status, StatusCode::FORBIDDEN);
    // Even with a token of a writable console's: the read-only one refuses
    // before it looks at the form.
    let cookie = page.csrf_cookie().expect("a cookie");
    let posted = post(
        &console,
        &cookie,
        &format!("{slot}&fence={fence}&as=release&csrf=x"),
    )
    .await;
    assert_eq!(posted.status, StatusCode::FORBIDDEN);
    assert_eq!(
        row(&gate, &id).await.map(|r| r.0).as_deref(),
        Some("in_doubt")
    );
}

#[tokio::test]
async fn a_confirmed_resolution_changes_the_claim_and_says_what_it_did() {
    let gate = testing::gate().await.namespace("live");
    let id = Identity::new("charge").part("ord_1");
    let fence = in_doubt(&gate, &id).await;
    let console = writable(&gate);
    let (page, form) = confirmation(&console, &gate, &id, fence, "succeeded").await;
    assert!(
        page.body.contains("in_doubt → success, kept forever"),
        "{}",
        page.body
    );
    let cookie = page.csrf_cookie().expect("a cookie");
    let done = post(
        &console,
        &cookie,
        &format!("{form}&output=%7B%22receipt%22%3A%22r_1%22%7D"),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("Resolved: in_doubt → success"));
    let (state, after, output) = row(&gate, &id).await.expect("kept");
    assert_eq!(
        (state.as_str(), after, output.as_deref()),
        ("success", fence, Some(r#"{"receipt":"r_1"}"#))
    );
    // The same confirmation again changes nothing: it is settled now.
    let again = post(&console, &cookie, &form).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
}

#[tokio::test]
async fn confirmations_racing_at_one_instant_resolve_the_claim_exactly_once() {
    const RACERS: usize = 8;
    let gate = testing::gate().await;
    let console = writable(&gate);
    for round in 0..3 {
        let id = Identity::new("charge").part(round);
        let fence = in_doubt(&gate, &id).await;
        let (page, _) = confirmation(&console, &gate, &id, fence, "failed").await;
        let cookie = page.csrf_cookie().expect("a cookie");
        let csrf = page.csrf_field().expect("a token");
        let slot = slot_query(gate.account_name(), None, &id.address());
        let barrier = Arc::new(Barrier::new(RACERS));
        let mut racers = tokio::task::JoinSet::new();
        for i in 0..RACERS {
            let asked = ["failed", "release", "succeeded"][i % 3];
            let form = format!("{slot}&fence={fence}&state=in_doubt&as={asked}&csrf={csrf}");
            let (console, cookie, barrier) = (console.clone(), cookie.clone(), barrier.clone());
            racers.spawn(async move {
                barrier.wait().await;
                (asked, post(&console, &cookie, &form).await)
            });
        }
        let results = racers.join_all().await;
        let won: Vec<&str> = results
            .iter()
            .filter(|(_, p)| p.status == StatusCode::OK)
            .map(|(asked, _)| *asked)
            .collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: {} resolutions applied",
            won.len()
        );
        assert!(
            results
                .iter()
                .all(|(_, p)| p.status == StatusCode::OK || p.status == StatusCode::CONFLICT)
        );
        let expected = match won[0] {
            "failed" => Some("failed"),
            "succeeded" => Some("success"),
            _ => None,
        };
        assert_eq!(
            row(&gate, &id).await.map(|r| r.0).as_deref(),
            expected,
            "round {round}"
        );
    }
}

#[tokio::test]
async fn a_forged_write_is_refused_and_changes_nothing() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part(1);
    let fence = in_doubt(&gate, &id).await;
    let console = writable(&gate);
    let (page, form) = confirmation(&console, &gate, &id, fence, "release").await;
    let cookie = page.csrf_cookie().expect("a cookie");
    let slot = slot_query(gate.account_name(), None, &id.address());
    let without_token = format!("{slot}&fence={fence}&as=release");
    // Another console's page (another secret), with its own cookie.
    let other = writable(&gate);
    let (other_page, other_form) = confirmation(&other, &gate, &id, fence, "release").await;
    let planted = format!("{}; {}", other_page.csrf_cookie().unwrap(), "x=1");
    // (the request's headers, its form, what is wrong with it)
    type Attempt<'a> = (Vec<(&'a str, &'a str)>, String, &'a str);
    let attempts: Vec<Attempt> = vec![
        (vec![], form.clone(), "no cookie"),
        (vec![("cookie", &cookie)], without_token.clone(), "no token"),
        (
            vec![("cookie", &cookie)],
            format!("{without_token}&csrf=00"),
            "a wrong token",
        ),
        (
            vec![("cookie", &planted)],
            other_form.clone(),
            "another console's token",
        ),
        (
            vec![("cookie", &cookie), ("origin", "http://evil.example")],
            form.clone(),
            "another origin",
        ),
        (
            vec![("cookie", &cookie), ("origin", "null")],
            form.clone(),
            "an opaque origin",
        ),
        (
            vec![("cookie", &cookie), ("sec-fetch-site", "cross-site")],
            form.clone(),
            "another site",
        ),
        (
            vec![("cookie", &cookie), ("sec-fetch-site", "same-site")],
            form.clone(),
            "a sibling site",
        ),
    ];
    for (headers, body, what) in attempts {
        let refused = send(&console, "POST", "/claim/resolve", &headers, Some(body)).await;
        assert_eq!(
            refused.status,
            StatusCode::FORBIDDEN,
            "{what}: {}",
            refused.body
        );
        assert_eq!(
            row(&gate, &id).await.map(|r| r.0).as_deref(),
            Some("in_doubt"),
            "{what}"
        );
    }
    // The real form goes through.
    let done = post(&console, &cookie, &form).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(row(&gate, &id).await, None);
}

#[tokio::test]
async fn a_claim_that_moved_on_or_whose_holder_is_at_work_is_not_resolved() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    // Taken over since the operator looked: the fence moved.
    let id = Identity::new("charge").part("moved");
    let fence = in_doubt(&gate, &id).await;
    let (page, form) = confirmation(&console, &gate, &id, fence, "release").await;
    idem::sqlx::query(
        "UPDATE idem_records SET fence = fence + 1 WHERE account = $1 AND address = $2",
    )
    .bind(gate.account_name())
    .bind(id.address())
    .execute(gate.pool())
    .await
    .unwrap();
    let (cookie, csrf) = (page.csrf_cookie().unwrap(), page.csrf_field().unwrap());
    let refused = post(&console, &cookie, &form).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(
        refused
            .body
            .contains(&format!("fence is {} now", fence + 1)),
        "{}",
        refused.body
    );
    assert_eq!(
        row(&gate, &id).await.map(|r| r.0).as_deref(),
        Some("in_doubt")
    );

    // Pending with a live lease: no button, no confirmation, no write.
    let busy = Identity::new("charge").part("busy");
    let claim = gate
        .guard(&busy)
        .lease(std::time::Duration::from_secs(300))
        .claim()
        .await
        .expect("claim");
    let busy_fence = claim.fence().expect("a fence");
    let slot = slot_query(gate.account_name(), None, &busy.address());
    let shown = get(&console, &format!("/claim?{slot}")).await;
    assert!(shown.body.contains("Its lease is live"), "{}", shown.body);
    assert!(
        !shown.body.contains("claim/resolve?"),
        "a live claim offers to resolve"
    );
    let confirm = get(
        &console,
        &format!("/claim/resolve?{slot}&fence={busy_fence}&as=release"),
    )
    .await;
    assert_eq!(confirm.status, StatusCode::CONFLICT);
    // A form made by hand, with this browser's real token, gets no further.
    let forced = post(
        &console,
        &cookie,
        &format!("{slot}&fence={busy_fence}&state=pending&as=release&csrf={csrf}"),
    )
    .await;
    assert_eq!(forced.status, StatusCode::CONFLICT, "{}", forced.body);
    assert!(
        forced.body.contains("its holder is at work"),
        "{}",
        forced.body
    );
    assert_eq!(
        row(&gate, &busy).await.map(|r| r.0).as_deref(),
        Some("pending")
    );
    drop(claim);
}

#[tokio::test]
async fn an_output_that_is_not_json_comes_back_as_typed_and_nothing_changes() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part(1);
    let fence = in_doubt(&gate, &id).await;
    let console = writable(&gate);
    let (page, form) = confirmation(&console, &gate, &id, fence, "succeeded").await;
    let typed = "{receipt: r_1 <b>";
    let body = format!(
        "{form}&{}",
        serde_urlencoded::to_string([("output", typed)]).unwrap()
    );
    let refused = post(&console, &page.csrf_cookie().unwrap(), &body).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.body.contains("not JSON"));
    assert!(
        refused.body.contains("{receipt: r_1 &lt;b&gt;</textarea>"),
        "{}",
        refused.body
    );
    assert_eq!(
        row(&gate, &id).await.map(|r| r.0).as_deref(),
        Some("in_doubt")
    );
}

/// How long the leases of the claims below last: their holders vanish,
/// and the console offers to resolve a pending claim only once its lease
/// ran out.
const LEASE: Duration = Duration::from_millis(200);

/// Claims `id` under a lease that turns it in doubt when it runs out
/// (`on_expiry = "in_doubt"`), as money-moving code does, and vanishes:
/// the claim stays pending, its lease running out. Its fence.
async fn pending_of_a_vanished_holder(gate: &Gate, id: &Identity) -> i64 {
    let holder = gate
        .guard(id)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
        .expect("claim");
    let fence = holder.fence().expect("a fence");
    crate::support::holders::vanish(holder);
    fence
}

/// A retry of `id`, as the service makes it: the claim it finds pending,
/// its lease run out, turns in doubt (at the same fence), and it is
/// refused.
async fn retry(gate: &Gate, id: &Identity) -> Result<idem::Claim, Rejected> {
    gate.guard(id)
        .lease(LEASE)
        .on_expiry(OnExpiry::InDoubt)
        .claim()
        .await
}

/// "Only while it is still pending at fence N: if it changed since this
/// page was shown, nothing is changed": a claim shown pending (its holder
/// gone, its lease run out) that a retry turned in doubt at the same fence
/// before the operator confirmed is not resolved, whatever was asked;
/// above all not released, which would let the next retry run an action
/// whose outcome is unknown.
#[tokio::test]
async fn a_pending_claim_turned_in_doubt_after_its_confirmation_is_not_resolved() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let asks = ["release", "failed", "succeeded"];
    let mut claims = Vec::new();
    for asked in asks {
        let id = Identity::new("charge").part(format!("turned_{asked}"));
        let fence = pending_of_a_vanished_holder(&gate, &id).await;
        claims.push((asked, id, fence));
    }
    tokio::time::sleep(LEASE * 2).await;
    for (asked, id, fence) in claims {
        let (page, form) = confirmation(&console, &gate, &id, fence, asked).await;
        assert!(
            page.body
                .contains(&format!("still pending at fence {fence}")),
            "{asked}: {}",
            page.body
        );
        let refused = retry(&gate, &id).await;
        assert!(matches!(refused, Err(Rejected::InDoubt)), "{refused:?}");
        assert_eq!(
            row(&gate, &id).await.map(|r| (r.0, r.1)),
            Some(("in_doubt".to_owned(), fence)),
            "the retry turned it in doubt at the same fence"
        );
        let posted = post(&console, &page.csrf_cookie().unwrap(), &form).await;
        assert_eq!(
            posted.status,
            StatusCode::CONFLICT,
            "{asked} confirmed on a page that showed it pending was applied to it in doubt: \
             {}",
            posted.body
        );
        assert!(posted.body.contains("in_doubt"), "{}", posted.body);
        assert_eq!(
            row(&gate, &id).await.map(|r| (r.0, r.1)),
            Some(("in_doubt".to_owned(), fence)),
            "{asked}: the claim in doubt was changed"
        );
    }
}

/// The same from each state a confirmation can show, for each resolution
/// it offers: the claim in another resolvable state at the same fence when
/// the confirmation is posted (pending turned in doubt; in doubt found
/// pending, set by hand) is left as it is.
#[tokio::test]
async fn a_confirmation_applies_only_in_the_state_it_showed() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    for (shown, now) in [("pending", "in_doubt"), ("in_doubt", "pending")] {
        for asked in ["succeeded", "failed", "release"] {
            let id = Identity::new("charge").part(format!("{shown}_{asked}"));
            let fence = in_doubt(&gate, &id).await;
            set_state(&gate, &id, shown).await;
            let (page, form) = confirmation(&console, &gate, &id, fence, asked).await;
            assert!(
                page.body
                    .contains(&format!("still {shown} at fence {fence}")),
                "{}",
                page.body
            );
            set_state(&gate, &id, now).await;
            let posted = post(&console, &page.csrf_cookie().unwrap(), &form).await;
            assert_eq!(
                posted.status,
                StatusCode::CONFLICT,
                "{asked} confirmed {shown} was applied to the claim {now}: {}",
                posted.body
            );
            assert_eq!(
                row(&gate, &id).await.map(|r| (r.0, r.1)),
                Some((now.to_owned(), fence)),
                "{asked} confirmed {shown}"
            );
        }
    }
    // A form that does not say which state it was confirmed in (a page of
    // an older console) is refused as a request, and changes nothing.
    let id = Identity::new("charge").part("stateless");
    let fence = in_doubt(&gate, &id).await;
    let (page, form) = confirmation(&console, &gate, &id, fence, "release").await;
    let stateless = form.replace("&state=in_doubt", "");
    assert_ne!(stateless, form);
    let refused = post(&console, &page.csrf_cookie().unwrap(), &stateless).await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert_eq!(
        row(&gate, &id).await.map(|r| (r.0, r.1)),
        Some(("in_doubt".to_owned(), fence))
    );
}

/// A confirmation opened from a claim's page that showed it in another
/// state than it is now says it changed, and offers nothing to confirm.
#[tokio::test]
async fn a_confirmation_opened_from_a_page_that_showed_another_state_says_it_changed() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    let id = Identity::new("charge").part("stale_link");
    let fence = in_doubt(&gate, &id).await;
    set_state(&gate, &id, "pending").await;
    let slot = slot_query(gate.account_name(), None, &id.address());
    let shown = get(&console, &format!("/claim?{slot}")).await;
    let release = shown
        .links("claim/resolve?")
        .into_iter()
        .find(|pairs| pairs.contains(&("as".into(), "release".into())))
        .expect("a link to release it");
    assert!(
        release.contains(&("state".into(), "pending".into())),
        "the link does not say which state the page showed: {release:?}"
    );
    set_state(&gate, &id, "in_doubt").await;
    let link = serde_urlencoded::to_string(&release).unwrap();
    let page = get(&console, &format!("/claim/resolve?{link}")).await;
    assert_eq!(page.status, StatusCode::CONFLICT, "{}", page.body);
    assert!(
        page.csrf_field().is_none(),
        "it offers a form: {}",
        page.body
    );
    assert_eq!(
        row(&gate, &id).await.map(|r| (r.0, r.1)),
        Some(("in_doubt".to_owned(), fence))
    );
}

/// Operators' confirmations of a claim shown pending (its holder gone, its
/// lease run out) and a retry that turns it in doubt at the same fence, all
/// at one instant: either exactly one confirmation applies (and the retry
/// finds what it left), or the retry turns it in doubt and none applies.
/// Never two, and never a release of a claim in doubt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmations_racing_a_retry_that_turns_the_claim_in_doubt_apply_once_or_not_at_all() {
    const CONFIRMATIONS: usize = 6;
    const ROUNDS: usize = 8;
    let gate = testing::gate().await;
    let console = writable(&gate);
    let mut ids = Vec::new();
    for round in 0..ROUNDS {
        let id = Identity::new("charge").part(format!("race_{round}"));
        let fence = pending_of_a_vanished_holder(&gate, &id).await;
        ids.push((id, fence));
    }
    tokio::time::sleep(LEASE * 2).await;
    for (round, (id, fence)) in ids.into_iter().enumerate() {
        let mut forms = Vec::new();
        for i in 0..CONFIRMATIONS {
            let asked = ["release", "failed", "succeeded"][(i + round) % 3];
            let (page, form) = confirmation(&console, &gate, &id, fence, asked).await;
            forms.push((asked, page.csrf_cookie().unwrap(), form));
        }
        let barrier = Arc::new(Barrier::new(CONFIRMATIONS + 1));
        let mut racers = tokio::task::JoinSet::new();
        for (asked, cookie, form) in forms {
            let (console, barrier) = (console.clone(), barrier.clone());
            racers.spawn(async move {
                barrier.wait().await;
                (asked, post(&console, &cookie, &form).await)
            });
        }
        let retried = {
            let (gate, id, barrier) = (gate.clone(), id.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                retry(&gate, &id).await
            })
        };
        let results = racers.join_all().await;
        let retried = retried.await.expect("the retry");
        for (asked, page) in &results {
            assert!(
                page.status == StatusCode::OK || page.status == StatusCode::CONFLICT,
                "round {round}, {asked}: {} {}",
                page.status,
                page.body
            );
        }
        let won: Vec<&str> = results
            .iter()
            .filter(|(_, page)| page.status == StatusCode::OK)
            .map(|(asked, _)| *asked)
            .collect();
        let now = row(&gate, &id).await.map(|r| (r.0, r.1));
        match retried {
            Err(Rejected::InDoubt) => {
                assert_eq!(
                    won,
                    Vec::<&str>::new(),
                    "round {round}: the retry turned it in doubt, and a confirmation of it \
                     pending was applied to it in doubt"
                );
                assert_eq!(now, Some(("in_doubt".to_owned(), fence)), "round {round}");
            }
            Err(Rejected::AlreadyDone) => {
                assert_eq!(won, ["succeeded"], "round {round}");
                assert_eq!(now, Some(("success".to_owned(), fence)), "round {round}");
            }
            Err(Rejected::AlreadyFailed) => {
                assert_eq!(won, ["failed"], "round {round}");
                assert_eq!(now, Some(("failed".to_owned(), fence)), "round {round}");
            }
            Ok(claim) => {
                // Released first: the retry claimed the vacant slot anew.
                assert_eq!(won, ["release"], "round {round}");
                assert_eq!(
                    now.map(|(state, _)| state).as_deref(),
                    Some("pending"),
                    "round {round}"
                );
                claim.release().await.expect("release the retry's claim");
            }
            Err(other) => panic!("round {round}: the retry was refused {other:?}"),
        }
    }
}
