//! `serve`: the proxy itself, until SIGINT/SIGTERM (then requests and the
//! ledger writer drain); also the options `run` starts its private proxy with.

use super::out::errln;
use super::{init_tracing, load, parse_line, runtime_block, Cli, LimitFlags, UpstreamFlags};
use anyhow::Result;
use clap::Args;
use oceancode_config::{self as config, Config};
use oceancode_ledger::store::StoreOptions;
use oceancode_proxy::app::FrontConfig;
use oceancode_proxy::registry::{self, Entry, Registration};
use oceancode_proxy::runtime::{self, ProxyOptions};
use oceancode_proxy::sessions::{ModelLimits, ModelResolver, SessionLimits, Settings};
use oceancode_proxy::token;
use oceancode_proxy::upstream::UpstreamOptions;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// `serve`'s flags.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8787).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    upstreams: UpstreamFlags,
    /// Tideline for all sessions: `40%`, `500k`, `0` (the model's ceiling).
    #[arg(long, value_name = "X")]
    tideline: Option<String>,
    /// Old tool output becomes a pointer at each cut (`ledger.compress`).
    #[arg(long, value_name = "on|off", value_parser = super::parse_on_off)]
    compress: Option<bool>,
    /// Allow a non-loopback listen address (`0.0.0.0:…`, `[::]:…`): other
    /// machines can then use the proxy (the admin API needs the admin token).
    #[arg(long)]
    pub(super) allow_remote: bool,
    #[command(flatten)]
    pub(super) limits: LimitFlags,
    /// Serve the in-band `oceancode_recall` tool (`ledger.recall_tool`).
    #[arg(long)]
    pub(super) recall_tool: bool,
    /// Export OpenTelemetry GenAI spans to this OTLP/HTTP collector
    /// (`telemetry.otlp.endpoint`, e.g. `http://127.0.0.1:6006`).
    #[arg(long, value_name = "URL", value_parser = super::parse_otlp)]
    pub(super) otlp: Option<String>,
}

/// `serve`.
pub fn run(cli: &Cli, a: &ServeArgs) -> Result<i32> {
    let line = a.tideline.as_deref().map(parse_line).transpose()?.flatten();
    let loaded = load(cli, a.listen, &a.upstreams, line, a.compress)?;
    init_tracing(loaded.config.log_filter());
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    if !loaded.config.ledger.enabled && line.is_some() {
        tracing::warn!("--tideline is ignored: the ledger is off (ledger.enabled: false)");
    }
    let opts = proxy_options(&loaded.config, loaded.config.listen)?;
    runtime_block(serve(opts, loaded.config.retention.days))
}

/// What a proxy on `listen` starts with, from the config.
pub(super) fn proxy_options(cfg: &Config, listen: SocketAddr) -> Result<ProxyOptions> {
    let data_dir = cfg.resolved_data_dir(&config::process_env);
    // The headers (credentials) come from this process's environment only.
    let telemetry =
        oceancode_proxy::telemetry::OtlpOptions::from_config(&cfg.telemetry.otlp, &|k| {
            std::env::var(k).ok()
        })?;
    let c = Arc::new(cfg.clone());
    let models: ModelResolver = Arc::new(move |model: &str, learned: Option<u64>| ModelLimits {
        context: config::context_window(model, &c, &config::process_env, learned),
        max_output: config::max_output(model, &c),
    });
    Ok(ProxyOptions {
        listen,
        front: FrontConfig {
            anthropic_upstream: cfg.anthropic_upstream().to_string(),
            openai_upstream: cfg.openai_upstream().to_string(),
            gemini_upstream: cfg.gemini_upstream().to_string(),
            max_body_bytes: cfg.limits.max_body_bytes,
            data_dir: data_dir.clone(),
            idle_stream_timeout: cfg.limits.idle_stream_timeout(),
            net: oceancode_proxy::app::NetLimits::from_config(&cfg.limits),
            access: oceancode_proxy::access::AccessRules::from_config(&cfg.access),
            recall: oceancode_proxy::recall_tool::RecallTool::from_config(&cfg.ledger.recall_tool),
        },
        upstream: UpstreamOptions::from_config(&cfg.limits),
        sessions: Settings {
            data_dir,
            line: cfg.ledger.line_spec(),
            block: cfg.ledger.block_spec(),
            models,
            tideline_enabled: cfg.ledger.enabled,
            live_window: oceancode_proxy::sessions::LIVE_WINDOW,
            state_tokens: cfg
                .ledger
                .state
                .enabled
                .then_some(cfg.ledger.state.max_tokens),
            compress: cfg.ledger.compress,
            seq_tags: cfg.context.seq_tags,
            cold_cut: cfg.ledger.tideline.cold_cut(),
            clock: oceancode_proxy::sessions::Clock::wall(),
        },
        // `ledger.enabled: false`: nothing is recorded, nothing on disk.
        store: cfg.ledger.enabled.then_some(StoreOptions {
            queue_capacity: cfg.writer.queue_capacity,
            queue_bytes: usize::try_from(cfg.writer.queue_bytes).unwrap_or(usize::MAX),
            batch_max: cfg.writer.batch_max,
            lease: std::time::Duration::from_millis(cfg.ledger.lease_ms),
            ..StoreOptions::default()
        }),
        limits: SessionLimits::from_config(&cfg.limits.session, {
            let c = Arc::new(cfg.clone());
            Arc::new(move |model: &str| config::price(model, &c))
        }),
        database: cfg.ledger.postgres_url().map(str::to_string),
        // Opt-in: `ledger.merge.model` and a key in this process's own
        // environment (never a client's).
        merge: cfg
            .ledger
            .enabled
            .then(|| {
                oceancode_proxy::merge::MergeOptions::from_config(cfg, &|k| std::env::var(k).ok())
            })
            .flatten(),
        telemetry,
    })
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How often `serve` runs the retention sweep.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

async fn serve(opts: ProxyOptions, retention_days: u32) -> Result<i32> {
    let data_dir = opts.front.data_dir.clone();
    let running = runtime::start(opts).await?;
    if let (Some(store), true) = (running.app.store.clone(), retention_days > 0) {
        tokio::spawn(async move {
            loop {
                let s = store.clone();
                match tokio::task::spawn_blocking(move || s.sweep(retention_days)).await {
                    Ok(Ok(r)) if !r.removed.is_empty() => tracing::info!(
                        sessions = r.removed.len(),
                        rows = r.rows,
                        "retention sweep removed idle sessions"
                    ),
                    Ok(Ok(_)) => {}
                    Ok(Err(oceancode_ledger::store::StoreError::Closed)) | Err(_) => break,
                    Ok(Err(e)) => tracing::warn!(error = %e, "retention sweep failed"),
                }
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        });
    }
    let registration = register(&running, "serve", None);
    let ledger = ledger_label(&running, &data_dir);
    // One start line (tests and scripts read it), not a log line too.
    errln!(
        "oceancode-proxy listening on http://{} (ledger: {ledger})",
        running.addr
    );
    shutdown_signal().await;
    tracing::info!("shutting down: draining requests and the ledger writer");
    // Out of the registry first: a command no longer picks a proxy that is
    // going away.
    drop(registration);
    running.shutdown().await;
    Ok(0)
}

/// Where the ledger is, or `off` (`ledger.enabled: false`).
pub(super) fn ledger_label(running: &runtime::Running, data_dir: &Path) -> String {
    match running.app.store {
        Some(_) => data_dir.display().to_string(),
        None => "off".to_string(),
    }
}

/// Register a started proxy in its data dir's registry
/// ([`oceancode_proxy::registry`]) until the registration drops; not with
/// the ledger off (nothing on disk then). A failure is logged: the proxy
/// serves anyway, commands then need `--proxy`.
pub(super) fn register(
    running: &runtime::Running,
    kind: &str,
    command: Option<String>,
) -> Option<Registration> {
    running.app.store.as_ref()?;
    let data_dir = &running.app.cfg.data_dir;
    let token_file = token::read(data_dir)
        .ok()
        .flatten()
        .filter(|t| *t == running.app.admin_token)
        .map(|_| token::path(data_dir));
    let mut addr = running.addr;
    if addr.ip().is_unspecified() {
        // `--allow-remote` on 0.0.0.0/[::]: commands here use loopback.
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let entry = Entry {
        url: format!("http://{addr}"),
        pid: std::process::id(),
        started_ms: oceancode_ledger::time::now_ms(),
        kind: kind.to_string(),
        command,
        token_file,
        version: env!("CARGO_PKG_VERSION").to_string(),
        instance: Some(running.app.instance.clone()),
    };
    match registry::register(data_dir, &entry) {
        Ok(r) => {
            let own = entry
                .token_file
                .is_some()
                .then(|| running.app.admin_token.clone());
            Some(r.keep(data_dir, &entry, own))
        }
        Err(e) => {
            tracing::warn!(dir = %registry::dir(data_dir).display(), error = %e, "cannot register the proxy in its data dir: commands need --proxy to find it");
            None
        }
    }
}
