//! The console's stylesheet and script, served by the router itself (the
//! content security policy allows nothing else): no build step, no Node
//! toolchain, nothing fetched from elsewhere.

use axum::http::header;
use axum::response::IntoResponse;

pub(super) async fn css() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console.css"),
    )
}

pub(super) async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("console.js"),
    )
}
