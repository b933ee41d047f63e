//! What the console's pages show and hide: hostile names as text, values
//! only when asked, every claim of a list once across its pages in either
//! order, and requests it cannot use refused as such, never as an outage.

use std::collections::BTreeSet;

use http::StatusCode;
use idem::console::Console;
use idem::sqlx;
use idem::{Identity, testing};

use super::support::{get, in_doubt, set_state, slot_query, writable};

/// Names an attacker can choose (an account is often a tenant's id, a
/// namespace a customer's label): markup, quotes, controls, a bidi
/// override, a name longer than any page.
fn hostile_names() -> Vec<String> {
    vec![
        format!("<script>alert(1)</script>\"'{}", testing::unique_name("x")),
        format!("a\u{202e}gnp.exe\x01\x1b[31m{}", testing::unique_name("y")),
        // As long as a gate takes (a row written by other means may be
        // longer; the page cuts it the same way).
        format!(
            "{}{}",
            "L".repeat(idem::Gate::MAX_SCOPE_NAME_BYTES - 64),
            testing::unique_name("z")
        ),
    ]
}

/// What a page shows: `body` without its fields' values and its links'
/// targets, which carry names whole for the next request.
fn without_values(body: &str) -> String {
    let mut out = body.to_owned();
    for attribute in [" value=\"", " href=\""] {
        let mut kept = String::new();
        let mut rest = out.as_str();
        while let Some(at) = rest.find(attribute) {
            kept.push_str(&rest[..at]);
            let after = &rest[at + attribute.len()..];
            rest = &after[after.find('"').expect("a closed attribute") + 1..];
        }
        kept.push_str(rest);
        out = kept;
    }
    out
}

#[tokio::test]
async fn hostile_names_render_as_text_on_every_page() {
    let base = testing::gate().await;
    let console = writable(&base);
    for name in hostile_names() {
        let gate = base.account(&name).namespace(&name);
        let id = Identity::new("<img src=x onerror=alert(2)>").part(name.as_str());
        let fence = in_doubt(&gate, &id).await;
        let address = id.address();
        let slot = slot_query(&name, Some(&name), &address);
        let list = format!(
            "/claims?{}",
            serde_urlencoded::to_string([("account", &name), ("state", &"in_doubt".to_owned())])
                .unwrap()
        );
        let pages = [
            get(&console, "/").await,
            get(&console, &list).await,
            get(&console, &format!("/claim?{slot}")).await,
            get(
                &console,
                &format!("/claim/resolve?{slot}&fence={fence}&as=failed"),
            )
            .await,
        ];
        for page in &pages {
            assert_eq!(page.status, StatusCode::OK, "{}", page.body);
            // Nowhere, not even in its fields' values and its links, which
            // carry the names whole for the next request (HTML-escaped, and
            // as the page shows them).
            for raw in ["<script>alert", "<img src=x", "\u{202e}", "\x01", "\x1b"] {
                assert!(
                    !page.body.contains(raw),
                    "a page carries {raw:?} as it was written, not as text"
                );
            }
        }
        // The list (filtered to this account) and the claim's page show it,
        // escaped, legible, cut.
        for page in &pages[1..] {
            let visible = without_values(&page.body);
            if name.starts_with("<script>") {
                assert!(
                    page.body
                        .contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;")
                );
            } else if name.starts_with('a') {
                assert!(page.body.contains("a\\u{202e}gnp.exe\\u{1}\\u{1b}[31m"));
            } else {
                assert!(
                    page.body
                        .contains(&format!("({} characters)", name.chars().count()))
                );
                assert!(!visible.contains(&"L".repeat(200)), "a long name is cut");
            }
        }
        // Whatever the name, the list links to the claim, which opens.
        let links = pages[1].claim_links();
        assert_eq!(
            links,
            vec![(name.clone(), Some(name.clone()), address.clone())]
        );
    }
}

#[tokio::test]
async fn stored_values_are_shown_only_when_asked() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part("ord_secret");
    gate.guard(&id)
        .replay()
        .run(async { Ok::<_, idem::Rejected>("card 4242 4242 4242 4242".to_owned()) })
        .await
        .expect("run");
    let console = writable(&gate);
    let slot = slot_query(gate.account_name(), None, &id.address());
    let page = get(&console, &format!("/claim?{slot}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains("4242"),
        "a stored output is shown unasked"
    );
    assert!(page.body.contains("bytes"), "its size is shown");
    let shown = get(&console, &format!("/claim?{slot}&values=shown")).await;
    assert!(shown.body.contains("card 4242 4242 4242 4242"));
}

/// Walks a list from its first page, following "next page", and returns
/// every claim it showed, in order.
async fn walk(console: &axum::Router, first: &str) -> Vec<(String, Option<String>, String)> {
    let mut shown = Vec::new();
    let mut uri = first.to_owned();
    for _ in 0..100 {
        let page = get(console, &uri).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        shown.extend(page.claim_links());
        match page.next_page() {
            Some(next) => uri = next,
            None => return shown,
        }
    }
    panic!("the list never ended");
}

#[tokio::test]
async fn a_list_shows_every_claim_once_across_its_pages_in_either_order() {
    let base = testing::gate().await;
    let account = base.account_name().to_owned();
    // The same identities without a namespace and in three (the empty one
    // among them): one address, four claims, sorted apart only by
    // namespace; and all claimed in one microsecond, so that the oldest-
    // first order is decided by everything after the time.
    let scopes = [
        base.clone(),
        base.namespace(""),
        base.namespace("a"),
        base.namespace("b"),
    ];
    let mut expected = BTreeSet::new();
    for i in 0..7 {
        let id = Identity::new("charge").part(i);
        for gate in &scopes {
            in_doubt(gate, &id).await;
            if i % 3 == 0 {
                set_state(gate, &id, "success").await;
            }
            expected.insert((
                account.clone(),
                gate.namespace_name().map(str::to_owned),
                id.address(),
                i % 3 == 0,
            ));
        }
    }
    sqlx::query(
        "UPDATE idem_records SET created_at = '2026-01-01T00:00:00Z', \
                in_doubt_since = '2026-01-01T00:00:00Z' WHERE account = $1",
    )
    .bind(&account)
    .execute(base.pool())
    .await
    .unwrap();
    let console = Console::new(base.pool().clone()).router();
    let every = |settled: Option<bool>| -> Vec<(String, Option<String>, String)> {
        expected
            .iter()
            .filter(|(.., s)| settled.is_none_or(|want| *s == want))
            .map(|(a, n, ad, _)| (a.clone(), n.clone(), ad.clone()))
            .collect()
    };
    let q = |extra: &str| format!("/claims?account={account}&limit=3{extra}");
    for (filter, settled) in [
        ("", None),
        ("&state=in_doubt", Some(false)),
        ("&state=success", Some(true)),
    ] {
        let shown = walk(&console, &q(filter)).await;
        let as_set: BTreeSet<_> = shown.iter().cloned().collect();
        assert_eq!(
            as_set.len(),
            shown.len(),
            "{filter}: a claim shown twice: {shown:?}"
        );
        assert_eq!(as_set, every(settled).into_iter().collect(), "{filter}");
    }
    // A namespace filter: only its claims, the empty namespace included.
    for (filter, namespace) in [("&namespace=a", Some("a")), ("&without_namespace=1", None)] {
        let shown = walk(&console, &q(filter)).await;
        assert_eq!(shown.len(), 7, "{filter}: {shown:?}");
        assert!(
            shown.iter().all(|(_, n, _)| n.as_deref() == namespace),
            "{filter}"
        );
    }
}

#[tokio::test]
async fn requests_it_cannot_use_are_refused_saying_why_and_never_as_an_outage() {
    let gate = testing::gate().await;
    let console = writable(&gate);
    for (uri, says) in [
        ("/claims?stat=in_doubt", "unknown parameter"),
        ("/claims?state=doubtful", "is not one"),
        ("/claims?state=failed&state=pending", "twice"),
        ("/claims?older_than=soon", "not a duration"),
        ("/claims?limit=0", "limit is a number"),
        ("/claims?after=1.zz.claim_1.-", "cursor"),
        ("/claims?namespace=a&without_namespace=1", "not both"),
        ("/claim?account=a&address=CLAIM;DROP", "not a claim address"),
        ("/claim?account=a", "address is required"),
        ("/?pending_older_than=-1", "not a duration"),
        (
            "/claim/resolve?account=a&address=claim_1&fence=x&as=failed",
            "fence is a number",
        ),
        (
            "/claim/resolve?account=a&address=claim_1&fence=1&as=maybe",
            "as is succeeded",
        ),
    ] {
        let page = get(&console, uri).await;
        assert_eq!(page.status, StatusCode::BAD_REQUEST, "{uri}: {}", page.body);
        assert!(page.body.contains(says), "{uri}: {}", page.body);
    }
    let missing = get(
        &console,
        &format!(
            "/claim?{}",
            slot_query(gate.account_name(), None, "claim_000000000000000000000000")
        ),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);

    // The database gone is an outage, and said to be one.
    let nowhere = idem::sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .unwrap();
    let down = Console::new(nowhere).router();
    for uri in [
        "/",
        "/claims?state=in_doubt",
        "/claim?account=a&address=claim_1",
    ] {
        let page = get(&down, uri).await;
        assert_eq!(
            page.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{uri}: {}",
            page.body
        );
        assert!(page.body.contains("Nothing was changed"), "{uri}");
    }
}

#[tokio::test]
async fn the_overview_counts_open_claims_and_shows_the_oldest_in_doubt() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    for i in 0..3 {
        in_doubt(&gate, &Identity::new("refund").part(i)).await;
    }
    let console = writable(&gate);
    // Of every account (other tests' claims are there too), then of this one.
    assert_eq!(get(&console, "/").await.status, StatusCode::OK);
    let page = get(&console, &format!("/?account={account}")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.claim_links().len(),
        3,
        "its three claims in doubt, and no other"
    );
    // Its row in the table of open claims links to its list.
    let groups = page.links("claims?");
    assert!(
        groups
            .iter()
            .any(|pairs| pairs.contains(&("account".into(), account.clone()))
                && pairs.contains(&("action".into(), "refund".into()))
                && pairs.contains(&("state".into(), "in_doubt".into()))),
        "no group for this account's claims in doubt"
    );
    assert!(page.body.contains("passes: the gate starts on this schema"));
    assert!(page.body.contains("this build expects"));
}

/// The count at the top of the overview for `state`: the number in its
/// total's link.
fn overview_total(body: &str, state: &str) -> String {
    let badge = format!(r#"<span class="state {state}">"#);
    body.split(r#"<a class="total""#)
        .skip(1)
        .map(|total| &total[..total.find("</a>").expect("a closed link")])
        .find(|total| total.contains(&badge))
        .and_then(|total| {
            let count = &total[total.find(r#"<span class="count">"#)? + 20..];
            Some(count[..count.find("</span>")?].to_owned())
        })
        .unwrap_or_else(|| panic!("no total of {state} on the overview: {body}"))
}

/// "every open claim (pending, in doubt, kept failure) counted": the totals
/// at the top count every open claim of the account, however many of their
/// groups (account, state, action) the table below has room for: 1,200
/// claims in doubt across 600 actions are 1,200, and the pending ones that
/// sort after them are counted too.
#[tokio::test]
async fn the_overview_totals_count_every_open_claim_beyond_the_groups_it_lists() {
    let gate = testing::gate().await;
    let account = gate.account_name().to_owned();
    let (mut states, mut addresses, mut identities) = (Vec::new(), Vec::new(), Vec::new());
    let mut add = |state: &str, id: Identity| {
        states.push(state.to_owned());
        addresses.push(id.address());
        identities.push(id.canonical().to_vec());
    };
    for group in 0..600 {
        for i in 0..2 {
            add(
                "in_doubt",
                Identity::new(format!("charge_{group:03}")).part(i),
            );
        }
    }
    for i in 0..3 {
        add("pending", Identity::new("refund").part(i));
    }
    for i in 0..2 {
        add("failed", Identity::new("payout").part(i));
    }
    sqlx::query(
        "INSERT INTO idem_records (account, kind, address, state, identity, in_doubt_since) \
         SELECT $1, 'claim', a, s, i, CASE WHEN s = 'in_doubt' THEN now() END \
         FROM unnest($2::text[], $3::text[], $4::bytea[]) AS t(s, a, i)",
    )
    .bind(&account)
    .bind(&states)
    .bind(&addresses)
    .bind(&identities)
    .execute(gate.pool())
    .await
    .expect("plant the claims");
    let console = writable(&gate);
    let page = get(&console, &format!("/?account={account}")).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(
        page.body.contains("Only the first groups are shown"),
        "the table of groups is not cut: the test plants too few"
    );
    for (state, expected) in [("in_doubt", "1200"), ("pending", "3"), ("failed", "2")] {
        assert_eq!(
            overview_total(&page.body, state),
            expected,
            "the overview's total of {state}"
        );
    }
}

#[tokio::test]
async fn mounted_under_a_path_every_link_and_cookie_stays_under_it() {
    let gate = testing::gate().await;
    let id = Identity::new("charge").part(1);
    in_doubt(&gate, &id).await;
    let app = axum::Router::new().nest("/ops/idem", writable(&gate));
    let page = get(
        &app,
        &format!("/ops/idem/claims?account={}", gate.account_name()),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    for piece in page.body.split("href=\"").skip(1) {
        assert!(
            piece.starts_with("/ops/idem/"),
            "a link leaves the mount: {piece:.60}"
        );
    }
    assert!(
        page.set_cookies()
            .iter()
            .all(|c| c.contains("Path=/ops/idem/"))
    );
    assert_eq!(page.claim_links().len(), 1);
}

#[tokio::test]
async fn the_audit_page_shows_what_the_given_audit_finds_and_says_when_there_is_none() {
    use std::future::Future;
    use std::pin::Pin;

    struct Fixed;
    impl idem::console::Audit for Fixed {
        fn findings<'a>(
            &'a self,
            _pool: &'a idem::sqlx::PgPool,
        ) -> Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>> {
            Box::pin(async { Ok("hole: <orders_ref_key> lets duplicates in".to_owned()) })
        }
    }
    let gate = testing::gate().await;
    let none = get(&Console::new(gate.pool().clone()).router(), "/audit").await;
    assert_eq!(none.status, StatusCode::OK);
    assert!(none.body.contains("No audit is configured"));
    let given = get(
        &Console::new(gate.pool().clone()).audit(Fixed).router(),
        "/audit",
    )
    .await;
    assert!(
        given
            .body
            .contains("hole: &lt;orders_ref_key&gt; lets duplicates in"),
        "{}",
        given.body
    );
}

/// The overview says whether the index of open claims (schema version 9)
/// is there and, when it is not, what reads the whole table instead and
/// what to build; the schema still passes, since the gate does not need it.
#[tokio::test]
async fn the_overview_says_whether_the_index_of_open_claims_is_there() {
    let (_, pool) = idem_test_support::schemas::fresh_schema(2).await;
    let gate = idem::Gate::connect(pool.clone()).await.expect("set up");
    let console = writable(&gate);
    let page = get(&console, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("index of open claims") && page.body.contains(">present<"),
        "{}",
        page.body
    );
    sqlx::raw_sql("DROP INDEX idem_records_open_claims")
        .execute(&pool)
        .await
        .expect("drop the index");
    let page = get(&console, "/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(">absent<"), "{}", page.body);
    assert!(page.body.contains("read the whole table"), "{}", page.body);
    assert!(page.body.contains("passes: the gate starts on this schema"));
}
