//! `run -- CMD`: a private proxy on a free loopback port around one child
//! command (its `*_BASE_URL`s point at it, `GOOGLE_GEMINI_BASE_URL` too; a `claude` child also gets the
//! data dir as a directory it may read, `--add-dir=DIR`); exits with the
//! child's code, or with [`LIMIT_EXIT`] when the run reached a bound of
//! `--max-spend`, `--max-steps` or `--max-time` (`limits.session`: one
//! budget for every session of the run).

use super::out::errln;
use super::serve::{ledger_label, proxy_options, register};
use super::{init_tracing, load, parse_line, runtime_block, Cli, LimitFlags, UpstreamFlags};
use anyhow::{bail, Context, Result};
use clap::Args;
use oceancode_proxy::runtime::{self, ProxyOptions};
use std::net::SocketAddr;

/// `run`'s flags.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Tideline for this run: `50%`, `500k`, `default`.
    #[arg(long, value_name = "X")]
    tideline: Option<String>,
    /// Old tool output becomes a pointer at each cut (`ledger.compress`).
    #[arg(long, value_name = "on|off", value_parser = super::parse_on_off)]
    compress: Option<bool>,
    #[command(flatten)]
    upstreams: UpstreamFlags,
    #[command(flatten)]
    pub(super) limits: LimitFlags,
    /// Serve the in-band `oceancode_recall` tool (`ledger.recall_tool`).
    #[arg(long)]
    pub(super) recall_tool: bool,
    /// Export OpenTelemetry GenAI spans to this OTLP/HTTP collector
    /// (`telemetry.otlp.endpoint`, e.g. `http://127.0.0.1:6006`).
    #[arg(long, value_name = "URL", value_parser = super::parse_otlp)]
    pub(super) otlp: Option<String>,
    /// The command to run, after `--`.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    cmd: Vec<String>,
}

/// The exit code of a run a session limit stopped (whatever the child's
/// own code): the proxy refused the session's requests from the bound on.
/// (2 is an error of the proxy's own, e.g. an unknown session.)
pub const LIMIT_EXIT: i32 = 8;

/// `run`.
pub fn run(cli: &Cli, a: &RunArgs) -> Result<i32> {
    let line = a.tideline.as_deref().map(parse_line).transpose()?.flatten();
    let loaded = load(cli, None, &a.upstreams, line, a.compress)?;
    init_tracing("warn");
    let mut opts = proxy_options(&loaded.config, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    // The bounds hold for the whole run: one budget for every session it
    // sees, whatever names its agent declares.
    opts.limits.run_wide = true;
    runtime_block(run_child(opts, a.cmd.clone()))
}

async fn run_child(opts: ProxyOptions, cmd: Vec<String>) -> Result<i32> {
    let data_dir = opts.front.data_dir.clone();
    let running = runtime::start(opts).await?;
    let url = running.url();
    let Some((prog, args)) = cmd.split_first() else {
        bail!("run needs a command after --");
    };
    let command = std::path::Path::new(prog)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    let registration = register(&running, "run", command.clone());
    let mut child = tokio::process::Command::new(prog);
    if command.as_deref() == Some("claude") && running.app.store.is_some() {
        // The stub and the pointers name transcript files in the data dir:
        // Claude Code reads them without asking once it is a directory of
        // the run (`=`: the flag takes several values, a prompt after it
        // must stay a prompt).
        let dir = std::path::absolute(&data_dir).unwrap_or_else(|_| data_dir.clone());
        child.arg(format!("--add-dir={}", dir.display()));
    }
    let mut child = child
        .args(args)
        .env("ANTHROPIC_BASE_URL", &url)
        .env("OPENAI_BASE_URL", format!("{url}/v1"))
        .env("GOOGLE_GEMINI_BASE_URL", &url)
        .env("OCEANCODE_PROXY_URL", &url)
        .env(oceancode_proxy::token::ENV, &running.app.admin_token)
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
    // A line the fixed part of every request nearly fills: said at the end.
    let cramped: Vec<(String, String)> = running
        .app
        .sessions
        .sessions()
        .iter()
        .filter_map(|s| {
            let m = s.state.lock().meter;
            oceancode_ledger::status::fixed_part_note(m.fixed, m.line).map(|n| (s.id.clone(), n))
        })
        .collect();
    let ledger = ledger_label(&running, &data_dir);
    let off = running.app.store.is_none();
    let hits = running.app.sessions.limit_hits();
    drop(registration);
    running.shutdown().await;
    let code = if hits.is_empty() {
        exit_code(status)
    } else {
        LIMIT_EXIT
    };
    if sessions.is_empty() || off {
        errln!("oceancode-proxy: no session was recorded (ledger: {ledger})");
    } else {
        for id in sessions {
            errln!(
                "oceancode-proxy: ledger {}",
                data_dir.join("sessions").join(&id).display()
            );
        }
    }
    for (id, note) in &cramped {
        errln!("oceancode-proxy: session {id}: {note}");
    }
    for hit in &hits {
        errln!(
            "oceancode-proxy: the run stopped at a limit: {} (exit code {LIMIT_EXIT}; the command exited with {})",
            hit.describe(),
            exit_code(status)
        );
    }
    Ok(code)
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
