//! The recall itself: the `recall` CLI's three reads against the ledger
//! (settled first), clipped as the CLI clips them, as the tool's text.

use oceancode_ledger::store::LedgerStore;
use serde::Deserialize;
use std::time::Duration;

/// The tool's input.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Input {
    /// `recall --match`.
    #[serde(rename = "match")]
    pub pattern: Option<String>,
    /// `recall --before`.
    pub before: Option<u64>,
    /// `recall entry SEQ`.
    pub seq: Option<u64>,
    /// `recall search WORDS`.
    pub search: Option<String>,
    /// `--limit` (default 20, at most 100).
    pub limit: Option<usize>,
}

/// Most lines listed.
pub const MAX_LIMIT: usize = 100;
/// Longest entry returned whole (characters); the rest is clipped.
pub const ENTRY_MAX: usize = 16_000;
/// How long a recall waits for the ledger's writer to catch up.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Run the call with `input` (JSON text) on session `session`; blocking
/// (SQLite): call from a blocking thread.
pub fn run(store: &dyn LedgerStore, session: &str, input: &str) -> String {
    let input: Input = match serde_json::from_str(input) {
        Ok(i) => i,
        Err(e) => {
            return format!(
                "oceancode_recall: the input is not an object of match, before, seq, search, limit ({e})"
            )
        }
    };
    if let Err(e) = store.settle_within(SETTLE_WAIT) {
        tracing::warn!(error = %e, "recall tool: the ledger did not settle; reading what is committed");
    }
    let limit = input.limit.unwrap_or(20).clamp(1, MAX_LIMIT);
    let res = if let Some(seq) = input.seq {
        entry(store, session, seq)
    } else if let Some(words) = input.search.as_deref().filter(|w| !w.trim().is_empty()) {
        let words: Vec<String> = words.split_whitespace().map(str::to_string).collect();
        store.search(&words, limit).map(|hits| {
            if hits.is_empty() {
                "no entry contains every word".to_string()
            } else {
                hits.iter()
                    .map(|h| h.line(true))
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        })
    } else {
        store
            .recall_log(session, input.pattern.as_deref(), input.before, limit)
            .map(|hits| {
                if hits.is_empty() {
                    "no entry matched in this session".to_string()
                } else {
                    hits.iter()
                        .map(|h| h.line(false))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            })
    };
    res.unwrap_or_else(|e| format!("oceancode_recall: the ledger could not be read ({e})"))
}

fn entry(
    store: &dyn LedgerStore,
    session: &str,
    seq: u64,
) -> Result<String, oceancode_ledger::store::StoreError> {
    let Some(meta) = store.session_meta(session)? else {
        return Ok(format!("this session is not in the ledger yet (seq {seq})"));
    };
    let Some((row, hidden)) = store.recall_entry(session, seq)? else {
        return Ok(format!("this session has no seq {seq}"));
    };
    let text = oceancode_ledger::transcript::render_turn(
        meta.dialect,
        row.turn,
        std::slice::from_ref(&row),
    );
    let head = format!(
        "seq {} · turn {} · {}{}\n",
        row.seq,
        row.turn,
        row.kind.as_str(),
        if hidden { " · hidden by a rewind" } else { "" }
    );
    let mut out = head;
    if text.chars().count() > ENTRY_MAX {
        out.extend(text.chars().take(ENTRY_MAX));
        out.push_str("\n… (clipped)");
    } else {
        out.push_str(&text);
    }
    Ok(out)
}
