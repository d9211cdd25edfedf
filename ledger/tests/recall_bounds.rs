//! Issue 33.3: one word repeated in a search, against rows that hold it
//! many times, pinned a core for minutes (FTS5 `snippet()` costs about
//! occurrences × terms², and it ran for every matching row). On both
//! engines the search answers within seconds.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_testkit::ledger::*;
use std::time::{Duration, Instant};

#[test]
fn a_repeated_word_search_over_rows_full_of_it_answers_in_seconds() {
    for b in backends() {
        let tmp = tempfile::tempdir().expect("tmp");
        let store = b.open(tmp.path());
        let mut s = Sim::new(&store, "sess-zq", T0);
        for _ in 0..20 {
            s.prompt(&"zq ".repeat(20_000));
        }
        s.end_step(1, 1, 0, 0);
        s.settle();
        let words = vec!["zq".to_string(); 150];
        let (tx, rx) = std::sync::mpsc::channel();
        let st = store.clone();
        let t = Instant::now();
        std::thread::spawn(move || {
            let _ = tx.send(st.search(&words, 20).map(|h| h.len()));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{}: the search still ran after 20 s", b.name()));
        eprintln!(
            "{}: 150 × zq over 20 rows × 20,000 zq: {:?}",
            b.name(),
            t.elapsed()
        );
        assert_eq!(got.expect("search"), 20, "{}", b.name());
    }
}
