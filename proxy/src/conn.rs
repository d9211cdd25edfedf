//! Client connections: at most `limits.max_connections` open at once, and
//! two timers per connection while no request is in flight: a request head
//! must arrive whole within `limits.header_read_timeout_ms` of its first
//! byte — or of the connection's opening, for its first request: a
//! connection that sends nothing gives its slot back then (slowloris, idle
//! sockets) — and a connection idle for `limits.keepalive_timeout_ms`
//! after a request is closed. A request in flight (its answer still
//! streaming) is never cut by either.
//!
//! At the cap a new connection is not left waiting behind idle ones: the
//! connection idle the longest ([`Open::evict_idle`]: one that never sent a
//! byte first, else a keep-alive one) is closed for it. When every slot has
//! a request in flight it takes one of a few [`RESERVED`] places (where
//! health and admin requests are answered at once, provider requests wait
//! for a slot), and past those it waits in the listen backlog.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Connection limits (from `limits.*`).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// A request head must be whole this long after its first byte.
    pub header_read_timeout: Duration,
    /// A connection without a request in flight is closed after this.
    pub keepalive_timeout: Duration,
}

const NONE: u64 = u64::MAX;

/// What one connection is doing, shared by its I/O, its requests and its
/// watcher.
#[derive(Debug)]
pub struct Activity {
    start: Instant,
    busy: AtomicUsize,
    /// ms since `start` when the last request ended (or the connection opened).
    idle_since: AtomicU64,
    /// ms since `start` when the first byte of a request head arrived (0,
    /// the opening, for the first request); NONE while no head is being read.
    head_since: AtomicU64,
    /// No byte has arrived yet.
    fresh: AtomicBool,
    /// Closed to make room for a new connection ([`Open::evict_idle`]).
    evicted: AtomicBool,
    wake: Notify,
}

/// Why the watcher closes a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// A request head did not arrive whole in time.
    Head,
    /// No request for the keep-alive timeout.
    Idle,
    /// Idle at the connection cap: closed for a new connection.
    Evicted,
}

impl Activity {
    /// A connection that just opened.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            start: Instant::now(),
            busy: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            // The first request's head is timed from the opening.
            head_since: AtomicU64::new(0),
            fresh: AtomicBool::new(true),
            evicted: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// How idle the connection is, for [`Open::evict_idle`]: (0, opened)
    /// when it never sent a byte, (1, idle since) when a keep-alive one has
    /// no request in flight and no head arriving; None when it is busy.
    fn idle_rank(&self) -> Option<(u8, Instant)> {
        if self.busy.load(Ordering::Acquire) > 0 || self.evicted.load(Ordering::Acquire) {
            return None;
        }
        if self.fresh.load(Ordering::Acquire) {
            return Some((0, self.start));
        }
        (self.head_since.load(Ordering::Acquire) == NONE).then(|| {
            let ms = self.idle_since.load(Ordering::Acquire);
            (1, self.start + Duration::from_millis(ms))
        })
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A request started: held until its answer is done (or dropped).
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
        InFlight(self.clone())
    }

    fn bytes_read(&self) {
        if self.fresh.load(Ordering::Relaxed) {
            self.fresh.store(false, Ordering::Release);
        }
        if self.busy.load(Ordering::Acquire) == 0
            && self
                .head_since
                .compare_exchange(NONE, self.now_ms(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.wake.notify_one();
        }
    }

    fn deadline(&self, l: &ConnLimits) -> Option<(Instant, Expired)> {
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        let at = |ms: u64, d: Duration| self.start + Duration::from_millis(ms) + d;
        match self.head_since.load(Ordering::Acquire) {
            NONE => Some((
                at(self.idle_since.load(Ordering::Acquire), l.keepalive_timeout),
                Expired::Idle,
            )),
            h => Some((at(h, l.header_read_timeout), Expired::Head)),
        }
    }

    /// Has a timer run out now (or was the connection evicted)?
    pub fn expired(&self, l: &ConnLimits) -> Option<Expired> {
        if self.evicted.load(Ordering::Acquire) {
            return Some(Expired::Evicted);
        }
        self.deadline(l)
            .filter(|(at, _)| Instant::now() >= *at)
            .map(|(_, why)| why)
    }

    /// Wait until the state changes or a timer may have run out.
    pub async fn changed(&self, l: &ConnLimits) {
        let notified = self.wake.notified();
        match self.deadline(l) {
            Some((at, _)) => {
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }
}

/// The open connections' activity, to find an idle one at the cap.
#[derive(Debug, Default)]
pub struct Open {
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Entry>>,
}

/// An open connection: what it does, and its place.
type Entry = (Arc<Activity>, Arc<Slot>);

/// Which place a connection closed by [`Open::evict_idle`] gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freed {
    /// A slot of the cap.
    Cap,
    /// A reserved place.
    Reserved,
}

impl Open {
    /// A connection opened: its key for [`Open::remove`].
    pub fn add(&self, act: Arc<Activity>, slot: Arc<Slot>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(id, (act, slot));
        id
    }

    /// A connection ended.
    pub fn remove(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    /// Close the connection idle the longest to make room for a new one:
    /// the oldest that never sent a byte, else the keep-alive one idle the
    /// longest; which place it gives back. None when every connection has
    /// a request in flight (or a head arriving).
    pub fn evict_idle(&self) -> Option<Freed> {
        let conns = self.conns.lock();
        let (act, slot) = conns
            .values()
            .filter_map(|c| c.0.idle_rank().map(|r| (r, c)))
            .min_by_key(|(r, _)| *r)
            .map(|(_, c)| c.clone())?;
        drop(conns);
        act.evicted.store(true, Ordering::Release);
        act.wake.notify_one();
        Some(if slot.is_reserved() {
            Freed::Reserved
        } else {
            Freed::Cap
        })
    }
}

/// Connections accepted past `limits.max_connections` when every
/// connection has a request in flight: a health check or an admin request
/// is served on one at once; a provider request on one waits for a slot of
/// the cap ([`Slot::for_provider`]).
pub const RESERVED: usize = 8;

/// A connection's place: a slot of the cap, or one of the [`RESERVED`].
#[derive(Debug)]
pub struct Slot {
    held: Mutex<Held>,
    cap: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug)]
enum Held {
    Cap(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit),
    Reserved(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit),
}

impl Slot {
    /// A slot of the cap (`cap`'s permit).
    pub fn cap(
        p: tokio::sync::OwnedSemaphorePermit,
        cap: Arc<tokio::sync::Semaphore>,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            held: Mutex::new(Held::Cap(p)),
            cap,
        })
    }

    /// A reserved place (the reserve's permit); provider requests on it
    /// wait for a slot of `cap`.
    pub fn reserved(
        p: tokio::sync::OwnedSemaphorePermit,
        cap: Arc<tokio::sync::Semaphore>,
    ) -> Arc<Slot> {
        Arc::new(Slot {
            held: Mutex::new(Held::Reserved(p)),
            cap,
        })
    }

    /// On a reserved place.
    pub fn is_reserved(&self) -> bool {
        matches!(*self.held.lock(), Held::Reserved(_))
    }

    /// Before a provider request: a connection on a reserved place first
    /// takes a slot of the cap (waiting while every slot is busy) and gives
    /// its reserved place back.
    pub async fn for_provider(&self) {
        if !matches!(*self.held.lock(), Held::Reserved(_)) {
            return;
        }
        let Ok(p) = self.cap.clone().acquire_owned().await else {
            return;
        };
        let mut held = self.held.lock();
        if matches!(*held, Held::Reserved(_)) {
            *held = Held::Cap(p);
        }
    }
}

/// A request in flight on a connection; dropping it ends the request.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        if a.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.idle_since.store(a.now_ms(), Ordering::Release);
            a.head_since.store(NONE, Ordering::Release);
            a.wake.notify_one();
        }
    }
}

/// The connection's socket, noting when bytes arrive between requests.
pub struct Watched<T> {
    io: T,
    act: Arc<Activity>,
}

impl<T> Watched<T> {
    /// Wrap `io`.
    pub fn new(io: T, act: Arc<Activity>) -> Self {
        Watched { io, act }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.act.bytes_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Drive one connection to its end: closed by the client, by a timer
/// (`act`, `limits`), or gracefully (`graceful`: hyper's
/// `graceful_shutdown`) once `stop` is true.
pub async fn drive<C, Err>(
    conn: C,
    graceful: impl Fn(Pin<&mut C>),
    act: Arc<Activity>,
    limits: ConnLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    C: Future<Output = Result<(), Err>>,
    Err: std::fmt::Display,
{
    tokio::pin!(conn);
    let mut closing = *stop.borrow();
    if closing {
        graceful(conn.as_mut());
    }
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = act.changed(&limits), if !closing => match act.expired(&limits) {
                Some(Expired::Head) => {
                    tracing::debug!(timeout = ?limits.header_read_timeout, "request head not complete in time: connection closed");
                    return;
                }
                Some(Expired::Idle) => {
                    tracing::debug!(timeout = ?limits.keepalive_timeout, "idle connection closed");
                    closing = true;
                    graceful(conn.as_mut());
                }
                Some(Expired::Evicted) => {
                    tracing::debug!("idle connection closed for a new one (limits.max_connections reached)");
                    if act.fresh.load(Ordering::Acquire) {
                        return;
                    }
                    closing = true;
                    graceful(conn.as_mut());
                }
                None => {}
            },
            r = stop.changed(), if !closing => {
                if r.is_err() || *stop.borrow() {
                    closing = true;
                    graceful(conn.as_mut());
                }
            }
        }
    }
}
