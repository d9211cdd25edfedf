//! Recall: read the verbatim record back, hidden branches included.
//!
//! - `recall_log`: one session's rows, oldest first, bodies clipped to
//!   [`BODY_MAX`] characters; `pattern` is SQL `LIKE` over the row's text
//!   (`%` and `_` are wildcards); `before` keeps seqs below it; `limit` keeps
//!   the newest matches (so `--before <first seq shown>` pages back).
//! - `recall_entry`: one row, whole.
//! - `search`: every session (or one session and its relatives, see
//!   [`Scope`]), newest first; every word must appear (SQLite FTS5 or
//!   PostgreSQL full-text search over the rows' text). A search is bounded
//!   before it runs ([`search_terms`]: distinct words, their number and
//!   length) and while it runs ([`SEARCH_TIME`], [`SEARCH_MAX_SCAN`]); past a
//!   bound it fails with [`TooBroad`] instead of holding a core. The
//!   agent's notes in force (`[[note]]` in context.txt, each session's
//!   latest edit set) are searched too and listed first ([`note_hits`]).
//!
//! They are methods of [`LedgerRead`](crate::store::LedgerRead) (the SQLite
//! queries are in `store::reads`); this module holds the hit and its
//! formatting. Callers settle the store first.

use crate::model::RowKind;
use std::time::Duration;

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
    crate::facts::squash_clip(text, max)
}

/// Longest search text (characters, all words with their spaces).
pub const SEARCH_MAX_CHARS: usize = 512;
/// Most distinct words of a search.
pub const SEARCH_MAX_TERMS: usize = 8;
/// Longest word of a search (characters).
pub const SEARCH_MAX_TERM_CHARS: usize = 128;
/// Most tokens the words make together (`a.b.c` is one word of three
/// tokens, searched as a phrase).
pub const SEARCH_MAX_TOKENS: usize = 16;
/// Most matching rows a search looks at (SQLite: the newest ones; each
/// engine stops at [`SEARCH_TIME`] anyway).
pub const SEARCH_MAX_SCAN: usize = 10_000;
/// Longest a search runs before the engine stops it (a SQLite interrupt,
/// PostgreSQL's `statement_timeout`).
pub const SEARCH_TIME: Duration = Duration::from_secs(2);

/// A search refused before it ran, or stopped while it ran: its words are
/// too many or too long, or it took longer than [`SEARCH_TIME`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("query too broad: {0}")]
pub struct TooBroad(pub String);

impl TooBroad {
    /// The search ran past [`SEARCH_TIME`].
    pub fn timed_out() -> Self {
        TooBroad(format!(
            "the search ran past {} s; search fewer or rarer words",
            SEARCH_TIME.as_secs()
        ))
    }
}

/// Which sessions a search reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every session in the ledger (the `recall search` command, the viewer).
    All,
    /// This session, its parent, its children and its siblings (the other
    /// sessions of its parent): what the in-band recall tool reads by
    /// default. A session known only by the fingerprint of its opening
    /// (an `fp:` client key) reads itself alone: its "relatives" may be
    /// another user's conversations that began with the same words.
    Related(&'a str),
}

impl Scope<'_> {
    /// The session whose relatives are read; None: every session.
    pub fn session(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Related(s) => Some(s),
        }
    }
}

/// The words of a search, split on whitespace, bounded and without
/// repeats (folded to lower case, as both engines fold them): at most
/// [`SEARCH_MAX_CHARS`] of text, [`SEARCH_MAX_TERMS`] distinct words of at
/// most [`SEARCH_MAX_TERM_CHARS`] each, [`SEARCH_MAX_TOKENS`] tokens in all.
/// A word of punctuation only (no token) is dropped. Empty when there is no
/// word.
pub fn search_terms(words: &[String]) -> Result<Vec<String>, TooBroad> {
    let chars: usize = words.iter().map(|w| w.chars().count() + 1).sum();
    if chars > SEARCH_MAX_CHARS + 1 {
        return Err(TooBroad(format!(
            "the search is {} characters long (at most {SEARCH_MAX_CHARS})",
            chars - 1
        )));
    }
    let mut terms: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    // A control character (NUL ends an FTS5 string early) separates words
    // as whitespace does.
    let split = |w: &String| -> Vec<String> {
        w.split(|c: char| c.is_whitespace() || c.is_control())
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()
    };
    for w in words.iter().flat_map(split) {
        let folded = w.to_lowercase();
        // A word with no token (punctuation only: `-`, `...`) would be an
        // empty FTS5 phrase, which no row holds: it is no word.
        if seen.contains(&folded) || tokens(&w) == 0 {
            continue;
        }
        if w.chars().count() > SEARCH_MAX_TERM_CHARS {
            return Err(TooBroad(format!(
                "a word is longer than {SEARCH_MAX_TERM_CHARS} characters"
            )));
        }
        seen.push(folded);
        terms.push(w);
    }
    if terms.len() > SEARCH_MAX_TERMS {
        return Err(TooBroad(format!(
            "{} distinct words (at most {SEARCH_MAX_TERMS})",
            terms.len()
        )));
    }
    let tokens: usize = terms.iter().map(|t| tokens(t)).sum();
    if tokens > SEARCH_MAX_TOKENS {
        return Err(TooBroad(format!(
            "the words make {tokens} tokens (at most {SEARCH_MAX_TOKENS}; punctuation splits a word)"
        )));
    }
    Ok(terms)
}

/// The tokens of a word as the full-text tokenizers see them, about:
/// runs of letters and digits.
fn tokens(w: &str) -> usize {
    w.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .count()
}

/// Most tokens of a search hit's snippet.
pub const SNIPPET_TOKENS: usize = 16;
/// Most of a row's text (bytes) a snippet is looked for in; a match past it
/// shows the row's head.
pub const SNIPPET_SCAN: usize = 256 * 1024;

/// The snippet of a search hit: at most [`SNIPPET_TOKENS`] tokens of
/// `text` around the first place one of `terms` (as [`search_terms`] gives
/// them; a term of several tokens is a phrase) appears, case ignored, each
/// match in `[brackets]`, `…` where the text is cut. Linear in the text
/// (FTS5's `snippet()` scores every window against every match, quadratic
/// in the matches); no match in it: the text's head.
pub fn snippet(text: &str, terms: &[String]) -> String {
    let toks = token_spans(text);
    let lower: Vec<String> = toks
        .iter()
        .map(|&(a, b)| text[a..b].to_lowercase())
        .collect();
    let phrases = phrases(terms);
    let match_at = |i: usize| -> Option<usize> {
        phrases
            .iter()
            .find(|p| lower.get(i..i + p.len()).is_some_and(|w| w == p.as_slice()))
            .map(Vec::len)
    };
    if toks.is_empty() {
        return String::new();
    }
    let first = (0..toks.len())
        .find(|&i| match_at(i).is_some())
        .unwrap_or(0);
    let start = first
        .saturating_sub(SNIPPET_TOKENS / 4)
        .min(toks.len().saturating_sub(SNIPPET_TOKENS));
    let end = (start + SNIPPET_TOKENS).min(toks.len());
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    let mut i = start;
    let mut at = toks[start].0;
    while i < end {
        let (a, b) = toks[i];
        out.push_str(&text[at..a]);
        match match_at(i) {
            Some(n) => {
                let j = (i + n).min(end);
                out.push('[');
                out.push_str(&text[a..toks[j - 1].1]);
                out.push(']');
                at = toks[j - 1].1;
                i = j;
            }
            None => {
                out.push_str(&text[a..b]);
                at = b;
                i += 1;
            }
        }
    }
    if end < toks.len() {
        out.push('…');
    }
    out
}

/// `text`'s tokens ([`token_spans`]), lowercased.
fn lower_tokens(text: &str) -> Vec<String> {
    token_spans(text)
        .into_iter()
        .map(|(a, b)| text[a..b].to_lowercase())
        .collect()
}

/// Each search term as its lowercased tokens (a phrase), empty ones left
/// out: what [`snippet`] and [`note_hits`] match a text's tokens against.
fn phrases(terms: &[String]) -> Vec<Vec<String>> {
    terms
        .iter()
        .map(|t| lower_tokens(t))
        .filter(|p| !p.is_empty())
        .collect()
}

/// The byte spans of `text`'s tokens (runs of letters and digits), within
/// its first [`SNIPPET_SCAN`] bytes.
fn token_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut open: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if i >= SNIPPET_SCAN {
            break;
        }
        match (c.is_alphanumeric(), open) {
            (true, None) => open = Some(i),
            (false, Some(a)) => {
                out.push((a, i));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(a) = open {
        let end = text[a..]
            .char_indices()
            .find(|&(_, c)| !c.is_alphanumeric())
            .map_or(text.len(), |(k, _)| a + k);
        out.push((a, end));
    }
    out
}

/// A note as an edit set's JSON holds it (what a search reads of it).
#[derive(serde::Deserialize)]
struct Note {
    id: u32,
    after: u64,
    text: String,
}

/// The notes of an edit set's JSON.
#[derive(serde::Deserialize, Default)]
struct NoteSet {
    #[serde(default)]
    notes: Vec<Note>,
}

/// The notes of an edit set's JSON (none when it does not read).
fn notes_of(set_json: &str) -> NoteSet {
    serde_json::from_str(set_json).unwrap_or_default()
}

/// The seqs the notes of an edit set's JSON follow.
pub fn note_seqs(set_json: &str) -> Vec<u64> {
    notes_of(set_json).notes.iter().map(|n| n.after).collect()
}

/// Most sessions whose notes a search reads (the newest first).
pub const SEARCH_MAX_NOTE_SETS: usize = 1_000;

/// The notes in force of an edit set (`context_edits.set_json`, the
/// session's latest) that hold every term, as [`RecallHit`]s: `seq` the
/// row each follows (0 = before every row), `turn` that row's (from
/// `turn_of`), `role` `note N`, the snippet as for a row. A term matches as
/// the full-text search reads a row: its tokens in a row, case ignored.
pub fn note_hits(
    session: &str,
    set_json: &str,
    terms: &[String],
    turn_of: &mut dyn FnMut(u64) -> u32,
) -> Vec<RecallHit> {
    let set = notes_of(set_json);
    let phrases = phrases(terms);
    if phrases.is_empty() {
        return Vec::new();
    }
    set.notes
        .into_iter()
        .rev()
        .filter(|n| {
            let words = lower_tokens(&n.text);
            phrases
                .iter()
                .all(|p| words.windows(p.len()).any(|w| w == p.as_slice()))
        })
        .map(|n| RecallHit {
            session: session.to_string(),
            seq: n.after,
            turn: turn_of(n.after),
            role: format!("note {}", n.id),
            kind: RowKind::Other,
            hidden: false,
            body: clip_body(&snippet(&n.text, terms), BODY_MAX),
        })
        .collect()
}

/// An FTS5 query where every term must appear (each a quoted string); the
/// terms as [`search_terms`] gives them.
pub fn fts_query(terms: &[String]) -> Option<String> {
    let terms: Vec<String> = terms
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
    fn notes_holding_every_word_are_hits_after_their_row() {
        let set = r#"{"deleted":[3],"notes":[{"id":1,"after":5,"text":"Only net/ fails; the rest builds.","raw":""},{"id":2,"after":9,"text":"Ask about net first.","raw":""}],"next_note":2}"#;
        let t = |w: &[&str]| {
            search_terms(&w.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        let hits = note_hits("s1", set, &t(&["NET", "builds"]), &mut |seq| {
            seq as u32 * 10
        });
        assert_eq!(hits.len(), 1);
        assert_eq!(
            (hits[0].seq, hits[0].turn, hits[0].role.as_str()),
            (5, 50, "note 1")
        );
        assert_eq!(
            hits[0].line(true),
            "s1 · seq 5 · t50 · note 1 · Only [net]/ fails; the rest [builds]"
        );
        let both = note_hits("s1", set, &t(&["net"]), &mut |_| 1);
        assert_eq!(
            both.iter().map(|h| h.seq).collect::<Vec<_>>(),
            [9, 5],
            "newest first"
        );
        assert!(note_hits("s1", set, &t(&["rest", "ask"]), &mut |_| 1).is_empty());
        assert!(note_hits("s1", "not json", &t(&["net"]), &mut |_| 1).is_empty());
        assert_eq!(note_seqs(set), [5, 9]);
    }

    #[test]
    fn search_terms_are_bounded_and_without_repeats() {
        let w = |s: &str| vec![s.to_string()];
        assert_eq!(
            search_terms(&w("zq ZQ zq  foo zq")),
            Ok(vec!["zq".to_string(), "foo".to_string()])
        );
        let repeated = vec!["zq"; 100].join(" ");
        assert_eq!(search_terms(&w(&repeated)), Ok(vec!["zq".to_string()]));
        let long = vec!["zq"; 200].join(" ");
        assert!(search_terms(&w(&long)).is_err(), "600 characters");
        let many: Vec<String> = (0..9).map(|i| format!("w{i}")).collect();
        assert!(search_terms(&many).is_err(), "nine distinct words");
        assert!(search_terms(&many[..8]).is_ok());
        assert!(search_terms(&w(&"x".repeat(129))).is_err());
        assert!(
            search_terms(&w(&vec!["a"; 17].join("."))).is_err(),
            "17 tokens"
        );
        assert_eq!(search_terms(&w("   ")), Ok(Vec::new()));
        assert_eq!(
            search_terms(&w("a\u{0}b \u{7}")),
            Ok(vec!["a".to_string(), "b".to_string()])
        );
        // A word of punctuation only has no token: FTS5 reads it as an empty
        // phrase that no row holds, so `parser - error` found nothing.
        assert_eq!(
            search_terms(&w("parser - error ... \" ^ * parser.")),
            Ok(vec![
                "parser".to_string(),
                "error".to_string(),
                "parser.".to_string()
            ])
        );
        assert_eq!(search_terms(&w("- ...")), Ok(Vec::new()));
        let e = search_terms(&many).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.starts_with("query too broad: ")));
    }

    #[test]
    fn a_snippet_marks_the_words_around_the_first_match() {
        let t = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            snippet("is the Flux capacitor stable?", &t("flux capacitor")),
            "is the [Flux] [capacitor] stable"
        );
        let long = format!("{}needle {}", "a ".repeat(30), "b ".repeat(30));
        let s = snippet(&long, &t("NEEDLE"));
        assert!(s.starts_with("…a a a a [needle] b"), "{s}");
        assert!(s.ends_with('…'), "{s}");
        assert_eq!(s.matches(['a', 'b']).count(), 15);
        assert_eq!(
            snippet("see notes.txt now", &t("notes.txt")),
            "see [notes.txt] now"
        );
        assert_eq!(snippet("no match here", &t("zq")), "no match here");
        assert_eq!(snippet("", &t("zq")), "");
        // Linear: a row of 200,000 matches is read at once.
        let zq = "zq ".repeat(200_000);
        let t0 = std::time::Instant::now();
        assert!(snippet(&zq, &t("zq")).starts_with("[zq] [zq]"));
        assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn bodies_are_clipped() {
        assert_eq!(clip_body("a\n  b", 10), "a b");
        assert_eq!(clip_body("abcdef", 4), "abc…");
    }
}
