//! `ledger rebuild --merge`: the optional model merge of `SESSION.md`.

use super::out::{err, errln, outln};
use anyhow::{bail, Context, Result};
use oceancode_config::Config;
use oceancode_ledger::merge as m;
use oceancode_ledger::store::LedgerStore;
use oceancode_proxy::merge as lm;
use oceancode_window::Dialect;
use std::io::BufRead;

/// Ask y/N on stderr; anything but `y`/`yes` (EOF included) is no.
fn confirm(question: &str) -> bool {
    err!("{question} [y/N] ");
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(_) => matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    }
}

/// Fold each session's merge backlog with `ledger.merge.model`.
pub fn run(store: &dyn LedgerStore, cfg: &Config, ids: &[String], yes: bool) -> Result<i32> {
    let Some(model) = cfg.ledger.merge.model.clone() else {
        bail!("the model merge is off: set ledger.merge.model in the config to use --merge");
    };
    let mut work = Vec::new();
    for id in ids {
        let (from, to) = store.page_backlog(id)?;
        if from <= to {
            let meta = store
                .session_meta(id)?
                .with_context(|| format!("no session {id}"))?;
            work.push((id.clone(), meta.dialect, from, to));
        }
    }
    if work.is_empty() {
        outln!("merge: no backlog (every turn past the tideline is merged)");
        return Ok(0);
    }
    let turns: u32 = work.iter().map(|(_, _, f, t)| t - f + 1).sum();
    if !yes
        && !confirm(&format!(
            "--merge sends {turns} turn{} of {} session{} to {model} (model calls, billed to your API key). Continue?",
            if turns == 1 { "" } else { "s" },
            work.len(),
            if work.len() == 1 { "" } else { "s" },
        ))
    {
        errln!("merge: cancelled, nothing sent");
        return Ok(1);
    }
    let up = oceancode_proxy::upstream::Upstream::new(
        oceancode_proxy::upstream::UpstreamOptions::from_config(&cfg.limits),
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    for (id, dialect, from, to) in work {
        let (page, transcripts) = m::read_inputs(store.data_dir(), &id, from, to);
        let prompt = m::prompt(&id, &page, &transcripts);
        let answer = rt.block_on(ask(&up, cfg, dialect, &model, &prompt))?;
        let mut notes = m::parse_notes(&answer.text, from, to);
        let n = notes.len();
        notes.push(m::marker_with(to, &model, &answer.usage));
        store.add_page_notes(&id, notes)?;
        outln!(
            "merged {id}: t{from:02}–t{to:02} → {n} line{} in SESSION.md",
            if n == 1 { "" } else { "s" }
        );
    }
    Ok(0)
}

/// One non-streaming request to the provider of the session's dialect,
/// with the credentials of this process's environment.
async fn ask(
    up: &oceancode_proxy::upstream::Upstream,
    cfg: &Config,
    dialect: Dialect,
    model: &str,
    prompt: &str,
) -> Result<lm::Answer> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (base, provider, auth) = match dialect {
        Dialect::Anthropic => {
            let auth = if let Some(k) = env("ANTHROPIC_API_KEY") {
                lm::Auth::ApiKey(lm::Secret::new(k))
            } else if let Some(t) = env("ANTHROPIC_AUTH_TOKEN") {
                lm::Auth::Bearer(lm::Secret::new(t))
            } else {
                bail!("--merge needs ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN) for an Anthropic session");
            };
            (cfg.anthropic_upstream(), lm::Provider::Anthropic, auth)
        }
        Dialect::OpenaiChat | Dialect::OpenaiResponses => {
            let Some(k) = env("OPENAI_API_KEY") else {
                bail!("--merge needs OPENAI_API_KEY for an OpenAI session");
            };
            (
                cfg.openai_upstream(),
                lm::Provider::OpenAi,
                lm::Auth::Bearer(lm::Secret::new(k)),
            )
        }
        Dialect::Gemini => bail!("--merge does not call Gemini yet: merge this session with an Anthropic or OpenAI model's session"),
    };
    Ok(lm::ask(up, base, provider, model, &auth, prompt).await?)
}
