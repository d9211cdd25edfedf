//! `status [SESSION] [--json]`: the session meter, with the live line of a
//! running proxy when one answers.

use super::admin_client::AdminClient;
use super::out::{out, outln};
use super::{admin_client, live_behind, open_store, pricer, AdminTokenFlag};
use anyhow::{Context, Result};
use clap::Args;
use oceancode_config::{self as config, Config};
use oceancode_proxy::sessions::line_label;
use std::path::Path;
use std::time::Duration;

/// `status`'s flags.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Session id or unique prefix (default: the most recent session).
    session: Option<String>,
    /// Print JSON instead of the meter.
    #[arg(long)]
    json: bool,
    /// Admin URL of a running proxy whose live line (runtime overrides
    /// included) is shown when it answers (default: http://<listen>).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
}

/// `status`.
pub fn run(dir: &Path, cfg: &Config, a: &StatusArgs) -> Result<i32> {
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
    let client = admin_client(cfg, a.proxy.as_deref(), &a.token);
    let live = live_line(&client, &id);
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
        behind: live_behind(&client).contains(&id),
        ..st
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&st)?);
    } else {
        out!("{}", st.render());
    }
    let _ = store.shutdown();
    Ok(0)
}

/// The line a running proxy applies to a session (from its last request) and
/// the spec it comes from (`20k`, `50%`: the session's override, else the
/// proxy's own line); `None` when no proxy answers within half a second or
/// it does not hold the session in memory.
fn live_line(client: &AdminClient, id: &str) -> Option<(u64, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let path = format!("/_oceancode/sessions/{id}");
    let answer = rt
        .block_on(client.get(&path, Duration::from_millis(500)))
        .ok()?;
    if !answer.status.is_success() {
        return None;
    }
    let v = answer.json;
    let line = v.pointer("/meter/line")?.as_u64().filter(|&l| l > 0)?;
    let label = v.get("line_spec")?.as_str()?.to_string();
    Some((line, label))
}
