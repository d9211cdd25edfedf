//! `tideline [--session S] [50% | 500k | now | default]`: show or change a
//! running proxy's line through its admin API.

use super::admin_client::AdminClient;
use super::out::{errln, outln};
use super::{admin_client, runtime_block, AdminTokenFlag};
use anyhow::Result;
use clap::Args;
use oceancode_config::{self as config, Config};

/// `tideline`'s flags.
#[derive(Args, Debug)]
pub struct TidelineArgs {
    /// Session id (default: all sessions for a set, the latest for `now`).
    #[arg(long)]
    session: Option<String>,
    /// Admin URL of the running proxy (default: http://<listen>).
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
pub fn run(cfg: &Config, a: &TidelineArgs) -> Result<i32> {
    let mut words = a.value.clone();
    if let Some(s) = &a.session {
        words.insert(0, s.clone());
        words.insert(0, "--session".into());
    }
    let parsed = config::tideline_args(&words).map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = admin_client(cfg, a.proxy.as_deref(), &a.token);
    runtime_block(tideline(
        client,
        parsed.session,
        a.value.first().cloned(),
        a.json,
    ))
}

async fn tideline(
    client: AdminClient,
    session: Option<String>,
    value: Option<String>,
    json: bool,
) -> Result<i32> {
    let body = serde_json::json!({"session": session, "value": value});
    let answer = client.post_json("/_oceancode/tideline", &body).await?;
    if !answer.status.is_success() {
        errln!("{}", answer.error_message());
        return Ok(2);
    }
    if json {
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
