//! The `oceancode-proxy` command line.

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Parser, Subcommand};
use oceancode_config::{self as config, Config, LineSpec, Overrides};
use oceancode_ledger::rebuild::Progress;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_proxy::runtime::{self, ProxyOptions};
use oceancode_proxy::server::FrontConfig;
use oceancode_proxy::sessions::{line_label, ModelLimits, ModelResolver, Settings};
use oceancode_proxy::upstream::UpstreamOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// mimalloc: large request bodies (up to tens of MB, many at once) are reused
/// from its segments instead of being mapped, faulted in and unmapped per
/// request as with the system allocator; see docs/benchmarks.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A transparent proxy between coding agents and their model APIs that keeps
/// the context under the tideline and a verbatim ledger on the side.
#[derive(Parser, Debug)]
#[command(name = "oceancode-proxy", version, about)]
struct Cli {
    /// Config file (JSON). Default: $OCEANCODE_CONFIG, else
    /// $XDG_CONFIG_HOME/oceancode-proxy/config.json if it exists.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (ledger). Default: $OCEANCODE_DATA_DIR, else
    /// $XDG_DATA_HOME/oceancode-proxy.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the proxy.
    Serve(ServeArgs),
    /// Run a command through a private proxy on a free port (CI wrapper).
    Run(RunArgs),
    /// Inspect the ledger.
    #[command(subcommand)]
    Ledger(LedgerCmd),
    /// Show or change the tideline of a running proxy.
    Tideline(TidelineArgs),
    /// Export a session as one Markdown document or one ATIF-v1.8 trajectory.
    Export(ExportArgs),
    /// Read the verbatim record back: a session's log, one entry, or a search
    /// across sessions (rows hidden by rewinds included).
    Recall(RecallArgs),
    /// The session meter: context (window / line / model context), tokens
    /// in/out, cache hit ratio, spend.
    Status(StatusArgs),
}

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("format").required(true).args(["md", "atif"])))]
struct ExportArgs {
    /// Markdown: frontmatter, every turn, a `## Summary` table.
    #[arg(long)]
    md: bool,
    /// ATIF-v1.8 JSON trajectory.
    #[arg(long)]
    atif: bool,
    /// Session id or unique prefix (default: the most recent session).
    session: Option<String>,
    /// Output file, or `-` for stdout.
    #[arg(long, value_name = "FILE|-", default_value = "-")]
    out: String,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct RecallArgs {
    #[command(subcommand)]
    cmd: Option<RecallCmd>,
    /// Only rows whose text matches (SQL LIKE: `%` and `_` are wildcards).
    #[arg(long = "match", value_name = "TEXT")]
    pattern: Option<String>,
    /// Only rows with a seq below this one (page back with the first seq shown).
    #[arg(long, value_name = "SEQ")]
    before: Option<u64>,
    /// The newest N matching rows (printed oldest first).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Session id or unique prefix (default: the most recent session).
    session: Option<String>,
}

#[derive(Subcommand, Debug)]
enum RecallCmd {
    /// Print one row, whole (rendered; `--raw` for the verbatim JSON).
    Entry {
        /// The row's seq.
        seq: u64,
        /// Session id or unique prefix (default: the most recent session).
        #[arg(long)]
        session: Option<String>,
        /// Print the row's verbatim JSON instead of the rendering.
        #[arg(long)]
        raw: bool,
    },
    /// Search every session, newest first; every word must appear.
    Search {
        /// Words to find.
        #[arg(required = true)]
        words: Vec<String>,
        /// Most hits shown.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Session id or unique prefix (default: the most recent session).
    session: Option<String>,
    /// Print JSON instead of the meter.
    #[arg(long)]
    json: bool,
    /// Admin URL of a running proxy whose live line (runtime overrides
    /// included) is shown when it answers (default: http://<listen>).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
}

#[derive(Args, Debug, Default)]
struct UpstreamFlags {
    /// Anthropic upstream base URL.
    #[arg(long, value_name = "URL")]
    anthropic_upstream: Option<String>,
    /// OpenAI upstream base URL.
    #[arg(long, value_name = "URL")]
    openai_upstream: Option<String>,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8787).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    #[command(flatten)]
    upstreams: UpstreamFlags,
    /// Tideline for all sessions: `40%`, `500k`, `0` (the model's ceiling).
    #[arg(long, value_name = "X")]
    tideline: Option<String>,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Tideline for this run: `50%`, `500k`, `default`.
    #[arg(long, value_name = "X")]
    tideline: Option<String>,
    #[command(flatten)]
    upstreams: UpstreamFlags,
    /// The command to run, after `--`.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum LedgerCmd {
    /// Print a session's ledger directory (default: the most recent session).
    Path {
        /// Session id.
        session: Option<String>,
    },
    /// List sessions: id, client, model, turns, rows, last activity.
    List,
    /// Rebuild transcripts, index.md, SESSION.md and the search index from
    /// the database alone (no model call; byte-identical to the live writer).
    Rebuild {
        /// Session id or unique prefix (default: the most recent session).
        session: Option<String>,
        /// Rebuild every session.
        #[arg(long, conflicts_with = "session")]
        all: bool,
        /// Also fold the merge backlog into SESSION.md with the model of
        /// `ledger.merge.model` (model calls; asks y/N).
        #[arg(long)]
        merge: bool,
        /// Do not ask before the model calls of `--merge`.
        #[arg(long, requires = "merge")]
        yes: bool,
    },
    /// Apply `retention.days` now, then compact the database.
    Vacuum,
}

#[derive(Args, Debug)]
struct TidelineArgs {
    /// Session id (default: all sessions for a set, the latest for `now`).
    #[arg(long)]
    session: Option<String>,
    /// Admin URL of the running proxy (default: http://<listen>).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    /// `50%`, `500k`, `now` or `default`; none shows the state.
    value: Vec<String>,
    /// Print the admin API's JSON answer instead of one line.
    #[arg(long)]
    json: bool,
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Run(_)) {
        // A report piped into `head` ends quietly, as other command-line
        // tools do, instead of panicking on the closed stdout. (The proxy
        // itself keeps SIGPIPE ignored: a closed socket is an error to
        // handle, not a reason to exit.)
        // SAFETY: called before any thread is started; SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match real_main(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("oceancode-proxy: {}", error_chain(&e));
            std::process::exit(2);
        }
    }
}

/// An error and its causes, `: `-joined, each cause once: the crates'
/// errors already name their source in their own message.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

fn parse_line(s: &str) -> Result<Option<LineSpec>> {
    if s.trim().eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    match s.parse::<config::Amount>() {
        Ok(config::Amount::Percent(p)) => Ok(Some(LineSpec::Percent(p))),
        Ok(config::Amount::Tokens(t)) if t == 0 || t >= config::MIN_FIXED_LINE => {
            Ok(Some(LineSpec::Tokens(t)))
        }
        Ok(config::Amount::Tokens(_)) => bail!(
            "the smallest fixed tideline is 20k\n{}",
            config::TIDELINE_USAGE
        ),
        Err(e) => bail!("{e}\n{}", config::TIDELINE_USAGE),
    }
}

fn load(
    cli: &Cli,
    listen: Option<SocketAddr>,
    up: &UpstreamFlags,
    tideline: Option<LineSpec>,
) -> Result<config::Loaded> {
    let overrides = Overrides {
        listen,
        data_dir: cli.data_dir.clone(),
        anthropic_upstream: up.anthropic_upstream.clone(),
        openai_upstream: up.openai_upstream.clone(),
        tideline,
    };
    let loaded = Config::resolve(cli.config.as_deref(), &config::process_env, &overrides)?;
    // The log filter is checked here, where a bad one can still stop the
    // command with an error that names where it came from.
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(loaded.config.log_filter()) {
        let from = if std::env::var_os("OCEANCODE_LOG").is_some_and(|v| !v.is_empty()) {
            "environment variable OCEANCODE_LOG"
        } else {
            "log"
        };
        bail!("config: {from}={:?}: {e}", loaded.config.log_filter());
    }
    if !matches!(cli.command, Command::Serve(_)) {
        // `serve` logs them once its log is set up.
        for w in &loaded.warnings {
            eprintln!("oceancode-proxy: {w}");
        }
    }
    Ok(loaded)
}

/// The data directory, absolute: the paths the commands print and export
/// (`ledger path`, ATIF's `transcript_dir`) must work from anywhere, as the
/// stub's do.
fn data_dir(cfg: &Config) -> PathBuf {
    let dir = cfg.resolved_data_dir(&config::process_env);
    std::path::absolute(&dir).unwrap_or(dir)
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OCEANCODE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn proxy_options(cfg: &Config, listen: SocketAddr) -> ProxyOptions {
    let data_dir = cfg.resolved_data_dir(&config::process_env);
    let c = Arc::new(cfg.clone());
    let models: ModelResolver = Arc::new(move |model: &str, learned: Option<u64>| ModelLimits {
        context: config::context_window(model, &c, &config::process_env, learned),
        max_output: config::max_output(model, &c),
    });
    ProxyOptions {
        listen,
        front: FrontConfig {
            anthropic_upstream: cfg.anthropic_upstream().to_string(),
            openai_upstream: cfg.openai_upstream().to_string(),
            max_body_bytes: cfg.limits.max_body_bytes,
            data_dir: data_dir.clone(),
            idle_stream_timeout: cfg.limits.idle_stream_timeout(),
        },
        upstream: UpstreamOptions {
            connect_timeout: cfg.limits.connect_timeout(),
            header_timeout: cfg.limits.response_header_timeout(),
        },
        sessions: Settings {
            data_dir,
            line: cfg.ledger.line_spec(),
            block: cfg.ledger.block_spec(),
            models,
            tideline_enabled: cfg.ledger.enabled,
        },
        // `ledger.enabled: false`: nothing is recorded, nothing on disk.
        store: cfg.ledger.enabled.then_some(StoreOptions {
            queue_capacity: cfg.writer.queue_capacity,
            batch_max: cfg.writer.batch_max,
        }),
    }
}

fn real_main(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Serve(a) => {
            let line = a.tideline.as_deref().map(parse_line).transpose()?.flatten();
            let loaded = load(&cli, a.listen, &a.upstreams, line)?;
            init_tracing(loaded.config.log_filter());
            for w in &loaded.warnings {
                tracing::warn!("{w}");
            }
            if !loaded.config.ledger.enabled && line.is_some() {
                tracing::warn!("--tideline is ignored: the ledger is off (ledger.enabled: false)");
            }
            let opts = proxy_options(&loaded.config, loaded.config.listen);
            runtime_block(serve(opts, loaded.config.retention.days))
        }
        Command::Run(a) => {
            let line = a.tideline.as_deref().map(parse_line).transpose()?.flatten();
            let loaded = load(&cli, None, &a.upstreams, line)?;
            init_tracing("warn");
            let opts = proxy_options(&loaded.config, SocketAddr::from(([127, 0, 0, 1], 0)));
            runtime_block(run_child(opts, a.cmd.clone()))
        }
        Command::Ledger(cmd) => {
            let loaded = load(&cli, None, &UpstreamFlags::default(), None)?;
            let dir = data_dir(&loaded.config);
            ledger(&dir, &loaded.config, cmd)
        }
        Command::Export(a) => {
            let loaded = load(&cli, None, &UpstreamFlags::default(), None)?;
            let dir = data_dir(&loaded.config);
            export(&dir, &loaded.config, a)
        }
        Command::Recall(a) => {
            let loaded = load(&cli, None, &UpstreamFlags::default(), None)?;
            let dir = data_dir(&loaded.config);
            recall(&dir, a)
        }
        Command::Status(a) => {
            let loaded = load(&cli, None, &UpstreamFlags::default(), None)?;
            let dir = data_dir(&loaded.config);
            status(&dir, &loaded.config, a)
        }
        Command::Tideline(a) => {
            let loaded = load(&cli, None, &UpstreamFlags::default(), None)?;
            let mut words = a.value.clone();
            if let Some(s) = &a.session {
                words.insert(0, s.clone());
                words.insert(0, "--session".into());
            }
            let parsed = config::tideline_args(&words).map_err(|e| anyhow::anyhow!("{e}"))?;
            let url = a
                .proxy
                .clone()
                .unwrap_or_else(|| format!("http://{}", loaded.config.listen));
            runtime_block(tideline(
                url,
                parsed.session,
                a.value.first().cloned(),
                a.json,
            ))
        }
    }
}

fn runtime_block<F: std::future::Future<Output = Result<i32>>>(f: F) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("oceancode")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(f)
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
    let ledger = ledger_label(&running, &data_dir);
    tracing::info!(addr = %running.addr, ledger = %ledger, "oceancode-proxy listening");
    eprintln!(
        "oceancode-proxy listening on http://{} (ledger: {ledger})",
        running.addr
    );
    shutdown_signal().await;
    tracing::info!("shutting down: draining requests and the ledger writer");
    running.shutdown().await;
    Ok(0)
}

/// Where the ledger is, or `off` (`ledger.enabled: false`).
fn ledger_label(running: &runtime::Running, data_dir: &Path) -> String {
    match running.app.store {
        Some(_) => data_dir.display().to_string(),
        None => "off".to_string(),
    }
}

async fn run_child(opts: ProxyOptions, cmd: Vec<String>) -> Result<i32> {
    let data_dir = opts.front.data_dir.clone();
    let running = runtime::start(opts).await?;
    let url = running.url();
    let Some((prog, args)) = cmd.split_first() else {
        bail!("run needs a command after --");
    };
    let mut child = tokio::process::Command::new(prog)
        .args(args)
        .env("ANTHROPIC_BASE_URL", &url)
        .env("OPENAI_BASE_URL", format!("{url}/v1"))
        .env("OCEANCODE_PROXY_URL", &url)
        .spawn()
        .with_context(|| format!("cannot start {prog}"))?;
    // The child gets Ctrl-C from the terminal itself; the proxy waits for it.
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.context("waiting for the child")?,
            _ = tokio::signal::ctrl_c() => continue,
        }
    };
    let sessions: Vec<String> = running
        .app
        .sessions
        .sessions()
        .iter()
        .map(|s| s.id.clone())
        .collect();
    let ledger = ledger_label(&running, &data_dir);
    let off = running.app.store.is_none();
    running.shutdown().await;
    if sessions.is_empty() || off {
        eprintln!("oceancode-proxy: no session was recorded (ledger: {ledger})");
        return Ok(exit_code(status));
    }
    for id in sessions {
        eprintln!(
            "oceancode-proxy: ledger {}",
            data_dir.join("sessions").join(&id).display()
        );
    }
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    status.code().unwrap_or(1)
}

fn open_store(dir: &Path) -> Result<Store> {
    if !dir.join("oceancode.db").exists() {
        bail!(
            "no ledger in {} yet (run `oceancode-proxy serve` first)",
            dir.display()
        );
    }
    Store::open(dir, StoreOptions::default())
        .with_context(|| format!("cannot open the ledger in {}", dir.display()))
}

fn ledger(dir: &Path, cfg: &Config, cmd: &LedgerCmd) -> Result<i32> {
    let store = open_store(dir)?;
    match cmd {
        LedgerCmd::Path { session } => {
            let id = store.resolve_session(session.as_deref())?;
            println!("{}", store.session_dir(&id).display());
        }
        LedgerCmd::Rebuild {
            session,
            all,
            merge,
            yes,
        } => {
            store.settle_blocking()?;
            let ids = if *all {
                store.list_sessions()?.into_iter().map(|s| s.id).collect()
            } else {
                vec![store.resolve_session(session.as_deref())?]
            };
            for id in &ids {
                let rows = session_rows(&store, id);
                let bar = progress_bar(rows, "rebuild");
                let started = std::time::Instant::now();
                let r = store.rebuild(id, bar.as_ref().map(|(_, p)| p.clone()))?;
                if let Some((b, _)) = bar {
                    b.finish_and_clear();
                }
                println!(
                    "rebuilt {}: {} rows, {} turn files{}, index.md, {}search index ({} ms)",
                    r.session,
                    r.rows,
                    r.turns,
                    if r.removed > 0 {
                        format!(" ({} stale removed)", r.removed)
                    } else {
                        String::new()
                    },
                    if r.page { "SESSION.md, " } else { "" },
                    started.elapsed().as_millis()
                );
            }
            if *merge {
                let code = merge::run(&store, cfg, &ids, *yes)?;
                let _ = store.shutdown();
                return Ok(code);
            }
        }
        LedgerCmd::Vacuum => {
            let swept = store.sweep(cfg.retention.days)?;
            for id in &swept.removed {
                println!("removed idle session {id}");
            }
            let v = store.vacuum()?;
            println!(
                "retention: {} session{} removed ({} rows; retention.days = {}); database {} → {} bytes",
                swept.removed.len(),
                if swept.removed.len() == 1 { "" } else { "s" },
                swept.rows,
                cfg.retention.days,
                v.bytes_before,
                v.bytes_after
            );
        }
        LedgerCmd::List => {
            let list = store.list_sessions()?;
            println!(
                "{:<34} {:<13} {:<26} {:>6} {:>7}  last activity",
                "id", "client", "model", "turns", "rows"
            );
            for s in list {
                println!(
                    "{:<34} {:<13} {:<26} {:>6} {:>7}  {}",
                    s.id,
                    s.client,
                    s.model,
                    s.turns,
                    s.rows,
                    oceancode_ledger::transcript::utc_iso(s.last_ms)
                );
            }
        }
    }
    let _ = store.shutdown();
    Ok(0)
}

async fn tideline(
    url: String,
    session: Option<String>,
    value: Option<String>,
    json: bool,
) -> Result<i32> {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let body = serde_json::json!({"session": session, "value": value}).to_string();
    let req = http::Request::post(format!("{}/_oceancode/tideline", url.trim_end_matches('/')))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body)))?;
    let resp = client
        .request(req)
        .await
        .with_context(|| format!("no proxy answering at {url} (start one with `oceancode-proxy serve`, or pass --proxy URL)"))?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    if !status.is_success() {
        let msg = v
            .pointer("/error/message")
            .and_then(|m| m.as_str())
            .unwrap_or("error");
        eprintln!("{msg}");
        return Ok(2);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", tideline_line(&v));
    }
    Ok(0)
}

/// The `tideline` answer for a person: what changed, then the session's
/// line, gauge, window and cut, e.g. `session S: line 50% (100k) · gauge 43k ·
/// window 31 rows · cut up to seq 25`.
fn tideline_line(v: &serde_json::Value) -> String {
    use oceancode_ledger::status::tokens;
    let scope = v["scope"].as_str().unwrap_or("all sessions");
    let head = match v["action"].as_str().unwrap_or("show") {
        "set" => format!(
            "line set to {} for {scope} (from the next request)\n",
            v["value"].as_str().unwrap_or("?")
        ),
        "default" => {
            format!("line back to the configured one for {scope} (from the next request)\n")
        }
        "now" => format!(
            // The rows the next request adds can move the start of a valid
            // window (a tool call waits for its result): at least this far.
            "the next request cuts up to seq {} or a little past it\n",
            v["cut_upto"].as_u64().unwrap_or(0)
        ),
        _ => String::new(),
    };
    let s = &v["session"];
    let Some(id) = s["id"].as_str() else {
        return format!("{head}no session yet");
    };
    let m = &s["meter"];
    let n = |k: &str| m[k].as_u64().unwrap_or(0);
    let cut = match n("cut_upto") {
        0 => "never cut".to_string(),
        c => format!("cut up to seq {c}"),
    };
    format!(
        "{head}session {id}: line {} ({}) · gauge {} · window {} rows · {cut}",
        s["line_spec"].as_str().unwrap_or("?"),
        tokens(n("line")),
        tokens(n("gauge")),
        n("window_rows"),
    )
}

/// Rows of a session on the active line (0 if unknown).
fn session_rows(store: &Store, id: &str) -> u64 {
    store
        .session_summary(id)
        .ok()
        .flatten()
        .map_or(0, |s| s.rows)
}

/// Rows from which rebuild and export show a progress bar (on a terminal).
const PROGRESS_MIN_ROWS: u64 = 2_000;

/// A progress bar on stderr for large sessions (drawn only on a terminal).
fn progress_bar(rows: u64, what: &str) -> Option<(indicatif::ProgressBar, Progress)> {
    if rows < PROGRESS_MIN_ROWS {
        return None;
    }
    let bar = indicatif::ProgressBar::new(rows);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} rows ({eta})")
    {
        bar.set_style(style.progress_chars("█▉ "));
    }
    bar.set_message(what.to_string());
    let b = bar.clone();
    let progress: Progress = Arc::new(move |done, total| {
        b.set_length(total);
        b.set_position(done);
    });
    Some((bar, progress))
}

/// Create (or truncate) an export file readable by its owner only: it holds
/// the whole conversation.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

fn pricer(cfg: &Config) -> impl Fn(&str) -> Option<config::Price> + '_ {
    move |model: &str| config::price(model, cfg)
}

fn export(dir: &Path, cfg: &Config, a: &ExportArgs) -> Result<i32> {
    let store = open_store(dir)?;
    store.settle_blocking()?;
    let id = store.resolve_session(a.session.as_deref())?;
    let price = pricer(cfg);
    let mut out: Box<dyn std::io::Write> = if a.out == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            private_file(Path::new(&a.out)).with_context(|| format!("cannot create {}", a.out))?,
        )
    };
    let bar = progress_bar(session_rows(&store, &id), "export");
    if a.md {
        oceancode_ledger::export::markdown(
            &store,
            &id,
            &price,
            &mut out,
            bar.as_ref().map(|(_, p)| p),
        )?;
    } else {
        if let Some((b, _)) = &bar {
            b.set_message("export (ATIF)");
            b.enable_steady_tick(std::time::Duration::from_millis(120));
        }
        oceancode_ledger::atif::write(&store, &id, &price, &mut out)?;
    }
    if let Some((b, _)) = bar {
        b.finish_and_clear();
    }
    out.flush()?;
    if a.out != "-" {
        eprintln!("exported {id} to {}", a.out);
    }
    let _ = store.shutdown();
    Ok(0)
}

fn recall(dir: &Path, a: &RecallArgs) -> Result<i32> {
    let store = open_store(dir)?;
    store.settle_blocking()?;
    match &a.cmd {
        None => {
            let id = store.resolve_session(a.session.as_deref())?;
            let hits = store.recall_log(&id, a.pattern.as_deref(), a.before, a.limit)?;
            for h in &hits {
                println!("{}", h.line(false));
            }
            if hits.is_empty() {
                eprintln!("no rows matched in {id}");
            }
        }
        Some(RecallCmd::Entry { seq, session, raw }) => {
            let id = store.resolve_session(session.as_deref())?;
            let meta = store
                .session_meta(&id)?
                .with_context(|| format!("no session {id}"))?;
            let Some((row, hidden)) = store.recall_entry(&id, *seq)? else {
                bail!("session {id} has no seq {seq}");
            };
            if *raw {
                println!("{}", row.raw);
            } else {
                println!(
                    "<!-- {id} · seq {} · turn {} · step {} · {}{} -->",
                    row.seq,
                    row.turn,
                    row.step,
                    row.kind.as_str(),
                    if hidden { " · hidden by a rewind" } else { "" }
                );
                print!(
                    "{}",
                    oceancode_ledger::transcript::render_turn(
                        meta.dialect,
                        row.turn,
                        std::slice::from_ref(&row)
                    )
                );
            }
        }
        Some(RecallCmd::Search { words, limit }) => {
            let hits = store.search(words, *limit)?;
            for h in &hits {
                println!("{}", h.line(true));
            }
            if hits.is_empty() {
                eprintln!("no row contains every word");
            }
        }
    }
    let _ = store.shutdown();
    Ok(0)
}

fn status(dir: &Path, cfg: &Config, a: &StatusArgs) -> Result<i32> {
    use oceancode_ledger::tideline;
    let store = open_store(dir)?;
    store.settle_blocking()?;
    let id = store.resolve_session(a.session.as_deref())?;
    let meta = store
        .session_meta(&id)?
        .with_context(|| format!("no session {id}"))?;
    let steps = store.steps(&id)?;
    let cuts = store.cuts(&id)?;
    let summary = store.session_summary(&id)?;
    let context = config::context_window(&meta.model, cfg, &config::process_env, None);
    let spec = cfg.ledger.line_spec();
    let mut calc =
        tideline::effective_line(spec, context, config::max_output(&meta.model, cfg), None);
    let mut spec_label = line_label(spec);
    let url = a
        .proxy
        .clone()
        .unwrap_or_else(|| format!("http://{}", cfg.listen));
    let live = live_line(&url, &id);
    if let Some((line, label)) = &live {
        // The running proxy's line for this session (`serve --tideline`, a
        // `tideline` override, a learned ceiling) wins over the configured one.
        calc.line = *line;
        spec_label.clone_from(label);
    }
    let price = pricer(cfg);
    let st = oceancode_ledger::status::Status::new(
        &meta,
        &steps,
        &cuts,
        summary.as_ref().map_or(0, |s| s.turns),
        summary.as_ref().map_or(0, |s| s.rows),
        calc.line,
        spec_label,
        context,
        &price,
    );
    let st = oceancode_ledger::status::Status {
        line_live: live.is_some(),
        ..st
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        print!("{}", st.render());
    }
    let _ = store.shutdown();
    Ok(0)
}

/// The line a running proxy applies to a session (from its last request) and
/// the spec it comes from (`20k`, `50%`: the session's override, else the
/// proxy's own line); `None` when no proxy answers at `url` within half a
/// second or it does not hold the session in memory.
fn live_line(url: &str, id: &str) -> Option<(u64, String)> {
    use http_body_util::{BodyExt, Empty};
    let uri: http::Uri = format!("{}/_oceancode/sessions/{id}", url.trim_end_matches('/'))
        .parse()
        .ok()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let v: serde_json::Value = rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Empty<bytes::Bytes>>();
        let wait = std::time::Duration::from_millis(500);
        let resp = tokio::time::timeout(wait, client.get(uri))
            .await
            .ok()?
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = tokio::time::timeout(wait, resp.into_body().collect())
            .await
            .ok()?
            .ok()?;
        serde_json::from_slice(&body.to_bytes()).ok()
    })?;
    let line = v.pointer("/meter/line")?.as_u64().filter(|&l| l > 0)?;
    let label = v.get("line_spec")?.as_str()?.to_string();
    Some((line, label))
}

/// `ledger rebuild --merge`: the optional model merge of `SESSION.md`.
mod merge {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use oceancode_ledger::merge as m;
    use oceancode_ledger::Dialect;
    use std::io::BufRead;

    /// Ask y/N on stderr; anything but `y`/`yes` (EOF included) is no.
    fn confirm(question: &str) -> bool {
        eprint!("{question} [y/N] ");
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(_) => matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
            Err(_) => false,
        }
    }

    /// Fold each session's merge backlog with `ledger.merge.model`.
    pub fn run(store: &Store, cfg: &Config, ids: &[String], yes: bool) -> Result<i32> {
        let Some(model) = cfg.ledger.merge.model.clone() else {
            bail!("the model merge is off: set ledger.merge.model in the config to use --merge");
        };
        let mut work = Vec::new();
        for id in ids {
            let (from, to) = store.page_backlog(id)?;
            if from <= to {
                let meta = store
                    .session_meta(id)?
                    .with_context(|| format!("no session {id}"))?;
                work.push((id.clone(), meta.dialect, from, to));
            }
        }
        if work.is_empty() {
            println!("merge: no backlog (every turn past the tideline is merged)");
            return Ok(0);
        }
        let turns: u32 = work.iter().map(|(_, _, f, t)| t - f + 1).sum();
        if !yes
            && !confirm(&format!(
                "--merge sends {turns} turn{} of {} session{} to {model} (model calls, billed to your API key). Continue?",
                if turns == 1 { "" } else { "s" },
                work.len(),
                if work.len() == 1 { "" } else { "s" },
            ))
        {
            eprintln!("merge: cancelled, nothing sent");
            return Ok(1);
        }
        let up =
            oceancode_proxy::upstream::Upstream::new(oceancode_proxy::upstream::UpstreamOptions {
                connect_timeout: cfg.limits.connect_timeout(),
                header_timeout: cfg.limits.response_header_timeout(),
            })?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        for (id, dialect, from, to) in work {
            let dir = store.data_dir();
            let page = std::fs::read_to_string(dir.session_md(&id)).unwrap_or_default();
            let transcripts: Vec<(u32, String)> = (from..=to)
                .filter_map(|t| {
                    std::fs::read_to_string(dir.turn_file(&id, t))
                        .ok()
                        .map(|s| (t, s))
                })
                .collect();
            let prompt = m::prompt(&id, &page, &transcripts);
            let answer = rt.block_on(ask(&up, cfg, dialect, &model, &prompt))?;
            let mut notes = m::parse_notes(&answer, from, to);
            let n = notes.len();
            notes.push(m::marker(to));
            store.add_page_notes(&id, notes)?;
            println!(
                "merged {id}: t{from:02}–t{to:02} → {n} line{} in SESSION.md",
                if n == 1 { "" } else { "s" }
            );
        }
        Ok(0)
    }

    /// One non-streaming request to the provider of the session's dialect,
    /// with the credentials of this process's environment.
    async fn ask(
        up: &oceancode_proxy::upstream::Upstream,
        cfg: &Config,
        dialect: Dialect,
        model: &str,
        prompt: &str,
    ) -> Result<String> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (base, path, body, headers): (&str, &str, serde_json::Value, Vec<(&str, String)>) =
            match dialect {
                Dialect::Anthropic => {
                    let mut h = vec![("anthropic-version", "2023-06-01".to_string())];
                    if let Some(k) = env("ANTHROPIC_API_KEY") {
                        h.push(("x-api-key", k));
                    } else if let Some(t) = env("ANTHROPIC_AUTH_TOKEN") {
                        h.push(("authorization", format!("Bearer {t}")));
                    } else {
                        bail!("--merge needs ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) for an Anthropic session");
                    }
                    (
                        cfg.anthropic_upstream(),
                        "/v1/messages",
                        serde_json::json!({"model": model, "max_tokens": 4096,
                            "messages": [{"role": "user", "content": prompt}]}),
                        h,
                    )
                }
                Dialect::OpenaiChat | Dialect::OpenaiResponses => {
                    let Some(k) = env("OPENAI_API_KEY") else {
                        bail!("--merge needs OPENAI_API_KEY for an OpenAI session");
                    };
                    (
                        cfg.openai_upstream(),
                        "/v1/chat/completions",
                        serde_json::json!({"model": model,
                            "messages": [{"role": "user", "content": prompt}]}),
                        vec![("authorization", format!("Bearer {k}"))],
                    )
                }
            };
        let uri = oceancode_proxy::upstream::join(base, path)?;
        let mut req = http::Request::post(uri).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let body = Full::new(bytes::Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed();
        let resp = up.send(req.body(body)?, base).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if !status.is_success() {
            bail!(
                "the merge model answered {status}: {}",
                String::from_utf8_lossy(&bytes)
                    .chars()
                    .take(500)
                    .collect::<String>()
            );
        }
        let text = match dialect {
            Dialect::Anthropic => v["content"]
                .as_array()
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter_map(|b| b["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default(),
            _ => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        Ok(text)
    }
}
