//! An HTTP request guarded the two ways idem offers, in process: by
//! `#[idempotent]` on an axum handler (the `IdempotencyKey` extractor,
//! `replay`, a fingerprint of the body) and by `IdempotencyLayer` around a
//! plain handler. Both answer the same 201 with the same bytes and run the
//! same two statements (claim, settle with the response), so the ratio
//! between them is what the layer adds: reading the body, hashing it, the
//! response read whole and kept. No socket: a client and a network cost
//! the same either way and would only dilute the difference. Each
//! operation is one `POST /charges` with a fresh key through the router's
//! `oneshot`.

use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::BodyExt;
use idem::http::{IdempotencyKey, IdempotencyLayer, StoredResponse};
use idem::{Gate, Rejected, idempotent};
use tower::ServiceExt;

use crate::BoxError;
use crate::body::{Body, RESPONSE_BODY};
use crate::keys;

/// Which way a request is guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// `#[idempotent(..., replay)]` on the handler.
    Attribute,
    /// `IdempotencyLayer` around the router.
    Layer,
}

/// The two routers of one run, on its gate.
pub struct Routers {
    attribute: Router,
    layer: Router,
}

/// What the handlers share: the gate, and the body to run.
#[derive(Clone)]
struct App {
    gate: Gate,
    body: Body,
}

impl Routers {
    pub fn new(gate: &Gate, body: Body) -> Routers {
        let app = App {
            gate: gate.clone(),
            body,
        };
        Routers {
            attribute: Router::new()
                .route("/charges", post(charge_by_attribute))
                .with_state(app.clone()),
            layer: Router::new()
                .route("/charges", post(charge))
                // One client, the load generator: one tenant.
                .layer(IdempotencyLayer::new(gate.clone()).single_tenant())
                .with_state(app),
        }
    }
}

/// The handler guarded by the attribute: the response built as the one to
/// keep.
#[idempotent(key = "key", action = "POST /charges", fingerprint = "payload", replay, gate = app.gate)]
async fn charge_by_attribute(
    State(app): State<App>,
    key: IdempotencyKey,
    payload: String,
) -> Result<StoredResponse, Rejected> {
    app.body.run().await;
    Ok(StoredResponse::new(StatusCode::CREATED)
        .with_header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .with_body(RESPONSE_BODY))
}

/// The same handler, unguarded: the layer guards it.
async fn charge(State(app): State<App>, _payload: String) -> impl IntoResponse {
    app.body.run().await;
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        RESPONSE_BODY,
    )
}

/// One `POST /charges` under a fresh key, `way`; an error unless it ran
/// and answered the 201.
pub async fn charge_once(routers: &Routers, way: Way, n: u64) -> Result<(), BoxError> {
    let router = match way {
        Way::Attribute => routers.attribute.clone(),
        Way::Layer => routers.layer.clone(),
    };
    let request = Request::post("/charges")
        .header("idempotency-key", keys::hex24(n))
        .header(CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(format!(r#"{{"amount_cents":{n}}}"#)))?;
    let response = router.oneshot(request).await?;
    let status = response.status();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let bytes = response.into_body().collect().await?.to_bytes();
    if status != StatusCode::CREATED || replayed || bytes != RESPONSE_BODY {
        return Err(format!(
            "{way:?}: POST /charges for {n} answered {status} (replayed: {replayed}): {}",
            String::from_utf8_lossy(&bytes)
        )
        .into());
    }
    Ok(())
}
