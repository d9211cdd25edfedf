//! `statusline [--format T]`: one line of the session meter for Claude
//! Code's `statusLine` setting, a tmux status or a shell prompt. It reads
//! the JSON Claude Code pipes on stdin (its `session_id`), asks the running
//! proxies of the data dir (the registry, [`super::proxies`]) with short
//! timeouts, and prints the line of the session whose client session is
//! that id (no stdin: the latest session). It never fails: no proxy, no
//! session, a proxy that does not answer in time — each is one short line
//! and exit code 0.

use super::out::outln;
use super::proxies::Proxies;
use super::AdminTokenFlag;
use clap::Args;
use oceancode_config::{self as config, Config};
use oceancode_ledger::status::{tokens, usd};
use serde_json::Value;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

/// `statusline`'s flags.
#[derive(Args, Debug)]
pub struct StatuslineArgs {
    /// The line's template; fields: {window} {line} {pct} {cuts} {cut}
    /// {last_cut} {hit} {spend} {cap} {rows} {session} {model}.
    #[arg(long, value_name = "TEMPLATE", default_value = DEFAULT_FORMAT)]
    format: String,
    /// Session (ledger id, the client's session id, or a unique prefix);
    /// default: the `session_id` on stdin, else the latest session.
    #[arg(long)]
    session: Option<String>,
    /// Admin URL of the running proxy (default: the data dir's registry).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
}

/// The default template: `oceancode 14k/20k · 3 cuts (cut 12 rows) · hit 87% · $0.4200`.
pub const DEFAULT_FORMAT: &str =
    "oceancode {window}/{line} · {cuts} cuts{cut} · hit {hit}% · {spend}{cap}";

/// How long each proxy has to answer: loopback answers in well under a
/// millisecond; a proxy slower than this is reported, not waited for.
const WAIT: Duration = Duration::from_millis(40);

/// How long stdin may take to reach its end (Claude Code writes the JSON
/// at once and closes it; a terminal or an open pipe is not waited for).
const STDIN_WAIT: Duration = Duration::from_millis(40);

/// `statusline`: always exit code 0, always one line.
pub fn run(dir: &Path, cfg: &Config, a: &StatuslineArgs) -> anyhow::Result<i32> {
    let stdin = read_stdin();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let Ok(rt) = rt else {
        outln!("oceancode: no runtime");
        return Ok(0);
    };
    let proxies = rt.block_on(Proxies::find_within(
        cfg,
        dir,
        a.proxy.as_deref(),
        &a.token,
        WAIT,
        false,
    ));
    let from_stdin = stdin
        .recv_timeout(STDIN_WAIT)
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok());
    let client_session = from_stdin
        .as_ref()
        .and_then(|v| v["session_id"].as_str())
        .map(str::to_string);
    outln!(
        "{}",
        line(
            cfg,
            &proxies,
            a.session.as_deref(),
            client_session.as_deref(),
            &a.format
        )
    );
    Ok(0)
}

/// Read stdin to its end on a thread (unless it is a terminal): the
/// receiver gets it, or nothing when it does not end.
fn read_stdin() -> std::sync::mpsc::Receiver<String> {
    use std::io::IsTerminal;
    let (tx, rx) = std::sync::mpsc::channel();
    if !std::io::stdin().is_terminal() {
        std::thread::spawn(move || {
            let mut s = String::new();
            // At most 1 MiB: the JSON is a few hundred bytes.
            if std::io::stdin()
                .take(1 << 20)
                .read_to_string(&mut s)
                .is_ok()
            {
                let _ = tx.send(s);
            }
        });
    }
    rx
}

/// The line for the proxies found: the session named (`--session`), else
/// the live session whose client session is `client_session` (Claude
/// Code's id), else — none given — the latest.
fn line(
    cfg: &Config,
    proxies: &Proxies,
    named: Option<&str>,
    client_session: Option<&str>,
    format: &str,
) -> String {
    if proxies.live.is_empty() {
        return match proxies
            .unreachable
            .iter()
            .find(|(_, why)| why != super::proxies::NO_ANSWER)
        {
            Some(_) => "oceancode: proxy refuses the admin token".to_string(),
            None => "oceancode: no proxy".to_string(),
        };
    }
    let found = match (named, client_session) {
        (Some(spec), _) => oceancode_ledger::resolve::resolve(spec, &proxies.candidates())
            .ok()
            .and_then(|id| Some(proxies.holding(&id)?.session(&id)?.clone())),
        (None, Some(cs)) => by_client_session(proxies, cs),
        (None, None) => proxies
            .latest_session()
            .and_then(|(p, id)| p.session(&id).cloned()),
    };
    match found {
        Some(s) => render(format, &fields(cfg, &s)),
        None => "oceancode: no request of this session yet".to_string(),
    }
}

/// The live session whose client session is Claude Code's `cs` (the proxy
/// keys it `cc:<id>`), or whose ledger id is `cs`; the most recently active
/// should several proxies hold one.
fn by_client_session(proxies: &Proxies, cs: &str) -> Option<Value> {
    let keyed = format!("cc:{cs}");
    proxies
        .live
        .iter()
        .flat_map(|p| &p.sessions)
        .filter(|s| s["client_session"] == keyed.as_str() || s["id"] == cs)
        .max_by_key(|s| s["last_ms"].as_i64().unwrap_or(0))
        .cloned()
}

/// The template's fields for a session as `GET /_oceancode/sessions` lists it.
fn fields(cfg: &Config, s: &Value) -> Vec<(&'static str, String)> {
    let m = &s["meter"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let (gauge, line) = (n(&m["gauge"]), n(&m["line"]));
    let t = &s["totals"];
    let input = n(&t["input"]) + n(&t["cache_read"]) + n(&t["cache_write"]);
    let hit = (n(&t["cache_read"]) * 100 + input / 2)
        .checked_div(input)
        .unwrap_or(0);
    let limits = &s["limits"];
    // The proxy's own count (linked sessions too) when it keeps a budget,
    // else the session's usage at the configured price.
    let spent = limits["spent_usd"].as_f64().or_else(|| {
        let price = config::price(s["model"].as_str()?, cfg)?;
        Some(price.cost_usd(
            n(&t["input"]),
            n(&t["output"]),
            n(&t["cache_read"]),
            n(&t["cache_write"]),
        ))
    });
    let cap = limits["spend_cap_usd"].as_f64();
    let last_cut = n(&m["last_cut_rows"]);
    let pct = (gauge * 100).checked_div(line).unwrap_or(0);
    let text = |k: &str| s[k].as_str().unwrap_or("").to_string();
    vec![
        ("window", tokens(gauge)),
        ("line", tokens(line)),
        ("pct", pct.to_string()),
        ("cuts", n(&m["cuts"]).to_string()),
        (
            "cut",
            if last_cut > 0 {
                format!(" (cut {last_cut} rows)")
            } else {
                String::new()
            },
        ),
        ("last_cut", last_cut.to_string()),
        ("hit", hit.to_string()),
        ("spend", spent.map(usd).unwrap_or_else(|| "$?".into())),
        (
            "cap",
            cap.map(|c| format!("/{}", usd(c))).unwrap_or_default(),
        ),
        ("rows", n(&m["window_rows"]).to_string()),
        ("session", text("id")),
        ("model", text("model")),
    ]
}

/// `format` with each `{name}` of `fields` replaced; anything else as it is.
fn render(format: &str, fields: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(format.len() + 32);
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find('}')
            .and_then(|close| Some((close, fields.iter().find(|(k, _)| *k == &after[..close])?)))
        {
            Some((close, (_, v))) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    // One line, whatever a field held.
    out.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // a test: failures panic
    use super::*;
    use serde_json::json;

    fn session() -> Value {
        json!({
            "id": "s1", "client_session": "cc:cc-uuid", "model": "unpriced-model", "last_ms": 5,
            "meter": {"gauge": 14_200, "line": 20_000, "cuts": 3, "last_cut_rows": 12, "window_rows": 40},
            "totals": {"input": 100, "output": 50, "cache_read": 870, "cache_write": 30},
            "limits": {"spent_usd": 0.42, "spend_cap_usd": 2.0},
        })
    }

    #[test]
    fn the_default_line_shows_window_line_cuts_the_last_cut_hit_and_spend() {
        let cfg = Config::default();
        let line = render(DEFAULT_FORMAT, &fields(&cfg, &session()));
        assert_eq!(
            line,
            "oceancode 14k/20k · 3 cuts (cut 12 rows) · hit 87% · $0.4200/$2.00"
        );
    }

    #[test]
    fn a_template_takes_fields_and_keeps_the_rest() {
        let cfg = Config::default();
        let mut s = session();
        s["meter"]["last_cut_rows"] = json!(0);
        s["limits"] = Value::Null;
        let f = fields(&cfg, &s);
        assert_eq!(
            render(
                "{window}/{line} cuts {cuts}{cut} hit {hit}% {pct}% {spend}{cap} {x} {",
                &f
            ),
            "14k/20k cuts 3 hit 87% 71% $? {x} {"
        );
    }

    #[test]
    fn no_proxy_and_no_session_are_one_short_line() {
        let cfg = Config::default();
        let none = Proxies {
            live: Vec::new(),
            unreachable: vec![(
                "http://127.0.0.1:1".into(),
                super::super::proxies::NO_ANSWER.into(),
            )],
            explicit: false,
        };
        assert_eq!(
            line(&cfg, &none, None, Some("x"), DEFAULT_FORMAT),
            "oceancode: no proxy"
        );
    }

    #[test]
    fn claude_codes_session_id_picks_its_session_and_no_stdin_the_latest() {
        let cfg = Config::default();
        let mut other = session();
        other["id"] = json!("s2");
        other["client_session"] = json!("other");
        other["last_ms"] = json!(9);
        let p = Proxies {
            live: vec![super::super::proxies::Live {
                client: super::super::admin_client::AdminClient::new("http://127.0.0.1:1", None),
                entry: None,
                sessions: vec![session(), other],
                data_dir: None,
            }],
            unreachable: Vec::new(),
            explicit: false,
        };
        assert_eq!(line(&cfg, &p, None, Some("cc-uuid"), "{session}"), "s1");
        assert_eq!(line(&cfg, &p, None, None, "{session}"), "s2");
        assert_eq!(line(&cfg, &p, Some("s1"), None, "{session}"), "s1");
        assert_eq!(
            line(&cfg, &p, None, Some("not-proxied"), "{session}"),
            "oceancode: no request of this session yet"
        );
    }
}
