//! The `oceancode-proxy` command line.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use oceancode_config::{self as config, Config, LineSpec, Overrides};
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_proxy::runtime::{self, ProxyOptions};
use oceancode_proxy::server::FrontConfig;
use oceancode_proxy::sessions::{ModelLimits, ModelResolver, Settings};
use oceancode_proxy::upstream::UpstreamOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    #[arg(allow_hyphen_values = true)]
    value: Vec<String>,
}

fn main() {
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("oceancode-proxy: {e:#}");
            std::process::exit(2);
        }
    }
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
    Ok(loaded)
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OCEANCODE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
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
        store: Some(StoreOptions {
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
            let opts = proxy_options(&loaded.config, loaded.config.listen);
            runtime_block(serve(opts))
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
            let dir = loaded.config.resolved_data_dir(&config::process_env);
            ledger(&dir, cmd)
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
            runtime_block(tideline(url, parsed.session, a.value.first().cloned()))
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

async fn serve(opts: ProxyOptions) -> Result<i32> {
    let data_dir = opts.front.data_dir.clone();
    let running = runtime::start(opts).await?;
    tracing::info!(addr = %running.addr, data_dir = %data_dir.display(), "oceancode-proxy listening");
    eprintln!(
        "oceancode-proxy listening on http://{} (ledger: {})",
        running.addr,
        data_dir.display()
    );
    shutdown_signal().await;
    tracing::info!("shutting down: draining requests and the ledger writer");
    running.shutdown().await;
    Ok(0)
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
    running.shutdown().await;
    if sessions.is_empty() {
        eprintln!(
            "oceancode-proxy: no session was recorded (ledger: {})",
            data_dir.display()
        );
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

fn ledger(dir: &Path, cmd: &LedgerCmd) -> Result<i32> {
    let store = open_store(dir)?;
    match cmd {
        LedgerCmd::Path { session } => {
            let id = match session {
                Some(s) => s.clone(),
                None => store
                    .latest_session()?
                    .context("the ledger has no session yet")?,
            };
            println!("{}", store.session_dir(&id).display());
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

async fn tideline(url: String, session: Option<String>, value: Option<String>) -> Result<i32> {
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
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(0)
}
