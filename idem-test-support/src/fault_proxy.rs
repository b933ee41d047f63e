//! A TCP proxy in front of PostgreSQL that injects faults: it cuts every
//! connection (and turns new ones away until it resumes), and it loses the
//! reply of a chosen statement after the server has committed it.
//!
//! To lose a reply it reads the frontend protocol's framing (a type byte,
//! then a 4-byte big-endian length that counts itself; the startup message
//! has no type byte). sqlx sends every statement with arguments as Parse,
//! then Bind, Execute and Sync; with `statement_cache_capacity(0)` the Parse
//! carries the SQL text every time, so the proxy can recognise the
//! statement. When an armed [`Statement`] is executed, the proxy forwards
//! the client's messages, swallows the server's replies up to and including
//! the ReadyForQuery that answers the Sync (by then an autocommitted
//! statement has committed), and closes both sockets: the client sees its
//! connection die with the work done.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem::sqlx::PgPool;
use idem::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// A statement of the gate or the meter whose reply the proxy can lose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Statement {
    /// The claim: the statement that looks and inserts `pending`.
    Claim,
    /// A lease takeover: the compare-and-swap on an expired claim's fence.
    TakeOver,
    /// The settle: `pending` becomes `success`.
    Settle,
    /// The release: the claim is deleted.
    Release,
    /// A lease renewal.
    Extend,
    /// A metering batch.
    Meter,
}

impl Statement {
    /// Every statement the proxy tells apart.
    pub const ALL: [Statement; 6] = [
        Statement::Claim,
        Statement::TakeOver,
        Statement::Settle,
        Statement::Release,
        Statement::Extend,
        Statement::Meter,
    ];

    /// A stable name, for figures.
    pub fn name(self) -> &'static str {
        match self {
            Statement::Claim => "claim",
            Statement::TakeOver => "take_over",
            Statement::Settle => "settle",
            Statement::Release => "release",
            Statement::Extend => "extend",
            Statement::Meter => "meter",
        }
    }

    /// Which statement `sql` is, if any of these. Recognised by fragments
    /// only these statements contain (the meter's batch inserts into
    /// `idem_records` too, but never a `pending` row).
    pub fn of(sql: &str) -> Option<Statement> {
        let has = |fragment: &str| sql.contains(fragment);
        if has("INSERT INTO idem_records") && has("'pending'") {
            Some(Statement::Claim)
        } else if has("INSERT INTO idem_records") && has("'meter_event'") {
            Some(Statement::Meter)
        } else if has("UPDATE idem_records") && has("nextval('idem_records_fence_seq')") {
            Some(Statement::TakeOver)
        } else if has("UPDATE idem_records") && has("state = 'success'") {
            Some(Statement::Settle)
        } else if has("UPDATE idem_records SET lease_expires_at") {
            Some(Statement::Extend)
        } else if has("DELETE FROM idem_records") {
            Some(Statement::Release)
        } else {
            None
        }
    }
}

/// A reply the proxy lost: which statement, and when (the moment it
/// swallowed the server's ReadyForQuery, so after the commit).
#[derive(Debug, Clone, Copy)]
pub struct LostReply {
    /// The statement whose reply was lost.
    pub statement: Statement,
    /// When the reply was swallowed.
    pub at: Instant,
}

/// The proxy. Dropping it closes every connection.
pub struct Proxy {
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    upstream: PgConnectOptions,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

/// What the accept loop and every connection share.
struct Shared {
    upstream: String,
    accepting: AtomicBool,
    connections: Mutex<JoinSet<()>>,
    /// Statements whose next execution loses its reply, once each.
    armed: Mutex<Vec<Statement>>,
    lost: Mutex<Vec<LostReply>>,
    /// SQL fragments: the next statement containing one loses its reply,
    /// once each (for statements [`Statement`] does not tell apart).
    armed_fragments: Mutex<Vec<&'static str>>,
    /// The SQL text of each statement whose reply was lost to a fragment.
    lost_fragments: Mutex<Vec<String>>,
    /// Statements executed through the proxy (Execute messages and simple
    /// Queries), on every connection.
    executions: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Proxy {
    /// A proxy in front of the test database (`DATABASE_URL`).
    pub async fn start() -> Proxy {
        let url = idem::testing::database_url();
        let options = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("DATABASE_URL={url} is not a PostgreSQL URL: {e}"));
        Proxy::in_front_of(options).await
    }

    /// A proxy in front of the server `upstream` points at; its
    /// [`options`](Proxy::options) keep `upstream`'s user and database.
    pub async fn in_front_of(upstream: PgConnectOptions) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a local port");
        let port = listener.local_addr().expect("local address").port();
        let shared = Arc::new(Shared {
            upstream: format!("{}:{}", upstream.get_host(), upstream.get_port()),
            accepting: AtomicBool::new(true),
            connections: Mutex::new(JoinSet::new()),
            armed: Mutex::new(Vec::new()),
            lost: Mutex::new(Vec::new()),
            armed_fragments: Mutex::new(Vec::new()),
            lost_fragments: Mutex::new(Vec::new()),
            executions: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept(listener, shared.clone()));
        Proxy {
            port,
            upstream,
            shared,
            accept,
        }
    }

    /// Connection options for the upstream server, through this proxy.
    pub fn options(&self) -> PgConnectOptions {
        self.upstream.clone().host("127.0.0.1").port(self.port)
    }

    /// A pool through the proxy that gives up quickly once it is cut.
    pub async fn pool(&self, max_connections: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(1))
            .connect_with(self.options())
            .await
            .expect("connect through the proxy")
    }

    /// Closes every proxied connection and turns new ones away; returns
    /// once no byte can pass any more.
    pub async fn cut(&self) {
        self.shared.accepting.store(false, Ordering::SeqCst);
        let mut connections = std::mem::take(&mut *lock(&self.shared.connections));
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }

    /// After [`Proxy::cut`]: accepts connections again, so pools that were
    /// cut off reconnect, as when a server comes back. (`&mut`, as the tests
    /// that own their proxy have always called it; [`Proxy::cut_for`] cuts
    /// and resumes a shared one.)
    pub async fn resume(&mut self) {
        self.shared.accepting.store(true, Ordering::SeqCst);
    }

    /// Cuts every connection and turns new ones away for `outage`.
    pub async fn cut_for(&self, outage: Duration) {
        self.cut().await;
        tokio::time::sleep(outage).await;
        self.shared.accepting.store(true, Ordering::SeqCst);
    }

    /// Loses the reply of the next execution of `statement`, on whichever
    /// connection runs it. `false` when one is armed already.
    pub fn lose_next_reply(&self, statement: Statement) -> bool {
        let mut armed = lock(&self.shared.armed);
        if armed.contains(&statement) {
            return false;
        }
        armed.push(statement);
        true
    }

    /// Loses the reply of the next statement whose SQL text contains
    /// `fragment`, on whichever connection runs it: for a statement that
    /// [`Statement`] does not tell apart (a lookup, say). `false` when that
    /// fragment is armed already.
    pub fn lose_next_reply_to(&self, fragment: &'static str) -> bool {
        let mut armed = lock(&self.shared.armed_fragments);
        if armed.contains(&fragment) {
            return false;
        }
        armed.push(fragment);
        true
    }

    /// The SQL text of each statement whose reply was lost to
    /// [`lose_next_reply_to`](Proxy::lose_next_reply_to) since the last
    /// call, oldest first.
    pub fn take_lost_fragment_replies(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.shared.lost_fragments))
    }

    /// The replies lost since the last call, oldest first.
    pub fn take_lost_replies(&self) -> Vec<LostReply> {
        std::mem::take(&mut *lock(&self.shared.lost))
    }

    /// How many statements have been executed through the proxy so far, on
    /// every connection: to count a caller's round trips.
    pub fn executions(&self) -> u64 {
        self.shared.executions.load(Ordering::SeqCst)
    }

    /// Disarms every reply not lost yet.
    pub fn disarm(&self) {
        lock(&self.shared.armed).clear();
        lock(&self.shared.armed_fragments).clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.shared.connections).abort_all();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        if !shared.accepting.load(Ordering::SeqCst) {
            continue; // dropped: the client sees its connection close
        }
        let mut connections = lock(&shared.connections);
        while connections.try_join_next().is_some() {}
        connections.spawn(relay(client, shared.clone()));
    }
}

/// Relays one client connection to the server until either side closes,
/// the proxy is cut, or a reply is lost.
async fn relay(mut client: TcpStream, shared: Arc<Shared>) {
    let Ok(startup) = startup_message(&mut client).await else {
        return;
    };
    let Ok(mut server) = TcpStream::connect(&shared.upstream).await else {
        return;
    };
    if server.write_all(&startup).await.is_err() {
        return;
    }
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let syncs = Syncs::default();
    tokio::select! {
        _ = frontend(client_read, server_write, &syncs, &shared) => {}
        _ = backend(server_read, client_write, &syncs, &shared) => {}
    }
}

/// The client's startup message, after answering "no" to any request for
/// encryption (the proxy must read the messages that follow).
async fn startup_message(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    loop {
        let length = client.read_u32().await?;
        let body_length = usize::try_from(length.saturating_sub(4)).unwrap_or(usize::MAX);
        if !(4..=10_000).contains(&body_length) {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let mut message = length.to_be_bytes().to_vec();
        message.resize(4 + body_length, 0);
        client.read_exact(&mut message[4..]).await?;
        let code = u32::from_be_bytes([message[4], message[5], message[6], message[7]]);
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            client.write_all(b"N").await?;
            continue;
        }
        return Ok(message);
    }
}

/// One connection's count of requests that each earn a ReadyForQuery (the
/// startup, every Sync and every simple Query), and the one, if any, whose
/// reply is to be lost.
#[derive(Default)]
struct Syncs {
    sent: AtomicU64,
    /// `(sync number, what it carries)`, set before that Sync is forwarded.
    lose: Mutex<Option<(u64, Armed)>>,
}

/// What an execution whose reply is to be lost was armed by.
#[derive(Debug, Clone)]
enum Armed {
    Statement(Statement),
    /// A fragment of its SQL; the whole text.
    Fragment(String),
}

/// One protocol message: its type byte and its body.
struct Message {
    kind: u8,
    body: Vec<u8>,
}

impl Message {
    async fn read(from: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Message> {
        let kind = from.read_u8().await?;
        let length = from.read_u32().await?;
        let mut body = vec![0; usize::try_from(length.saturating_sub(4)).unwrap_or(0)];
        from.read_exact(&mut body).await?;
        Ok(Message { kind, body })
    }

    async fn write(&self, to: &mut (impl AsyncWrite + Unpin)) -> std::io::Result<()> {
        to.write_u8(self.kind).await?;
        let length = u32::try_from(self.body.len() + 4).expect("a protocol message fits a u32");
        to.write_u32(length).await?;
        to.write_all(&self.body).await
    }

    /// The SQL text of a Parse (after the statement's name) or a Query.
    fn sql(&self) -> Option<String> {
        let text = match self.kind {
            b'P' => {
                let name_end = self.body.iter().position(|b| *b == 0)?;
                &self.body[name_end + 1..]
            }
            b'Q' => &self.body[..],
            _ => return None,
        };
        let end = text.iter().position(|b| *b == 0)?;
        Some(String::from_utf8_lossy(&text[..end]).into_owned())
    }
}

/// Client to server: forwards every message, and marks the Sync whose
/// reply is to be lost when an armed statement is executed.
async fn frontend(
    from: impl AsyncRead + Unpin,
    to: impl AsyncWrite + Unpin,
    syncs: &Syncs,
    shared: &Shared,
) -> std::io::Result<()> {
    let (mut from, mut to) = (BufReader::new(from), BufWriter::new(to));
    syncs.sent.store(1, Ordering::SeqCst); // the startup's ReadyForQuery
    // The SQL last parsed: the unnamed statement that a Bind then executes.
    let mut parsed: Option<String> = None;
    // An armed statement executed since the last Sync.
    let mut executed: Option<Armed> = None;
    loop {
        let message = Message::read(&mut from).await?;
        if matches!(message.kind, b'E' | b'Q') {
            shared.executions.fetch_add(1, Ordering::SeqCst);
        }
        match message.kind {
            b'P' => parsed = message.sql(),
            b'E' => executed = parsed.as_deref().and_then(|sql| shared.armed_by(sql)),
            b'S' => syncs.mark(executed.take()),
            b'Q' => syncs.mark(
                message
                    .sql()
                    .as_deref()
                    .and_then(|sql| shared.armed_by(sql)),
            ),
            _ => {}
        }
        // Marked before it is forwarded: the server cannot answer it sooner.
        message.write(&mut to).await?;
        if from.buffer().is_empty() {
            to.flush().await?;
        }
    }
}

impl Syncs {
    /// Counts one more request that earns a ReadyForQuery, whose reply is
    /// lost if it carries an armed `statement`.
    fn mark(&self, armed: Option<Armed>) {
        let number = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(armed) = armed {
            *lock(&self.lose) = Some((number, armed));
        }
    }
}

/// Server to client: forwards every message until the reply to be lost
/// begins, then swallows it through its ReadyForQuery and returns, which
/// closes both sockets.
async fn backend(
    from: impl AsyncRead + Unpin,
    to: impl AsyncWrite + Unpin,
    syncs: &Syncs,
    shared: &Shared,
) -> std::io::Result<()> {
    let (mut from, mut to) = (BufReader::new(from), BufWriter::new(to));
    let mut ready = 0_u64;
    loop {
        let message = Message::read(&mut from).await?;
        let lose = lock(&syncs.lose).clone();
        if let Some((number, armed)) = lose
            && ready + 1 == number
        {
            // Everything before this reply reaches the client; none of it.
            to.flush().await?;
            if message.kind == b'Z' {
                match armed {
                    Armed::Statement(statement) => lock(&shared.lost).push(LostReply {
                        statement,
                        at: Instant::now(),
                    }),
                    Armed::Fragment(sql) => lock(&shared.lost_fragments).push(sql),
                }
                return Ok(());
            }
            continue;
        }
        message.write(&mut to).await?;
        if message.kind == b'Z' {
            ready += 1;
        }
        if from.buffer().is_empty() {
            to.flush().await?;
        }
    }
}

impl Shared {
    /// What, if anything, armed the loss of the reply to `sql`: its
    /// statement, or a fragment of it (each disarmed as it fires).
    fn armed_by(&self, sql: &str) -> Option<Armed> {
        if let Some(statement) = Statement::of(sql).filter(|s| self.take_armed(*s)) {
            return Some(Armed::Statement(statement));
        }
        let mut fragments = lock(&self.armed_fragments);
        let position = fragments.iter().position(|f| sql.contains(f))?;
        fragments.swap_remove(position);
        Some(Armed::Fragment(sql.to_owned()))
    }

    /// Disarms `statement` if it was armed; `true` if it was.
    fn take_armed(&self, statement: Statement) -> bool {
        let mut armed = lock(&self.armed);
        let position = armed.iter().position(|a| *a == statement);
        position.map(|at| armed.swap_remove(at)).is_some()
    }
}
