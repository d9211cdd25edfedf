//! Recall: read the verbatim record back, hidden branches included.
//!
//! - `recall_log`: one session's rows, oldest first, bodies clipped to
//!   [`BODY_MAX`] characters; `pattern` is SQL `LIKE` over the row's text
//!   (`%` and `_` are wildcards); `before` keeps seqs below it; `limit` keeps
//!   the newest matches (so `--before <first seq shown>` pages back).
//! - `recall_entry`: one row, whole.
//! - `search`: every session, newest first; every word must appear (SQLite
//!   FTS5 over the rows' text).
//!
//! They are methods of [`LedgerRead`](crate::store::LedgerRead) (the SQLite
//! queries are in `store::reads`); this module holds the hit and its
//! formatting. Callers settle the store first.

use crate::model::RowKind;

/// Longest body shown by `recall_log` (characters).
pub const BODY_MAX: usize = 200;

/// One line of a recall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallHit {
    /// Session id.
    pub session: String,
    /// Row seq.
    pub seq: u64,
    /// Turn.
    pub turn: u32,
    /// Role as sent.
    pub role: String,
    /// Row kind.
    pub kind: RowKind,
    /// Hidden by a branch (a rewind or client compaction).
    pub hidden: bool,
    /// Body: the row's text clipped to [`BODY_MAX`] (log) or a snippet with
    /// the matches in `[brackets]` (search).
    pub body: String,
}

impl RecallHit {
    /// `seq 42 · t03 · assistant · body` (`· hidden` after the role for hidden rows),
    /// prefixed by the session id when `with_session`.
    pub fn line(&self, with_session: bool) -> String {
        let mut s = String::new();
        if with_session {
            s.push_str(&self.session);
            s.push_str(" · ");
        }
        s.push_str(&format!(
            "seq {} · t{:02} · {}",
            self.seq, self.turn, self.role
        ));
        if self.hidden {
            s.push_str(" · hidden");
        }
        s.push_str(" · ");
        s.push_str(&self.body);
        s
    }
}

/// Whitespace collapsed, clipped to `max` characters (`…` marks a cut).
pub fn clip_body(text: &str, max: usize) -> String {
    crate::page::clip(&crate::page::squash(text), max)
}

/// An FTS5 query where every word must appear (each word a quoted string).
pub fn fts_query(words: &[String]) -> Option<String> {
    let terms: Vec<String> = words
        .iter()
        .flat_map(|w| w.split_whitespace())
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" AND "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fts_terms_are_quoted() {
        assert_eq!(
            fts_query(&["foo bar".into(), "a\"b".into()]).as_deref(),
            Some("\"foo\" AND \"bar\" AND \"a\"\"b\"")
        );
        assert_eq!(fts_query(&[]), None);
    }

    #[test]
    fn bodies_are_clipped() {
        assert_eq!(clip_body("a\n  b", 10), "a b");
        assert_eq!(clip_body("abcdef", 4), "abc…");
    }
}
