//! The recall itself: the `recall` CLI's three reads against the ledger
//! (settled first), clipped as the CLI clips them, as the tool's text.
//! What a call asks is parsed and bounded first ([`parse`], pure): a
//! search's words by [`oceancode_ledger::recall::search_terms`], a match
//! pattern's length, the lines listed; what a call returns is bounded too
//! ([`RESULT_MAX`]), and so is the number of calls one answer gets run
//! ([`MAX_CALLS`]).

use oceancode_ledger::recall::{search_terms, Scope};
use oceancode_ledger::store::{LedgerStore, StoreError};
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

/// What a call asks, parsed and bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// One entry whole.
    Entry(u64),
    /// Rows with every term (distinct, bounded), at most `limit`.
    Search {
        /// The words, as [`search_terms`] gives them.
        terms: Vec<String>,
        /// Most lines.
        limit: usize,
    },
    /// This session's rows.
    Log {
        /// `LIKE` pattern, at most [`MATCH_MAX`] characters.
        pattern: Option<String>,
        /// Seqs below this.
        before: Option<u64>,
        /// Most lines.
        limit: usize,
    },
}

/// Most lines listed.
pub const MAX_LIMIT: usize = 100;
/// Longest entry returned whole (characters); the rest is clipped.
pub const ENTRY_MAX: usize = 16_000;
/// Longest `match` pattern (characters).
pub const MATCH_MAX: usize = 256;
/// Longest result of one call (characters); the rest is clipped.
pub const RESULT_MAX: usize = 32_000;
/// Most recall calls of one answer the proxy runs; the others are answered
/// with a note and not run.
pub const MAX_CALLS: usize = 8;
/// How long a recall waits for the ledger's writer to catch up.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// What `input` (the call's JSON text) asks, or the text answered to the
/// model when it cannot be run.
pub fn parse(input: &str) -> Result<Ask, String> {
    let input: Input = serde_json::from_str(input).map_err(|e| {
        format!(
            "oceancode_recall: the input is not an object of match, before, seq, search, limit ({e})"
        )
    })?;
    let limit = input.limit.unwrap_or(20).clamp(1, MAX_LIMIT);
    if let Some(seq) = input.seq {
        return Ok(Ask::Entry(seq));
    }
    if let Some(words) = input.search {
        let terms = search_terms(&[words])
            .map_err(|e| format!("oceancode_recall: {e}; search fewer, rarer words"))?;
        if !terms.is_empty() {
            return Ok(Ask::Search { terms, limit });
        }
    }
    if let Some(p) = &input.pattern {
        if p.chars().count() > MATCH_MAX {
            return Err(format!(
                "oceancode_recall: match is longer than {MATCH_MAX} characters"
            ));
        }
    }
    Ok(Ask::Log {
        pattern: input.pattern,
        before: input.before,
        limit,
    })
}

/// `text` clipped to [`RESULT_MAX`] characters, the cut said.
pub fn bound(text: String) -> String {
    let n = text.chars().count();
    if n <= RESULT_MAX {
        return text;
    }
    let mut out: String = text.chars().take(RESULT_MAX).collect();
    out.push_str(&format!(
        "\n… (clipped: {} more characters; ask for fewer lines)",
        n - RESULT_MAX
    ));
    out
}

/// Run the call with `input` (JSON text) on session `session`; a search
/// reads every session when `search_all`, else the session and its
/// relatives. Blocking (SQLite): call from a blocking thread.
pub fn run(store: &dyn LedgerStore, session: &str, input: &str, search_all: bool) -> String {
    let ask = match parse(input) {
        Ok(a) => a,
        Err(text) => return text,
    };
    if let Err(e) = store.settle_within(SETTLE_WAIT) {
        tracing::warn!(error = %e, "recall tool: the ledger did not settle; reading what is committed");
    }
    let res = match ask {
        Ask::Entry(seq) => entry(store, session, seq),
        Ask::Search { terms, limit } => {
            let scope = if search_all {
                Scope::All
            } else {
                Scope::Related(session)
            };
            store.search_in(&terms, limit, scope).map(|hits| {
                if hits.is_empty() {
                    "no entry contains every word".to_string()
                } else {
                    hits.iter()
                        .map(|h| h.line(true))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            })
        }
        Ask::Log {
            pattern,
            before,
            limit,
        } => store
            .recall_log(session, pattern.as_deref(), before, limit)
            .map(|hits| {
                if hits.is_empty() {
                    "no entry matched in this session".to_string()
                } else {
                    hits.iter()
                        .map(|h| h.line(false))
                        .collect::<Vec<_>>()
                        .join("\n")
                }
            }),
    };
    bound(res.unwrap_or_else(|e| match e {
        StoreError::TooBroad(e) => format!("oceancode_recall: {e}"),
        e => format!("oceancode_recall: the ledger could not be read ({e})"),
    }))
}

/// The answer to a call past [`MAX_CALLS`] in one answer.
pub fn not_run() -> String {
    format!("oceancode_recall: not run: at most {MAX_CALLS} recall calls are answered at once; call again")
}

fn entry(store: &dyn LedgerStore, session: &str, seq: u64) -> Result<String, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_word_is_searched_once_and_a_broad_query_refused() {
        let rep = vec!["zq"; 150].join(" ");
        let ask = parse(&serde_json::json!({ "search": rep }).to_string());
        assert_eq!(
            ask,
            Ok(Ask::Search {
                terms: vec!["zq".into()],
                limit: 20
            })
        );
        let rep = vec!["zq"; 300].join(" ");
        let ask = parse(&serde_json::json!({ "search": rep }).to_string());
        assert!(
            ask.as_ref()
                .is_err_and(|e| e.contains("query too broad") && !e.contains("zq zq")),
            "{ask:?}"
        );
        let many = (0..20)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let ask = parse(&serde_json::json!({ "search": many }).to_string());
        assert!(ask.is_err_and(|e| e.contains("query too broad")));
        let ask = parse(&serde_json::json!({ "match": "%a".repeat(200) }).to_string());
        assert!(ask.is_err());
        assert_eq!(parse(r#"{"seq": 3, "search": "x"}"#), Ok(Ask::Entry(3)));
        assert!(parse("[1]").is_err());
    }

    #[test]
    fn a_result_is_clipped_to_its_bound() {
        let t = bound("é".repeat(RESULT_MAX + 10));
        assert!(t.starts_with(&"é".repeat(RESULT_MAX)));
        assert!(t.ends_with("(clipped: 10 more characters; ask for fewer lines)"));
        assert_eq!(bound("short".into()), "short");
    }
}
