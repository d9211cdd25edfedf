//! `tideline [--session S] [50% | 500k | now | default]`: show or change a
//! running proxy's line through its admin API — the proxy that holds the
//! session (found in the data dir's registry), else the newest.

use super::out::{errln, outln};
use super::proxies::Proxies;
use super::{open_store, runtime_block, AdminTokenFlag};
use anyhow::{bail, Result};
use clap::Args;
use oceancode_config::{self as config, Config};
use oceancode_ledger::resolve::{resolve, Candidate};
use std::path::Path;

/// `tideline`'s flags.
#[derive(Args, Debug)]
pub struct TidelineArgs {
    /// Session: ledger id, the client's session name or id, or a unique
    /// prefix (default: all sessions for a set, the latest for `now`).
    #[arg(long)]
    session: Option<String>,
    /// Admin URL of the running proxy (default: the proxy registered in the
    /// data dir that holds the session, else the newest).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
    /// `50%`, `500k`, `now` or `default`; none shows the state.
    value: Vec<String>,
    /// Print the admin API's JSON answer instead of one line.
    #[arg(long)]
    json: bool,
}

/// `tideline`.
pub fn run(dir: &Path, cfg: &Config, a: &TidelineArgs) -> Result<i32> {
    let mut words = a.value.clone();
    if let Some(s) = &a.session {
        words.insert(0, s.clone());
        words.insert(0, "--session".into());
    }
    let parsed = config::tideline_args(&words).map_err(|e| anyhow::anyhow!("{e}"))?;
    // The recorded sessions, for a name no running proxy lists (an unknown
    // name is answered with the closest of them all).
    let recorded = match &parsed.session {
        Some(_) if dir.join("oceancode.db").exists() => {
            let store = open_store(dir)?;
            let c = store.session_candidates()?;
            let _ = store.shutdown();
            c
        }
        _ => Vec::new(),
    };
    runtime_block(tideline(dir, cfg, a, parsed.session, recorded))
}

async fn tideline(
    dir: &Path,
    cfg: &Config,
    a: &TidelineArgs,
    spec: Option<String>,
    recorded: Vec<Candidate>,
) -> Result<i32> {
    let proxies = Proxies::find(cfg, dir, a.proxy.as_deref(), &a.token).await;
    if proxies.live.is_empty() {
        return Err(proxies.none_error());
    }
    let (target, session) = match spec {
        Some(spec) => {
            let mut cands = proxies.candidates();
            for c in recorded {
                if !cands.iter().any(|l| l.id == c.id) {
                    cands.push(c);
                }
            }
            let id = resolve(&spec, &cands)?;
            let target = match proxies.holding(&id) {
                Some(p) => p,
                // The one proxy asked for: its own answer says what it knows.
                None if proxies.explicit => &proxies.live[0],
                None => bail!(
                    "session {id} is not held by a running proxy on {} (it has ended, or left memory after {} idle minutes until its next request); `oceancode-proxy status {id}` shows the line it ran with",
                    dir.display(),
                    oceancode_proxy::runtime::IDLE_EVICT_MS / 60_000
                ),
            };
            (target, Some(id))
        }
        None => {
            let target = proxies.for_latest().unwrap_or(&proxies.live[0]);
            if proxies.live.len() > 1 {
                errln!(
                    "oceancode-proxy: note: {} proxies run on this data dir; this is {} (give --session or --proxy for another)",
                    proxies.live.len(),
                    target.describe()
                );
            }
            (target, None)
        }
    };
    let body = serde_json::json!({"session": session, "value": a.value.first()});
    let answer = target
        .client
        .post_json("/_oceancode/tideline", &body)
        .await?;
    if !answer.status.is_success() {
        errln!("{}", answer.error_message());
        return Ok(2);
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&answer.json)?);
    } else {
        outln!("{}", tideline_line(&answer.json));
    }
    Ok(0)
}

/// The `tideline` answer for a person: what changed, then the session's
/// line, gauge, window and cut, e.g. `session S: line 50% (100k) · gauge 43k ·
/// window 31 rows · cut up to seq 25`.
fn tideline_line(v: &serde_json::Value) -> String {
    use oceancode_ledger::status::{counted, tokens};
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
    // A change applies from the next request: the line shown is the one in
    // force until then, said so, with what comes.
    let global = v["scope"].as_str() == Some("all sessions");
    let coming = match (v["action"].as_str(), s["override"].as_str()) {
        (Some("set" | "default"), Some(own)) if global => format!(
            " (it keeps its own line {own}: `tideline --session {id} default` lets the new one apply)"
        ),
        (Some("set"), _) => {
            let value = v["value"].as_str().unwrap_or("?");
            let share = value
                .strip_suffix('%')
                .and_then(|p| p.parse::<f64>().ok())
                .zip(m["context"].as_u64())
                .map(|(p, c)| format!(" ({})", tokens((c as f64 * p / 100.0) as u64)))
                .unwrap_or_default();
            format!(" now, {value}{share} from its next request")
        }
        (Some("default"), _) => " now, the configured line from its next request".to_string(),
        _ => String::new(),
    };
    format!(
        "{head}session {id}: line {} ({}){coming} · gauge {} · window {} · {cut}",
        s["line_spec"].as_str().unwrap_or("?"),
        tokens(n("line")),
        tokens(n("gauge")),
        counted(n("window_rows"), "row"),
    )
}
