//! `export --md`: one Markdown document per session: YAML frontmatter, every
//! turn of the active line (the ledger's own transcript files when they
//! exist, else rendered from the database with the same renderer), and a
//! `## Summary` table. Settles the store first.

use crate::model::{Row, RowKind};
use crate::rebuild::Progress;
use crate::store::{LedgerStore, StoreError};
use crate::transcript::{self, cell, utc_iso};
use oceancode_config::Price;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

/// Errors of an export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The ledger failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the output failed.
    #[error("writing the export: {0}")]
    Io(#[from] io::Error),
    /// JSON encoding failed.
    #[error("encoding the export: {0}")]
    Json(#[from] serde_json::Error),
}

/// A YAML scalar: a JSON string literal (valid YAML double-quoted scalar).
fn yaml_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// Write the Markdown export of `session` to `out`.
pub fn markdown(
    store: &dyn LedgerStore,
    session: &str,
    pricer: &dyn Fn(&str) -> Option<Price>,
    out: &mut dyn Write,
    progress: Option<&Progress>,
) -> Result<(), ExportError> {
    store.settle_blocking()?;
    let meta = store
        .session_meta(session)?
        .ok_or_else(|| StoreError::UnknownSession(session.to_string()))?;
    let all = store.session_rows(session, true)?;
    let hidden_rows = all.iter().filter(|(_, h)| *h).count();
    let mut turns: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    for (row, hidden) in all {
        if !hidden {
            turns.entry(row.turn).or_default().push(row);
        }
    }
    let steps = store.steps(session)?;
    let cuts = store.cuts(session)?;
    let edits = store.context_edits(session)?;
    let cut_upto = cuts.iter().map(|c| c.upto_seq).max().unwrap_or(0);
    let (totals, by_model) = crate::status::totals(&steps, pricer);
    let rows_total: usize = turns.values().map(Vec::len).sum();
    let dir = store.data_dir();
    let last_ms = steps.iter().map(|s| s.ts_ms).max().unwrap_or(meta.last_ms);

    let mut w = io::BufWriter::new(out);
    writeln!(w, "---")?;
    writeln!(w, "session: {}", yaml_str(&meta.id))?;
    writeln!(w, "client: {}", yaml_str(&meta.client))?;
    if let Some(cs) = &meta.client_session {
        writeln!(w, "client_session: {}", yaml_str(cs))?;
    }
    writeln!(w, "dialect: {}", meta.dialect.as_str())?;
    writeln!(w, "model: {}", yaml_str(&meta.model))?;
    if let Some(p) = &meta.parent {
        writeln!(w, "parent: {}", yaml_str(p))?;
    }
    if let Some(s) = meta.parent_seq {
        writeln!(w, "parent_seq: {s}")?;
    }
    writeln!(w, "created: {}", utc_iso(meta.created_ms))?;
    writeln!(w, "last_activity: {}", utc_iso(last_ms.max(meta.last_ms)))?;
    writeln!(w, "turns: {}", turns.len())?;
    writeln!(w, "rows: {rows_total}")?;
    writeln!(w, "hidden_rows: {hidden_rows}")?;
    writeln!(w, "steps: {}", steps.len())?;
    writeln!(w, "cuts: {}", cuts.len())?;
    if !edits.is_empty() {
        writeln!(w, "context_edits: {}", edits.len())?;
    }
    writeln!(w, "past_tideline_upto_seq: {cut_upto}")?;
    writeln!(w, "tokens_in: {}", totals.input_total())?;
    writeln!(w, "tokens_out: {}", totals.output)?;
    writeln!(w, "cache_read_tokens: {}", totals.cache_read)?;
    writeln!(w, "cache_write_tokens: {}", totals.cache_write)?;
    writeln!(w, "cache_hit_ratio: {:.4}", totals.cache_hit_ratio())?;
    match totals.cost_if_known() {
        Some(c) => writeln!(w, "cost_usd: {c:.6}")?,
        None => writeln!(w, "cost_usd: null")?,
    }
    // The same requests with no cuts and the client's own cache pattern,
    // estimated from the ledger (`status::unmanaged`).
    let cache = crate::status::CacheSummary::of(&steps, &cuts, pricer);
    if let Some(u) = cache.unmanaged_usd {
        writeln!(w, "unmanaged_cost_usd_estimate: {u:.6}")?;
    }
    if cache.free_cuts > 0 {
        writeln!(w, "free_cuts: {}", cache.free_cuts)?;
    }
    for m in &cache.misses {
        writeln!(w, "cache_misses_{}: {}", m.cause, m.steps)?;
    }
    if totals.reasoning > 0 {
        writeln!(w, "reasoning_tokens: {}", totals.reasoning)?;
    }
    if totals.compactions > 0 || totals.beyond_window > 0 {
        writeln!(w, "provider_compactions: {}", totals.compactions)?;
        writeln!(w, "tokens_beyond_window: {}", totals.beyond_window)?;
    }
    if !totals.edits.is_empty() {
        writeln!(w, "provider_context_edits:")?;
        for e in &totals.edits {
            writeln!(w, "  - type: {}", yaml_str(&e.kind))?;
            writeln!(w, "    steps: {}", e.steps)?;
            writeln!(w, "    cleared_input_tokens: {}", e.cleared_input_tokens)?;
            writeln!(w, "    cleared_tool_uses: {}", e.cleared_tool_uses)?;
            writeln!(
                w,
                "    cleared_thinking_turns: {}",
                e.cleared_thinking_turns
            )?;
        }
    }
    writeln!(
        w,
        "exported_by: {}",
        yaml_str(&format!("oceancode-proxy {}", env!("CARGO_PKG_VERSION")))
    )?;
    writeln!(w, "---\n")?;
    writeln!(w, "# Session {}", transcript::one_line(&meta.id))?;

    let mut done = 0u64;
    let total = rows_total as u64;
    for (turn, rows) in &turns {
        w.write_all(b"\n")?;
        let path = dir.turn_file(session, *turn);
        // The turn file as written, read with no link followed and
        // bounded (a link to /dev/zero or a FIFO is not read): else the turn
        // rendered from the database, the same bytes.
        let text = match dir.read_file(&path, crate::inside::READ_MAX) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => transcript::render_turn(meta.dialect, *turn, rows),
        };
        let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
        w.write_all(escape_client_headings(&text, &seqs).as_bytes())?;
        done += rows.len() as u64;
        if let Some(p) = progress {
            p(done, total);
        }
    }

    if let Some(last) = edits.last() {
        // The rows the edit set in force changes in every request (the
        // transcript above keeps their originals).
        let set: serde_json::Value = serde_json::from_str(&last.set).unwrap_or_default();
        let seqs = |k: &str| -> Vec<u64> {
            match &set[k] {
                serde_json::Value::Array(a) => {
                    a.iter().filter_map(serde_json::Value::as_u64).collect()
                }
                serde_json::Value::Object(m) => m.keys().filter_map(|s| s.parse().ok()).collect(),
                _ => Vec::new(),
            }
        };
        writeln!(w, "\n## Context edits\n")?;
        writeln!(w, "| Edit | Seqs | Tokens before | Tokens after |")?;
        writeln!(w, "|---:|:---|---:|---:|")?;
        for e in &edits {
            let s: Vec<String> = e.seqs.iter().map(u64::to_string).collect();
            writeln!(
                w,
                "| {} | {} | {} | {} |",
                e.n,
                s.join(", "),
                e.tokens_before,
                e.tokens_after
            )?;
        }
        writeln!(w, "\n| Seq | Edited (in every later request) |")?;
        writeln!(w, "|---:|:---|")?;
        for s in seqs("deleted") {
            writeln!(w, "| {s} | deleted |")?;
        }
        for s in seqs("rewritten") {
            writeln!(w, "| {s} | rewritten |")?;
        }
        let notes = set["notes"].as_array().cloned().unwrap_or_default();
        if !notes.is_empty() {
            writeln!(
                w,
                "\n{} note{} of the agent's in force (sent as its own words, where each stands):",
                notes.len(),
                if notes.len() == 1 { "" } else { "s" }
            )?;
            for n in &notes {
                let place = match n["after"].as_u64().unwrap_or(0) {
                    0 => "before every message".to_string(),
                    s => format!("after seq {s}"),
                };
                writeln!(w, "\n- note {}, {place}:\n", n["id"].as_u64().unwrap_or(0))?;
                for line in n["text"].as_str().unwrap_or_default().lines() {
                    writeln!(w, "  > {line}")?;
                }
            }
        }
    }

    writeln!(w, "\n## Summary\n")?;
    writeln!(
        w,
        "| Turn | Seq | Rows | Steps | Tool calls | Tokens | Past tideline | First line |"
    )?;
    writeln!(w, "|---:|:---|---:|---:|---:|---:|:---:|:---|")?;
    for (turn, rows) in &turns {
        let Some(s) = transcript::summarize_turn(meta.dialect, *turn, rows) else {
            continue;
        };
        let steps_in: BTreeSet<u32> = rows.iter().map(|r| r.step).collect();
        let calls: usize = rows
            .iter()
            .filter(|r| r.kind == RowKind::Assistant)
            .map(|r| {
                crate::parts::parts(meta.dialect, &r.raw)
                    .iter()
                    .filter(|p| matches!(p, crate::parts::Part::ToolCall { .. }))
                    .count()
            })
            .sum();
        let seqs = if s.first_seq == s.last_seq {
            s.first_seq.to_string()
        } else {
            format!("{}–{}", s.first_seq, s.last_seq)
        };
        let past = if s.last_seq <= cut_upto { "yes" } else { "" };
        writeln!(
            w,
            "| {turn} | {seqs} | {} | {} | {calls} | {} | {past} | {} |",
            rows.len(),
            steps_in.len(),
            s.tokens,
            cell(&s.first_line)
        )?;
    }
    writeln!(
        w,
        "\n| Model | Steps | Input | Cache read | Cache write | Output | Cost (USD) |"
    )?;
    writeln!(w, "|:---|---:|---:|---:|---:|---:|---:|")?;
    for (model, t) in by_model
        .iter()
        .chain(std::iter::once((&"**total**".to_string(), &totals)))
    {
        let cost = t
            .cost_if_known()
            .map_or_else(|| "unknown".to_string(), |c| format!("{c:.4}"));
        writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {cost} |",
            cell(model),
            t.steps,
            t.input,
            t.cache_read,
            t.cache_write,
            t.output
        )?;
    }
    provider_context(&mut w, &steps)?;
    failed_steps(&mut w, &steps)?;
    pruned_rows(&mut w, &steps)?;
    writeln!(
        w,
        "\n{} turn{} · {} rows · {} steps · {} cuts · cache hit ratio {:.1}%",
        turns.len(),
        if turns.len() == 1 { "" } else { "s" },
        rows_total,
        steps.len(),
        cuts.len(),
        totals.cache_hit_ratio() * 100.0
    )?;
    w.flush()?;
    Ok(())
}

/// The steps that failed (no whole answer): one table row each, none when
/// every step completed.
fn failed_steps(w: &mut dyn Write, steps: &[crate::store::StepRecord]) -> io::Result<()> {
    let failed: Vec<&crate::store::StepRecord> =
        steps.iter().filter(|s| s.error.is_some()).collect();
    if failed.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "\nFailed steps (no whole answer; the client's rows of the step are recorded):\n"
    )?;
    writeln!(w, "| Step | Status | Error | Time |")?;
    writeln!(w, "|---:|---:|:---|:---|")?;
    for s in failed {
        writeln!(
            w,
            "| {} | {} | {} | {} |",
            s.step,
            s.status,
            cell(s.error.as_deref().unwrap_or_default()),
            transcript::utc_iso(s.ts_ms)
        )?;
    }
    Ok(())
}

/// The rows whose tool output `ledger.compress` sent as a pointer, with the
/// step whose cut chose them; none when it never did.
fn pruned_rows(w: &mut dyn Write, steps: &[crate::store::StepRecord]) -> io::Result<()> {
    let marked: Vec<String> = steps
        .iter()
        .filter_map(|s| s.detail.compress.as_ref().map(|c| (s.step, c)))
        .flat_map(|(step, c)| c.rows.iter().map(move |seq| format!("{seq} (step {step})")))
        .collect();
    if marked.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "\nTool output sent upstream as a pointer by ledger.compress (the transcript above keeps the originals), seq (from step): {}",
        marked.join(", ")
    )
}

/// The steps on which the provider managed the context itself (server-side
/// compaction, applied context edits): one table row each, none when no
/// step had any.
fn provider_context(w: &mut dyn Write, steps: &[crate::store::StepRecord]) -> io::Result<()> {
    let managed: Vec<&crate::store::StepRecord> = steps
        .iter()
        .filter(|s| {
            s.detail.compactions > 0 || !s.detail.edits.is_empty() || !s.detail.extra.is_zero()
        })
        .collect();
    if managed.is_empty() {
        return Ok(());
    }
    writeln!(
        w,
        "\nContext managed by the provider (the window column is the real input after it; billed beyond it is in the tokens above):\n"
    )?;
    writeln!(
        w,
        "| Step | Window | Compactions | Billed beyond window | Edits applied |"
    )?;
    writeln!(w, "|---:|---:|---:|---:|:---|")?;
    for s in managed {
        let mut edits = Vec::new();
        crate::status::add_edits(&mut edits, &s.detail.edits);
        let edits: Vec<String> = edits.iter().map(crate::status::EditTotal::label).collect();
        writeln!(
            w,
            "| {} | {} | {} | {} | {} |",
            s.step,
            s.usage.window_total(),
            s.detail.compactions,
            s.detail.extra.window_total(),
            cell(&edits.join("; "))
        )?;
    }
    Ok(())
}

/// A turn file as the export embeds it: the headings of the messages' own
/// text (`# Plan`, a prompt's `## Context`) escaped (`\# Plan`), so that
/// only the file's own structure — its `# Turn N` heading and the
/// `## seq N · …` anchor of each row of `seqs`, in order — reads as
/// headings of the document. Lines inside fenced code stay as they are.
fn escape_client_headings(turn_md: &str, seqs: &[u64]) -> String {
    let mut out = String::with_capacity(turn_md.len() + 64);
    let mut next = seqs.iter().peekable();
    // The open fence: its character and length.
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in turn_md.split_inclusive('\n').enumerate() {
        let body = line.trim_end_matches(['\n', '\r']);
        let lead = body.len() - body.trim_start_matches(' ').len();
        let t = &body[lead..];
        let run = |c: char| t.chars().take_while(|&x| x == c).count();
        if lead <= 3 {
            match fence {
                Some((c, n)) => {
                    if run(c) >= n && t.trim_start_matches(c).trim().is_empty() {
                        fence = None;
                    }
                    out.push_str(line);
                    continue;
                }
                None => {
                    if let Some(c) = ['`', '~'].into_iter().find(|&c| run(c) >= 3) {
                        fence = Some((c, run(c)));
                        out.push_str(line);
                        continue;
                    }
                }
            }
        } else if fence.is_some() {
            out.push_str(line);
            continue;
        }
        let hashes = run('#');
        let heading = lead <= 3
            && (1..=6).contains(&hashes)
            && t[hashes..]
                .chars()
                .next()
                .is_none_or(|c| c == ' ' || c == '\t');
        let anchor = next.peek().is_some_and(|s| {
            t.starts_with(&format!("## seq {s} · ")) || t == format!("## seq {s}")
        });
        if anchor {
            next.next();
        }
        let own = anchor || (i == 0 && t.starts_with("# Turn "));
        if heading && !own {
            out.push_str(&line[..lead]);
            out.push('\\');
            out.push_str(&line[lead..]);
        } else {
            out.push_str(line);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape_client_headings;

    #[test]
    fn client_headings_are_escaped_and_the_files_own_are_kept() {
        let md = "# Turn 2\n\n## seq 4 · user\n\n# Plan\n## seq 9 · user\n```bash\n# a comment\n```\n\n## seq 5 · assistant · call Bash\n\n  ### Done\n####### seven\n#tag\n";
        assert_eq!(
            escape_client_headings(md, &[4, 5]),
            "# Turn 2\n\n## seq 4 · user\n\n\\# Plan\n\\## seq 9 · user\n```bash\n# a comment\n```\n\n## seq 5 · assistant · call Bash\n\n  \\### Done\n####### seven\n#tag\n"
        );
    }
}
