//! The `oceancode-proxy` command line: the argument tree, the shared steps
//! (config layering, the data dir, the store, the runtime), and one module
//! per command group. Every command that talks to a running proxy finds it
//! with [`proxies::Proxies`] (the data dir's registry) and goes through
//! [`admin_client::AdminClient`]; session names resolve with
//! [`oceancode_ledger::resolve`].
//!
//! | module | command |
//! |---|---|
//! | `serve` | `serve`: the proxy itself |
//! | `run` | `run -- CMD`: a private proxy around a child command |
//! | `ledger` | `ledger path/list/rebuild/vacuum` (`merge`: `rebuild --merge`) |
//! | `export` | `export --md/--atif` |
//! | `recall` | `recall`, `recall entry`, `recall search` |
//! | `status` | `status`: the session meter |
//! | `tideline` | `tideline`: show or change a running proxy's line |
//! | `context` | `context`: export the window to context.txt, edit it without the file, the receipt; `evict` |
//! | `ui` | `ui [--open]`: the session viewer's URL, the admin token handed over once |
//! | `statusline` | `statusline`: one meter line for Claude Code's status line, tmux, a prompt |
//! | `setup` | `setup claude-code`: install the status line, slash commands, allowed reads |
//! | `proxies` | the running proxies of a data dir, and which one holds a session |

mod admin_client;
mod context;
mod export;
mod ledger;
mod merge;
mod out;
mod progress;
mod proxies;
mod recall;
mod run;
mod serve;
mod setup;
mod status;
mod statusline;
mod tideline;
mod ui;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use oceancode_config::{self as config, Config, LineSpec, Overrides};
use oceancode_ledger::store::{open_ledger, LedgerStore, StoreOptions};
use out::errln;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A transparent proxy between coding agents and their model APIs that keeps
/// the context under the tideline and a verbatim ledger on the side.
#[derive(Parser, Debug)]
#[command(name = "oceancode-proxy", version, about)]
pub struct Cli {
    /// Config file (JSON). Default: $OCEANCODE_CONFIG, else
    /// $XDG_CONFIG_HOME/oceancode-proxy/config.json if it exists.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory (ledger). Default: $OCEANCODE_DATA_DIR, else
    /// $XDG_DATA_HOME/oceancode-proxy.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The ledger's database: `sqlite` (the data dir's oceancode.db) or a
    /// postgres://user@host:port/db URL shared by several proxies.
    /// Default: $OCEANCODE_DATABASE_URL, else `ledger.database`, else sqlite.
    #[arg(long, global = true, value_name = "URL")]
    database: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the proxy.
    Serve(serve::ServeArgs),
    /// Run a command through a private proxy on a free port (CI wrapper).
    Run(run::RunArgs),
    /// Inspect the ledger.
    #[command(subcommand)]
    Ledger(ledger::LedgerCmd),
    /// Show or change the tideline of a running proxy.
    Tideline(tideline::TidelineArgs),
    /// Export the session's live window to context.txt for the agent (or
    /// you) to edit, or make the same edit without the file.
    Context(context::ContextArgs),
    /// Cut now: down to PERCENT of the session's line (default 50%) or
    /// through a turn, inside a long turn too; the newest ask and step stay.
    Evict(context::EvictArgs),
    /// Export a session as one Markdown document or one ATIF-v1.8 trajectory.
    Export(export::ExportArgs),
    /// Read the verbatim record back: a session's log, one entry, or a search
    /// across sessions (rows hidden by rewinds included).
    Recall(recall::RecallArgs),
    /// The session meter: context (window / line / model context), tokens
    /// in/out, cache hit ratio, spend.
    Status(status::StatusArgs),
    /// The session viewer of the running proxy: print (or --open) its URL,
    /// which hands the admin token over once.
    Ui(ui::UiArgs),
    /// One line of the session meter for Claude Code's `statusLine`, tmux or
    /// a shell prompt (reads Claude Code's JSON on stdin; never fails).
    Statusline(statusline::StatuslineArgs),
    /// Install (or --remove) the status line, slash commands and allowed
    /// reads in a client's settings.
    #[command(subcommand)]
    Setup(setup::SetupCmd),
}

/// Upstream URLs given on the command line (`serve`, `run`).
#[derive(Args, Debug, Default)]
struct UpstreamFlags {
    /// Anthropic upstream base URL.
    #[arg(long, value_name = "URL")]
    anthropic_upstream: Option<String>,
    /// OpenAI upstream base URL.
    #[arg(long, value_name = "URL")]
    openai_upstream: Option<String>,
    /// Gemini upstream base URL.
    #[arg(long, value_name = "URL")]
    gemini_upstream: Option<String>,
}

/// Per-session bounds given on the command line (`serve`, `run`): they
/// win over `limits.session` in the config and the `OCEANCODE_MAX_*`
/// variables.
#[derive(Args, Debug, Default)]
struct LimitFlags {
    /// Most a session may spend, in USD at list price (cache reads and
    /// writes included): `2`, `0.50`.
    #[arg(long, value_name = "USD", value_parser = config::parse_usd)]
    max_spend: Option<f64>,
    /// Most steps (requests sent upstream) a session may make.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_steps: Option<u32>,
    /// Longest a session may run, from its first request: `30m`, `2h`, `1h30m`.
    #[arg(long, value_name = "DURATION", value_parser = config::parse_duration)]
    max_time: Option<std::time::Duration>,
}

/// Parse the command line, run the command, exit with its code (2 and one
/// line on stderr for an error).
pub fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Run(_)) {
        // A report piped into `head` ends quietly, as other command-line
        // tools do, instead of panicking on the closed stdout. (The proxy
        // itself keeps SIGPIPE ignored: a closed socket is an error to
        // handle, not a reason to exit.)
        // SAFETY: called before any thread is started; SIG_DFL is a valid
        // disposition for SIGPIPE.
        #[allow(unsafe_code)] // signal(2) has no safe std equivalent
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match real_main(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            errln!("oceancode-proxy: {}", error_chain(&e));
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

/// A `--tideline` value of `serve`/`run`: `40%`, `500k`, `0`, `default`
/// (None); the value as every other line value is read (`LineSpec`'s parser).
/// A refused value is answered with this flag's own forms, not the
/// `tideline` command's usage.
fn parse_line(s: &str) -> Result<Option<LineSpec>> {
    if s.trim().eq_ignore_ascii_case("default") {
        return Ok(None);
    }
    match s.parse::<LineSpec>() {
        Ok(spec) => Ok(Some(spec)),
        Err(e) => {
            let why = match config::bare_number_hint(s) {
                Some(meant) => format!("{s} would be {s} tokens; did you mean {meant}?"),
                None => e.reason.replace(" (or 0 for the model ceiling)", ""),
            };
            bail!(
                "--tideline {s}: {why}\n--tideline takes a share of the model's context (40%), a fixed line of at least 20k tokens (20k, 500k), 0 (the model's ceiling) or default"
            )
        }
    }
}

/// `--compress on|off`.
pub(super) fn parse_on_off(s: &str) -> Result<bool, String> {
    config::parse_switch(s).ok_or_else(|| format!("expected on or off, not {s:?}"))
}

fn parse_otlp(s: &str) -> std::result::Result<String, String> {
    config::check_otlp_url(s).map(|()| s.to_string())
}

/// Resolve the config layers (file, env, these flags); warnings go to
/// stderr except for `serve`, which logs them.
fn load(
    cli: &Cli,
    listen: Option<SocketAddr>,
    up: &UpstreamFlags,
    tideline: Option<LineSpec>,
    compress: Option<bool>,
) -> Result<config::Loaded> {
    let limits = match &cli.command {
        Command::Serve(a) => Some(&a.limits),
        Command::Run(a) => Some(&a.limits),
        _ => None,
    };
    let overrides = Overrides {
        max_spend_usd: limits.and_then(|l| l.max_spend),
        max_steps: limits.and_then(|l| l.max_steps),
        max_time: limits.and_then(|l| l.max_time),
        listen,
        data_dir: cli.data_dir.clone(),
        anthropic_upstream: up.anthropic_upstream.clone(),
        openai_upstream: up.openai_upstream.clone(),
        gemini_upstream: up.gemini_upstream.clone(),
        tideline,
        compress,
        allow_remote: matches!(&cli.command, Command::Serve(a) if a.allow_remote),
        recall_tool: match &cli.command {
            Command::Serve(a) => a.recall_tool,
            Command::Run(a) => a.recall_tool,
            _ => false,
        },
        database: cli.database.clone(),
        otlp: match &cli.command {
            Command::Serve(a) => a.otlp.clone(),
            Command::Run(a) => a.otlp.clone(),
            _ => None,
        },
    };
    let loaded = Config::resolve(cli.config.as_deref(), &config::process_env, &overrides)?;
    let _ = DATABASE.set(loaded.config.ledger.postgres_url().map(str::to_string));
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
            errln!("oceancode-proxy: {w}");
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

/// The log on stderr (`OCEANCODE_LOG`, else `filter`).
fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("OCEANCODE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(out::log_writer)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn real_main(cli: Cli) -> Result<i32> {
    match &cli.command {
        Command::Serve(a) => serve::run(&cli, a),
        Command::Run(a) => run::run(&cli, a),
        Command::Ledger(cmd) => {
            let (cfg, dir) = reader(&cli)?;
            ledger::run(&dir, &cfg, cmd)
        }
        Command::Export(a) => {
            let (cfg, dir) = reader(&cli)?;
            export::run(&dir, &cfg, a)
        }
        Command::Recall(a) => {
            let (_, dir) = reader(&cli)?;
            recall::run(&dir, a)
        }
        Command::Status(a) => {
            let (cfg, dir) = reader(&cli)?;
            status::run(&dir, &cfg, a)
        }
        Command::Tideline(a) => {
            let (cfg, dir) = reader(&cli)?;
            tideline::run(&dir, &cfg, a)
        }
        Command::Context(a) => {
            let (cfg, dir) = reader(&cli)?;
            context::run(&dir, &cfg, a)
        }
        Command::Evict(a) => {
            let (cfg, dir) = reader(&cli)?;
            context::run_evict(&dir, &cfg, a)
        }
        Command::Ui(a) => {
            let (cfg, dir) = reader(&cli)?;
            ui::run(&dir, &cfg, a)
        }
        Command::Statusline(a) => match reader(&cli) {
            Ok((cfg, dir)) => statusline::run(&dir, &cfg, a),
            Err(_) => {
                out::outln!("oceancode: config error (run `oceancode-proxy status`)");
                Ok(0)
            }
        },
        Command::Setup(cmd) => {
            let (cfg, dir) = reader(&cli)?;
            setup::run(&dir, &cfg, cmd)
        }
    }
}

/// The config and the absolute data dir of a command that reads the
/// ledger or asks a running proxy (no flags of `serve`'s).
fn reader(cli: &Cli) -> Result<(Config, PathBuf)> {
    let loaded = load(cli, None, &UpstreamFlags::default(), None, None)?;
    let dir = data_dir(&loaded.config);
    Ok((loaded.config, dir))
}

/// `--admin-token` of the commands that ask a running proxy.
#[derive(clap::Args, Debug, Default)]
struct AdminTokenFlag {
    /// Admin token of the proxy (default: the one in the data dir; give it
    /// for a proxy on another machine).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "OCEANCODE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    admin_token: Option<String>,
}

/// Run `f` on a multi-threaded runtime.
fn runtime_block<T, F: std::future::Future<Output = Result<T>>>(f: F) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("oceancode")
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(f)
}

/// The PostgreSQL URL of the loaded config (`ledger.database`), set once
/// the config is loaded; unset or None = SQLite in the data dir.
static DATABASE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Open the ledger of `dir` (or of the configured PostgreSQL database,
/// with `dir` for the files it renders) for a command; an SQLite ledger
/// is never created by a command.
fn open_store(dir: &Path) -> Result<std::sync::Arc<dyn LedgerStore>> {
    if let Some(url) = DATABASE.get().and_then(Option::as_deref) {
        return open_ledger(Some(url), dir, StoreOptions::default()).with_context(|| {
            format!(
                "cannot open the ledger at {}",
                oceancode_ledger::store::pg::redact_url(url)
            )
        });
    }
    if !dir.join("oceancode.db").exists() {
        bail!(
            "no ledger in {} yet (run `oceancode-proxy serve` first)",
            dir.display()
        );
    }
    open_ledger(None, dir, StoreOptions::default())
        .with_context(|| format!("cannot open the ledger in {}", dir.display()))
}

/// The configured price of a model.
fn pricer(cfg: &Config) -> impl Fn(&str) -> Option<config::Price> + '_ {
    move |model: &str| config::price(model, cfg)
}
