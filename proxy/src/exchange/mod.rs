//! The exchange: one provider request, from its body to the answer the
//! client gets, in named phases (after pingora's request phases):
//!
//! 1. **read** ([`read`]): the body, whole, within `limits.max_body_bytes`,
//!    the body budget all connections share, and the read timeout;
//! 2. **prepare** (`SessionManager::prepare_request`): match, record, the
//!    tideline, the window; a refusal (`limits.session`) ends here;
//! 3. **send**: the window upstream ([`upstream_request`]);
//! 4. **classify** the answer, and take one branch:
//!    - **relay** ([`relay`]): through the usage tap to the client, which
//!      finishes the step once;
//!    - **too long** ([`retry`]): a 400/413 context-limit error, or a
//!      Responses stream failing with `context_length_exceeded` before any
//!      output: every closed block cut and the request sent once more
//!      ([`retry::retry_after_cut`], the one place that does it);
//!    - **recall** ([`recall`]): the in-band recall tool's internal loop.
//!
//! A path outside the provider routes is passed through ([`passthrough`]).

mod read;
pub(crate) mod recall;
mod relay;
pub(crate) mod retry;

use crate::app::App;
use crate::error::{ProxyBody, ProxyError};
use crate::identity::{ReqKind, Route};
use crate::sessions::{MeterHead, Prepared, Refusal, StepError, Ticket};
use crate::upstream::{self, UpBody};
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use oceancode_window::Dialect;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

#[allow(clippy::too_many_arguments)]
pub(crate) async fn provider_request(
    app: &Arc<App>,
    dialect: Dialect,
    kind: ReqKind,
    prefix: Option<String>,
    uri: http::Uri,
    base: String,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let (mut parts, body) = req.into_parts();
    if !app.sessions.enabled() && !app.sessions.budgeted() {
        // Ledger off: a plain relay whose answer is still read for /metrics.
        let up = upstream_request(&parts, uri, body.boxed(), None);
        let (head, body) = app.upstream.send(up, &base).await?.into_parts();
        return Ok(relay::tap_response(app, dialect, None, head, body));
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let t_read = Instant::now();
    // Held until the upstream answers: the body is in memory until then.
    let (body, _permit) = read::read_body(app, body, declared).await?;
    let read_us = t_read.elapsed().as_micros() as u64;
    // A content-encoded request body is forwarded as is: never rewritten.
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    // The model a Gemini path names (the body does not).
    let model = crate::dialect::gemini::model_of_path(uri.path()).map(str::to_string);
    let t0 = Instant::now();
    let prepared = if encoded || !app.sessions.enabled() {
        // Never recorded (ledger off, or a body it would not rewrite): only
        // admitted within the bounds of `limits.session`, when one is set.
        let route = Route {
            prefix: prefix.as_deref(),
            model: model.as_deref(),
        };
        app.sessions
            .prepare_unrecorded(dialect, kind, route, &parts.headers, body, encoded)?
    } else {
        let sessions = app.sessions.clone();
        let headers = parts.headers.clone();
        let big = body.len() >= crate::cpu::INLINE_MAX;
        let work = move || {
            let route = Route {
                prefix: prefix.as_deref(),
                model: model.as_deref(),
            };
            sessions.prepare_request(dialect, kind, route, &headers, body)
        };
        // CPU work (hashing, parsing new rows, rendering): a large body's
        // moves off the reactor; a small one's (well under a millisecond)
        // costs less than handing the worker's other tasks to another thread.
        if big {
            crate::cpu::run(work)?
        } else {
            work()?
        }
    };
    let prepare_us = t0.elapsed().as_micros() as u64;
    app.metrics
        .prepare_us
        .fetch_add(prepare_us, Ordering::Relaxed);
    let Prepared {
        body,
        mut ticket,
        refused,
        reservation,
    } = prepared;
    if let Some(t) = ticket.as_mut() {
        t.traced(app.telemetry.start_step(t0));
    }
    match refused {
        // A session past a bound of `limits.session`: nothing is forwarded.
        Some(Refusal::Limit(hit)) => return Err(ProxyError::LimitReached(hit)),
        Some(Refusal::Unreadable(why)) => return Err(ProxyError::BadRequestBody(why)),
        None => {}
    }
    let len = body.len();
    let recall = app.cfg.recall.enabled && ticket.is_some();
    if recall {
        // The answer is read whole to find the tool's calls: plain bytes.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
    }
    let sent = body.clone();
    let up = upstream_request(&parts, uri.clone(), full_up(body), Some(len));
    let t_up = Instant::now();
    let resp = match app.upstream.send(up, &base).await {
        Ok(r) => r,
        Err(e) => return Err(failed(ticket, e)),
    };
    let upstream_us = t_up.elapsed().as_micros() as u64;
    let status = resp.status();
    if let Some(t) = ticket.as_mut() {
        // Held until now: a 401/403 leaves no trace of the request.
        t.answered(status.as_u16());
    }
    tracing::debug!(
        read_us,
        upstream_us,
        path = %uri.path(),
        status = status.as_u16(),
        session = ticket.as_ref().map(|t| t.session.id.as_str()).unwrap_or("-"),
        window_rows = ticket.as_ref().map(|t| t.window_rows).unwrap_or(0),
        bytes = len,
        prepare_us,
        "forwarded"
    );
    if status.is_client_error() || status.is_server_error() {
        app.metrics.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }
    match ticket {
        Some(t) if status == StatusCode::BAD_REQUEST || status == StatusCode::PAYLOAD_TOO_LARGE => {
            retry::too_long_path(app, &parts, uri, base, resp, t).await
        }
        Some(t) if status == StatusCode::OK && recall => {
            recall::answer(app, &parts, uri, base, sent, resp, t, false).await
        }
        Some(t) if status == StatusCode::OK && retry::holds_opening(app, &t, resp.headers()) => {
            retry::overflow_in_stream_path(app, &parts, uri, base, resp, t).await
        }
        ticket => {
            let (head, body) = resp.into_parts();
            Ok(relay::tap_response_charged(
                app,
                dialect,
                ticket,
                reservation,
                head,
                body,
            ))
        }
    }
}

/// The upstream call failed: the step is recorded as failed with why.
pub(crate) fn failed(ticket: Option<Ticket>, e: ProxyError) -> ProxyError {
    if let Some(t) = ticket {
        let kind = match e {
            ProxyError::Timeout { .. } => StepError::Timeout,
            _ => StepError::Unreachable,
        };
        t.fail(e.status().as_u16(), kind);
    }
    e
}

pub(crate) fn full_up(b: Bytes) -> UpBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

/// Send `body` (a window the proxy rendered) upstream with the request's
/// head: the retries and the recall loop's continuations.
pub(crate) async fn send(
    app: &App,
    parts: &http::request::Parts,
    uri: &http::Uri,
    base: &str,
    body: &Bytes,
) -> Result<Response<Incoming>, ProxyError> {
    let up = upstream_request(parts, uri.clone(), full_up(body.clone()), Some(body.len()));
    app.upstream.send(up, base).await
}

pub(crate) fn upstream_request(
    parts: &http::request::Parts,
    uri: http::Uri,
    body: UpBody,
    len: Option<usize>,
) -> Request<UpBody> {
    // A body the proxy already read is sent whole: `Expect: 100-continue` no
    // longer applies to it.
    let read: &[&str] = if len.is_some() { &["expect"] } else { &[] };
    let mut headers = upstream::end_to_end(
        &parts.headers,
        &[
            &upstream::OWN_HEADERS[..],
            &["host", "content-length"],
            read,
        ]
        .concat(),
    );
    if let Some(n) = len {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    } else if let Some(cl) = parts.headers.get(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, cl.clone());
    }
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req
}

pub(crate) fn relay_head(head: &http::response::Parts) -> http::response::Builder {
    let mut b = Response::builder().status(head.status);
    if let Some(h) = b.headers_mut() {
        *h = upstream::end_to_end(&head.headers, &[]);
    }
    b
}

/// The meter headers of the answer to a recorded step: `x-oceancode-window`
/// and `x-oceancode-line` (tokens), `x-oceancode-cut` (rows this request
/// cut, 0 for none), `x-oceancode-session` (the ledger's session id). Only
/// headers: the window's bytes, stub and state block carry no number that
/// changes per request.
pub(crate) fn meter_headers(
    mut b: http::response::Builder,
    session: &str,
    m: MeterHead,
) -> http::response::Builder {
    if let Some(h) = b.headers_mut() {
        h.insert("x-oceancode-window", HeaderValue::from(m.window));
        h.insert("x-oceancode-line", HeaderValue::from(m.line));
        h.insert("x-oceancode-cut", HeaderValue::from(m.cut_rows));
        if let Ok(v) = HeaderValue::from_str(session) {
            h.insert("x-oceancode-session", v);
        }
    }
    b
}

/// A path outside the provider routes: streamed both ways, untouched.
pub(crate) async fn passthrough(
    app: &App,
    uri: http::Uri,
    base: String,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.passthrough.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let up = upstream_request(&parts, uri, body.boxed(), None);
    let (head, body) = app.upstream.send(up, &base).await?.into_parts();
    relay_head(&head)
        .body(body.map_err(Into::into).boxed_unsync())
        .map_err(|e| ProxyError::BadTarget(e.to_string()))
}
