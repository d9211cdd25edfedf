//! The loopback HTTP server (HTTP/1.1 and h2c): routing, request recording, scripted
//! replies, delays, per-event body frames and optional gzip.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use flate2::write::GzEncoder;
use flate2::Compression;
use http::header::{HeaderName, HeaderValue, ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::{Mutex, RwLock};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::{JoinHandle, JoinSet};

use crate::analyze::{analyze, schema_stub, Dialect, Endpoint, Reject};
use crate::compaction;
use crate::json::obj;
use crate::plan::{self, Ids};
use crate::render::{self, Ctx};
use crate::script::{Reply, Script, StreamFail, TooLong};
use crate::tokens::TokenMemo;
use crate::usage::{PromptCache, Usage};

/// Largest request body accepted (larger: 413).
const MAX_BODY: usize = 256 * 1024 * 1024;

/// Server configuration.
#[derive(Clone, Debug)]
pub struct FakeConfig {
    /// Loopback address to bind (default `127.0.0.1:0`).
    pub listen: SocketAddr,
    /// Initial script.
    pub script: Script,
    /// Requests with more input tokens get the provider's context-length error.
    pub max_context_tokens: Option<u64>,
    /// Reject structurally invalid conversations with a 400 (default on).
    pub validate: bool,
    /// Gzip response bodies when the request accepts it.
    pub gzip: bool,
    /// Bound of the prompt-cache prefix set and of the token-count memo.
    pub cache_entries: usize,
    /// Anthropic: the request's `max_tokens` counts against `max_context_tokens`
    /// too (older models): input + max_tokens over it gets the `input length and
    /// `max_tokens` exceed context limit` error.
    pub count_max_tokens: bool,
    /// Responses: a streamed request over `max_context_tokens` gets a 200
    /// stream that fails (`response.failed`, `context_length_exceeded`)
    /// instead of the 400.
    pub overflow_in_stream: bool,
    /// Seed of the answers' ids (`msg_…`, Responses item ids); None = the
    /// clock's. Two fakes with the same seed and script answer the same
    /// requests with the same bytes.
    pub id_seed: Option<u64>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            script: Script::default(),
            max_context_tokens: None,
            validate: true,
            gzip: false,
            cache_entries: 100_000,
            count_max_tokens: false,
            overflow_in_stream: false,
            id_seed: None,
        }
    }
}

impl FakeConfig {
    pub fn with_script(mut self, script: Script) -> Self {
        self.script = script;
        self
    }

    pub fn with_max_context(mut self, tokens: u64) -> Self {
        self.max_context_tokens = Some(tokens);
        self
    }

    pub fn with_id_seed(mut self, seed: u64) -> Self {
        self.id_seed = Some(seed);
        self
    }

    pub fn with_validate(mut self, on: bool) -> Self {
        self.validate = on;
        self
    }

    pub fn with_gzip(mut self, on: bool) -> Self {
        self.gzip = on;
        self
    }

    pub fn with_listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    pub fn with_count_max_tokens(mut self, on: bool) -> Self {
        self.count_max_tokens = on;
        self
    }

    pub fn with_overflow_in_stream(mut self, on: bool) -> Self {
        self.overflow_in_stream = on;
        self
    }
}

/// One request as received, with what the fake answered.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Arrival order (0-based).
    pub seq: u64,
    pub method: Method,
    /// Path including the query string.
    pub path: String,
    pub version: Version,
    pub headers: HeaderMap,
    /// Raw body bytes.
    pub body: Bytes,
    /// When the request head arrived.
    pub received_at: Instant,
    pub endpoint: Endpoint,
    /// Status answered.
    pub status: u16,
    /// The request asked for a stream.
    pub stream: bool,
    pub model: Option<String>,
    /// Usage reported to the client (count_tokens: `input_tokens` = the count);
    /// None for errors.
    pub usage: Option<Usage>,
    /// Input tokens computed for the request (also set for too-long and scripted
    /// errors; None when the body was not analyzed).
    pub input_tokens_total: Option<u64>,
}

impl Recorded {
    /// The body parsed as JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// A header value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Clone, Debug)]
struct Settings {
    max_context: Option<u64>,
    validate: bool,
    gzip: bool,
    count_max_tokens: bool,
    overflow_in_stream: bool,
}

struct ScriptState {
    queue: VecDeque<Reply>,
    default: Option<Reply>,
    no_tools: Option<Reply>,
    /// The pointers `follow_pointer` replies followed (their text).
    followed: std::collections::HashSet<String>,
}

impl ScriptState {
    fn new(s: Script) -> Self {
        ScriptState {
            queue: s.replies.into(),
            default: s.default,
            no_tools: s.no_tools,
            followed: std::collections::HashSet::new(),
        }
    }

    fn next(&mut self) -> Reply {
        self.queue
            .pop_front()
            .or_else(|| self.default.clone())
            .unwrap_or_default()
    }
}

struct Shared {
    settings: RwLock<Settings>,
    script: Mutex<ScriptState>,
    recorded: Mutex<Vec<Recorded>>,
    arrived: Notify,
    seq: AtomicU64,
    memo: TokenMemo,
    cache: PromptCache,
    ids: Ids,
}

/// Entry point: `FakeUpstream::start(FakeConfig::default()).await?`.
pub struct FakeUpstream;

impl FakeUpstream {
    /// Binds and serves on the current (multi-threaded) tokio runtime.
    pub async fn start(cfg: FakeConfig) -> anyhow::Result<FakeHandle> {
        if !cfg.listen.ip().is_loopback() {
            bail!("refusing non-loopback listen address {}", cfg.listen);
        }
        let listener = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding {}", cfg.listen))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            settings: RwLock::new(Settings {
                max_context: cfg.max_context_tokens,
                validate: cfg.validate,
                gzip: cfg.gzip,
                count_max_tokens: cfg.count_max_tokens,
                overflow_in_stream: cfg.overflow_in_stream,
            }),
            script: Mutex::new(ScriptState::new(cfg.script)),
            recorded: Mutex::new(Vec::new()),
            arrived: Notify::new(),
            seq: AtomicU64::new(0),
            memo: TokenMemo::new(cfg.cache_entries),
            cache: PromptCache::new(cfg.cache_entries),
            ids: cfg.id_seed.map_or_else(Ids::new, Ids::with_seed),
        });
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, shared.clone(), rx));
        tracing::debug!("fakeup listening on {addr}");
        Ok(FakeHandle {
            addr,
            shared,
            shutdown: tx,
            task: Some(task),
            runtime: None,
        })
    }

    /// Starts on a dedicated 2-thread runtime owned by the handle (for sync callers).
    pub fn start_background(cfg: FakeConfig) -> anyhow::Result<FakeHandle> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fakeup")
            .enable_all()
            .build()?;
        let mut handle = rt.block_on(Self::start(cfg))?;
        handle.runtime = Some(rt);
        Ok(handle)
    }
}

/// A running fake upstream; dropping it stops the server.
pub struct FakeHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        let mut v = self.shared.recorded.lock().clone();
        v.sort_by_key(|r| r.seq);
        v
    }

    /// Number of requests recorded.
    pub fn request_count(&self) -> usize {
        self.shared.recorded.lock().len()
    }

    /// Forgets the recorded requests.
    pub fn clear(&self) {
        self.shared.recorded.lock().clear();
    }

    /// Replaces the script (scripted replies restart from the first).
    pub fn set_script(&self, script: Script) {
        *self.shared.script.lock() = ScriptState::new(script);
    }

    /// Appends one reply to the scripted sequence.
    pub fn push_reply(&self, reply: Reply) {
        self.shared.script.lock().queue.push_back(reply);
    }

    /// Scripted replies not consumed yet.
    pub fn replies_left(&self) -> usize {
        self.shared.script.lock().queue.len()
    }

    pub fn set_max_context_tokens(&self, max: Option<u64>) {
        self.shared.settings.write().max_context = max;
    }

    pub fn set_validate(&self, on: bool) {
        self.shared.settings.write().validate = on;
    }

    pub fn set_gzip(&self, on: bool) {
        self.shared.settings.write().gzip = on;
    }

    pub fn set_count_max_tokens(&self, on: bool) {
        self.shared.settings.write().count_max_tokens = on;
    }

    pub fn set_overflow_in_stream(&self, on: bool) {
        self.shared.settings.write().overflow_in_stream = on;
    }

    /// Forgets every cached prefix (next requests are cold).
    pub fn reset_prompt_cache(&self) {
        self.shared.cache.clear();
    }

    /// Waits until at least `n` requests are recorded.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Recorded>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let have = self.request_count();
            if have >= n {
                return Ok(self.requests());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!("timed out waiting for {n} requests (have {have})");
            }
        }
    }

    /// Stops accepting, lets open connections finish (up to 1 s), then closes them.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let shared = shared.clone();
                    let svc = service_fn(move |req| handle(shared.clone(), req));
                    let conn = builder.serve_connection(TokioIo::new(stream), svc).into_owned();
                    let conn = graceful.watch(conn);
                    conns.spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
    }
    conns.abort_all();
}

/// Response body: one buffer, or frames produced by a task (one per SSE event).
pub(crate) struct FakeBody(BodyInner);

enum BodyInner {
    Full(Option<Bytes>),
    Chan(mpsc::Receiver<Result<Bytes, std::io::Error>>),
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.get_mut().0 {
            BodyInner::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BodyInner::Chan(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(&self.0, BodyInner::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.0 {
            BodyInner::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyInner::Full(None) => SizeHint::with_exact(0),
            BodyInner::Chan(_) => SizeHint::default(),
        }
    }
}

enum OutBody {
    Full(Bytes),
    Events {
        events: Vec<Bytes>,
        chunk_delay: Duration,
        abort_after: Option<usize>,
        /// Pause this long after the first `opening` events.
        open_pause: (usize, Duration),
    },
}

/// What to answer, decided before any byte is sent.
struct Outcome {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: OutBody,
    delay_first: Duration,
    usage: Option<Usage>,
    total: Option<u64>,
    model: Option<String>,
    stream: bool,
}

impl Outcome {
    fn json(status: StatusCode, body: Vec<u8>) -> Self {
        Outcome {
            status,
            headers: vec![(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body: OutBody::Full(Bytes::from(body)),
            delay_first: Duration::ZERO,
            usage: None,
            total: None,
            model: None,
            stream: false,
        }
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((HeaderName::from_static(name), v));
        }
        self
    }

    fn delayed(mut self, ms: u64) -> Self {
        self.delay_first = Duration::from_millis(ms);
        self
    }

    fn into_response(self, gzip: bool, head: bool) -> Response<FakeBody> {
        let mut resp = Response::new(FakeBody(BodyInner::Full(None)));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        for (k, v) in self.headers {
            h.append(k, v);
        }
        if head {
            return resp;
        }
        let body = match self.body {
            OutBody::Full(b) if b.is_empty() => BodyInner::Full(None),
            OutBody::Full(b) if gzip => match gzip_all(&b) {
                Some(z) => {
                    h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                    BodyInner::Full(Some(Bytes::from(z)))
                }
                None => BodyInner::Full(Some(b)),
            },
            OutBody::Full(b) => BodyInner::Full(Some(b)),
            OutBody::Events {
                events,
                chunk_delay,
                abort_after,
                open_pause,
            } => {
                if gzip {
                    h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
                }
                BodyInner::Chan(produce(events, chunk_delay, abort_after, open_pause, gzip))
            }
        };
        *resp.body_mut() = FakeBody(body);
        resp
    }
}

fn gzip_all(b: &[u8]) -> Option<Vec<u8>> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(b).ok()?;
    enc.finish().ok()
}

/// Sends each event as its own frame (gzip: each frame sync-flushed; the last one
/// carries the gzip trailer), waiting `delay` between events.
fn produce(
    events: Vec<Bytes>,
    delay: Duration,
    abort_after: Option<usize>,
    open_pause: (usize, Duration),
    gzip: bool,
) -> mpsc::Receiver<Result<Bytes, std::io::Error>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut enc = gzip.then(|| GzEncoder::new(Vec::new(), Compression::fast()));
        let total = events.len();
        for (i, ev) in events.into_iter().enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if i > 0 && i == open_pause.0 && !open_pause.1.is_zero() {
                tokio::time::sleep(open_pause.1).await;
            }
            if abort_after == Some(i) {
                // Let the connection flush what was sent before breaking it.
                tokio::time::sleep(Duration::from_millis(30)).await;
                let _ = tx
                    .send(Err(std::io::Error::other("stream aborted by script")))
                    .await;
                return;
            }
            let frame = match enc.as_mut() {
                None => ev,
                Some(e) => {
                    let _ = e.write_all(&ev);
                    if i + 1 < total {
                        let _ = e.flush();
                        Bytes::from(std::mem::take(e.get_mut()))
                    } else {
                        let rest = enc.take().and_then(|e| e.finish().ok());
                        Bytes::from(rest.unwrap_or_default())
                    }
                }
            };
            if tx.send(Ok(frame)).await.is_err() {
                return; // client went away
            }
        }
    });
    rx
}

fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    == Some(0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<FakeBody>, Infallible> {
    let received_at = Instant::now();
    let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
    let (parts, incoming) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    let endpoint = Endpoint::route(&parts.method, parts.uri.path());
    let path_model = crate::gemini::path_method(parts.uri.path()).map(|(m, _)| m.to_string());
    let (body, outcome) = match Limited::new(incoming, MAX_BODY).collect().await {
        Ok(c) => {
            let body = c.to_bytes();
            let outcome = match endpoint.dialect() {
                None => not_found(&parts.method, parts.uri.path()),
                Some(_) => {
                    let (s, b) = (shared.clone(), body.clone());
                    tokio::task::spawn_blocking(move || process(&s, endpoint, &b, path_model))
                        .await
                        .unwrap_or_else(|e| {
                            internal_error(endpoint, &format!("fake upstream failed: {e}"))
                        })
                }
            };
            (body, outcome)
        }
        Err(e) => (
            Bytes::new(),
            body_error(endpoint, &format!("cannot read request body: {e}")),
        ),
    };
    let gzip = shared.settings.read().gzip && accepts_gzip(&parts.headers);
    tracing::debug!(
        "{} {} -> {} {:?}",
        parts.method,
        path,
        outcome.status.as_u16(),
        outcome.usage
    );
    shared.recorded.lock().push(Recorded {
        seq,
        method: parts.method.clone(),
        path,
        version: parts.version,
        headers: parts.headers.clone(),
        body,
        received_at,
        endpoint,
        status: outcome.status.as_u16(),
        stream: outcome.stream,
        model: outcome.model.clone(),
        usage: outcome.usage,
        input_tokens_total: outcome.total,
    });
    shared.arrived.notify_waiters();
    if !outcome.delay_first.is_zero() {
        tokio::time::sleep(outcome.delay_first).await;
    }
    Ok(outcome.into_response(gzip, parts.method == Method::HEAD))
}

fn request_id(shared: &Shared) -> String {
    format!("req_fake_{}", shared.ids.hex(24))
}

fn openai_path(path: &str) -> bool {
    [
        "/v1/chat",
        "/v1/responses",
        "/v1/models",
        "/v1/completions",
        "/v1/embeddings",
    ]
    .iter()
    .any(|p| path.starts_with(p))
}

fn not_found(method: &Method, path: &str) -> Outcome {
    if openai_path(path) {
        let msg = format!("Invalid URL ({method} {path})");
        Outcome::json(
            StatusCode::NOT_FOUND,
            render::chat::error(&msg, "invalid_request_error", None, None),
        )
    } else {
        let body = obj! {
            "type": "error",
            "error": obj! { "type": "not_found_error", "message": format!("Not found: {method} {path}") },
        };
        Outcome::json(StatusCode::NOT_FOUND, body.to_vec())
    }
}

/// A 400/413/500 in the dialect's envelope.
fn dialect_error(
    dialect: Option<Dialect>,
    status: StatusCode,
    kind: &str,
    message: &str,
    param: Option<&str>,
) -> Outcome {
    match dialect {
        Some(Dialect::Chat | Dialect::Responses) => {
            Outcome::json(status, render::chat::error(message, kind, param, None))
        }
        Some(Dialect::Gemini) => {
            Outcome::json(status, crate::gemini::error(status.as_u16(), message))
        }
        _ => Outcome::json(
            status,
            render::anthropic::error(kind, message, "req_fake_error"),
        ),
    }
}

fn internal_error(endpoint: Endpoint, message: &str) -> Outcome {
    let kind = match endpoint.dialect() {
        Some(Dialect::Anthropic) | None => "api_error",
        _ => "server_error",
    };
    dialect_error(
        endpoint.dialect(),
        StatusCode::INTERNAL_SERVER_ERROR,
        kind,
        message,
        None,
    )
}

fn body_error(endpoint: Endpoint, message: &str) -> Outcome {
    dialect_error(
        endpoint.dialect(),
        StatusCode::PAYLOAD_TOO_LARGE,
        match endpoint.dialect() {
            Some(Dialect::Anthropic) | None => "request_too_large",
            _ => "invalid_request_error",
        },
        message,
        None,
    )
}

fn invalid(shared: &Shared, dialect: Dialect, message: &str, param: Option<&str>) -> Outcome {
    match dialect {
        Dialect::Gemini => {
            Outcome::json(StatusCode::BAD_REQUEST, crate::gemini::error(400, message))
        }
        Dialect::Anthropic => Outcome::json(
            StatusCode::BAD_REQUEST,
            render::anthropic::error("invalid_request_error", message, &request_id(shared)),
        ),
        _ => Outcome::json(
            StatusCode::BAD_REQUEST,
            render::chat::error(message, "invalid_request_error", param, None),
        ),
    }
}

/// Default maximum reported by `too_long: true` without a configured limit.
fn default_max(dialect: Dialect) -> u64 {
    match dialect {
        Dialect::Anthropic => 200_000,
        Dialect::Chat => 128_000,
        Dialect::Responses => 272_000,
        Dialect::Gemini => 1_048_576,
    }
}

/// The providers' real context-length errors.
fn too_long(shared: &Shared, dialect: Dialect, n: u64, max: u64) -> Outcome {
    let rid = request_id(shared);
    let body = match dialect {
        Dialect::Anthropic => render::anthropic::error(
            "invalid_request_error",
            &format!("prompt is too long: {n} tokens > {max} maximum"),
            &rid,
        ),
        Dialect::Chat => render::chat::error(
            &format!(
                "This model's maximum context length is {max} tokens. However, your messages resulted in {n} tokens. \
                 Please reduce the length of the messages."
            ),
            "invalid_request_error",
            Some("messages"),
            Some("context_length_exceeded"),
        ),
        Dialect::Responses => render::chat::error(
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "invalid_request_error",
            Some("input"),
            Some("context_length_exceeded"),
        ),
        Dialect::Gemini => crate::gemini::too_long(n, max),
    };
    let out = Outcome::json(StatusCode::BAD_REQUEST, body);
    match dialect {
        Dialect::Anthropic => out.header("request-id", &rid),
        _ => out.header("x-request-id", &rid),
    }
}

/// Anthropic's other context error: input and `max_tokens` together over the limit.
fn context_limit(shared: &Shared, n: u64, max_tokens: u64, max: u64) -> Outcome {
    let rid = request_id(shared);
    let body = render::anthropic::error(
        "invalid_request_error",
        &format!(
            "input length and `max_tokens` exceed context limit: {n} + {max_tokens} > {max}, decrease input length or `max_tokens` and try again"
        ),
        &rid,
    );
    Outcome::json(StatusCode::BAD_REQUEST, body).header("request-id", &rid)
}

/// A 200 stream that fails right after its opening events (OpenAI's context
/// overflow as Codex sees it).
fn failed_stream(shared: &Shared, a: &crate::analyze::Analysis, fail: &StreamFail) -> Outcome {
    let ctx = Ctx {
        model: &a.model,
        ids: &shared.ids,
        created: render::unix_now(),
        include_usage: a.include_usage,
    };
    let mut o = sse_outcome(render::responses::failed_stream(
        &ctx,
        &fail.code,
        &fail.message(),
    ));
    o.stream = true;
    let rid = request_id(shared);
    o.header("x-request-id", &rid)
}

/// A 200 `text/event-stream` answer of `events`.
fn sse_outcome(events: Vec<Bytes>) -> Outcome {
    let mut o = Outcome::json(StatusCode::OK, Vec::new());
    o.headers = vec![
        (
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        ),
        (
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        ),
    ];
    o.body = OutBody::Events {
        events,
        chunk_delay: Duration::ZERO,
        abort_after: None,
        open_pause: (0, Duration::ZERO),
    };
    o
}

fn scripted_error(e: &crate::script::ErrorReply) -> Outcome {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match &e.body {
        Value::String(s) => s.clone().into_bytes(),
        Value::Null => Vec::new(),
        v => serde_json::to_vec(v).unwrap_or_default(),
    };
    let mut out = Outcome::json(status, body);
    let has_ct = e
        .headers
        .keys()
        .any(|k| k.eq_ignore_ascii_case("content-type"));
    if has_ct {
        out.headers.clear();
    }
    for (k, v) in &e.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            out.headers.push((k, v));
        }
    }
    out
}

/// Everything CPU-bound about a model request (runs on the blocking pool).
fn process(
    shared: &Shared,
    endpoint: Endpoint,
    body: &[u8],
    path_model: Option<String>,
) -> Outcome {
    let Some(dialect) = endpoint.dialect() else {
        return internal_error(endpoint, "no dialect");
    };
    let settings = shared.settings.read().clone();
    let mut a = match analyze(dialect, body, settings.validate, &shared.memo) {
        Ok(a) => a,
        Err(Reject::BadJson(e)) => {
            return invalid(
                shared,
                dialect,
                &format!("Invalid JSON in request body: {e}"),
                None,
            )
        }
        Err(Reject::Invalid { message, param }) => {
            return invalid(shared, dialect, &message, param.as_deref())
        }
    };
    if dialect == Dialect::Gemini {
        // The model and streaming are the path's.
        a.model = path_model.unwrap_or_default();
        a.stream = endpoint == Endpoint::GeminiStream;
        a.include_usage = true;
    }
    if endpoint == Endpoint::GeminiCount {
        let mut out = Outcome::json(StatusCode::OK, crate::gemini::count(a.total));
        out.model = Some(a.model);
        out.total = Some(a.total);
        return out;
    }
    if endpoint == Endpoint::CountTokens {
        let mut out = Outcome::json(StatusCode::OK, obj! { "input_tokens": a.total }.to_vec());
        out.usage = Some(Usage {
            input_tokens: a.total,
            total_input_tokens: a.total,
            ..Usage::default()
        });
        out.model = Some(a.model);
        out.total = Some(a.total);
        return out;
    }
    if let Some(max) = settings.max_context {
        let over = if a.total > max {
            Some(
                if settings.overflow_in_stream && dialect == Dialect::Responses && a.stream {
                    failed_stream(shared, &a, &StreamFail::context_length_exceeded())
                } else {
                    too_long(shared, dialect, a.total, max)
                },
            )
        } else {
            let reserved = a.max_tokens.unwrap_or(0);
            (settings.count_max_tokens && dialect == Dialect::Anthropic && a.total + reserved > max)
                .then(|| context_limit(shared, a.total, reserved, max))
        };
        if let Some(mut out) = over {
            out.total = Some(a.total);
            out.model = Some(a.model);
            out.stream = a.stream;
            return out;
        }
    }
    if endpoint == Endpoint::ResponsesCompact || a.compaction_trigger {
        let mut out = compact(shared, endpoint, body, &a);
        out.total = Some(a.total);
        out.model = Some(a.model);
        out.stream = a.stream && endpoint == Endpoint::Responses;
        return out;
    }
    let reply = match &a.schema {
        Some(schema) => Reply::text(schema_stub(schema, "").to_string()),
        None => {
            let mut script = shared.script.lock();
            let reply = match script.no_tools.clone().filter(|_| a.no_tools) {
                Some(r) => r,
                None => script.next(),
            };
            crate::pointer::resolve(reply, body, &mut script.followed)
        }
    };
    let mut out = if let Some(e) = &reply.error {
        scripted_error(e)
    } else if let Some(tl) = reply
        .too_long
        .as_ref()
        .filter(|t| **t != TooLong::Flag(false))
    {
        let max = match tl {
            TooLong::Max(m) => *m,
            TooLong::Flag(_) => settings.max_context.unwrap_or(default_max(dialect)),
        };
        too_long(shared, dialect, a.total.max(max + 1), max)
    } else if let Some(tl) = reply
        .context_limit
        .as_ref()
        .filter(|t| **t != TooLong::Flag(false) && dialect == Dialect::Anthropic)
    {
        let max = match tl {
            TooLong::Max(m) => *m,
            TooLong::Flag(_) => settings.max_context.unwrap_or(default_max(dialect)),
        };
        let reserved = a.max_tokens.unwrap_or(4_096);
        context_limit(
            shared,
            a.total.max((max + 1).saturating_sub(reserved)),
            reserved,
            max,
        )
    } else {
        respond(shared, dialect, &reply, &a)
    };
    out.delay_first = Duration::from_millis(reply.delay_first_ms);
    out.total = Some(a.total);
    out.model = Some(a.model);
    out.stream = a.stream;
    out
}

/// Remote compaction (see [`crate::compaction`]): V1's `response.compaction` object,
/// or V2's single `compaction` output item (streamed when asked).
fn compact(
    shared: &Shared,
    endpoint: Endpoint,
    body: &[u8],
    a: &crate::analyze::Analysis,
) -> Outcome {
    let input: Vec<Value> = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut("input").map(Value::take))
        .and_then(|v| match v {
            Value::Array(items) => Some(items),
            Value::String(s) => Some(vec![serde_json::json!({"role": "user", "content": s})]),
            _ => None,
        })
        .unwrap_or_default();
    let encrypted = compaction::seal(&shared.ids, input.len());
    let mut usage = shared.cache.input_usage(Dialect::Responses, a, true);
    usage.output_tokens = shared.memo.text(&encrypted).max(1);
    let item = compaction::item(&shared.ids, &encrypted);
    let ctx = Ctx {
        model: &a.model,
        ids: &shared.ids,
        created: render::unix_now(),
        include_usage: a.include_usage,
    };
    let mut out = if endpoint == Endpoint::ResponsesCompact {
        let mut output = compaction::retained_users(&shared.ids, &input);
        output.push(item);
        Outcome::json(
            StatusCode::OK,
            render::responses::compacted(output, &ctx, &usage),
        )
    } else if a.stream {
        sse_outcome(render::responses::compaction_stream(item, &ctx, &usage))
    } else {
        Outcome::json(
            StatusCode::OK,
            render::responses::compaction_json(item, &ctx, &usage),
        )
    };
    out.usage = Some(usage);
    let rid = request_id(shared);
    out.header("x-request-id", &rid)
}

fn respond(
    shared: &Shared,
    dialect: Dialect,
    reply: &Reply,
    a: &crate::analyze::Analysis,
) -> Outcome {
    let mut input = shared.cache.input_usage(dialect, a, true);
    let edits = if dialect == Dialect::Anthropic {
        crate::context::apply_edits(&a.context, &a.clearable, a.total)
    } else {
        Vec::new()
    };
    clear_edited(&mut input, a, &edits);
    let mut plan = plan::build(dialect, reply, a, input, &shared.memo, &shared.ids);
    plan.edits = edits;
    let compact = dialect == Dialect::Anthropic
        && (reply.compaction.is_some()
            || a.context
                .compact
                .is_some_and(|(trigger, _)| input.total_input_tokens >= trigger));
    if compact {
        compact_first(shared, &mut plan, reply, a, input);
    }
    let ctx = Ctx {
        model: &a.model,
        ids: &shared.ids,
        created: render::unix_now(),
        include_usage: a.include_usage,
    };
    let rid = request_id(shared);
    let (rid_header, json_ct) = match dialect {
        Dialect::Anthropic => ("request-id", "application/json"),
        _ => ("x-request-id", "application/json"),
    };
    let mut out = if a.stream {
        let mut events = match dialect {
            Dialect::Anthropic => render::anthropic::stream(&plan, &ctx),
            Dialect::Chat => render::chat::stream(&plan, &ctx),
            Dialect::Responses => render::responses::stream(&plan, &ctx),
            Dialect::Gemini => crate::gemini::stream(&plan, &ctx),
        };
        let opening = match dialect {
            Dialect::Anthropic => render::anthropic::OPENING_EVENTS,
            Dialect::Chat | Dialect::Gemini => 0,
            Dialect::Responses => render::responses::OPENING_EVENTS,
        };
        if let Some(f) = &reply.fail {
            events.truncate((opening + f.after_events).min(events.len().saturating_sub(1)));
            let msg = f.message();
            events.push(match dialect {
                Dialect::Anthropic => render::anthropic::stream_error(&f.code, &msg),
                Dialect::Chat => render::chat::stream_error(&f.code, &msg),
                Dialect::Gemini => crate::gemini::stream_error(&f.code, &msg),
                Dialect::Responses => {
                    render::responses::failed(events.len() as u64, &ctx, &f.code, &msg)
                }
            });
        }
        let mut o = sse_outcome(events);
        o.body = match o.body {
            OutBody::Events { events, .. } => OutBody::Events {
                events,
                chunk_delay: Duration::from_millis(reply.chunk_delay_ms),
                abort_after: reply.abort_after_events,
                open_pause: (opening, Duration::from_millis(reply.open_delay_ms)),
            },
            other => other,
        };
        o.stream = true;
        o
    } else {
        let body = match dialect {
            Dialect::Anthropic => render::anthropic::json(&plan, &ctx),
            Dialect::Chat => render::chat::json(&plan, &ctx),
            Dialect::Responses => render::responses::json(&plan, &ctx),
            Dialect::Gemini => crate::gemini::json(&plan, &ctx),
        };
        let mut o = Outcome::json(StatusCode::OK, body);
        o.headers[0].1 = HeaderValue::from_static(json_ct);
        o
    };
    if let Some(ct) = reply
        .content_type
        .as_deref()
        .and_then(|ct| HeaderValue::from_str(ct).ok())
    {
        out.headers.retain(|(n, _)| n != CONTENT_TYPE);
        out.headers.push((CONTENT_TYPE, ct));
    }
    // A stream that fails reports no usage.
    out.usage = (reply.fail.is_none() || !a.stream).then_some(plan.usage);
    out.header(rid_header, &rid).delayed(reply.delay_first_ms)
}

/// The input as counted after context edits: what they cleared is not
/// counted, and the prompt cache holds only what precedes the first cleared
/// message.
fn clear_edited(u: &mut Usage, a: &crate::analyze::Analysis, edits: &[crate::context::Applied]) {
    let Some(first) = edits.iter().map(|e| e.first_message).min() else {
        return;
    };
    let cleared: u64 = edits.iter().map(|e| e.cleared_input_tokens).sum();
    let total = u.total_input_tokens.saturating_sub(cleared);
    let seg = a.first_message_seg + first.saturating_sub(a.dropped_messages);
    let before: u64 = a.seg_tokens[..seg.min(a.seg_tokens.len())].iter().sum();
    let read = u.cache_read_input_tokens.min(before).min(total);
    let input = u.input_tokens.min(total - read);
    *u = Usage {
        input_tokens: input,
        cache_creation_input_tokens: total - read - input,
        cache_read_input_tokens: read,
        total_input_tokens: total,
        ..*u
    };
}

/// Server-side compaction before the answer: the summary step reads the whole
/// input (a `compaction` iteration), the answer is sampled from the tools,
/// the system prompt, the summary and the newest message (a `message`
/// iteration, the top-level usage).
fn compact_first(
    shared: &Shared,
    plan: &mut plan::Plan,
    reply: &Reply,
    a: &crate::analyze::Analysis,
    input: Usage,
) {
    let summary = reply
        .compaction
        .clone()
        .unwrap_or_else(|| crate::context::summary(a.messages, input.total_input_tokens));
    let summary_tokens = shared.memo.text(&summary).max(1);
    let compaction = Usage {
        output_tokens: summary_tokens,
        reasoning_tokens: 0,
        ..input
    };
    let head: u64 = a.seg_tokens[..a.first_message_seg.min(a.seg_tokens.len())]
        .iter()
        .sum();
    let newest = if a.messages > 0 {
        a.seg_tokens.last().copied().unwrap_or(0)
    } else {
        0
    };
    let after = head + summary_tokens + 3 + newest;
    let message = Usage {
        input_tokens: after,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
        total_input_tokens: after,
        output_tokens: plan.usage.output_tokens,
        reasoning_tokens: plan.usage.reasoning_tokens,
    };
    plan.usage = message;
    plan.compaction = Some(summary);
    plan.iterations = vec![("compaction", compaction), ("message", message)];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_parsing() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("zstd,gzip"));
        assert!(accepts_gzip(&h));
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("gzip;q=0, br"));
        assert!(!accepts_gzip(&h));
        h.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        assert!(!accepts_gzip(&h));
    }
}
