//! Hostile names as an operator meets them, page after page, by the links
//! and forms the pages themselves give: shown escaped everywhere (in the
//! filter boxes, the links and the forms' hidden fields too, by the rule
//! of `idem::shown` that the `idem` command follows), and still the names
//! themselves when a filter box is submitted unchanged, when a name is
//! copied from the page into one, and when a resolution is confirmed.

use std::collections::BTreeSet;

use http::StatusCode;
use idem::shown::{escaped, is_escaped};
use idem::{Identity, testing};

use super::support::{Page, get, in_doubt, post, writable};

/// A name an attacker may choose: a terminal escape, a bidirectional
/// override, an Arabic letter mark, a zero-width space, C0, DEL and C1
/// controls, a line separator and a line break, a backslash that looks
/// like an escape, markup and a quote.
fn hostile(tag: &str) -> String {
    format!(
        "{tag}\u{1b}[2J\u{202e}gnp.exe\u{61c}\u{200b}\x01\x7f\u{85}\u{2028}\n\\u{{41}}\"<b>{}",
        testing::unique_name("")
    )
}

/// Every character of `body` that no page may hold as it is.
fn hidden_in(body: &str) -> Vec<char> {
    body.chars().filter(|&c| is_escaped(c)).collect()
}

#[track_caller]
fn assert_nothing_hidden(what: &str, page: &Page) {
    assert_eq!(page.status, StatusCode::OK, "{what}: {}", page.body);
    let hidden = hidden_in(&page.body);
    assert!(
        hidden.is_empty(),
        "{what}: the page holds {hidden:?} as it is:\n{}",
        page.body
    );
}

/// Text of an attribute value or an element, as the browser reads it.
fn html_unescaped(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The attributes of the tag that starts `tag` (after `<name`), decoded;
/// a boolean attribute with an empty value.
fn attributes(tag: &str) -> Vec<(String, String)> {
    let tag = &tag[..tag.find('>').expect("a closed tag")];
    let mut found = Vec::new();
    let mut rest = tag.trim_start();
    while !rest.is_empty() {
        let end = rest.find([' ', '=']).unwrap_or(rest.len());
        let name = rest[..end].trim_end_matches('/').to_owned();
        rest = &rest[end..];
        if let Some(value) = rest.strip_prefix("=\"") {
            let close = value.find('"').expect("a closed attribute");
            found.push((name, html_unescaped(&value[..close])));
            rest = value[close + 1..].trim_start();
        } else {
            if !name.is_empty() {
                found.push((name, String::new()));
            }
            rest = rest.trim_start();
        }
    }
    found
}

fn attribute<'a>(attributes: &'a [(String, String)], name: &str) -> Option<&'a str> {
    attributes
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// What the form of `class` submits as it is shown: its fields with their
/// values, a checkbox only when checked, a select's selected option.
fn form(body: &str, class: &str) -> Vec<(String, String)> {
    let start = body
        .find(&format!("<form class=\"{class}\""))
        .unwrap_or_else(|| panic!("no form {class}: {body}"));
    let form = &body[start..start + body[start..].find("</form>").expect("a closed form")];
    let mut fields = Vec::new();
    for input in form.split("<input").skip(1) {
        let attrs = attributes(input);
        let Some(name) = attribute(&attrs, "name") else {
            continue;
        };
        if attribute(&attrs, "type") == Some("checkbox") && attribute(&attrs, "checked").is_none() {
            continue;
        }
        let value = attribute(&attrs, "value").unwrap_or_default();
        fields.push((name.to_owned(), value.to_owned()));
    }
    for select in form.split("<select").skip(1) {
        let attrs = attributes(select);
        let name = attribute(&attrs, "name").expect("a named select");
        let options = &select[..select.find("</select>").expect("a closed select")];
        let chosen = options
            .split("<option")
            .skip(1)
            .map(attributes)
            .find(|attrs| attribute(attrs, "selected").is_some())
            .and_then(|attrs| attribute(&attrs, "value").map(str::to_owned))
            .unwrap_or_default();
        fields.push((name.to_owned(), chosen));
    }
    fields
}

/// The value of the form's field `name`.
fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}

/// The text of every `<span class="{class}" ...>` of the page.
fn spans(body: &str, class: &str) -> Vec<String> {
    body.split(&format!("<span class=\"{class}\""))
        .skip(1)
        .map(|rest| {
            let text = &rest[rest.find('>').expect("a closed tag") + 1..];
            html_unescaped(&text[..text.find("</span>").expect("a closed span")])
        })
        .collect()
}

/// The addresses of the claims a list shows, with their scope as the
/// links name it.
fn listed(page: &Page) -> BTreeSet<(String, Option<String>, String)> {
    page.claim_links().into_iter().collect()
}

#[tokio::test]
async fn the_list_reached_from_the_overview_shows_hostile_names_escaped_and_filters_on_them() {
    let base = testing::gate().await;
    let account = hostile("acct");
    let namespace = hostile("ns");
    let other_namespace = hostile("other");
    let action = hostile("act");
    let gate = base.account(&account).namespace(&namespace);
    let beside = base.account(&account).namespace(&other_namespace);
    let mut ours = BTreeSet::new();
    let mut every = BTreeSet::new();
    for (n, gate) in [(1, &gate), (2, &gate), (3, &beside)] {
        let id = Identity::new(&action).part(hostile("part")).part(n);
        in_doubt(gate, &id).await;
        let claim = (
            account.clone(),
            gate.namespace_name().map(str::to_owned),
            id.address(),
        );
        if gate.namespace_name() == Some(namespace.as_str()) {
            ours.insert(claim.clone());
        }
        every.insert(claim);
    }
    // And a claim of another account, which no filter here may show.
    in_doubt(
        &base.account(format!("{account}x")),
        &Identity::new(&action).part(0),
    )
    .await;
    let console = writable(&base);

    // The overview of the account, as its own form asks for it.
    let overview = get(
        &console,
        &format!(
            "/?{}",
            serde_urlencoded::to_string([("account", escaped(&account))]).unwrap()
        ),
    )
    .await;
    assert_nothing_hidden("the overview", &overview);
    assert_eq!(
        field(&form(&overview.body, "inline"), "account"),
        escaped(&account),
        "the overview's account box"
    );

    // Its table of open claims links to the list of the group.
    let groups: Vec<Vec<(String, String)>> = overview
        .links("claims?")
        .into_iter()
        .filter(|pairs| pairs.iter().any(|(name, _)| name == "action"))
        .collect();
    assert_eq!(groups.len(), 1, "one group, of this account: {groups:?}");
    let list = get(
        &console,
        &format!(
            "/claims?{}",
            serde_urlencoded::to_string(&groups[0]).unwrap()
        ),
    )
    .await;
    assert_nothing_hidden("the list opened from the overview", &list);
    assert_eq!(listed(&list), every, "the list of the group");
    let filters = form(&list.body, "filters");
    assert_eq!(field(&filters, "account"), escaped(&account));
    assert_eq!(field(&filters, "action"), escaped(&action));
    assert_eq!(field(&filters, "state"), "in_doubt");

    // The filter submitted unchanged: the same claims.
    let again = get(
        &console,
        &format!("/claims?{}", serde_urlencoded::to_string(&filters).unwrap()),
    )
    .await;
    assert_nothing_hidden("the list filtered again", &again);
    assert_eq!(listed(&again), every, "the filter submitted unchanged");

    // The namespace copied from the page into its box: its claims only.
    let shown_namespace = spans(&again.body, "namespace")
        .into_iter()
        .find(|text| text.starts_with("ns"))
        .expect("the namespace on the page");
    assert_eq!(shown_namespace, escaped(&namespace));
    let mut narrowed = form(&again.body, "filters");
    for (name, value) in &mut narrowed {
        if name == "namespace" {
            *value = shown_namespace.clone();
        }
    }
    let narrowed = get(
        &console,
        &format!(
            "/claims?{}",
            serde_urlencoded::to_string(&narrowed).unwrap()
        ),
    )
    .await;
    assert_nothing_hidden("the list of one namespace", &narrowed);
    assert_eq!(
        listed(&narrowed),
        ours,
        "the namespace copied from the page"
    );
    assert_eq!(
        field(&form(&narrowed.body, "filters"), "namespace"),
        escaped(&namespace)
    );

    // A claim opened from the list, and its resolution confirmed from its
    // page: the confirmation's hidden fields carry the names escaped too,
    // and the write finds the claim by them.
    let (_, _, address) = ours.iter().next().expect("a claim of ours").clone();
    let link = narrowed
        .links("claim?")
        .into_iter()
        .find(|pairs| pairs.contains(&("address".to_owned(), address.clone())))
        .expect("the claim's link");
    let claim = get(
        &console,
        &format!("/claim?{}", serde_urlencoded::to_string(&link).unwrap()),
    )
    .await;
    assert_nothing_hidden("the claim", &claim);
    let resolve = claim
        .links("claim/resolve?")
        .into_iter()
        .find(|pairs| pairs.contains(&("as".to_owned(), "failed".to_owned())))
        .expect("a link to resolve it as failed");
    let confirm = get(
        &console,
        &format!(
            "/claim/resolve?{}",
            serde_urlencoded::to_string(&resolve).unwrap()
        ),
    )
    .await;
    assert_nothing_hidden("the confirmation", &confirm);
    let posted = post(
        &console,
        &confirm.csrf_cookie().expect("a CSRF cookie"),
        &serde_urlencoded::to_string(form(&confirm.body, "resolve")).unwrap(),
    )
    .await;
    assert_nothing_hidden("the resolution", &posted);
    let state = idem::sqlx::query_scalar::<_, String>(
        "SELECT state FROM idem_records \
         WHERE account = $1 AND namespace = $2 AND kind = 'claim' AND address = $3",
    )
    .bind(gate.account_name())
    .bind(gate.namespace_name())
    .bind(&address)
    .fetch_one(gate.pool())
    .await
    .expect("read the claim");
    assert_eq!(state, "failed", "the confirmation resolved the claim");
}
