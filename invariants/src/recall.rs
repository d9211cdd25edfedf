//! The recall tool's query: any input (the call's JSON text, or any text as
//! its `search`) parses without panicking into an ask or a refusal; an
//! accepted search has at most [`SEARCH_MAX_TERMS`] words, distinct when
//! folded to lower case, none longer than [`SEARCH_MAX_TERM_CHARS`], at most
//! [`SEARCH_MAX_TOKENS`] tokens in all; a refusal says "query too broad"
//! and never echoes the words; the FTS5 query made of the words is valid
//! FTS5 syntax (SQLite runs it, `snippet()` included, on a row that holds
//! every word many times), and finds that row when the words are plain
//! ASCII letters and digits; lines listed stay within 1 to `MAX_LIMIT`.

use oceancode_ledger::recall::{
    fts_query, SEARCH_MAX_TERMS, SEARCH_MAX_TERM_CHARS, SEARCH_MAX_TOKENS,
};
use oceancode_proxy::recall_tool::search::{self, Ask, MATCH_MAX, MAX_LIMIT};
use rusqlite::Connection;
use std::cell::RefCell;

/// Input: `[mode, text]`; mode bit 0 set: `text` is the call's input JSON
/// as the model sent it, else `text` is the value of `search`.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let input = if mode & 1 == 1 {
        text.into_owned()
    } else {
        serde_json::json!({ "search": text }).to_string()
    };
    match search::parse(&input) {
        Err(msg) => {
            assert!(msg.starts_with("oceancode_recall: "), "{msg}");
            if msg.contains("query too broad") {
                assert!(msg.len() < 200, "a refusal is short: {msg}");
            }
        }
        Ok(Ask::Entry(_)) => {}
        Ok(Ask::Log { pattern, limit, .. }) => {
            assert!((1..=MAX_LIMIT).contains(&limit));
            assert!(pattern.is_none_or(|p| p.chars().count() <= MATCH_MAX));
        }
        Ok(Ask::Search { terms, limit }) => {
            assert!((1..=MAX_LIMIT).contains(&limit));
            assert!(!terms.is_empty(), "an empty search is a log");
            assert!(terms.len() <= SEARCH_MAX_TERMS, "{terms:?}");
            let mut folded: Vec<String> = terms.iter().map(|t| t.to_lowercase()).collect();
            folded.sort();
            folded.dedup();
            assert_eq!(folded.len(), terms.len(), "repeated words: {terms:?}");
            for t in &terms {
                assert!(t.chars().count() <= SEARCH_MAX_TERM_CHARS, "{t}");
                assert!(!t.is_empty() && !t.contains(char::is_whitespace), "{t:?}");
            }
            let tokens: usize = terms
                .iter()
                .map(|t| {
                    t.split(|c: char| !c.is_alphanumeric())
                        .filter(|s| !s.is_empty())
                        .count()
                })
                .sum();
            assert!(tokens <= SEARCH_MAX_TOKENS, "{tokens} tokens: {terms:?}");
            runs_in_fts5(&terms);
        }
    }
}

thread_local! {
    static DB: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

/// The words' FTS5 query runs (and finds a row of them, for plain words).
fn runs_in_fts5(terms: &[String]) {
    let query = fts_query(terms).expect("words make a query");
    let row = std::iter::repeat_n(terms.join(" "), 20)
        .collect::<Vec<_>>()
        .join(" filler ");
    DB.with(|db| {
        let mut db = db.borrow_mut();
        let c = db.get_or_insert_with(|| {
            let c = Connection::open_in_memory().expect("an in-memory database");
            c.execute_batch("CREATE VIRTUAL TABLE t USING fts5(text);")
                .expect("fts5");
            c
        });
        c.execute("DELETE FROM t", []).expect("delete");
        c.execute("INSERT INTO t(text) VALUES (?1)", [&row])
            .expect("insert");
        let found: Vec<String> = c
            .prepare("SELECT snippet(t, 0, '[', ']', '…', 16) FROM t WHERE t MATCH ?1")
            .and_then(|mut s| {
                s.query_map([&query], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .unwrap_or_else(|e| panic!("FTS5 refused {query:?}: {e}"));
        let plain = terms
            .iter()
            .all(|t| t.chars().all(|ch| ch.is_ascii_alphanumeric()));
        if plain {
            assert_eq!(found.len(), 1, "{query:?} finds the row of its words");
        }
    });
}
