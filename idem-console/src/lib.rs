//! The operator console: idem's claims in a browser, as an axum `Router`
//! (`idem::console` with the facade's feature `console`; the `idem
//! console` command serves it).
//!
//! The `idem console` command serves it; an axum service can mount the same
//! pages behind its own authentication:
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) {
//! use idem_console::{Console, Operator};
//!
//! let console = Console::new(pool)
//!     // The service's own middleware authenticates, and says who.
//!     .behind_your_auth()
//!     // Resolving and releasing claims: off unless asked for.
//!     .allow_writes(true);
//! let app: axum::Router = axum::Router::new().nest("/ops/idem", console.router());
//! # let _ = app;
//! # }
//! ```
//!
//! # Pages
//!
//! | path | what |
//! |---|---|
//! | `GET /` | the overview, of every account or one (`?account=`): open claims (pending, in doubt, kept failures) counted exactly in each state, and by account, state and action (the first 500 groups); pending past a threshold (`?pending_older_than=5m`); in doubt, oldest first; the schema's version, layout and verification |
//! | `GET /claims` | a list: `state`, `account`, `namespace` (or `without_namespace=1`), `action`, `older_than` (`90s`, `2h`, `7d`), `limit`; `after` is the next page's cursor |
//! | `GET /claim` | one claim (`account`, `address`, `namespace` when it has one): its identity decoded, fence and lineage, state and reason, timestamps, steps, its stored output's size; the values themselves with `values=shown` |
//! | `GET /claim/resolve` | the confirmation of a resolution (`as=succeeded`, `failed` or `release`), naming what will change |
//! | `POST /claim/resolve` | the resolution, through [`operations::resolve_as`](idem_runtime::operations::resolve_as), as `idem claims resolve` does: only a claim pending or in doubt, in the state and under the fence the confirmation showed (its form carries both), never a pending one whose lease is live; exactly once |
//! | `GET /audit` | what `idem audit` finds in the database, when a [`Console::audit`] is given (the command gives its own) |
//!
//! Every link starts where the request found the router (read from the
//! path it was asked by, not from the route it was nested at), so the pages
//! work wherever the router is nested, under a path parameter too.
//!
//! # Security
//!
//! - **Who may look** ([`Access`]): by default only requests addressed to
//!   a loopback name (`127.0.0.1`, `localhost`, `[::1]`), which also stops
//!   a page elsewhere from reaching it through DNS rebinding; with
//!   [`Console::token`], whoever presents the token (a bearer header, its
//!   scheme in any case, or the cookie that opening `?token=...` once
//!   sets), which must resist guessing ([`check_token`]: at least
//!   [`TOKEN_MIN_BITS`], e.g. `openssl rand -hex 32`); with
//!   [`Console::behind_your_auth`], whoever the mounting service lets
//!   through.
//! - **Read-only** unless [`Console::allow_writes`]: no form is shown and
//!   every write is refused.
//! - **CSRF**: every write carries a token bound to a cookie of the
//!   browser's and to a secret of the console's, and is refused from
//!   another site (`Origin`, `Sec-Fetch-Site`).
//! - **Escaping**: every value is HTML-escaped by construction ([maud]);
//!   every control, bidirectional and invisible formatting character is
//!   shown as a `\u{..}` escape, and a backslash in a name as `\\`, by the
//!   rule the `idem` command follows too ([`idem_runtime::shown`]); long names are
//!   cut on the page (the links keep them whole). No page holds such a
//!   character, not even in a field's value or a link (the one exception:
//!   the output an operator typed into a resolution, given back to them as
//!   typed when it is not JSON): names travel in the pages' links and forms
//!   as they are shown, and are read back so, so that a name in a filter
//!   box, submitted unchanged (or copied from the page), filters on the
//!   name itself. (A link made by hand may carry an ordinary name as it
//!   is; a backslash in one is written `\\`.) Stored outputs and
//!   fingerprints are not read unless asked for.
//! - **Audit**: every write attempt leaves exactly one line (`tracing`,
//!   target `idem::console::audit`), whether refused at the door (not
//!   admitted: its method, path, `Host` and `Origin`, and why), refused
//!   later, or applied: who did it ([`Operator`], set by the mounting
//!   service's middleware, or how the request got in), what was asked and
//!   what happened. Every value a request chose is recorded with `Debug`,
//!   so none can end a line and forge another.
//! - Every response is `no-store`, framed by nobody, sends no referrer to
//!   another site, and
//!   runs no script but the console's own (a content security policy).

mod assets;
mod audit_log;
mod handlers;
mod pages;
mod params;
mod security;
mod text;
mod token;

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use sqlx::PgPool;

pub use security::Operator;
pub use token::{TOKEN_MIN_BITS, WeakToken, check_token, token_bits};

/// Who may use the console. See the [module docs](self#security).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Requests addressed to a loopback name only (the `Host` header is
    /// checked: a page on another site cannot reach the console by making
    /// its own name resolve to 127.0.0.1).
    Loopback,
    /// Requests that present this token: `Authorization: Bearer TOKEN` (the
    /// scheme in any case), or the cookie set by opening any page with
    /// `?token=TOKEN` once. It must resist guessing: [`check_token`].
    Token(String),
    /// Whoever the service mounting the router lets through: its own
    /// middleware authenticates (and may say who, with [`Operator`]).
    BehindYourAuth,
}

impl fmt::Debug for Access {
    // The token is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Access::Loopback => f.write_str("Loopback"),
            Access::Token(_) => f.write_str("Token(..)"),
            Access::BehindYourAuth => f.write_str("BehindYourAuth"),
        }
    }
}

/// Runs `idem audit` for the console's `/audit` page: the findings as text,
/// or why they could not be had. The `idem` command gives its own; a
/// service that mounts the console may give none (the page then says so).
pub trait Audit: Send + Sync + 'static {
    /// The findings for the database `pool` is on, as the command prints
    /// them.
    fn findings<'a>(
        &'a self,
        pool: &'a PgPool,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<String, String>> + Send + 'a>>;
}

/// The console: its pool, who may use it, and whether it may write. Build
/// it with [`Console::new`] and its methods, then take its
/// [`router`](Console::router).
#[derive(Clone)]
pub struct Console {
    state: Arc<State>,
}

/// What every handler reads.
struct State {
    pool: PgPool,
    access: Access,
    writes: bool,
    /// The console's own secret: the CSRF tokens are digests of it and of
    /// each browser's cookie, so a cookie planted from elsewhere is not a
    /// token.
    secret: [u8; 32],
    audit: Option<Arc<dyn Audit>>,
}

impl fmt::Debug for Console {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Console")
            .field("access", &self.state.access)
            .field("writes", &self.state.writes)
            .finish_non_exhaustive()
    }
}

impl Console {
    /// A read-only console over `pool`, answering loopback names only
    /// ([`Access::Loopback`]).
    pub fn new(pool: PgPool) -> Console {
        Console {
            state: Arc::new(State {
                pool,
                access: Access::Loopback,
                writes: false,
                secret: security::new_secret(),
                audit: None,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut State)) -> Console {
        match Arc::get_mut(&mut self.state) {
            Some(state) => change(state),
            None => {
                // A clone was taken before this option: a state of our own,
                // with every option set so far.
                let old = &self.state;
                let mut state = State {
                    pool: old.pool.clone(),
                    access: old.access.clone(),
                    writes: old.writes,
                    secret: old.secret,
                    audit: old.audit.clone(),
                };
                change(&mut state);
                self.state = Arc::new(state);
            }
        }
        self
    }

    /// Who may use it ([`Access`]).
    pub fn access(self, access: Access) -> Console {
        self.with(|state| state.access = access)
    }

    /// Only requests that present `token` ([`Access::Token`]): what a
    /// console listening beyond loopback must have. Give one of at least
    /// [`TOKEN_MIN_BITS`] random bits (`openssl rand -hex 32`): a shorter
    /// one is taken, with a warning, and [`check_token`] says why (the
    /// `idem` command refuses it). An empty token lets nobody in.
    pub fn token(self, token: impl Into<String>) -> Console {
        let token = token.into();
        if let Err(weak) = check_token(&token) {
            tracing::warn!(target: "idem::console", "console token: {weak}");
        }
        self.access(Access::Token(token))
    }

    /// Whoever the service mounting the router lets through
    /// ([`Access::BehindYourAuth`]).
    pub fn behind_your_auth(self) -> Console {
        self.access(Access::BehindYourAuth)
    }

    /// Whether operators may resolve and release claims here (off by
    /// default: the pages only read).
    pub fn allow_writes(self, writes: bool) -> Console {
        self.with(|state| state.writes = writes)
    }

    /// What `/audit` shows: `idem audit`'s findings for the database.
    pub fn audit(self, audit: impl Audit) -> Console {
        let audit: Arc<dyn Audit> = Arc::new(audit);
        self.with(|state| state.audit = Some(audit))
    }

    /// The pages, as a router to serve or to nest.
    pub fn router(self) -> Router {
        let state = self.state;
        Router::new()
            .route("/", get(handlers::overview))
            .route("/claims", get(handlers::claims))
            .route("/claim", get(handlers::claim))
            .route(
                "/claim/resolve",
                get(handlers::confirm).post(handlers::resolve),
            )
            .route("/audit", get(handlers::audit))
            .route("/assets/console.css", get(assets::css))
            .route("/assets/console.js", get(assets::js))
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&state),
                security::guard,
            ))
            .with_state(state)
    }
}
