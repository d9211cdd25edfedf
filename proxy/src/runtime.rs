//! Starting and stopping a proxy instance: binds the listener, opens the
//! ledger store, wires the session manager's events to the single writer,
//! and shuts everything down in order (stop accepting, drain requests, drain
//! the writer).

use crate::app::{App, FrontConfig, Metrics};
use crate::server;
use crate::sessions::{
    EventSink, Resync, SessionLimits, SessionManager, Settings, SpendSeed, Spent,
};
use crate::upstream::{Upstream, UpstreamOptions};
use oceancode_ledger::store::{open_ledger, StoreOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Sessions idle this long leave memory.
pub const IDLE_EVICT_MS: i64 = 15 * 60 * 1000;

/// Everything needed to start a proxy.
#[derive(Clone)]
pub struct ProxyOptions {
    /// Address to listen on (port 0 = any free port).
    pub listen: SocketAddr,
    /// Front settings (upstreams, limits, data dir).
    pub front: FrontConfig,
    /// Upstream client settings.
    pub upstream: UpstreamOptions,
    /// Tideline/session settings.
    pub sessions: Settings,
    /// Ledger store settings; None = no ledger on disk.
    pub store: Option<StoreOptions>,
    /// Per-session bounds on spend, steps and time (`limits.session`).
    pub limits: SessionLimits,
    /// The ledger's PostgreSQL URL (`ledger.database`); None = SQLite in
    /// the data dir.
    pub database: Option<String>,
    /// The live merge of `SESSION.md` (None: off; needs the ledger).
    pub merge: Option<crate::merge::MergeOptions>,
    /// OpenTelemetry export (`telemetry.otlp`; None: off).
    pub telemetry: Option<crate::telemetry::OtlpOptions>,
}

/// Why a proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The ledger could not open.
    #[error("cannot open the ledger in {dir}: {source}")]
    Store {
        /// Data dir.
        dir: String,
        /// Cause.
        source: oceancode_ledger::store::StoreError,
    },
    /// The upstream client could not be built.
    #[error(transparent)]
    Upstream(#[from] crate::error::ProxyError),
    /// The OpenTelemetry export could not start.
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    /// A non-loopback listen address without `--allow-remote`.
    #[error("refusing to listen on {addr}: it is not a loopback address, and the proxy relays API keys and serves the ledger to whoever connects; pass --allow-remote (or set access.allow_remote) to serve other machines (the admin API then needs the admin token from <data dir>/admin-token)")]
    Remote {
        /// Address.
        addr: SocketAddr,
    },
    /// The admin token is too short to guard the admin API.
    #[error("{0}")]
    WeakToken(String),
    /// The admin token could not be read or made.
    #[error("cannot read or make the admin token {path}: {source}")]
    Token {
        /// Token file.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
}

/// Refuse a non-loopback address unless remote use was allowed; warn when it was.
fn check_remote(addr: SocketAddr, opts: &ProxyOptions) -> Result<(), StartError> {
    if crate::access::is_loopback(&addr) {
        return Ok(());
    }
    if !opts.front.access.allow_remote {
        return Err(StartError::Remote { addr });
    }
    tracing::warn!("listening on {addr}, reachable from other machines (--allow-remote): clients there use the API keys they send, and the admin API needs the admin token");
    Ok(())
}

/// The admin token: the configured one, else the data dir's (made at first
/// start), else (ledger off: nothing on disk) one for this run. A token
/// shorter than [`crate::token::MIN_LEN`] is refused.
fn admin_token(opts: &ProxyOptions) -> Result<String, StartError> {
    use crate::token;
    if let Some(t) = opts
        .front
        .access
        .admin_token
        .clone()
        .filter(|t| !t.is_empty())
    {
        return match token::weakness(&t, token::ENV) {
            Some(why) => Err(StartError::WeakToken(why)),
            None => Ok(t),
        };
    }
    let dir = &opts.front.data_dir;
    let file = token::path(dir).display().to_string();
    let err = |source| StartError::Token {
        path: file.clone(),
        source,
    };
    let stored = if opts.store.is_some() {
        Some(token::ensure(dir).map_err(err)?)
    } else {
        token::read(dir).map_err(err)?
    };
    match stored {
        Some(t) => match token::weakness(&t, &file) {
            Some(why) => Err(StartError::WeakToken(why)),
            None => Ok(t),
        },
        None => {
            tracing::info!("the ledger is off, so no admin token is stored: the admin API takes this run's own (set OCEANCODE_ADMIN_TOKEN to choose it)");
            token::generate().map_err(err)
        }
    }
}

/// What a session spent and how many steps it made, read back from the
/// ledger for a session that comes back after a restart (only when a
/// bound is set).
fn spend_seed(
    store: Option<&Arc<dyn oceancode_ledger::store::LedgerStore>>,
    limits: &SessionLimits,
) -> Option<SpendSeed> {
    if !limits.any() {
        return None;
    }
    let store = store?.clone();
    let pricer = limits.pricer.clone();
    Some(Arc::new(move |id: &str| {
        let steps = match store.steps(id) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(session = id, error = %e, "cannot read the session's steps back: its limits count from now");
                return None;
            }
        };
        let price = |m: &str| pricer.as_ref().and_then(|p| p(m));
        let (t, _) = oceancode_ledger::status::totals(&steps, &price);
        Some(Spent {
            usd: t.cost_usd,
            steps: t.steps,
            unpriced: !t.unpriced.is_empty(),
            ..Spent::default()
        })
    }))
}

/// A running proxy.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// Shared state (for tests and the admin API).
    pub app: Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Running {
    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, let open requests finish, drain the ledger writer.
    pub async fn shutdown(mut self) {
        self.stop_inner().await;
    }

    async fn stop_inner(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        // The last requests' spans go out (or are dropped) first.
        self.app.telemetry.flush(Duration::from_secs(5)).await;
        if let Some(store) = &self.app.store {
            let store = store.clone();
            let _ = tokio::task::spawn_blocking(move || store.shutdown()).await;
        }
    }
}

/// Start a proxy with `opts`.
pub async fn start(opts: ProxyOptions) -> Result<Running, StartError> {
    if !crate::access::is_loopback(&opts.listen) && !opts.front.access.allow_remote {
        return Err(StartError::Remote { addr: opts.listen });
    }
    let listener = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: opts.listen,
            source,
        })?;
    start_on(listener, opts).await
}

/// Start a proxy on an already bound listener.
pub async fn start_on(
    listener: TcpListener,
    mut opts: ProxyOptions,
) -> Result<Running, StartError> {
    // Stubs name the ledger directory to the model: it must be absolute.
    if let Ok(abs) = std::path::absolute(&opts.front.data_dir) {
        opts.front.data_dir.clone_from(&abs);
        opts.sessions.data_dir = abs;
    }
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: opts.listen,
        source,
    })?;
    check_remote(addr, &opts)?;
    let store = match &opts.store {
        Some(so) => Some(
            open_ledger(opts.database.as_deref(), &opts.front.data_dir, *so).map_err(|source| {
                StartError::Store {
                    dir: match &opts.database {
                        Some(url) => oceancode_ledger::store::pg::redact_url(url),
                        None => opts.front.data_dir.display().to_string(),
                    },
                    source,
                }
            })?,
        ),
        None => None,
    };
    let sink: EventSink = match &store {
        Some(s) => {
            let s = s.clone();
            Arc::new(move |events| {
                for ev in events {
                    if let Err(e) = s.submit(ev) {
                        tracing::error!(error = %e, "ledger write refused");
                    }
                }
            })
        }
        None => Arc::new(|_events| {}),
    };
    let admin_token = admin_token(&opts)?;
    let upstream = Upstream::new(opts.upstream)?;
    let merge = match (&opts.merge, &store) {
        (Some(m), Some(s)) => Some(crate::merge::Merger::new(
            m.clone(),
            upstream.clone(),
            s.clone(),
        )),
        _ => None,
    };
    let telemetry = match &opts.telemetry {
        Some(o) => {
            let l = &opts.limits;
            let bounds = crate::telemetry::Bounds {
                steps: l.steps,
                spend_usd: l.spend_usd,
                time_s: l.time.map(|d| d.as_secs()),
            };
            crate::telemetry::Telemetry::start(o, bounds)?
        }
        None => crate::telemetry::Telemetry::off(),
    };
    let app = Arc::new(App {
        telemetry,
        merge,
        prices: opts.limits.pricer.clone(),
        bodies: crate::app::BodyBudget::new(opts.front.net.max_bodies_in_flight_bytes),
        admin_token,
        viewer: crate::token::ViewerSessions::default(),
        instance: crate::token::generate().map_err(|source| StartError::Token {
            path: "(the registry's instance secret)".into(),
            source,
        })?,
        cfg: opts.front.clone(),
        upstream,
        sessions: Arc::new(match &store {
            Some(st) => {
                let st = st.clone();
                let healer = st.clone();
                SessionManager::new(opts.sessions.clone(), sink)
                    .with_restorer(Arc::new(move |key: &str| {
                        st.restore_client(key).map_err(Into::into)
                    }))
                    .with_healer(Arc::new(move |id: &str| {
                        // One atomic load while nothing is behind; a session
                        // behind heals once the writer keeps up again.
                        if healer.behind_count() == 0 || !healer.behind(id)?.ready {
                            return None;
                        }
                        match healer.resync(id) {
                            Ok(committed) => Some(Resync { committed }),
                            Err(e) => {
                                tracing::warn!(session = id, error = %e, "ledger resync failed; tried again at the next request");
                                None
                            }
                        }
                    }))
                    .with_recall_tool(opts.front.recall.enabled)
            }
            None => SessionManager::new(opts.sessions.clone(), sink)
                .with_recall_tool(opts.front.recall.enabled),
        }
        .with_budget(opts.limits.clone(), spend_seed(store.as_ref(), &opts.limits))),
        store,
        metrics: Arc::new(Metrics::default()),
        started: Instant::now(),
    });
    // Idle sessions leave memory after 15 minutes (restored from the ledger).
    let weak = Arc::downgrade(&app);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            let Some(app) = weak.upgrade() else { return };
            let gone = app.sessions.evict_idle_ids(IDLE_EVICT_MS);
            if !gone.is_empty() {
                tracing::debug!(sessions = gone.len(), "idle sessions left memory");
            }
            // A shared database: another proxy may serve them now.
            if let Some(store) = &app.store {
                for id in &gone {
                    store.release(id);
                }
            }
        }
    });
    let (tx, rx) = oneshot::channel::<()>();
    let a = app.clone();
    let task = tokio::spawn(async move {
        server::serve(
            listener,
            a,
            async {
                let _ = rx.await;
            },
            Duration::from_secs(30),
        )
        .await;
    });
    Ok(Running {
        addr,
        app,
        stop: Some(tx),
        task: Some(task),
    })
}
