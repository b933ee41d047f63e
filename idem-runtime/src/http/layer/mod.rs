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
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use tower_layer::Layer;

pub use body::BufferedBody;
pub use policy::{DEFAULT_KEPT_HEADERS, default_status_policy};
pub use service::{IdempotencyService, RequestBody, ResponseBody, ResponseFuture};

use super::IDEMPOTENCY_KEY;
use crate::detach::Detached;
use crate::gate::Gate;
use crate::guard::{Anywhere, AsyncCommit, LeaseOption, Leased, OutcomeCommitOption, PoolOption};
use crate::mode::{Mode, OnExpiry, OnUnavailable, OutcomeCommit};
use crate::outcome::Outcome;

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
/// | the first with its key | calls the service; its response is kept (by default: every status but 400, 405, 408, 413, 415, 422, 425, 429, 499 and 5xx) or the key is released |
/// | a duplicate, the first done | the kept response: status, [kept headers](IdempotencyLayer::keep_headers), body bytes and trailers, plus `Idempotent-Replayed: true` |
/// | a duplicate, the first done, its response past [`keep_value_for`](IdempotencyLayer::keep_value_for) | 409 `response-no-longer-kept`; the service is not called again |
/// | the same key past [`keep_slot_for`](IdempotencyLayer::keep_slot_for) | a new request: calls the service again |
/// | a duplicate, the first still running | 409 `in-flight`, `Retry-After: 1` |
/// | the same key on the same endpoint, another path, query or body | 422 `key-reused` |
/// | a key, but no caller the [scope](IdempotencyLayer::scope) can name | 401 `unidentified-caller`; the service is not called |
/// | a key, but no route (with axum: matched none) | 404 `no-route`; the service is not called, nothing is stored |
/// | the store unreachable | 503 `store-unavailable`; the service is not called |
///
/// **Whose keys.** Every layer says whose keys it guards, or it does not
/// compile: [`scope`](IdempotencyLayer::scope) claims each request's key
/// in its caller's account (read from the request, e.g. from an extension
/// your authentication middleware set), so two callers never share a key:
/// Bob's `order-1001` is never answered with Alice's. A request the scope
/// cannot name a caller for is refused with 401 `unidentified-caller`,
/// never claimed in a shared account. A service with one caller may say
/// [`single_tenant`](IdempotencyLayer::single_tenant) instead: then every
/// request's key is claimed in the gate's account, and two callers that
/// pick the same key *do* share it (one gets the other's response).
///
/// **Keys are per endpoint.** A request's key is claimed under its
/// *route*: its method and its route template, as the client addressed
/// it (axum's `MatchedPath`, the full template under `nest`, e.g.
/// `POST /payments/{id}/refund`; for gRPC, the method's path, e.g.
/// `POST /shop.Orders/Create`). That route is the identity's action, so
/// it is also the metrics' `action` label and the action a reconciler's
/// probe is registered for: one per endpoint, however many ids its paths
/// carry. The same key on another endpoint (another method, another
/// template) is another key there, and runs; one route for every request
/// (`.route(|_| "api".into())`) makes keys per caller only, Stripe's
/// way, where the same key anywhere else is a 422.
///
/// **The fingerprint** is the method, the path and the query as the
/// client sent them (axum's `OriginalUri`, not a path `nest` stripped)
/// and a sha1 of the body: the same key on the same endpoint for another
/// request (another path of its template, another query, another body) is
/// refused 422, never run again and never answered with the other
/// request's response.
///
/// **A keyed request with no route is refused, never run unguarded.**
/// With axum, a request that matched no route (the router's 404, a
/// fallback) and carries a key is answered 404 `no-route` by the layer:
/// the fallback is not called and nothing is stored, so made-up paths
/// neither fill the table nor the metrics, and a fallback with effects
/// never runs a keyed request twice. Without axum (a bare hyper service, a
/// layer wrapped around a whole router, idem's `axum` feature off) the
/// layer finds no template in any request: give it one with
/// [`route`](IdempotencyLayer::route), or every keyed request is refused
/// so (the layer also says so once, as a `tracing` warning). A request
/// without a key passes through as always.
///
/// **gRPC.** A request whose content type is `application/grpc*` is
/// refused with a gRPC status in a trailers-only response (`ABORTED` in
/// flight or in doubt, `ALREADY_EXISTS` done without a kept answer,
/// `FAILED_PRECONDITION` failed for good, `INVALID_ARGUMENT` for a bad key
/// or one reused, `RESOURCE_EXHAUSTED` over the limit, `UNAVAILABLE` with
/// the store down, `UNAUTHENTICATED` with no caller the scope can name), and its response is judged by its `grpc-status`
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
/// **How long keys are held.** For ever by default: a retry however late
/// is answered from the first request's outcome, and `idem prune` is how
/// rows leave. The IETF draft asks a server to publish its keys' expiry
/// policy: say it in your API's documentation. With
/// [`keep_slot_for`](IdempotencyLayer::keep_slot_for) each key is held for
/// a window after its outcome, then a request with it runs again, and every
/// response the layer keeps says until when in an
/// [`Idempotency-Key-Expires`](crate::http::IDEMPOTENCY_KEY_EXPIRES)
/// header, an HTTP-date (its replays carry the same value). With
/// [`keep_value_for`](IdempotencyLayer::keep_value_for) the response itself
/// is kept for a window, and a retry past it is refused 409
/// `response-no-longer-kept`, never run a second time.
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
/// /// The caller, as your authentication middleware put it in the
/// /// request's extensions.
/// #[derive(Clone)]
/// struct Caller(String);
///
/// fn app(gate: Gate) -> Router {
///     Router::new()
///         .route("/charges", post(create_charge))
///         // Every POST and PATCH with an Idempotency-Key runs once per
///         // caller, endpoint and key.
///         .layer(
///             IdempotencyLayer::new(gate)
///                 .scope(|parts| parts.extensions.get::<Caller>().map(|caller| caller.0.clone()))
///                 .body_limit(64 * 1024),
///         )
///     // .layer(your_authentication_middleware), outside: it runs first.
/// }
/// ```
///
/// Built with [`new`](IdempotencyLayer::new), given its scope, and
/// configured with its methods; cloning it (as routers do, once per
/// route) is cheap.
///
/// Without a scope it is not a layer (`Scope` is [`Unscoped`]), and the
/// compiler says what to choose:
///
/// ```compile_fail,E0277
/// # fn app(gate: idem_runtime::Gate) -> axum::Router {
/// axum::Router::new()
///     .route("/charges", axum::routing::post(|| async { "charged" }))
///     .layer(idem_runtime::http::IdempotencyLayer::new(gate)) // error: no scope chosen
/// # }
/// ```
pub struct IdempotencyLayer<Scope = Scoped, P = Anywhere> {
    config: Arc<Config>,
    /// Whose keys it guards, and which claim options it took (as a
    /// [`Guard`](crate::Guard)'s `P`: what may still be added).
    state: PhantomData<fn() -> (Scope, P)>,
}

/// The state of an [`IdempotencyLayer`] whose scope is not chosen yet:
/// not a layer until [`scope`](IdempotencyLayer::scope) or
/// [`single_tenant`](IdempotencyLayer::single_tenant) is called.
#[derive(Debug, Clone, Copy)]
pub struct Unscoped;

/// The state of an [`IdempotencyLayer`] that says whose keys it guards:
/// a layer.
#[derive(Debug, Clone, Copy)]
pub struct Scoped;

/// Implemented by [`Scoped`] only: an [`IdempotencyLayer`] is a
/// `tower::Layer` once it says whose keys it guards. Sealed.
#[diagnostic::on_unimplemented(
    message = "this `IdempotencyLayer` does not say whose keys it guards",
    label = "no scope chosen: every caller would share one key space",
    note = "call `.scope(|parts| ...)` to claim each caller's keys in their own account (read the caller your authentication middleware put in the request), or `.single_tenant()` if every request comes from one caller"
)]
pub trait ScopeChosen: sealed::Sealed {}

impl ScopeChosen for Scoped {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Scoped {}
}

impl<Scope, P> Clone for IdempotencyLayer<Scope, P> {
    fn clone(&self) -> Self {
        IdempotencyLayer {
            config: Arc::clone(&self.config),
            state: PhantomData,
        }
    }
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
    /// `None`: [`single_tenant`](IdempotencyLayer::single_tenant), the
    /// gate's account for everyone (the type says it was chosen).
    pub(super) scope: Option<FromParts<Option<String>>>,
    /// Whether the layer has said that it refused a keyed request for want
    /// of a route, once.
    pub(super) unrouted_warned: Arc<AtomicBool>,
    pub(super) status_policy: Arc<dyn Fn(StatusCode) -> Outcome + Send + Sync>,
    pub(super) kept_headers: Vec<HeaderName>,
    /// The guarded calls' task tracker and bound (see
    /// [`IdempotencyLayer::detached`]).
    pub(super) detached: Detached,
}

impl IdempotencyLayer<Unscoped> {
    /// A layer claiming on `gate`, with the defaults: the
    /// `Idempotency-Key` header, `POST` and `PATCH`, the key optional,
    /// bodies up to [`DEFAULT_BODY_LIMIT`](IdempotencyLayer::DEFAULT_BODY_LIMIT),
    /// the route as method and route template, [`default_status_policy`]
    /// and [`DEFAULT_KEPT_HEADERS`]. It is a layer once it says whose keys
    /// it guards: [`scope`](IdempotencyLayer::scope), or
    /// [`single_tenant`](IdempotencyLayer::single_tenant).
    pub fn new(gate: Gate) -> IdempotencyLayer<Unscoped> {
        IdempotencyLayer {
            state: PhantomData,
            config: Arc::new(Config {
                gate,
                mode: Mode::new(),
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                key_required: false,
                body_limit: IdempotencyLayer::DEFAULT_BODY_LIMIT,
                route: None,
                scope: None,
                unrouted_warned: Arc::new(AtomicBool::new(false)),
                status_policy: Arc::new(default_status_policy),
                kept_headers: DEFAULT_KEPT_HEADERS.to_vec(),
                detached: Detached::new(),
            }),
        }
    }
}

impl IdempotencyLayer {
    /// The largest request body read by default: 2 MiB, axum's own default
    /// limit, so a router behind the layer is refused nothing it would
    /// have accepted.
    pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;
}

impl<Scope, P> IdempotencyLayer<Scope, P> {
    fn with(mut self, change: impl FnOnce(&mut Config)) -> IdempotencyLayer<Scope, P> {
        change(Arc::make_mut(&mut self.config));
        self
    }

    fn scoped(mut self, scope: Option<FromParts<Option<String>>>) -> IdempotencyLayer<Scoped, P> {
        Arc::make_mut(&mut self.config).scope = scope;
        IdempotencyLayer {
            config: self.config,
            state: PhantomData,
        }
    }

    /// The layer with `change` made to its claims' options, in the state
    /// `Q` the option moves it to.
    fn optioned<Q>(mut self, change: impl FnOnce(Mode) -> Mode) -> IdempotencyLayer<Scope, Q> {
        let config = Arc::make_mut(&mut self.config);
        config.mode = change(config.mode.clone());
        IdempotencyLayer {
            config: self.config,
            state: PhantomData,
        }
    }

    /// Takes the key from this header instead of `Idempotency-Key`.
    #[must_use = "`header` returns the changed layer"]
    pub fn header(self, name: HeaderName) -> IdempotencyLayer<Scope, P> {
        self.with(|config| config.header = name)
    }

    /// Guards these methods instead of `POST` and `PATCH`. Requests of
    /// other methods pass through, key or not.
    #[must_use = "`methods` returns the changed layer"]
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> IdempotencyLayer<Scope, P> {
        let methods = methods.into_iter().collect();
        self.with(|config| config.methods = methods)
    }

    /// Refuses a request of a guarded method without the key header, with
    /// the extractor's 400 `missing-idempotency-key`, instead of passing it
    /// through.
    #[must_use = "`require_key` returns the changed layer"]
    pub fn require_key(self) -> IdempotencyLayer<Scope, P> {
        self.with(|config| config.key_required = true)
    }

    /// Reads request bodies up to `bytes` (default
    /// [`DEFAULT_BODY_LIMIT`](IdempotencyLayer::DEFAULT_BODY_LIMIT)); a longer one is
    /// refused with 413 `body-too-large`, and the inner service is not
    /// called. Only requests with a key are read.
    #[must_use = "`body_limit` returns the changed layer"]
    pub fn body_limit(self, bytes: usize) -> IdempotencyLayer<Scope, P> {
        self.with(|config| config.body_limit = bytes)
    }

    /// Names the route a request's key is claimed under (the identity's
    /// action: its metrics label, the action a probe is registered for),
    /// instead of its method and route template. Needed where the layer
    /// finds no template: a bare hyper service, a layer wrapped around a
    /// whole router, idem's `axum` feature off; without it such a service
    /// refuses **every keyed request** (404 `no-route`, never run
    /// unguarded). Return a template, never the raw path
    /// (one route per id is one metrics series and one probe per id); the
    /// path and query as sent are part of the fingerprint anyway. Every
    /// request of a guarded method with a key is guarded under what it
    /// returns.
    ///
    /// ```
    /// # fn demo(gate: idem_runtime::Gate) {
    /// // A hyper service with one guarded endpoint, `POST /jobs`.
    /// let layer = idem_runtime::http::IdempotencyLayer::new(gate)
    ///     .single_tenant()
    ///     .route(|parts| format!("{} /jobs", parts.method));
    /// # }
    /// ```
    #[must_use = "`route` returns the changed layer"]
    pub fn route(
        self,
        route: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> IdempotencyLayer<Scope, P> {
        self.with(|config| config.route = Some(Arc::new(route)))
    }

    /// Claims each request's key in the account `scope` reads from it (the
    /// caller: a tenant or user an authentication layer put in the
    /// request's extensions), so that two callers' keys never meet. An
    /// account name that cannot be stored is refused with 400
    /// `invalid-scope`.
    ///
    /// `None` (no caller) refuses a request with a key with 401
    /// `unidentified-caller` (gRPC `UNAUTHENTICATED`), without calling the
    /// service: claiming it in a shared account would let one anonymous
    /// caller be answered with another's response. To guard anonymous
    /// requests anyway, name their account yourself
    /// (`.unwrap_or_else(|| "anonymous".into())`), knowing that they share
    /// it. Requests without a key pass through as ever.
    ///
    /// Put the layer inside the authentication middleware, so that the
    /// extension is there when it runs.
    #[must_use = "`scope` returns the scoped layer"]
    pub fn scope(
        self,
        scope: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer<Scoped, P> {
        self.scoped(Some(Arc::new(scope)))
    }

    /// Claims every request's key in the gate's own account: all callers
    /// share one key space. Only for a service with a single caller (one
    /// internal client, one tenant per deployment): where two callers
    /// could pick the same key (`order-1001`), the second is answered with
    /// the first's kept response, marked replayed, and its request never
    /// runs. With more than one caller, use
    /// [`scope`](IdempotencyLayer::scope).
    #[must_use = "`single_tenant` returns the scoped layer"]
    pub fn single_tenant(self) -> IdempotencyLayer<Scoped, P> {
        self.scoped(None)
    }

    /// Chooses, by status, whether a response is kept and replayed or what
    /// its failure means for the key, instead of
    /// [`default_status_policy`] (whose docs show how to start from it).
    #[must_use = "`status_policy` returns the changed layer"]
    pub fn status_policy(
        self,
        policy: impl Fn(StatusCode) -> Outcome + Send + Sync + 'static,
    ) -> IdempotencyLayer<Scope, P> {
        self.with(|config| config.status_policy = Arc::new(policy))
    }

    /// Keeps these response headers (and trailers) with a kept response,
    /// instead of [`DEFAULT_KEPT_HEADERS`]; the others reach the first
    /// client only. Keep those that describe the result, never a
    /// `Set-Cookie` meant for one client.
    #[must_use = "`keep_headers` returns the changed layer"]
    pub fn keep_headers(
        self,
        names: impl IntoIterator<Item = HeaderName>,
    ) -> IdempotencyLayer<Scope, P> {
        let names = names.into_iter().collect();
        self.with(|config| config.kept_headers = names)
    }

    /// Keeps each stored response (and the request's fingerprint) for
    /// `window` after it is recorded, as
    /// [`Guard::keep_value_for`](crate::Guard::keep_value_for) says: past
    /// it a retry with the same key is answered 409
    /// `response-no-longer-kept` (gRPC `ALREADY_EXISTS`), never run again:
    /// the client must look the result up. Say the window in your API's
    /// documentation. The key itself stays held for ever, or for
    /// [`keep_slot_for`](IdempotencyLayer::keep_slot_for).
    #[must_use = "`keep_value_for` returns the changed layer"]
    pub fn keep_value_for(self, window: Duration) -> IdempotencyLayer<Scope, P> {
        self.optioned(|mode| mode.keep_value_for(window))
    }

    /// Holds each key for `window` after its outcome is recorded, as
    /// [`Guard::keep_slot_for`](crate::Guard::keep_slot_for) says: past it
    /// a request with the same key runs again, as a new request. Without
    /// it a key is held for ever (and no expiry header is sent). The IETF
    /// draft asks a server to publish its keys' expiry policy: say the
    /// window in your API's documentation.
    ///
    /// Every response the layer keeps says until when its key is held, in
    /// an [`Idempotency-Key-Expires`](crate::http::IDEMPOTENCY_KEY_EXPIRES)
    /// header: an HTTP-date (`Sun, 06 Dec 2026 21:30:00 GMT`), the moment
    /// the response was produced plus `window`, rounded down to the second.
    /// It is stored with the response, so every replay carries the same
    /// value; it replaces any such header the service sent, and is kept
    /// whatever [`keep_headers`](IdempotencyLayer::keep_headers) says.
    /// Answers the layer does not keep (refusals, released keys, failures
    /// kept by the status policy) carry none.
    ///
    /// The value is computed on this process's clock; the database's clock
    /// decides the true expiry, at the outcome's recording (just after the
    /// response was produced) plus `window`. So the time stated is at or
    /// before the true one, as far as the two clocks agree: keep them in
    /// sync (NTP) if clients act on the header.
    #[must_use = "`keep_slot_for` returns the changed layer"]
    pub fn keep_slot_for(self, window: Duration) -> IdempotencyLayer<Scope, P> {
        self.optioned(|mode| mode.keep_slot_for(window))
    }

    /// A duplicate in flight waits up to `wait` for the first call's
    /// answer (and gets it) instead of a 409, as
    /// [`Guard::wait`](crate::Guard::wait) says: handed the stored
    /// response as it is recorded when the first call runs in this process,
    /// woken by its notification when it runs in another. Past `wait` it is still answered 409
    /// `in-flight` with `Retry-After`.
    #[must_use = "`wait` returns the changed layer"]
    pub fn wait(self, wait: Duration) -> IdempotencyLayer<Scope, P::Pooled>
    where
        P: PoolOption,
    {
        self.optioned(|mode| mode.wait(wait))
    }

    /// What a request does when the store cannot be reached, as
    /// [`Guard::on_unavailable`](crate::Guard::on_unavailable) says (by
    /// default it is refused, 503).
    #[must_use = "`on_unavailable` returns the changed layer"]
    pub fn on_unavailable(self, policy: OnUnavailable) -> IdempotencyLayer<Scope, P::Pooled>
    where
        P: PoolOption,
    {
        self.optioned(|mode| mode.on_unavailable(policy))
    }

    /// Claims with a lease, so that a claim whose process died is taken
    /// over (or, with [`on_expiry`](IdempotencyLayer::on_expiry), held in
    /// doubt), as [`Guard::lease`](crate::Guard::lease) says; not with an
    /// asynchronous [`outcome_commit`](IdempotencyLayer::outcome_commit),
    /// which does not compile.
    ///
    /// A guarded call renews its own lease while it runs, even after its
    /// client left, as [`detach`](crate::detach) says: the
    /// [detached bound](IdempotencyLayer::detached), not the lease, limits
    /// how long it runs, and a retry within the bound is answered as a
    /// duplicate in flight (a 409, or with a [wait](IdempotencyLayer::wait)
    /// the first call's answer), never run a second time.
    #[must_use = "`lease` returns the changed layer"]
    pub fn lease(self, lease: Duration) -> IdempotencyLayer<Scope, Leased>
    where
        P: LeaseOption,
    {
        self.optioned(|mode| mode.lease(lease))
    }

    /// How the outcomes commit, as
    /// [`Guard::outcome_commit`](crate::Guard::outcome_commit) says; not
    /// with a [lease](IdempotencyLayer::lease), which does not compile.
    #[must_use = "`outcome_commit` returns the changed layer"]
    pub fn outcome_commit(self, commit: OutcomeCommit) -> IdempotencyLayer<Scope, AsyncCommit>
    where
        P: OutcomeCommitOption,
    {
        self.optioned(|mode| mode.outcome_commit(commit))
    }
}

impl<Scope> IdempotencyLayer<Scope, Leased> {
    /// What a claim whose lease ran out becomes, as
    /// [`Guard::on_expiry`](crate::Guard::on_expiry) says.
    #[must_use = "`on_expiry` returns the changed layer"]
    pub fn on_expiry(self, on_expiry: OnExpiry) -> IdempotencyLayer<Scope, Leased> {
        self.optioned(|mode| mode.on_expiry(on_expiry))
    }
}

impl<Scope, P> IdempotencyLayer<Scope, P> {
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
    pub fn detached(self, detached: Detached) -> IdempotencyLayer<Scope, P> {
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
    /// let layer = IdempotencyLayer::new(gate).single_tenant();
    /// let calls = layer.detached_calls();
    /// // ... serve `router.layer(layer)` until a shutdown signal, then:
    /// calls.shutdown(Duration::from_secs(20)).await;
    /// # }
    /// ```
    pub fn detached_calls(&self) -> Detached {
        self.config.detached.clone()
    }
}

impl<S, Scope: ScopeChosen, P> Layer<S> for IdempotencyLayer<Scope, P> {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> IdempotencyService<S> {
        IdempotencyService::new(inner, Arc::clone(&self.config))
    }
}

impl<Scope, P> fmt::Debug for IdempotencyLayer<Scope, P> {
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
            .field("per_caller", &self.scope.is_some())
            .field("kept_headers", &self.kept_headers)
            .finish_non_exhaustive()
    }
}
