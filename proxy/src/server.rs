//! The HTTP front: accepts client connections (HTTP/1.1 and h2c) within
//! the cap and timers of [`crate::conn`], refuses what the [`crate::access`]
//! rules refuse, and routes: provider paths to the exchange (`exchange/`),
//! the viewer to [`crate::ui`], admin paths and `/metrics` to
//! [`crate::admin`], `OPTIONS *`, `/` and `/favicon.ico` answered here,
//! other paths passed through untouched.

use crate::access;
use crate::admin;
use crate::app::App;
use crate::conn::{self, Activity, InFlight};
use crate::error::{full, BoxError, Envelope, ProxyBody, ProxyError};
use crate::exchange;
use crate::identity;
use crate::upstream;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use oceancode_window::Dialect;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// The most a client connection's read buffer holds (request heads
/// included). 100 agents sending 200 KB bodies at once each hold one (an
/// idle keep-alive connection keeps its own): at 128 KiB that was 25 MB of
/// a 100-session open's peak heap, at 32 KiB 6 MB, for ≈ 5 more reads of
/// the socket per 200 KB body and no CPU per request the load generator
/// could tell apart.
const READ_BUF_MAX: usize = 32 << 10;

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
    // 53 MB of a 100-session open's peak); a request head must fit in it
    // (a longer one is answered 431).
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
        Some((d, _)) => (Some(d), Envelope::from(d), app.upstream_for(d)),
        None => {
            let d = guess_dialect(req.headers());
            (None, Envelope::from(d), app.upstream_for(d))
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
    if crate::ui::is_ui(&path) {
        // The viewer checks the same token, also from its cookie.
        return Ok(crate::ui::handle(app, req).await);
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
        (Some((d, kind)), Some(_)) => {
            exchange::provider_request(&app, d, kind, prefix, uri, base, req).await
        }
        _ => exchange::passthrough(&app, uri, base, req).await,
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
