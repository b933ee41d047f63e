//! Servers and clients for the tower layer's tests (`http::detached`,
//! `http::documented_promises`): a guarded `POST /charges` whose effects are counted, a
//! server on 127.0.0.1 whose connections live in its own task, an HTTP/1.1
//! client that reads trailers, and the claims a test's account left.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use idem::Gate;
use idem::sqlx::PgPool;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// How long a test waits for a row to leave `pending` before it says the
/// row was stranded (a liveness bound, not a speed assertion).
pub(crate) const SETTLE_WAIT: Duration = Duration::from_secs(15);

/// A gate in an account of its own (named after `prefix`), and that
/// account's name.
pub(crate) async fn gate(prefix: &str) -> (Gate, String) {
    let account = idem::testing::unique_name(prefix);
    let gate = Gate::connect(idem::testing::pool_with(8).await)
        .await
        .expect("idem's schema")
        .account(account.clone());
    (gate, account)
}

/// The handler's effects: how many started, how many finished, and a
/// signal when one has started.
#[derive(Clone, Default)]
pub(crate) struct Effects {
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
    began: Arc<Notify>,
}

impl Effects {
    pub(crate) fn start(&self) -> usize {
        let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
        self.began.notify_one();
        n
    }

    pub(crate) fn finish(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub(crate) fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    /// Waits until a body has started.
    pub(crate) async fn began(&self) {
        tokio::time::timeout(SETTLE_WAIT, self.began.notified())
            .await
            .expect("the guarded handler never started");
    }
}

/// `POST /charges`: starts an effect, takes `time`, answers 201 with a
/// body naming the effect and what it was sent.
pub(crate) fn charges(effects: &Effects, time: Duration) -> Router {
    let effects = effects.clone();
    Router::new().route(
        "/charges",
        post(move |body: Bytes| {
            let effects = effects.clone();
            async move {
                let n = effects.start();
                tokio::time::sleep(time).await;
                effects.finish();
                (
                    StatusCode::CREATED,
                    [("content-type", "text/plain")],
                    format!("charge {n} of {}", String::from_utf8_lossy(&body)),
                )
            }
        }),
    )
}

/// A server on 127.0.0.1 whose connections live inside its own task:
/// aborting the task closes every connection at once, as a process that
/// stops does, and drops every request future it was serving.
pub(crate) async fn serve(router: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let address = listener.local_addr().expect("its address");
    let server = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = TowerToHyperService::new(router.clone());
            connections.spawn(async move {
                let _closed = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
            // Closed connections are reaped as new ones arrive, so a long
            // test does not keep every finished one.
            while connections.try_join_next().is_some() {}
        }
    });
    (address, server)
}

/// A response as an HTTP/1.1 client read it: trailers included.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Read {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) trailers: Option<HeaderMap>,
}

impl Read {
    /// The response as stored and replayed: without the `Date` header the
    /// server adds to every response as it sends it (two replays a second
    /// apart differ by it, and by nothing else).
    pub(crate) fn as_stored(&self) -> Read {
        let mut headers = self.headers.clone();
        headers.remove(axum::http::header::DATE);
        Read {
            headers,
            ..self.clone()
        }
    }

    pub(crate) fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true")
    }

    /// The body as text (a problem's type, where the layer refused).
    pub(crate) fn problem_type(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `request` over a fresh HTTP/1.1 connection (hyper's client,
/// which reads trailers) and reads the whole response; `None` when the
/// connection ended before one.
pub(crate) async fn try_send(address: SocketAddr, request: Request<Full<Bytes>>) -> Option<Read> {
    use hyper_util::rt::TokioIo;

    let stream = TcpStream::connect(address).await.expect("the server");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("an HTTP/1.1 handshake");
    tokio::spawn(connection);
    let response = sender.send_request(request).await.ok()?;
    let (head, body) = response.into_parts();
    let collected = body.collect().await.ok()?;
    Some(Read {
        status: head.status,
        headers: head.headers,
        trailers: collected.trailers().cloned(),
        body: collected.to_bytes(),
    })
}

/// [`try_send`], where the test expects a whole response.
pub(crate) async fn send(address: SocketAddr, request: Request<Full<Bytes>>) -> Read {
    try_send(address, request).await.expect("a whole response")
}

/// Writes a whole `POST /charges` on a raw connection and returns the
/// connection unread: dropping it is the client giving up.
pub(crate) async fn post_and_hold(address: SocketAddr, key: &str, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.expect("the server");
    let request = format!(
        "POST /charges HTTP/1.1\r\nhost: 127.0.0.1\r\nidempotency-key: {key}\r\n\
         content-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("the request written");
    stream
}

/// The state and reason of every claim in `account`, oldest first.
pub(crate) async fn rows(pool: &PgPool, account: &str) -> Vec<(String, Option<String>)> {
    idem::sqlx::query_as(
        "SELECT state, state_reason FROM idem_records WHERE account = $1 AND kind = 'claim' \
         ORDER BY created_at",
    )
    .bind(account)
    .fetch_all(pool)
    .await
    .expect("the claims")
}
