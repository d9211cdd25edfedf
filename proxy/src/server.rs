//! The HTTP front: accepts client connections (HTTP/1.1 and h2c), routes
//! provider paths through the session manager and the usage tap, passes other
//! paths through untouched, and serves the admin API.

use crate::admin;
use crate::dialect::{self, Collected};
use crate::error::{full, Envelope, ProxyBody, ProxyError};
use crate::identity::{self, ReqKind};
use crate::sessions::{Prepared, SessionManager, Ticket};
use crate::tap::{Framing, TapBody, TapEnd};
use crate::upstream::{self, UpBody, Upstream};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use oceancode_ledger::Dialect;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Runtime settings of the front.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// Anthropic upstream base URL.
    pub anthropic_upstream: String,
    /// OpenAI upstream base URL.
    pub openai_upstream: String,
    /// Largest request body read for rewriting.
    pub max_body_bytes: u64,
    /// The data directory.
    pub data_dir: PathBuf,
    /// A streamed answer silent for longer than this is ended with an error.
    pub idle_stream_timeout: Duration,
}

/// Request/traffic counters for `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests received on provider routes.
    pub requests: AtomicU64,
    /// Requests passed through on other paths.
    pub passthrough: AtomicU64,
    /// Proxy-made error answers.
    pub proxy_errors: AtomicU64,
    /// Upstream answers with a status ≥ 400.
    pub upstream_errors: AtomicU64,
    /// Streams the client cancelled.
    pub cancelled: AtomicU64,
    /// Input tokens (uncached) reported by upstreams.
    pub input_tokens: AtomicU64,
    /// Output tokens.
    pub output_tokens: AtomicU64,
    /// Cache-read tokens.
    pub cache_read_tokens: AtomicU64,
    /// Cache-write tokens.
    pub cache_write_tokens: AtomicU64,
    /// Microseconds spent preparing requests (parse, match, tideline, render).
    pub prepare_us: AtomicU64,
}

/// Everything a request handler needs.
pub struct App {
    /// Front settings.
    pub cfg: FrontConfig,
    /// Upstream client.
    pub upstream: Upstream,
    /// Sessions and tideline.
    pub sessions: Arc<SessionManager>,
    /// The ledger store (None when the ledger is off).
    pub store: Option<oceancode_ledger::store::Store>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Start time.
    pub started: Instant,
}

/// Serve connections from `listener` until `shutdown` resolves, then let
/// in-flight requests finish (up to `grace`).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let svc = service_fn(move |req| handle(app.clone(), peer, req));
                let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("shutdown grace period ended with requests still open");
    }
}

/// Handle one request (never fails: errors become provider-shaped answers).
pub async fn handle(
    app: Arc<App>,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = req.uri().path().to_string();
    if path.starts_with("/_oceancode/") || path == "/metrics" {
        return Ok(admin::handle(app, req).await);
    }
    let (prefix, rest) = identity::strip_session_prefix(&path);
    let rest = rest.to_string();
    if let Some((d, _)) = identity::route(&rest).filter(|_| is_websocket(req.headers())) {
        return Ok(ProxyError::WebSocket.into_response(Envelope::from(d)));
    }
    let routed = identity::route(&rest).filter(|_| req.method() == Method::POST);
    let (dialect, envelope, base) = match routed {
        Some((d, _)) => (Some(d), Envelope::from(d), upstream_for(&app, d)),
        None => {
            let d = guess_dialect(req.headers());
            (None, Envelope::from(d), upstream_for(&app, d))
        }
    };
    let pq = match req.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.clone(),
    };
    let prefix = match prefix {
        Ok(p) => p,
        Err(e) => return Ok(ProxyError::from(e).into_response(envelope)),
    };
    let uri = match upstream::join(&base, &pq) {
        Ok(u) => u,
        Err(e) => return Ok(e.into_response(envelope)),
    };
    let resp = match (routed, dialect) {
        (Some((d, kind)), Some(_)) => provider_request(&app, d, kind, prefix, uri, base, req).await,
        _ => passthrough(&app, uri, base, req).await,
    };
    Ok(resp.unwrap_or_else(|e| {
        app.metrics.proxy_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, path = %path, "answered with a proxy error");
        e.into_response(envelope)
    }))
}

/// The request asks to switch to WebSocket (`Upgrade: websocket`).
fn is_websocket(h: &http::HeaderMap) -> bool {
    h.get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
        })
}

/// Bodies from this size on are prepared with [`cpu`] (`block_in_place`).
const CPU_INLINE_MAX: usize = 1 << 20;

/// Run CPU-bound work: `block_in_place` on the multi-threaded runtime (so the
/// reactor keeps serving other connections), inline elsewhere.
fn cpu<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn upstream_for(app: &App, d: Dialect) -> String {
    match d {
        Dialect::Anthropic => app.cfg.anthropic_upstream.clone(),
        Dialect::OpenaiChat | Dialect::OpenaiResponses => app.cfg.openai_upstream.clone(),
    }
}

/// Paths outside the provider routes: Anthropic when the request carries
/// Anthropic's headers (or comes from Claude Code), OpenAI otherwise.
fn guess_dialect(h: &http::HeaderMap) -> Dialect {
    let ua = h
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if h.contains_key("anthropic-version")
        || h.contains_key("x-api-key")
        || ua.starts_with("claude-cli")
        || ua.starts_with("Anthropic/")
    {
        Dialect::Anthropic
    } else {
        Dialect::OpenaiChat
    }
}

fn upstream_request(
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

fn relay_head(resp: &Response<Incoming>) -> http::response::Builder {
    let mut b = Response::builder().status(resp.status());
    if let Some(h) = b.headers_mut() {
        *h = upstream::end_to_end(resp.headers(), &[]);
    }
    b
}

async fn passthrough(
    app: &App,
    uri: http::Uri,
    base: String,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.passthrough.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    let up = upstream_request(&parts, uri, body.boxed(), None);
    let resp = app.upstream.send(up, &base).await?;
    let b = relay_head(&resp);
    b.body(resp.into_body().map_err(Into::into).boxed_unsync())
        .map_err(|e| ProxyError::BadTarget(e.to_string()))
}

/// Read a request body whole, into one buffer sized by `Content-Length`.
/// Each frame is copied as it arrives and dropped, so the connection's read
/// buffer is reused instead of growing by the body's size (collecting the
/// frames and then joining them touched twice the body's size in fresh
/// memory: a third of an 8 MB request's CPU was the kernel zeroing pages).
async fn read_body(
    app: &App,
    mut body: Incoming,
    declared: Option<u64>,
) -> Result<Bytes, ProxyError> {
    let limit = app.cfg.max_body_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let mut buf: Vec<u8> = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::BadRequestBody(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if (buf.len() + data.len()) as u64 > limit {
                return Err(ProxyError::BodyTooLarge { limit });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

#[allow(clippy::too_many_arguments)]
async fn provider_request(
    app: &Arc<App>,
    dialect: Dialect,
    kind: ReqKind,
    prefix: Option<String>,
    uri: http::Uri,
    base: String,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, ProxyError> {
    app.metrics.requests.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = req.into_parts();
    if !app.sessions.enabled() {
        // Ledger off: a plain relay whose answer is still read for /metrics.
        let up = upstream_request(&parts, uri, body.boxed(), None);
        let resp = app.upstream.send(up, &base).await?;
        return Ok(tap_response(app, dialect, None, resp));
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let t_read = Instant::now();
    let body = read_body(app, body, declared).await?;
    let read_us = t_read.elapsed().as_micros() as u64;
    // A content-encoded request body is forwarded as is: never rewritten.
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    let t0 = Instant::now();
    let prepared = if encoded {
        Prepared { body, ticket: None }
    } else {
        let sessions = app.sessions.clone();
        let headers = parts.headers.clone();
        let big = body.len() >= CPU_INLINE_MAX;
        let work =
            move || sessions.prepare_request(dialect, kind, prefix.as_deref(), &headers, body);
        // CPU work (hashing, parsing new rows, rendering): a large body's
        // moves off the reactor; a small one's (well under a millisecond)
        // costs less than handing the worker's other tasks to another thread.
        if big {
            cpu(work)?
        } else {
            work()?
        }
    };
    let prepare_us = t0.elapsed().as_micros() as u64;
    app.metrics
        .prepare_us
        .fetch_add(prepare_us, Ordering::Relaxed);
    let Prepared { body, ticket } = prepared;
    let len = body.len();
    let up = upstream_request(&parts, uri.clone(), full_up(body), Some(len));
    let t_up = Instant::now();
    let resp = app.upstream.send(up, &base).await?;
    let upstream_us = t_up.elapsed().as_micros() as u64;
    let status = resp.status();
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
            too_long_path(app, &parts, uri, base, resp, t).await
        }
        ticket => Ok(tap_response(app, dialect, ticket, resp)),
    }
}

fn full_up(b: Bytes) -> UpBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

/// Parse the ceiling out of a too-long error body, if it is one.
pub fn too_long_ceiling(dialect: Dialect, body: &[u8]) -> Option<Option<u64>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    match dialect {
        Dialect::Anthropic => {
            let msg = v.pointer("/error/message")?.as_str()?;
            if !msg.starts_with("prompt is too long") {
                return None;
            }
            // "prompt is too long: N tokens > M maximum"
            let m = msg
                .split('>')
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok());
            Some(m)
        }
        Dialect::OpenaiChat | Dialect::OpenaiResponses => {
            let e = v.get("error")?;
            if e.get("code").and_then(|c| c.as_str()) != Some("context_length_exceeded") {
                return None;
            }
            let msg = e.get("message").and_then(|m| m.as_str()).unwrap_or("");
            let m = msg
                .split("maximum context length is ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok());
            Some(m)
        }
    }
}

async fn too_long_path(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    resp: Response<Incoming>,
    mut ticket: Ticket,
) -> Result<Response<ProxyBody>, ProxyError> {
    let head = relay_head(&resp);
    let status = resp.status().as_u16();
    let encoded = resp.headers().contains_key(header::CONTENT_ENCODING);
    let bytes = match Limited::new(resp.into_body(), 1 << 20).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            return Err(ProxyError::Unreachable {
                upstream: base,
                reason: format!("error body could not be read: {e}"),
            })
        }
    };
    let relay = |bytes: Bytes| -> Result<Response<ProxyBody>, ProxyError> {
        head.body(full(bytes))
            .map_err(|e| ProxyError::BadTarget(e.to_string()))
    };
    let ceiling = if encoded {
        None
    } else {
        too_long_ceiling(ticket.dialect, &bytes)
    };
    let Some(ceiling) = ceiling else {
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    let sessions = app.sessions.clone();
    let retry = cpu(|| sessions.too_long(&mut ticket, ceiling));
    let Some(new_body) = retry else {
        tracing::info!(session = %ticket.session.id, "too long, and nothing left to cut: relaying the error");
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    tracing::info!(session = %ticket.session.id, ?ceiling, "too long: cut every closed block, retrying once");
    let len = new_body.len();
    let up = upstream_request(parts, uri, full_up(new_body), Some(len));
    let resp = app.upstream.send(up, &base).await?;
    Ok(tap_response(app, ticket.dialect, Some(ticket), resp))
}

fn tap_response(
    app: &Arc<App>,
    dialect: Dialect,
    ticket: Option<Ticket>,
    resp: Response<Incoming>,
) -> Response<ProxyBody> {
    let head = relay_head(&resp);
    let status = resp.status().as_u16();
    let framing = Framing::from_content_type(
        resp.headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let encoding = resp
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let metrics = app.metrics.clone();
    let on_finish = Box::new(move |o: crate::tap::TapOutcome| {
        if let Some(u) = o.collected.usage {
            metrics.input_tokens.fetch_add(u.input, Ordering::Relaxed);
            metrics.output_tokens.fetch_add(u.output, Ordering::Relaxed);
            metrics
                .cache_read_tokens
                .fetch_add(u.cache_read, Ordering::Relaxed);
            metrics
                .cache_write_tokens
                .fetch_add(u.cache_write, Ordering::Relaxed);
        }
        if o.end == TapEnd::Cancelled && !o.collected.terminal {
            metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = ticket {
            // A client may close right after the terminal event, before the
            // upstream's end of stream: the answer is complete all the same.
            let whole =
                o.end == TapEnd::Complete || (o.end == TapEnd::Cancelled && o.collected.terminal);
            let ok = whole && o.collected.error.is_none();
            t.complete(status, ok, &o.collected);
        }
    });
    let body = TapBody::new(
        resp.into_body(),
        framing,
        encoding.as_deref(),
        dialect::collector(dialect),
        on_finish,
    )
    .with_idle_timeout(app.cfg.idle_stream_timeout);
    match head.body(body.boxed_unsync()) {
        Ok(r) => r,
        Err(e) => ProxyError::BadTarget(e.to_string()).into_response(Envelope::from(dialect)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_long_errors_are_recognised() {
        let a = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#;
        assert_eq!(too_long_ceiling(Dialect::Anthropic, a), Some(Some(200_000)));
        let o = br#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(
            too_long_ceiling(Dialect::OpenaiChat, o),
            Some(Some(128_000))
        );
        let other = br#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: field required"}}"#;
        assert_eq!(too_long_ceiling(Dialect::Anthropic, other), None);
    }
}
