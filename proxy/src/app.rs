//! The composition root: what every handler shares ([`App`]): the front's
//! settings ([`FrontConfig`], [`NetLimits`]), the upstream client, the
//! session manager, the store, the counters of `/metrics` ([`Metrics`]),
//! the admin token and the viewer's sessions, and the budget request bodies
//! share ([`BodyBudget`]). Built by [`crate::runtime`]; read by the server,
//! the exchange, the admin API and the viewer. It names no handler.

use crate::access::AccessRules;
use crate::conn::ConnLimits;
use crate::sessions::SessionManager;
use crate::tap::TapLimits;
use crate::upstream::Upstream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
pub(crate) struct BodyPermit<'a> {
    budget: &'a BodyBudget,
    held: u64,
    /// It holds the budget's overdraft.
    over: bool,
}

impl<'a> BodyPermit<'a> {
    /// Nothing held yet against `budget`.
    pub(crate) fn new(budget: &'a BodyBudget) -> Self {
        BodyPermit {
            budget,
            held: 0,
            over: false,
        }
    }

    /// Take `n` more bytes: at once when they fit or this body holds the
    /// overdraft, else the overdraft when no body holds it, else once
    /// enough bytes were given back.
    pub(crate) async fn grow(&mut self, n: u64) {
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
    pub viewer: crate::token::ViewerSessions,
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
    /// OpenTelemetry export (`telemetry.otlp`; off by default).
    pub telemetry: crate::telemetry::Telemetry,
}

impl App {
    /// The upstream base URL of `d`'s provider.
    pub fn upstream_for(&self, d: oceancode_window::Dialect) -> String {
        use oceancode_window::dialect::Provider;
        match Provider::from(d) {
            Provider::Anthropic => self.cfg.anthropic_upstream.clone(),
            Provider::OpenAi => self.cfg.openai_upstream.clone(),
            Provider::Gemini => self.cfg.gemini_upstream.clone(),
        }
    }
}
