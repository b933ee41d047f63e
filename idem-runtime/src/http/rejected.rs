//! A refusal of the gate as an HTTP response, in the terms of the IETF
//! idempotency-key draft where it has them.

use std::time::Duration;

use http::StatusCode;

use super::Problem;
use crate::error::Rejected;

/// `Retry-After` on a 409 for a request still in flight. Most API requests
/// finish within a second, and one second is the shortest delay HTTP can
/// state that is not "now" (`0` would invite a tight retry loop).
pub const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// `Retry-After` on a 409 for a request whose first attempt's outcome is
/// in doubt. Establishing it takes a reconciler's pass (asking the outside
/// world what happened), which runs on an interval of seconds to minutes:
/// a client retrying every second would only be refused again.
pub const IN_DOUBT_RETRY_AFTER: Duration = Duration::from_secs(30);

/// `Retry-After` on a 503 when idem's store cannot be reached. An outage
/// outlasts a request: a database restart or failover takes seconds, so one
/// or two retries ride it out, while a fleet of clients retrying every
/// second would crowd a database that is coming back.
pub const UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(5);

impl From<&Rejected> for Problem {
    /// The draft fixes three statuses (409 in flight, 422 key reused with
    /// another payload, 503 store down); the others are chosen by what the
    /// client should do next, which the detail also says.
    fn from(rejected: &Rejected) -> Problem {
        match rejected {
            Rejected::InFlight => Problem::idem(
                StatusCode::CONFLICT,
                "in-flight",
                "Request in flight",
                "A request with this Idempotency-Key is still being processed (or its outcome \
                 is not known yet), so this one was not run. Retry it unchanged, with the same \
                 key, after the Retry-After delay.",
            )
            .with_retry_after(IN_FLIGHT_RETRY_AFTER),
            Rejected::KeyReused => Problem::idem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency-Key reused",
                "This Idempotency-Key was already used for a request with a different payload, \
                 so this one was not run. Send a new request under a new key; resend the \
                 original payload to get its result.",
            ),
            Rejected::Unavailable { .. } => Problem::idem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "The server cannot check this Idempotency-Key right now, so the request was not \
                 run. Retry it unchanged, with the same key, after the Retry-After delay.",
            )
            .with_retry_after(UNAVAILABLE_RETRY_AFTER),
            // Not 2xx: the first answer is gone, and a success without it
            // would hand the client a body it cannot read as that answer.
            // No Retry-After: unlike an in-flight 409, retrying never helps.
            Rejected::AlreadyDone => Problem::idem(
                StatusCode::CONFLICT,
                "already-succeeded",
                "Request already succeeded",
                "A request with this Idempotency-Key already succeeded, and its response was not \
                 kept, so it cannot be sent again. Do not retry: the request took effect; look \
                 its result up instead.",
            ),
            // The response was kept for a window, which is over: as a
            // response never kept, said so.
            Rejected::ValueNotKept => Problem::idem(
                StatusCode::CONFLICT,
                "response-no-longer-kept",
                "Request already succeeded",
                "A request with this Idempotency-Key already succeeded; its response was kept \
                 for a while and no longer is, so it cannot be sent again. Do not retry: the \
                 request took effect; look its result up instead.",
            ),
            // Like in flight to the client: the same request, later, gets
            // the answer once it is established.
            Rejected::InDoubt => Problem::idem(
                StatusCode::CONFLICT,
                "outcome-in-doubt",
                "Request outcome being established",
                "The first request with this Idempotency-Key may or may not have taken effect, \
                 and the server is finding out; this one was not run, so nothing happened twice. \
                 Retry the same request, with the same key, after the Retry-After delay.",
            )
            .with_retry_after(IN_DOUBT_RETRY_AFTER),
            // A step of an earlier attempt was cut off: to the client, the
            // same as an outcome in doubt.
            Rejected::StepInDoubt { .. } => Problem::idem(
                StatusCode::CONFLICT,
                "outcome-in-doubt",
                "Request outcome being established",
                "An earlier request with this Idempotency-Key was cut off part way, and the \
                 server is finding out what it did; this one did not run that part again. Retry \
                 the same request, with the same key, after the Retry-After delay.",
            )
            .with_retry_after(IN_DOUBT_RETRY_AFTER),
            // As a request already done: nothing is left to do, and
            // retrying never helps, so no Retry-After.
            Rejected::Superseded => Problem::idem(
                StatusCode::CONFLICT,
                "superseded",
                "Event superseded",
                "A newer event of the same entity was already applied, so this older one was \
                 not run: applying it would roll the entity back. Do not retry it: there is \
                 nothing left to do.",
            ),
            // A definite failure was kept: retrying fails the same way.
            Rejected::AlreadyFailed => Problem::idem(
                StatusCode::CONFLICT,
                "already-failed",
                "Request already failed",
                "A request with this Idempotency-Key already failed definitively, and the \
                 failure was kept. Do not retry it: to try again, send a new request under a \
                 new key.",
            ),
            // To the client this is a key taken by another request, like
            // `KeyReused`, with the same way out: a new key.
            Rejected::Collision { .. } => Problem::idem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-collision",
                "Idempotency-Key unusable",
                "This Idempotency-Key maps to the same record as a different request, so this \
                 one was not run. Send it again under a new key.",
            ),
            // The body ran while the server no longer held the key alone, so
            // the effect may have happened twice: a server-side failure, and
            // the client should look before it acts. A success is kept in the
            // record, so a retry is answered from it and runs nothing.
            Rejected::ClaimLost { .. }
            | Rejected::LeaseLost { .. }
            | Rejected::NotRecorded { .. } => Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "outcome-unknown",
                "Outcome unknown",
                "The request ran, but the server lost its hold on this Idempotency-Key while it \
                 ran, so another attempt may have run it too. Check its effect before acting on \
                 this answer; a retry with the same key does not run it again once it succeeded.",
            ),
            // Neither is the client's doing, and retrying cannot help until
            // the server is fixed: a 500, not a 503, and no Retry-After.
            Rejected::StoreRefused { .. } => Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store-refused",
                "Idempotency store refused the request",
                "The server's idempotency store refused to record this request, so it was not \
                 run. This is a fault in the server's set-up, not an outage: retrying will not \
                 help until it is fixed.",
            ),
            // A claim recorded through the wrong connection: the server's
            // code is at fault, and the request may have run.
            Rejected::WrongConnection { .. } => Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "outcome-unknown",
                "Outcome unknown",
                "The request ran, but the server could not record its outcome. Check its effect \
                 before acting on this answer.",
            ),
            // The handler's code used a step where it cannot: its fault,
            // and nothing of the step ran.
            Rejected::NotGuarded { .. } => Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "step-misused",
                "Request handler misconfigured",
                "The server's handler used an idempotent step where it cannot work, so that step \
                 did not run. This is a fault in the server, not in the request.",
            ),
            Rejected::InvalidOption { .. } => Problem::idem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "invalid-option",
                "Idempotency misconfigured",
                "The server's idempotency settings for this operation are invalid, so the \
                 request was not run. This is a fault in the server, not in the request.",
            ),
            // The account or namespace comes from the request (a path
            // segment can decode to NUL, and to any length; a header cannot
            // hold NUL). Say which rule the name broke.
            Rejected::InvalidScope { scope, reason, .. } => Problem::idem(
                StatusCode::BAD_REQUEST,
                "invalid-scope",
                "Invalid account or namespace",
                format!(
                    "The {scope} name of this request cannot be stored: {reason}. The request \
                     was not run. Do not retry it under that name."
                ),
            ),
        }
    }
}
