//! `oceancode-fakeup`: runs the fake upstream until SIGTERM / ctrl-c.
//! First stdout line: `listening on http://127.0.0.1:PORT`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use oceancode_fakeup::{FakeConfig, FakeUpstream, Script};

/// The same allocator as `oceancode-proxy` (the fake parses every body into
/// a DOM: with the system allocator half its CPU went to malloc/free).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "oceancode-fakeup",
    version,
    about = "Fake Anthropic/OpenAI upstream (loopback only)"
)]
struct Args {
    /// Loopback address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Script JSON file (array of replies or {"replies": [...], "default": {...}}).
    #[arg(long)]
    script: Option<PathBuf>,
    /// Context limit in tokens: larger requests get the provider's too-long error.
    #[arg(long)]
    max_context: Option<u64>,
    /// Do not validate conversations.
    #[arg(long)]
    no_validate: bool,
    /// Gzip responses when the client accepts it.
    #[arg(long)]
    gzip: bool,
    /// Anthropic: `max_tokens` counts against `--max-context` too (input + max_tokens
    /// over it: the `input length and max_tokens exceed context limit` error).
    #[arg(long)]
    count_max_tokens: bool,
    /// Responses: a streamed request over `--max-context` gets a 200 stream ending in
    /// `response.failed` (`context_length_exceeded`) instead of the 400.
    #[arg(long)]
    overflow_in_stream: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    if !args.listen.ip().is_loopback() {
        anyhow::bail!("refusing non-loopback listen address {}", args.listen);
    }
    let script = match &args.script {
        Some(p) => Script::load(p)?,
        None => Script::default(),
    };
    let cfg = FakeConfig {
        listen: args.listen,
        script,
        max_context_tokens: args.max_context,
        validate: !args.no_validate,
        gzip: args.gzip,
        count_max_tokens: args.count_max_tokens,
        overflow_in_stream: args.overflow_in_stream,
        ..FakeConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let handle = FakeUpstream::start(cfg).await?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "listening on {}", handle.url())?;
            out.flush()?;
        }
        wait_for_signal().await;
        handle.shutdown().await;
        anyhow::Ok(())
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
