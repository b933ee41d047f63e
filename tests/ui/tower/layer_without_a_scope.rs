// An IdempotencyLayer that does not say whose keys it guards is not a
// layer: every caller would share one key space.
use idem::Gate;
use idem::http::IdempotencyLayer;

fn app(gate: Gate) -> axum::Router {
    axum::Router::new()
        .route("/charges", axum::routing::post(|| async { "charged" }))
        .layer(IdempotencyLayer::new(gate).body_limit(64 * 1024))
}

fn main() {
    let _ = app;
}
