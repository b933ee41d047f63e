//! [`IdempotencyLayer`]: the `Idempotency-Key` protocol for a whole
//! service, as one tower layer (feature `tower`). Its docs are the user's
//! page; here, one module a job: `service.rs` (one request through the
//! gate), `body.rs` (reading a body whole, and bodies in memory),
//! `policy.rs` (what a status means for the key), `refusal.rs` (the
//! answers given without the inner service), `grpc.rs` (the same in gRPC's
//! terms).

mod body;
mod grpc;
mod policy;
mod refusal;
mod service;

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use tower_layer::Layer;

pub use body::BufferedBody;
pub use policy::{DEFAULT_KEPT_HEADERS, ResponseOutcome, default_status_policy};
pub use service::{IdempotencyService, RequestBody, ResponseBody, ResponseFuture};

use super::IDEMPOTENCY_KEY;
use crate::detach::Detached;
use crate::gate::Gate;
use crate::mode::Mode;

/// The `Idempotency-Key` protocol for a whole service, as one `tower`
/// layer (feature `tower`). It wraps any `Service<http::Request<B>>`: an
/// axum `Router`, a hyper service, a tonic gRPC server.
///
/// For each request of a guarded method (`POST` and `PATCH` by default)
/// that carries the key header, the layer reads the body (up to a limit),
/// claims the key on the [`Gate`], and calls the inner service only if the
/// claim is won; the response is then kept, or the key released, as the
/// [status policy](IdempotencyLayer::status_policy) says. A duplicate gets
/// the kept response back byte for byte, marked `Idempotent-Replayed:
/// true`, or the same refusals as the `#[idempotent]` extractor's (409,
/// 422, 503 problem+json: one mapping for both).
///
/// | the request | what the layer does |
/// |---|---|
/// | another method, or no key header | passes it through untouched (no key: a 400 with [`require_key`](IdempotencyLayer::require_key)) |
/// | a malformed or repeated key | 400 `invalid-idempotency-key`; the service is not called |
/// | a body over the [limit](IdempotencyLayer::body_limit) | 413 `body-too-large`; the service is not called |
/// | the first with its key | calls the service; its response is kept (by default: every status but 408, 425, 429, 499 and 5xx) or the key is released |
/// | a duplicate, the first done | the kept response: status, [kept headers](IdempotencyLayer::keep_headers), body bytes and trailers, plus `Idempotent-Replayed: true` |
/// | a duplicate, the first still running | 409 `in-flight`, `Retry-After: 1` |
/// | the same key, another method, path, query or body | 422 `key-reused` |
/// | the store unreachable | 503 `store-unavailable`; the service is not called |
///
/// **The identity.** A request's key is claimed under its *route* (by
/// default its method and path; [`route`](IdempotencyLayer::route) names
/// another, such as axum's `MatchedPath`) in its caller's account (the
/// gate's, or the one [`scope`](IdempotencyLayer::scope) reads from the
/// request, e.g. from an extension your authentication middleware set): two
/// callers never share a key. Its fingerprint is the method, the path, the
/// query and a sha1 of the body, so a key reused for another request is
/// refused, never answered with the other request's response.
///
/// **gRPC.** A request whose content type is `application/grpc*` is
/// refused with a gRPC status in a trailers-only response (`ABORTED` in
/// flight or in doubt, `ALREADY_EXISTS` done without a kept answer,
/// `FAILED_PRECONDITION` failed for good, `INVALID_ARGUMENT` for a bad key
/// or one reused, `RESOURCE_EXHAUSTED` over the limit, `UNAVAILABLE` with
/// the store down), and its response is judged by its `grpc-status`
/// (see [`default_status_policy`]); trailers are kept and replayed. The
/// key is the `idempotency-key` metadata. gRPC-web (`application/grpc-web*`,
/// `-text` too) carries its status in the trailer frame at the end of the
/// body (flag `0x80`): the layer reads it there, and the frame is replayed
/// with the body.
///
/// **A response that fails mid-body** (its body returns an error) is
/// neither sent nor kept: the client gets a 500 `response-failed`, and the
/// key is held in doubt when the status policy would have kept the
/// response (the request may have taken effect), or recorded as the
/// policy's disposition says otherwise (by default, released). The inner
/// service returning an error instead of a response releases the key.
///
/// **A client that gives up** (disconnects, or a proxy or a `tower`
/// timeout outside the layer stops waiting) does not cancel the inner
/// call: it runs to completion in a task of its own, its response is kept
/// (or its key released, as the policy says) and the retry gets it. It
/// may run on for a bound after its client left, then it is stopped and
/// its key held in doubt; at shutdown, await
/// [`detached_calls`](IdempotencyLayer::detached_calls)`().shutdown(grace)`.
/// See [`detached`](IdempotencyLayer::detached).
///
/// **Trailers** the service sends reach the first client, and the kept
/// ones (those named by [`keep_headers`](IdempotencyLayer::keep_headers))
/// the replays, announced in a `Trailer` header. A response with trailers
/// is streamed, not sent with a `Content-Length`: over HTTP/1.1 it is
/// chunked, and the server sends its trailers to a client that asked for
/// them (`TE: trailers`, as HTTP/1.1 requires).
///
/// Responses are buffered whole before they are sent, to be kept: guard
/// requests whose answers are of a size you would store in a row, not
/// streams. Requests that pass through are not buffered.
///
/// ```
/// use axum::{Router, routing::post};
/// use idem_runtime::Gate;
/// use idem_runtime::http::IdempotencyLayer;
///
/// async fn create_charge(body: String) -> (axum::http::StatusCode, String) {
///     (axum::http::StatusCode::CREATED, format!("charged: {body}"))
/// }
///
/// fn app(gate: Gate) -> Router {
///     Router::new()
///         .route("/charges", post(create_charge))
///         // Every POST and PATCH with an Idempotency-Key runs once per key.
///         .layer(IdempotencyLayer::new(gate).body_limit(64 * 1024))
/// }
/// ```
///
/// Built with [`new`](IdempotencyLayer::new) and configured with its
/// methods; cloning it (as routers do, once per route) is cheap.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

/// Reads something from a request's head: its route, or its caller.
type FromParts<T> = Arc<dyn Fn(&Parts) -> T + Send + Sync>;

/// What the layer was configured with, shared by every service it made.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) gate: Gate,
    pub(super) mode: Mode,
    pub(super) header: HeaderName,
    pub(super) methods: Vec<Method>,
    pub(super) key_required: bool,
    pub(super) body_limit: usize,
    pub(super) route: Option<FromParts<String>>,
    pub(super) scope: Option<FromParts<Option<String>>>,
    pub(super) status_policy: Arc<dyn Fn(StatusCode) -> ResponseOutcome + Send + Sync>,
    pub(super) kept_headers: Vec<HeaderName>,
    /// The guarded calls' task tracker and bound (see
    /// [`IdempotencyLayer::detached`]).
    pub(super) detached: Detached,
}

impl IdempotencyLayer {
    /// The largest request body read by default: 2 MiB, axum's own default
    /// limit, so a router behind the layer is refused nothing it would
    /// have accepted.
    pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

    /// A layer claiming on `gate` (its account, unless
    /// [`scope`](IdempotencyLayer::scope) says otherwise), with the
    /// defaults: the `Idempotency-Key` header, `POST` and `PATCH`, the key
    /// optional, bodies up to [`DEFAULT_BODY_LIMIT`](Self::DEFAULT_BODY_LIMIT),
    /// the route as method and path, [`default_status_policy`] and
    /// [`DEFAULT_KEPT_HEADERS`].
    pub fn new(gate: Gate) -> IdempotencyLayer {
        IdempotencyLayer {
            config: Arc::new(Config {
                gate,
                mode: Mode::new(),
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                key_required: false,
                body_limit: IdempotencyLayer::DEFAULT_BODY_LIMIT,
                route: None,
                scope: None,
                status_policy: Arc::new(default_status_policy),
                kept_headers: DEFAULT_KEPT_HEADERS.to_vec(),
                detached: Detached::new(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> IdempotencyLayer {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Takes the key from this header instead of `Idempotency-Key`.
    #[must_use = "`header` returns the changed layer"]
    pub fn header(self, name: HeaderName) -> IdempotencyLayer {
        self.with(|config| config.header = name)
    }

    /// Guards these methods instead of `POST` and `PATCH`. Requests of
    /// other methods pass through, key or not.
    #[must_use = "`methods` returns the changed layer"]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> IdempotencyLayer {
        let methods = methods.into_iter().collect();
        self.with(|config| config.methods = methods)
    }

    /// Refuses a request of a guarded method without the key header, with
    /// the extractor's 400 `missing-idempotency-key`, instead of passing it
    /// through.
    #[must_use = "`require_key` returns the changed layer"]
    pub fn require_key(self) -> IdempotencyLayer {
        self.with(|config| config.key_required = true)
    }

    /// Reads request bodies up to `bytes` (default
    /// [`DEFAULT_BODY_LIMIT`](Self::DEFAULT_BODY_LIMIT)); a longer one is
    /// refused with 413 `body-too-large`, and the inner service is not
    /// called. Only requests with a key are read.
    #[must_use = "`body_limit` returns the changed layer"]
    pub fn body_limit(self, bytes: usize) -> IdempotencyLayer {
        self.with(|config| config.body_limit = bytes)
    }

    /// Names the route a request's key is claimed under (the identity's
    /// action), instead of its method and path. With axum's `Router::layer`
    /// (which wraps each route after routing), `MatchedPath` makes
    /// `/orders/{id}` one route; the path and query are still part of the
    /// fingerprint.
    ///
    /// ```
    /// use axum::extract::MatchedPath;
    /// # fn demo(gate: idem_runtime::Gate) {
    /// let layer = idem_runtime::http::IdempotencyLayer::new(gate).route(|parts| {
    ///     let path = parts.extensions.get::<MatchedPath>().map_or(parts.uri.path(), MatchedPath::as_str);
    ///     format!("{} {path}", parts.method)
    /// });
    /// # }
    /// ```
    #[must_use = "`route` returns the changed layer"]
    pub fn route(
        self,
        route: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        self.with(|config| config.route = Some(Arc::new(route)))
    }

    /// Claims each request's key in the account `scope` reads from it (the
    /// caller: a tenant or user an authentication layer put in the
    /// request's extensions), so that two callers' keys never meet; `None`
    /// claims in the gate's own account. An account name that cannot be
    /// stored is refused with 400 `invalid-scope`.
    ///
    /// Put the layer inside the authentication middleware, so that the
    /// extension is there when it runs.
    #[must_use = "`scope` returns the changed layer"]
    pub fn scope(
        self,
        scope: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        self.with(|config| config.scope = Some(Arc::new(scope)))
    }

    /// Chooses, by status, whether a response is kept and replayed or what
    /// its failure means for the key, instead of
    /// [`default_status_policy`] (whose docs show how to start from it).
    #[must_use = "`status_policy` returns the changed layer"]
    pub fn status_policy(
        self,
        policy: impl Fn(StatusCode) -> ResponseOutcome + Send + Sync + 'static,
    ) -> IdempotencyLayer {
        self.with(|config| config.status_policy = Arc::new(policy))
    }

    /// Keeps these response headers (and trailers) with a kept response,
    /// instead of [`DEFAULT_KEPT_HEADERS`]; the others reach the first
    /// client only. Keep those that describe the result, never a
    /// `Set-Cookie` meant for one client.
    #[must_use = "`keep_headers` returns the changed layer"]
    pub fn keep_headers(self, names: impl IntoIterator<Item = HeaderName>) -> IdempotencyLayer {
        let names = names.into_iter().collect();
        self.with(|config| config.kept_headers = names)
    }

    /// Claims with these modes: a [lease](Mode::lease) (so that a claim
    /// whose process died is taken over), a [wait](Mode::wait) (so that a
    /// duplicate in flight waits for the answer instead of a 409),
    /// [failing open](Mode::on_unavailable). The fingerprint is always the
    /// layer's own.
    #[must_use = "`mode` returns the changed layer"]
    pub fn mode(self, mode: Mode) -> IdempotencyLayer {
        self.with(|config| config.mode = mode)
    }
}

impl IdempotencyLayer {
    /// Runs the guarded calls with this handle: its bound (how long a call
    /// may run on after its client left, then it is stopped and its key
    /// held in doubt) and its shutdown. By default each layer has its own,
    /// [`Detached::new`] (a bound of a minute), which
    /// [`detached_calls`](IdempotencyLayer::detached_calls) returns.
    ///
    /// Every guarded call runs to completion whatever the client does: a
    /// client that disconnects, a proxy that gives up or a `tower`
    /// timeout outside the layer drops the request's future, not the
    /// inner call, whose response is kept and replayed to the retry.
    #[must_use = "`detached` returns the changed layer"]
    pub fn detached(self, detached: Detached) -> IdempotencyLayer {
        self.with(|config| config.detached = detached)
    }

    /// The handle of the guarded calls, to await at shutdown: once the
    /// server stopped accepting, [`Detached::shutdown`] waits for the calls
    /// still running, up to a grace period, then holds the rest in doubt.
    ///
    /// ```no_run
    /// # async fn demo(gate: idem_runtime::Gate) {
    /// use std::time::Duration;
    /// use idem_runtime::http::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(gate);
    /// let calls = layer.detached_calls();
    /// // ... serve `router.layer(layer)` until a shutdown signal, then:
    /// calls.shutdown(Duration::from_secs(20)).await;
    /// # }
    /// ```
    pub fn detached_calls(&self) -> Detached {
        self.config.detached.clone()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> IdempotencyService<S> {
        IdempotencyService::new(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("gate", &self.gate)
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("key_required", &self.key_required)
            .field("body_limit", &self.body_limit)
            .field("kept_headers", &self.kept_headers)
            .finish_non_exhaustive()
    }
}
