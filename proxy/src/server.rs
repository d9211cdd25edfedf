//! The HTTP front: accepts client connections (HTTP/1.1 and h2c) within
//! the cap and timers of [`crate::conn`], refuses what the [`crate::access`]
//! rules refuse, routes provider paths through the session manager and the
//! usage tap, passes other paths through untouched, and serves the admin API.
//! Request bodies the proxy reads grow with the bytes that arrive, within a
//! budget shared by all connections.

use crate::access::{self, AccessRules};
use crate::admin;
use crate::conn::{self, Activity, ConnLimits, InFlight};
use crate::dialect::{self, Collected};
use crate::error::{full, BoxError, Envelope, ProxyBody, ProxyError};
use crate::identity::{self, ReqKind};
use crate::overflow::{self, Opening};
use crate::sessions::{Prepared, Refusal, Reservation, SessionManager, StepError, Ticket};
use crate::tap::{Framing, TapBody, TapEnd, TapLimits};
use crate::upstream::{self, UpBody, Upstream};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use oceancode_ledger::Dialect;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Runtime settings of the front.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// Anthropic upstream base URL.
    pub anthropic_upstream: String,
    /// OpenAI upstream base URL.
    pub openai_upstream: String,
    /// Gemini upstream base URL.
    pub gemini_upstream: String,
    /// Largest request body read for rewriting.
    pub max_body_bytes: u64,
    /// The data directory.
    pub data_dir: PathBuf,
    /// A streamed answer silent for longer than this is ended with an error.
    pub idle_stream_timeout: Duration,
    /// Connection, body and answer bounds.
    pub net: NetLimits,
    /// Who may use the proxy (remote use, extra `Host` names).
    pub access: AccessRules,
    /// The in-band recall tool (`ledger.recall_tool`).
    pub recall: crate::recall_tool::RecallTool,
}

/// Bounds of the front (`limits.*`; defaults as in the config).
#[derive(Debug, Clone, Copy)]
pub struct NetLimits {
    /// Connection cap and timers.
    pub conn: ConnLimits,
    /// A request body the proxy reads must arrive whole within this.
    pub body_read_timeout: Duration,
    /// Bytes of request bodies held at once across connections.
    pub max_bodies_in_flight_bytes: u64,
    /// What the usage tap may keep and decode of one answer.
    pub tap: TapLimits,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            conn: ConnLimits {
                max_connections: 512,
                header_read_timeout: Duration::from_secs(30),
                keepalive_timeout: Duration::from_secs(90),
            },
            body_read_timeout: Duration::from_secs(120),
            max_bodies_in_flight_bytes: 128 << 20,
            tap: TapLimits::default(),
        }
    }
}

impl NetLimits {
    /// From the config's `limits`.
    pub fn from_config(l: &oceancode_config::LimitsConfig) -> Self {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        NetLimits {
            conn: ConnLimits {
                max_connections: size(l.max_connections),
                header_read_timeout: l.header_read_timeout(),
                keepalive_timeout: l.keepalive_timeout(),
            },
            body_read_timeout: l.body_read_timeout(),
            max_bodies_in_flight_bytes: l.max_bodies_in_flight_bytes,
            tap: TapLimits {
                max_kept: size(l.max_recorded_response_bytes),
                max_decoded: l.max_decoded_response_bytes,
            },
        }
    }
}

/// The bytes of request bodies held across connections, against
/// `limits.max_bodies_in_flight_bytes`. A body whose next bytes do not fit
/// waits (its connection is not read meanwhile, so its client is held back
/// by TCP) until other bodies give theirs back; so that reads always move
/// on, one body at a time may go past the budget (the bytes held stay
/// within the budget plus `limits.max_body_bytes`).
#[derive(Debug)]
pub struct BodyBudget {
    used: AtomicU64,
    max: u64,
    /// One body holds the overdraft.
    over: std::sync::atomic::AtomicBool,
    /// Bytes were given back.
    freed: tokio::sync::Notify,
}

impl BodyBudget {
    /// A budget of `max` bytes.
    pub fn new(max: u64) -> Self {
        BodyBudget {
            used: AtomicU64::new(0),
            max,
            over: std::sync::atomic::AtomicBool::new(false),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Bytes held now.
    pub fn in_use(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&t| t <= self.max)
            })
            .is_ok()
    }
}

/// Bytes of one body held against the [`BodyBudget`]; given back on drop.
struct BodyPermit<'a> {
    budget: &'a BodyBudget,
    held: u64,
    /// It holds the budget's overdraft.
    over: bool,
}

impl BodyPermit<'_> {
    /// Take `n` more bytes: at once when they fit or this body holds the
    /// overdraft, else the overdraft when no body holds it, else once
    /// enough bytes were given back.
    async fn grow(&mut self, n: u64) {
        loop {
            let freed = self.budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.budget.take(n) {
                break;
            }
            if !self.over
                && self
                    .budget
                    .over
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.over = true;
            }
            if self.over {
                self.budget.used.fetch_add(n, Ordering::AcqRel);
                break;
            }
            freed.await;
        }
        self.held += n;
    }

    fn release(&mut self) {
        self.budget
            .used
            .fetch_sub(std::mem::take(&mut self.held), Ordering::AcqRel);
        if std::mem::take(&mut self.over) {
            self.budget.over.store(false, Ordering::Release);
        }
        self.budget.freed.notify_waiters();
    }
}

impl Drop for BodyPermit<'_> {
    fn drop(&mut self) {
        self.release();
    }
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
    /// Requests refused by the access rules or the admin token.
    pub access_denied: AtomicU64,
    /// Requests answered 503: the body budget was spent.
    pub busy: AtomicU64,
    /// Request bodies that did not arrive in time.
    pub body_timeouts: AtomicU64,
    /// Upstream answers cut mid-way.
    pub streams_cut: AtomicU64,
    /// Answers recorded truncated.
    pub answers_truncated: AtomicU64,
    /// Compressed answers whose copy decoded past the bound.
    pub decode_stopped: AtomicU64,
    /// Client connections open now.
    pub connections: AtomicU64,
    /// Requests refused because their session reached a `limits.session` bound.
    pub limit_refusals: AtomicU64,
    /// `oceancode_recall` calls the proxy answered itself.
    pub recalls: AtomicU64,
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
    pub store: Option<std::sync::Arc<dyn oceancode_ledger::store::LedgerStore>>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Start time.
    pub started: Instant,
    /// The admin token every admin route and `/metrics` require.
    pub admin_token: String,
    /// The viewer's sessions (its cookie), handed out for the admin token.
    pub viewer: crate::ui::ViewerSessions,
    /// This run's secret in the proxies registry: a command checks the
    /// proxy at a registered URL holds it before sending the admin token
    /// ([`crate::registry::proof`]).
    pub instance: String,
    /// Request bodies held across connections.
    pub bodies: BodyBudget,
    /// The live merge of `SESSION.md` (None: off).
    pub merge: Option<Arc<crate::merge::Merger>>,
    /// The configured prices (`providers.<id>.models[].price`, else the
    /// built-in table): what `status`, the limits and the viewer price with.
    pub prices: Option<crate::sessions::Pricer>,
}

/// The most a client connection's read buffer holds (request heads
/// included).
const READ_BUF_MAX: usize = 128 << 10;

/// Serve connections from `listener` until `shutdown` resolves, then let
/// in-flight requests finish (up to `grace`).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    let limits = app.cfg.net.conn;
    let max = limits.max_connections.clamp(1, u32::MAX as usize);
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The connection timers are conn's: hyper's header timer (which would
    // also close keep-alive connections between requests) stays off.
    builder.http1().header_read_timeout(None);
    // A connection's read buffer grows to this while a body streams in
    // (hyper's default, ≈ 400 KiB, times 100 agents reading at once was
    // 53 MB of a 100-session open's peak); a request head must fit in it.
    builder.http1().max_buf_size(READ_BUF_MAX);
    tokio::pin!(shutdown);
    let open = Arc::new(conn::Open::default());
    let reserve = Arc::new(tokio::sync::Semaphore::new(conn::RESERVED));
    let mut warned_full: Option<Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // At the cap the connection idle the longest makes room (idle
        // sockets cannot starve a health check or an agent); when every
        // connection has a request in flight, a reserved place (health and
        // admin answered at once); past those this one waits (and those
        // after it, in the listen backlog).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => conn::Slot::cap(s, slots.clone()),
            Err(_) => {
                let freed = open.evict_idle();
                let reserved = match freed {
                    None => reserve.clone().try_acquire_owned().ok(),
                    Some(_) => None,
                };
                match reserved {
                    Some(r) => conn::Slot::reserved(r, slots.clone()),
                    None => {
                        if freed.is_none()
                            && warned_full.is_none_or(|t| t.elapsed() > Duration::from_secs(60))
                        {
                            tracing::warn!(
                                max,
                                "connection cap reached (limits.max_connections): new connections wait"
                            );
                            warned_full = Some(Instant::now());
                        }
                        tokio::select! {
                            // A connection closed for this one: the place it frees.
                            s = slots.clone().acquire_owned(), if freed != Some(conn::Freed::Reserved) => match s {
                                Ok(s) => conn::Slot::cap(s, slots.clone()),
                                Err(_) => break,
                            },
                            r = reserve.clone().acquire_owned(), if freed != Some(conn::Freed::Cap) => match r {
                                Ok(r) => conn::Slot::reserved(r, slots.clone()),
                                Err(_) => break,
                            },
                            _ = &mut shutdown => break,
                        }
                    }
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let act = Activity::new();
        let svc = {
            let app = app.clone();
            let act = act.clone();
            let slot = slot.clone();
            service_fn(move |req| tracked(app.clone(), peer, req, act.begin(), slot.clone()))
        };
        let io = TokioIo::new(conn::Watched::new(stream, act.clone()));
        let c = builder.serve_connection(io, svc).into_owned();
        let stop = stop_rx.clone();
        let metrics = app.metrics.clone();
        metrics.connections.fetch_add(1, Ordering::Relaxed);
        let id = open.add(act.clone(), slot.clone());
        let open = open.clone();
        tokio::spawn(async move {
            conn::drive(c, |c| c.graceful_shutdown(), act, limits, stop).await;
            open.remove(id);
            metrics.connections.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection gives its slot back when it ends.
    let all = async {
        let _ = slots.acquire_many(max as u32).await;
        let _ = reserve.acquire_many(conn::RESERVED as u32).await;
    };
    if tokio::time::timeout(grace, all).await.is_err() {
        tracing::warn!("shutdown grace period ended with requests still open");
    }
}

/// [`handle`], with the request counted as in flight on its connection
/// until its answer's body is done. A request other than health, admin or
/// `/metrics` on a reserved connection first waits for a slot of the cap.
async fn tracked(
    app: Arc<App>,
    peer: SocketAddr,
    req: Request<Incoming>,
    busy: InFlight,
    slot: Arc<conn::Slot>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = req.uri().path();
    if !(path.starts_with("/_oceancode/") || path == "/metrics") {
        slot.for_provider().await;
    }
    let resp = handle(app, peer, req).await?;
    Ok(resp.map(|inner| InFlightBody { inner, _busy: busy }.boxed_unsync()))
}

/// An answer's body holding its request's [`InFlight`].
struct InFlightBody {
    inner: ProxyBody,
    _busy: InFlight,
}

impl Body for InFlightBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// `OPTIONS *`: the server's own capabilities, answered here.
fn options_star() -> Response<ProxyBody> {
    let mut r = Response::new(full(Bytes::new()));
    r.headers_mut().insert(
        header::ALLOW,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    r
}

/// What a browser asks of the proxy's own address, answered here instead
/// of forwarded to a provider: `/` says what this is and where the viewer
/// is, `/favicon.ico` is not found.
fn local_page(method: &Method, path: &str) -> Option<Response<ProxyBody>> {
    if *method != Method::GET && *method != Method::HEAD {
        return None;
    }
    let (status, body) = match path {
        "/" => (
            StatusCode::OK,
            "oceancode-proxy: a proxy for the Anthropic and OpenAI APIs; point a client's base URL here.\n\
             The session viewer is at /_oceancode/ui/: `oceancode-proxy ui` prints the link that opens it.\n",
        ),
        "/favicon.ico" => (StatusCode::NOT_FOUND, ""),
        _ => return None,
    };
    let body = if *method == Method::HEAD { "" } else { body };
    let mut r = Response::new(full(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Some(r)
}

/// Handle one request (never fails: errors become provider-shaped answers).
pub async fn handle(
    app: Arc<App>,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = req.uri().path().to_string();
    let is_admin = path.starts_with("/_oceancode/") || path == "/metrics";
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
    let envelope = if is_admin {
        Envelope::Anthropic
    } else {
        envelope
    };
    let refused = access::check(req.uri(), req.headers(), &app.cfg.access)
        .and_then(|()| access::check_path(&path));
    if let Err(e) = refused {
        app.metrics.access_denied.fetch_add(1, Ordering::Relaxed);
        app.metrics.proxy_errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, path = %path, "request refused");
        return Ok(e.into_response(envelope));
    }
    if req.method() == Method::OPTIONS && req.uri() == "*" {
        return Ok(options_star());
    }
    if req.method() == Method::CONNECT || !path.starts_with('/') {
        app.metrics.proxy_errors.fetch_add(1, Ordering::Relaxed);
        return Ok(ProxyError::BadTarget(format!(
            "{} {} is not a request this proxy serves",
            req.method(),
            req.uri()
        ))
        .into_response(envelope));
    }
    if is_admin {
        return Ok(admin::handle(app, req).await);
    }
    if let Some(r) = local_page(req.method(), &path) {
        return Ok(r);
    }
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
        match e {
            ProxyError::Busy { .. } => {
                app.metrics.busy.fetch_add(1, Ordering::Relaxed);
            }
            ProxyError::BodyTimeout { .. } => {
                app.metrics.body_timeouts.fetch_add(1, Ordering::Relaxed);
            }
            ProxyError::LimitReached(ref hit) => {
                // Logged once per session when reached (`sessions::budget`).
                app.metrics.limit_refusals.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(session = %hit.session, limit = hit.limit.noun(), path = %path, "refused: the session reached a limit");
                return e.into_response(envelope);
            }
            _ => {}
        }
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
pub(crate) fn cpu<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

fn upstream_for(app: &App, d: Dialect) -> String {
    match d {
        Dialect::Anthropic => app.cfg.anthropic_upstream.clone(),
        Dialect::OpenaiChat | Dialect::OpenaiResponses => app.cfg.openai_upstream.clone(),
        Dialect::Gemini => app.cfg.gemini_upstream.clone(),
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

fn relay_head(head: &http::response::Parts) -> http::response::Builder {
    let mut b = Response::builder().status(head.status);
    if let Some(h) = b.headers_mut() {
        *h = upstream::end_to_end(&head.headers, &[]);
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
    let (head, body) = app.upstream.send(up, &base).await?.into_parts();
    relay_head(&head)
        .body(body.map_err(Into::into).boxed_unsync())
        .map_err(|e| ProxyError::BadTarget(e.to_string()))
}

/// The first reservation for a body, and the least a buffer grows by.
const MIN_BODY_GROWTH: usize = 64 << 10;

/// Read a request body whole, within `limits.body_read_timeout_ms`. The
/// buffer grows with the bytes that arrive (doubling, never past the
/// declared `Content-Length` nor `limits.max_body_bytes`): a header alone
/// reserves nothing. Each growth is taken from the budget all connections
/// share (waiting while it is spent, see [`BodyBudget`]), and given back when
/// the permit drops. Each frame is copied as it
/// arrives and dropped, so the connection's read buffer is reused.
async fn read_body(
    app: &App,
    body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyPermit<'_>), ProxyError> {
    let limit = app.cfg.max_body_bytes;
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let wait = app.cfg.net.body_read_timeout;
    match tokio::time::timeout(wait, collect_body(app, body, declared)).await {
        Ok(r) => r,
        Err(_) => Err(ProxyError::BodyTimeout {
            secs: wait.as_secs(),
        }),
    }
}

async fn collect_body(
    app: &App,
    mut body: Incoming,
    declared: Option<u64>,
) -> Result<(Bytes, BodyPermit<'_>), ProxyError> {
    let limit = app.cfg.max_body_bytes;
    let ceiling = usize::try_from(declared.unwrap_or(limit).min(limit)).unwrap_or(usize::MAX);
    let mut permit = BodyPermit {
        budget: &app.bodies,
        held: 0,
        over: false,
    };
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ProxyError::BadRequestBody(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let need = buf.len() + data.len();
        if need as u64 > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        if need > buf.capacity() {
            let grown = buf
                .capacity()
                .saturating_mul(2)
                .max(MIN_BODY_GROWTH)
                .min(ceiling)
                .max(need);
            permit.grow((grown - buf.capacity()) as u64).await;
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok((Bytes::from(buf), permit))
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
    let (mut parts, body) = req.into_parts();
    if !app.sessions.enabled() && !app.sessions.budgeted() {
        // Ledger off: a plain relay whose answer is still read for /metrics.
        let up = upstream_request(&parts, uri, body.boxed(), None);
        let (head, body) = app.upstream.send(up, &base).await?.into_parts();
        return Ok(tap_response(app, dialect, None, head, body));
    }
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let t_read = Instant::now();
    // Held until the upstream answers: the body is in memory until then.
    let (body, _permit) = read_body(app, body, declared).await?;
    let read_us = t_read.elapsed().as_micros() as u64;
    // A content-encoded request body is forwarded as is: never rewritten.
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    let t0 = Instant::now();
    let prepared = if encoded || !app.sessions.enabled() {
        // Never recorded (ledger off, or a body it would not rewrite): only
        // admitted within the bounds of `limits.session`, when one is set.
        app.sessions.prepare_unrecorded(
            dialect,
            kind,
            prefix.as_deref(),
            &parts.headers,
            body,
            encoded,
        )?
    } else {
        let sessions = app.sessions.clone();
        let headers = crate::dialect::gemini::identity_headers(uri.path(), parts.headers.clone());
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
    let Prepared {
        body,
        mut ticket,
        refused,
        reservation,
    } = prepared;
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
            too_long_path(app, &parts, uri, base, resp, t).await
        }
        Some(t) if status == StatusCode::OK && recall => {
            crate::recall_tool::flow::answer(app, &parts, uri, base, sent, resp, t, false).await
        }
        Some(t) if status == StatusCode::OK && holds_opening(app, &t, resp.headers()) => {
            overflow_in_stream_path(app, &parts, uri, base, resp, t).await
        }
        ticket => {
            let (head, body) = resp.into_parts();
            Ok(tap_response_charged(
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
fn failed(ticket: Option<Ticket>, e: ProxyError) -> ProxyError {
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

/// Parse the ceiling out of a context-limit error body, if it is one
/// (see [`overflow::context_limit`]).
pub fn too_long_ceiling(dialect: Dialect, body: &[u8]) -> Option<Option<u64>> {
    overflow::context_limit(dialect, body).map(|l| l.ceiling)
}

/// How much of a 400/413 answer is read to tell a too-long error (they are
/// small); a longer answer is relayed as it comes, whatever its size.
pub(crate) const ERROR_PEEK: usize = 1 << 20;

async fn too_long_path(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    resp: Response<Incoming>,
    mut ticket: Ticket,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (head, mut body) = resp.into_parts();
    let status = head.status.as_u16();
    let encoded = head.headers.contains_key(header::CONTENT_ENCODING);
    let mut read: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                let e = ProxyError::Unreachable {
                    upstream: base.clone(),
                    reason: format!("error body could not be read: {e}"),
                };
                ticket.fail(e.status().as_u16(), StepError::Stream);
                return Err(e);
            }
        };
        if let Ok(d) = frame.into_data() {
            read.extend_from_slice(&d);
            if read.len() > ERROR_PEEK {
                // Not a too-long error: relay it unchanged, read so far + the rest.
                let rest = overflow::Held::new(Bytes::from(read), body);
                return Ok(tap_response(app, ticket.dialect, Some(ticket), head, rest));
            }
        }
    }
    let bytes = Bytes::from(read);
    let relay = |bytes: Bytes| -> Result<Response<ProxyBody>, ProxyError> {
        relay_head(&head)
            .body(full(bytes))
            .map_err(|e| ProxyError::BadTarget(e.to_string()))
    };
    let limit = if encoded {
        None
    } else {
        overflow::context_limit(ticket.dialect, &bytes)
    };
    let Some(limit) = limit else {
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    let ceiling = limit.ceiling;
    let sessions = app.sessions.clone();
    sessions.learn_limit(&ticket, limit);
    let retry = cpu(|| sessions.too_long(&mut ticket, ceiling));
    let Some(new_body) = retry else {
        tracing::info!(session = %ticket.session.id, "too long, and nothing left to cut: relaying the error");
        ticket.complete(status, true, &Collected::default());
        return relay(bytes);
    };
    tracing::info!(session = %ticket.session.id, ?ceiling, "too long: cut every closed block, retrying once");
    let len = new_body.len();
    let up = upstream_request(parts, uri.clone(), full_up(new_body.clone()), Some(len));
    let resp = match app.upstream.send(up, &base).await {
        Ok(r) => r,
        Err(e) => return Err(failed(Some(ticket), e)),
    };
    if app.cfg.recall.enabled && resp.status() == StatusCode::OK {
        // The retry's answer goes through the recall loop like any other.
        return crate::recall_tool::flow::answer(
            app, parts, uri, base, new_body, resp, ticket, true,
        )
        .await;
    }
    let (head, body) = resp.into_parts();
    Ok(tap_response(app, ticket.dialect, Some(ticket), head, body))
}

/// A Responses stream worth reading the opening of before relaying it: a
/// plain SSE answer of a step a retry could cut.
fn holds_opening(app: &App, t: &Ticket, h: &http::HeaderMap) -> bool {
    t.dialect == Dialect::OpenaiResponses
        && Framing::from_content_type(h.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()))
            == Framing::Sse
        && h.get(header::CONTENT_ENCODING)
            .is_none_or(|v| v.as_bytes().eq_ignore_ascii_case(b"identity"))
        && app.sessions.can_cut(t)
}

/// A Responses stream that may fail with `context_length_exceeded` inside
/// its 200: its opening events are held back (at most
/// [`overflow::OPENING_HOLD`]); a failure before any output is answered like
/// the 400 (cut every closed block, retry once, the failed stream dropped);
/// anything else is relayed, held bytes first.
async fn overflow_in_stream_path(
    app: &Arc<App>,
    parts: &http::request::Parts,
    uri: http::Uri,
    base: String,
    resp: Response<Incoming>,
    mut ticket: Ticket,
) -> Result<Response<ProxyBody>, ProxyError> {
    let (head, body) = resp.into_parts();
    let (opening, held) = overflow::hold_opening(body, overflow::OPENING_HOLD).await;
    if opening == Opening::Overflow {
        let sessions = app.sessions.clone();
        if let Some(new_body) = cpu(|| sessions.too_long(&mut ticket, None)) {
            tracing::info!(session = %ticket.session.id, "context_length_exceeded inside the stream, before any output: cut every closed block, retrying once");
            drop(held);
            let len = new_body.len();
            let up = upstream_request(parts, uri, full_up(new_body), Some(len));
            let (head, body) = match app.upstream.send(up, &base).await {
                Ok(r) => r.into_parts(),
                Err(e) => return Err(failed(Some(ticket), e)),
            };
            return Ok(tap_response(app, ticket.dialect, Some(ticket), head, body));
        }
        tracing::info!(session = %ticket.session.id, "context_length_exceeded inside the stream, and nothing left to cut: relaying it");
    }
    Ok(tap_response(app, ticket.dialect, Some(ticket), head, held))
}

pub(crate) fn tap_response<B>(
    app: &Arc<App>,
    dialect: Dialect,
    ticket: Option<Ticket>,
    head: http::response::Parts,
    body: B,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    tap_response_charged(app, dialect, ticket, None, head, body)
}

/// [`tap_response`] for a request that records no step but holds spend
/// reserved by `limits.session` (`reservation`): settled with the usage
/// its answer tells, released when it tells none.
fn tap_response_charged<B>(
    app: &Arc<App>,
    dialect: Dialect,
    ticket: Option<Ticket>,
    reservation: Option<Reservation>,
    head: http::response::Parts,
    body: B,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError> + std::fmt::Display,
{
    let relay = relay_head(&head);
    let status = head.status.as_u16();
    let framing = Framing::from_content_type(
        head.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let encoding = head
        .headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let sized = head.headers.contains_key(header::CONTENT_LENGTH);
    let metrics = app.metrics.clone();
    let merge = app.merge.clone();
    let on_finish = Box::new(move |o: crate::tap::TapOutcome| {
        if let (Some(r), Some(u)) = (reservation, o.collected.usage) {
            let model = o.collected.model.clone().unwrap_or_default();
            r.settle(&model, u.plus(o.collected.detail.extra));
        }
        if let Some(u) = o.collected.usage {
            // Billed: the window and what came on top of it (compaction).
            let u = u.plus(o.collected.detail.extra);
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
        if matches!(o.end, TapEnd::Error(_)) {
            metrics.streams_cut.fetch_add(1, Ordering::Relaxed);
        }
        if o.collected.truncated {
            metrics.answers_truncated.fetch_add(1, Ordering::Relaxed);
        }
        if o.decode_stopped {
            metrics.decode_stopped.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = ticket {
            // A client may close right after the terminal event, before the
            // upstream's end of stream: the answer is complete all the same.
            let whole =
                o.end == TapEnd::Complete || (o.end == TapEnd::Cancelled && o.collected.terminal);
            let ok = whole && o.collected.error.is_none();
            let session = t.session.clone();
            if o.end == TapEnd::Cancelled && !whole {
                t.cut_short(status, StepError::Cancelled, &o.collected);
            } else {
                t.complete(status, ok, &o.collected);
            }
            if let Some(m) = &merge {
                // The live merge starts in the background when the cut moved.
                let cut = session.state.lock().meter.cut_upto;
                m.after_step(&session.id, cut);
            }
        }
    });
    let limits = app.cfg.net.tap;
    let mut tap = TapBody::with_limits(
        body,
        framing,
        encoding.as_deref(),
        dialect::collector_keeping(dialect, limits.max_kept),
        on_finish,
        limits,
    )
    .with_idle_timeout(app.cfg.idle_stream_timeout);
    if !sized {
        // A chunked stream can end with one more event; a sized one cannot.
        tap = tap.with_error_event(dialect, framing, encoding.as_deref());
    }
    match relay.body(tap.boxed_unsync()) {
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
