//! `status [SESSION] [--json]`: the session meter, with the live line of the
//! running proxy that holds the session, else the line it ran with.

use super::out::{out, outln};
use super::proxies::Proxies;
use super::{open_store, pricer, runtime_block, AdminTokenFlag};
use anyhow::{Context, Result};
use clap::Args;
use oceancode_config::{self as config, Config};
use oceancode_ledger::status::{tokens, Limits, LineSource};
use oceancode_proxy::sessions::line_label;
use std::path::Path;

/// `status`'s flags.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Session: ledger id, the client's session name or id, or a unique
    /// prefix (default: the most recent session).
    session: Option<String>,
    /// Print JSON instead of the meter.
    #[arg(long)]
    json: bool,
    /// Admin URL of the running proxy to ask for the live line (default:
    /// the proxy registered in the data dir that holds the session).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
}

/// `status`.
pub fn run(dir: &Path, cfg: &Config, a: &StatusArgs) -> Result<i32> {
    use oceancode_window::tideline;
    let store = open_store(dir)?;
    store.settle_blocking()?;
    let (proxies, behind) = runtime_block(async {
        let p = Proxies::find(cfg, dir, a.proxy.as_deref(), &a.token).await;
        let behind = p.behind().await;
        Ok((p, behind))
    })?;
    // No session named: the one a running proxy saw last (as `context` and
    // `evict` take it; the ledger may not have its latest request yet),
    // else the ledger's most recent.
    let live_latest = match &a.session {
        None => proxies
            .latest_session()
            .map(|(_, id)| id)
            .filter(|id| matches!(store.session_meta(id), Ok(Some(_)))),
        Some(_) => None,
    };
    let id = match live_latest {
        Some(id) => id,
        None => store.resolve_session(a.session.as_deref())?,
    };
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
    let mut source = LineSource::Configured;
    if let Some((line, label, proxy)) = live_line(&proxies, &id) {
        // The running proxy's line for this session (`serve --tideline`, a
        // `tideline` override, a learned ceiling) wins over the configured one.
        calc.line = line;
        spec_label = label;
        source = LineSource::Live { proxy };
    } else if let Some(rec) = store.recorded_line(&id)? {
        // A finished session: the line it ran with, not today's config.
        calc.line = rec.line;
        spec_label = rec.spec;
        source = LineSource::Recorded {
            since_ms: rec.ts_ms,
        };
    } else if let Some(cut) = cuts.last() {
        // Recorded before the ledger kept the line: its last cut's.
        calc.line = cut.line;
        spec_label = tokens(cut.line);
        source = LineSource::Recorded {
            since_ms: cut.ts_ms,
        };
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
    let limits = live_limits(&proxies, &id).or_else(|| configured_limits(cfg, &meta, &st));
    let st = oceancode_ledger::status::Status {
        line_live: matches!(source, LineSource::Live { .. }),
        line_source: source,
        behind: behind.contains(&id),
        limits,
        merge: oceancode_ledger::status::MergeSpend::of(&store.merge_uses(&id)?, &price),
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

/// The line the proxy holding the session applies to it (from its last
/// request), the spec it comes from (`20k`, `50%`: the session's override,
/// else the proxy's own line), and which proxy; `None` when no running
/// proxy holds the session in memory.
fn live_line(proxies: &Proxies, id: &str) -> Option<(u64, String, String)> {
    let p = proxies.holding(id)?;
    let v = p.session(id)?;
    let line = v.pointer("/meter/line")?.as_u64().filter(|&l| l > 0)?;
    let label = v.get("line_spec")?.as_str()?.to_string();
    Some((line, label, p.describe()))
}

/// The bounds of the running proxy holding the session, and its use as
/// that proxy counts it (with the sessions linked to it).
fn live_limits(proxies: &Proxies, id: &str) -> Option<Limits> {
    let p = proxies.holding(id)?;
    let v = p.session(id)?;
    let l = v.get("limits").filter(|l| l.is_object())?;
    let u64_of = |k: &str| l.get(k).and_then(serde_json::Value::as_u64);
    Some(Limits {
        spend_cap_usd: l.get("spend_cap_usd").and_then(serde_json::Value::as_f64),
        spent_usd: l.get("spent_usd").and_then(serde_json::Value::as_f64),
        steps: u64_of("steps").map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        steps_cap: u64_of("steps_cap").map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        elapsed_ms: u64_of("elapsed_ms").unwrap_or(0),
        time_cap_ms: u64_of("time_cap_ms"),
        from: format!("live from {}", p.describe()),
        stopped: l
            .get("stopped")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    })
}

/// No running proxy holds the session: the configured bounds
/// (`limits.session`) against the session's own record.
fn configured_limits(
    cfg: &Config,
    meta: &oceancode_window::SessionMeta,
    st: &oceancode_ledger::status::Status,
) -> Option<Limits> {
    let b = &cfg.limits.session;
    if !b.any() {
        return None;
    }
    Some(Limits {
        spend_cap_usd: b.spend_usd,
        spent_usd: None,
        steps: st.totals.steps,
        steps_cap: b.steps,
        elapsed_ms: u64::try_from(meta.last_ms.saturating_sub(meta.created_ms)).unwrap_or(0),
        time_cap_ms: b.time.map(|d| d.as_millis() as u64),
        from: "as configured: no running proxy holds the session".into(),
        stopped: None,
    })
}
