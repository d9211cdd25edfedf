//! `context [SESSION] [--drop SPANS] [--keep SEQS] [--note TEXT] [--receipt]`:
//! export the session's live window to `sessions/<id>/context.txt` (the
//! proxy keeps it fresh from then on and reads the edits made to it), or
//! make the same edit without the file, or print the last receipt — through
//! the admin API of the proxy holding the session.

use super::out::{errln, outln};
use super::proxies::Proxies;
use super::{open_store, runtime_block, AdminTokenFlag};
use anyhow::{bail, Result};
use clap::Args;
use oceancode_config::Config;
use oceancode_ledger::resolve::{resolve, Candidate};
use std::path::Path;

/// `context`'s flags.
#[derive(Args, Debug)]
pub struct ContextArgs {
    /// Session: ledger id, the client's session name or id, or a unique
    /// prefix (default: the most recent one).
    session: Option<String>,
    /// Drop these from the window: `t` (every tool call and result but the
    /// running round), seqs, `A-B` ranges, tool-call ids (comma-separated
    /// or repeated).
    #[arg(long, value_name = "SPANS")]
    drop: Vec<String>,
    /// Seqs held back from `--drop`.
    #[arg(long, value_name = "SEQS")]
    keep: Vec<String>,
    /// A note kept in the window, read as the agent's own words.
    #[arg(long, value_name = "TEXT")]
    note: Option<String>,
    /// Print the last receipt.
    #[arg(long)]
    receipt: bool,
    /// Admin URL of the running proxy (default: the one holding the session).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
    /// Print the admin API's JSON answer.
    #[arg(long)]
    json: bool,
}

/// `context`.
pub fn run(dir: &Path, cfg: &Config, a: &ContextArgs) -> Result<i32> {
    let recorded = match &a.session {
        Some(_) if dir.join("oceancode.db").exists() => {
            let store = open_store(dir)?;
            let c = store.session_candidates()?;
            let _ = store.shutdown();
            c
        }
        _ => Vec::new(),
    };
    runtime_block(context(dir, cfg, a, recorded))
}

async fn context(
    dir: &Path,
    cfg: &Config,
    a: &ContextArgs,
    recorded: Vec<Candidate>,
) -> Result<i32> {
    let proxies = Proxies::find(cfg, dir, a.proxy.as_deref(), &a.token).await;
    let mut resolved = match &a.session {
        Some(spec) => {
            let mut cands = proxies.candidates();
            for c in recorded {
                if !cands.iter().any(|l| l.id == c.id) {
                    cands.push(c);
                }
            }
            Some(resolve(spec, &cands)?)
        }
        None => None,
    };
    if proxies.live.is_empty() {
        if a.receipt {
            // The receipt is a file: readable without a proxy.
            if let Some(id) = &resolved {
                let p = oceancode_ledger::paths::DataDir::new(dir)
                    .session_dir(id)
                    .join("context.receipt.txt");
                // A regular file only, bounded (the session dir is the
                // agent's to write: a FIFO or a link must not hang or flood
                // the command).
                if let Ok((bytes, _)) = oceancode_proxy::context::io::read_file(
                    &p,
                    oceancode_proxy::context::io::MAX_RECEIPT_BYTES,
                ) {
                    outln!("{}", String::from_utf8_lossy(&bytes).trim_end());
                    return Ok(0);
                }
            }
        }
        return Err(proxies.none_error());
    }
    let target = match &resolved {
        Some(id) => match proxies.holding(id) {
            Some(p) => p,
            None if proxies.explicit => &proxies.live[0],
            None => bail!(
                "session {id} is not held by a running proxy on {} (its context is exported by the proxy that serves it; it is held again from its next request)",
                dir.display()
            ),
        },
        None => match proxies.latest_session() {
            Some((p, id)) => {
                resolved = Some(id);
                p
            }
            None => proxies.for_latest().unwrap_or(&proxies.live[0]),
        },
    };
    let mut body = serde_json::json!({"session": resolved.as_deref().unwrap_or("latest")});
    if a.receipt {
        body["receipt"] = true.into();
    }
    if !a.drop.is_empty() {
        body["drop"] = serde_json::json!(a.drop);
    }
    if !a.keep.is_empty() {
        body["keep"] = serde_json::json!(a.keep);
    }
    if let Some(n) = &a.note {
        body["note"] = serde_json::json!(n);
    }
    let answer = target
        .client
        .post_json("/_oceancode/context", &body)
        .await?;
    if !answer.status.is_success() {
        errln!("{}", answer.error_message());
        return Ok(2);
    }
    let v = &answer.json;
    if a.json {
        outln!("{}", serde_json::to_string_pretty(v)?);
    } else if a.receipt
        || v.get("receipt").is_some_and(|r| r.is_string()) && v.get("path").is_none()
    {
        match v["receipt"].as_str() {
            Some(r) => outln!("{}", r.trim_end()),
            None => outln!(
                "no receipt yet for session {}",
                v["session"].as_str().unwrap_or("?")
            ),
        }
    } else {
        outln!("{}", v["path"].as_str().unwrap_or(""));
        errln!(
            "oceancode-proxy: exported {} messages of session {} (export {}); edit the file, the next request reads it; the receipt: {}",
            v["messages"].as_u64().unwrap_or(0),
            v["session"].as_str().unwrap_or("?"),
            v["nonce"].as_str().unwrap_or("?"),
            v["receipt_path"].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

/// `evict`'s flags.
#[derive(Args, Debug)]
pub struct EvictArgs {
    /// `[SESSION] [PERCENT | through TURN]`: cut now down to PERCENT of the
    /// session's line (default 50%) or through turn TURN, inside a long
    /// turn too; the newest ask and the newest step always stay. SESSION
    /// defaults to the most recent one.
    words: Vec<String>,
    /// Admin URL of the running proxy (default: the one holding the session).
    #[arg(long, value_name = "URL", env = "OCEANCODE_PROXY_URL")]
    proxy: Option<String>,
    #[command(flatten)]
    token: AdminTokenFlag,
}

/// `evict`.
pub fn run_evict(dir: &Path, cfg: &Config, a: &EvictArgs) -> Result<i32> {
    let mut words = a.words.clone();
    let is_value = |w: &str| w == "through" || w.trim_end_matches('%').parse::<u8>().is_ok();
    let session = match words.first() {
        Some(w) if !is_value(w) => Some(words.remove(0)),
        _ => None,
    };
    let recorded = match &session {
        Some(_) if dir.join("oceancode.db").exists() => {
            let store = open_store(dir)?;
            let c = store.session_candidates()?;
            let _ = store.shutdown();
            c
        }
        _ => Vec::new(),
    };
    runtime_block(async move {
        let proxies = Proxies::find(cfg, dir, a.proxy.as_deref(), &a.token).await;
        if proxies.live.is_empty() {
            return Err(proxies.none_error());
        }
        let (target, id) = match &session {
            Some(spec) => {
                let mut cands = proxies.candidates();
                for c in recorded {
                    if !cands.iter().any(|l| l.id == c.id) {
                        cands.push(c);
                    }
                }
                let id = resolve(spec, &cands)?;
                let t = match proxies.holding(&id) {
                    Some(p) => p,
                    None if proxies.explicit => &proxies.live[0],
                    None => bail!(
                        "session {id} is not held by a running proxy on {}",
                        dir.display()
                    ),
                };
                (t, id)
            }
            // The session `status` and `context` take when none is named.
            None => proxies.latest_session().unwrap_or_else(|| {
                (
                    proxies.for_latest().unwrap_or(&proxies.live[0]),
                    "latest".to_string(),
                )
            }),
        };
        let body = serde_json::json!({"session": id, "value": words.join(" ")});
        let answer = target.client.post_json("/_oceancode/evict", &body).await?;
        if !answer.status.is_success() {
            errln!("{}", answer.error_message());
            return Ok(2);
        }
        let v = &answer.json;
        outln!(
            "session {}: the next request cuts up to seq {} (~{} tokens leave the window)",
            v["session"].as_str().unwrap_or("?"),
            v["upto"].as_u64().unwrap_or(0),
            oceancode_ledger::status::tokens(v["tokens"].as_u64().unwrap_or(0))
        );
        Ok(0)
    })
}
