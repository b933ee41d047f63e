//! [`IdempotencyService`]: one request through the gate. Read the key,
//! read the body, claim, call the inner service only if the claim was won,
//! keep its response or record its failure, answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response, Uri};
use http_body::Body;
use http_body_util::Either;
use sha1::{Digest, Sha1};
use tower_service::Service;

use super::body::{self, BoxError, BufferedBody, ReadError, Whole};
use super::{Config, grpc, refusal};
use crate::detach::run_detached;
use crate::error::Rejected;
use crate::gate::Gate;
use crate::http::{IDEMPOTENCY_KEY_EXPIRES, IdempotencyKey, KeyRejection, Problem, StoredResponse};
use crate::identity::Identity;
use crate::mode::{Disposition, Fingerprint};
use crate::outcome::Outcome;
use crate::run::replayed_outcome_of;

/// The request body the inner service gets: the client's, untouched, for
/// a request that passes through; the bytes the layer read, for a guarded
/// one.
pub type RequestBody<B> = Either<B, BufferedBody>;

/// The response body the layer answers with: the inner service's,
/// untouched, for a request that passed through; one in memory for a
/// guarded request (its response was read to be kept), a replay or a
/// refusal.
pub type ResponseBody<B> = Either<B, BufferedBody>;

/// The future of [`IdempotencyService`]: boxed, as the claim, the inner
/// call and the settle are one `async` sequence.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around
/// an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> IdempotencyService<S> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> IdempotencyService<S> {
        IdempotencyService { inner, config }
    }
}

impl<S: fmt::Debug> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for IdempotencyService<S>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service polled ready is the one to call; a fresh clone stays
        // behind for the next poll_ready (tower's clone-and-swap).
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        Box::pin(guard(Arc::clone(&self.config), ready, request))
    }
}

/// What a guarded request's inner call came to, when it is not a response
/// to keep: the `Err` of the run, so the gate records it as a failure.
enum Unkept<E> {
    /// The gate refused the request; the inner service was not called.
    Refused(Rejected),
    /// The inner service answered, with a response not to keep: it goes to
    /// this client, and the key is recorded as `disposition` says.
    Answered {
        response: Response<BufferedBody>,
        disposition: Disposition,
    },
    /// The inner service failed without answering: the key is released.
    Failed(E),
}

impl<E> From<Rejected> for Unkept<E> {
    fn from(rejected: Rejected) -> Unkept<E> {
        Unkept::Refused(rejected)
    }
}

/// What the gate records for a run's output (a kept response is settled,
/// never disposed).
fn disposition_of<E>(output: &Result<StoredResponse, Unkept<E>>) -> Disposition {
    match output {
        Err(Unkept::Answered { disposition, .. }) => *disposition,
        _ => Disposition::Release,
    }
}

/// The headers and trailers the service sent, for the first client: the
/// guarded call leaves them here (it runs detached, so it cannot borrow).
type FirstFields = Arc<Mutex<Option<(HeaderMap, Option<HeaderMap>)>>>;

/// One request through the layer.
async fn guard<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    if !config.methods.contains(&parts.method) {
        return pass_through(inner, parts, body).await;
    }
    let grpc = grpc::is_grpc(&parts.headers);
    let Some(route) = route_of(&config, &parts, grpc) else {
        // A key with nothing to keep it under: refused, never run
        // unguarded (a fallback with effects, or a service whose layer was
        // never given routes, would otherwise run every retry again).
        if parts.headers.contains_key(&config.header) {
            say_unrouted(&config, &parts);
            return Ok(refuse(&refusal::no_route(), grpc));
        }
        return pass_through(inner, parts, body).await;
    };
    let key = match IdempotencyKey::from_header_named(&parts.headers, &config.header) {
        Ok(Some(key)) => key,
        Ok(None) if !config.key_required => return pass_through(inner, parts, body).await,
        Ok(None) => return Ok(refuse(&Problem::from(&KeyRejection::Missing), grpc)),
        Err(rejection) => return Ok(refuse(&Problem::from(&rejection), grpc)),
    };
    let Some(gate) = gate_of(&config, &parts) else {
        return Ok(refuse(&refusal::unidentified_caller(), grpc));
    };
    let read = match body::read_limited(body, config.body_limit).await {
        Ok(read) => read,
        Err(ReadError::TooLarge) => {
            return Ok(refuse(&refusal::too_large(config.body_limit), grpc));
        }
        Err(ReadError::Unreadable(error)) => {
            tracing::debug!(target: "idem", %error, "a guarded request's body could not be read");
            return Ok(refuse(&refusal::unreadable(), grpc));
        }
    };

    let identity = identity_of(route, &key);
    let mode = config
        .mode
        .clone()
        .fingerprint(fingerprint_of(&parts, &read.data));
    let request = Request::from_parts(
        parts,
        Either::Right(BufferedBody::new(read.data, read.trailers)),
    );
    // The first client gets every header the service sent; only the kept
    // ones are stored for the duplicates.
    let first_fields = FirstFields::default();
    let outcome = replayed_outcome_of().disposed_by(disposition_of::<S::Error>);
    // Detached: a client that disconnects, or a timeout outside the layer,
    // drops this future, never the inner call, which runs to its end (or
    // the bound) and is recorded, so the retry gets its response.
    let call = call_inner(
        Arc::clone(&config),
        inner,
        request,
        identity.action().to_owned(),
        grpc,
        Arc::clone(&first_fields),
    );
    let ran = run_detached(
        &config.detached,
        gate.slots().clone(),
        identity.clone(),
        mode.clone(),
        outcome,
        call,
    )
    .await;
    let first_fields = first_fields
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();

    match ran {
        Ok(kept) => Ok(answer(kept, first_fields).map(Either::Right)),
        Err(Unkept::Refused(rejected)) => Ok(refuse(&Problem::from(&rejected), grpc)),
        Err(Unkept::Answered { mut response, .. }) => {
            announce_trailers(&mut response);
            Ok(response.map(Either::Right))
        }
        Err(Unkept::Failed(error)) => Err(error),
    }
}

/// The guarded call: the inner service's response, read whole, and what
/// it means for the key (kept, or a failure to record as the status
/// policy says). The headers and trailers it sent go to `first_fields`.
async fn call_inner<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<RequestBody<ReqBody>>,
    action: String,
    grpc: bool,
    first_fields: FirstFields,
) -> Result<StoredResponse, Unkept<S::Error>>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body<Data = Bytes>,
    ResBody::Error: Into<BoxError>,
{
    let response = inner.call(request).await.map_err(Unkept::Failed)?;
    let (head, body) = response.into_parts();
    let status = if grpc { None } else { Some(head.status) };
    let whole = match body::read_whole(body).await {
        Ok(whole) => whole,
        Err(error) => {
            // The service answered, then its body failed: nothing to
            // send or keep. If the answer would have been kept, it may
            // have taken effect.
            let error: BoxError = error.into();
            tracing::warn!(
                target: "idem",
                action,
                %error,
                "a guarded response's body failed; it is neither sent nor kept"
            );
            let status = status.unwrap_or_else(|| grpc::status_before_trailers(&head.headers));
            return Err(Unkept::Answered {
                response: refusal::respond(&refusal::response_failed(), grpc),
                disposition: match (config.status_policy)(status) {
                    Outcome::Succeeded(()) => Disposition::InDoubt,
                    Outcome::Failed(disposition) => disposition,
                },
            });
        }
    };
    let status = status.unwrap_or_else(|| grpc::status_of_whole(&head.headers, &whole));
    match (config.status_policy)(status) {
        Outcome::Succeeded(()) => {
            let mut headers = head.headers;
            let expires = key_expires(&config);
            if let Some(expires) = &expires {
                headers.insert(IDEMPOTENCY_KEY_EXPIRES, expires.clone());
            }
            let kept = kept_response(&config, head.status, &headers, &whole, expires);
            *first_fields.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((headers, whole.trailers));
            Ok(kept)
        }
        Outcome::Failed(disposition) => Err(Unkept::Answered {
            response: Response::from_parts(head, BufferedBody::new(whole.data, whole.trailers)),
            disposition,
        }),
    }
}

/// A request the layer does not guard, handed on untouched.
async fn pass_through<S, ReqBody, ResBody>(
    mut inner: S,
    parts: Parts,
    body: ReqBody,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
{
    let response = inner
        .call(Request::from_parts(parts, Either::Left(body)))
        .await?;
    Ok(response.map(Either::Left))
}

/// A refusal, in the layer's response body.
fn refuse<B>(problem: &Problem, grpc: bool) -> Response<ResponseBody<B>> {
    refusal::respond(problem, grpc).map(Either::Right)
}

/// The gate in the caller's account: the one the scope names, or the
/// gate's own for a single-tenant layer. `None` when the scope names no
/// caller: such a request is refused, never claimed in a shared account.
fn gate_of(config: &Config, parts: &Parts) -> Option<Gate> {
    match &config.scope {
        Some(scope) => scope(parts).map(|account| config.gate.account(account)),
        None => Some(config.gate.clone()),
    }
}

/// The route a request's key is claimed under: the layer's own
/// [`route`](super::IdempotencyLayer::route), else its method and route
/// template, so that actions (metrics labels, probes) are bounded by the
/// service's routes, not by the ids in paths. For gRPC the path is the
/// template: it names a method, and a made-up one is `UNIMPLEMENTED`,
/// which releases the key. `None`: no route (with axum, it matched none):
/// a keyed request is then refused, never run.
fn route_of(config: &Config, parts: &Parts, grpc: bool) -> Option<String> {
    if let Some(route) = &config.route {
        return Some(route(parts));
    }
    let template = if grpc {
        original_uri(parts).path()
    } else {
        route_template(parts)?
    };
    Some(format!("{} {template}", parts.method))
}

/// The route template axum matched, in full under `nest`.
#[cfg(feature = "axum")]
fn route_template(parts: &Parts) -> Option<&str> {
    parts
        .extensions
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str)
}

/// Without axum there is no template to read: `route` names it.
#[cfg(not(feature = "axum"))]
fn route_template(_: &Parts) -> Option<&str> {
    None
}

/// The URI as the client sent it: axum's `OriginalUri` when a `nest`
/// stripped a prefix from the one the layer sees.
fn original_uri(parts: &Parts) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return &original.0;
    }
    &parts.uri
}

/// A keyed request of a guarded method refused for want of a route: said
/// at debug level each time, and once as a warning, as a layer that never
/// finds one refuses every keyed request.
fn say_unrouted(config: &Config, parts: &Parts) {
    let path = original_uri(parts).path();
    if config.unrouted_warned.swap(true, Ordering::Relaxed) {
        tracing::debug!(target: "idem", method = %parts.method, path, "a request with an idempotency key matched no route: refused 404 no-route, not run");
    } else {
        tracing::warn!(
            target: "idem",
            method = %parts.method,
            path,
            "a request with an idempotency key was refused (404 no-route, not run): the layer \
             found no route template. Expected for a path that matched no axum route; otherwise \
             apply the layer with axum's Router::layer (with idem's `axum` feature on), or name \
             routes with IdempotencyLayer::route (a hyper service). Said once per layer; later \
             ones at debug level"
        );
    }
}

/// The route (the action) and the key.
fn identity_of(route: String, key: &IdempotencyKey) -> Identity {
    Identity::new(route).part(key)
}

/// What makes two requests under one key the same request: method, path,
/// query (as the client sent them, not as a `nest` stripped them) and
/// body. The body enters as its sha1, so the fingerprint costs one pass
/// over it and no copy.
fn fingerprint_of(parts: &Parts, body: &[u8]) -> Fingerprint {
    let body_digest: [u8; 20] = Sha1::digest(body).into();
    let uri = original_uri(parts);
    Fingerprint::new()
        .part(parts.method.as_str())
        .part(uri.path())
        .part(uri.query().unwrap_or_default())
        .part(body_digest)
}

/// The response as kept: status, the kept headers and trailers, the body,
/// and the layer's `Idempotency-Key-Expires` when it has one (whatever the
/// kept headers, and instead of any the service sent).
fn kept_response(
    config: &Config,
    status: http::StatusCode,
    headers: &HeaderMap,
    whole: &Whole,
    expires: Option<HeaderValue>,
) -> StoredResponse {
    let mut kept = StoredResponse::new(status).with_body(whole.data.to_vec());
    for name in &config.kept_headers {
        let ours = expires.is_some() && *name == IDEMPOTENCY_KEY_EXPIRES;
        for value in headers.get_all(name).iter().filter(|_| !ours) {
            kept = kept.with_header(name.clone(), value.clone());
        }
        for value in whole
            .trailers
            .iter()
            .flat_map(|trailers| trailers.get_all(name))
        {
            kept = kept.with_trailer(name.clone(), value.clone());
        }
    }
    if let Some(expires) = expires {
        kept = kept.with_header(IDEMPOTENCY_KEY_EXPIRES, expires);
    }
    kept
}

/// The first second past which no HTTP-date can be written (year 10000):
/// `httpdate` panics there.
const LAST_HTTP_DATE: u64 = 253_402_300_800;

/// The `Idempotency-Key-Expires` value of a response kept now: now (this
/// process's clock) plus the layer's slot window, rounded down to the
/// second, as an HTTP-date (RFC 9110 §5.6.7). `None` without a window (the
/// key is held for ever).
///
/// The slot really expires at its outcome's recording (after this moment,
/// on the database's clock) plus the window, so the time stated is at or
/// before the true expiry, as far as the two clocks agree: a client that
/// trusts it never retries too early to be answered from the outcome. A
/// clock outside 1970 to 9999 (it cannot be written) sends no header
/// rather than a wrong one.
fn key_expires(config: &Config) -> Option<HeaderValue> {
    let window = config.mode.slot_window()?;
    let expires = SystemTime::now().checked_add(window)?;
    let seconds = expires.duration_since(UNIX_EPOCH).ok()?.as_secs();
    if seconds >= LAST_HTTP_DATE {
        return None;
    }
    let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(seconds));
    HeaderValue::from_str(&date).ok()
}

/// A kept response as the answer: to the first client with every header
/// and trailer the service sent, to a duplicate as kept, marked replayed.
fn answer(
    kept: StoredResponse,
    first_fields: Option<(HeaderMap, Option<HeaderMap>)>,
) -> Response<BufferedBody> {
    let replayed = kept.is_replay();
    let (status, kept_headers, data, kept_trailers) = kept.into_parts();
    let (headers, trailers) = match first_fields {
        Some((headers, trailers)) if !replayed => (headers, trailers),
        _ => (kept_headers, Some(kept_trailers)),
    };
    let mut response = Response::new(BufferedBody::new(data, trailers));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if replayed {
        response.headers_mut().insert(
            crate::http::IDEMPOTENT_REPLAYED,
            http::HeaderValue::from_static("true"),
        );
    }
    // The first client too: trailers the service sent unannounced would
    // otherwise reach the replays only.
    announce_trailers(&mut response);
    response
}

/// Announces a response's trailers in a `Trailer` header (when its
/// headers did not): an HTTP/1.1 server sends only the trailers a
/// response announced, so without it the client would lose them.
fn announce_trailers(response: &mut Response<BufferedBody>) {
    if response.headers().contains_key(http::header::TRAILER) {
        return;
    }
    let names: Vec<&str> = response
        .body()
        .trailer_names()
        .map(http::HeaderName::as_str)
        .collect();
    if names.is_empty() {
        return;
    }
    if let Ok(value) = http::HeaderValue::from_str(&names.join(", ")) {
        response.headers_mut().insert(http::header::TRAILER, value);
    }
}
