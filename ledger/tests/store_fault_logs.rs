//! One WARN line per fault, not per event (issue 12 item 1): a stalled
//! writer with a full queue under several sessions logs that commits fail
//! and that the queue sheds, once each, and says when it recovered.
//! (Its own test binary: it installs the process's global subscriber.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::LedgerWrite;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_testkit::ledger::*;
use oceancode_window::{Dialect, Event, RowKind};
use parking_lot::Mutex;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn warn_lines(buf: &Buf) -> Vec<String> {
    String::from_utf8_lossy(&buf.0.lock())
        .lines()
        .filter(|l| l.contains("WARN"))
        .map(str::to_string)
        .collect()
}

fn fault(store: &Store, round: u64) {
    let lock = rusqlite::Connection::open(store.db_path()).expect("open");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    for step in 0..30u64 {
        for id in ["x", "y", "z"] {
            let seq = round * 100 + step + 1;
            store
                .submit(rows_event(
                    id,
                    vec![text_row(seq, 1, RowKind::Assistant, "during the fault")],
                ))
                .expect("submit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    lock.execute_batch("COMMIT").expect("unlock");
    store.settle_blocking().expect("settle");
    for id in ["x", "y", "z"] {
        store.resync(id).expect("resync");
    }
}

#[test]
fn one_warn_line_per_fault() {
    let buf = Buf::default();
    let writer = buf.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Store::open(
        tmp.path(),
        StoreOptions {
            queue_capacity: 4,
            batch_max: 1,
            busy_timeout: Duration::from_millis(100),
            ..StoreOptions::default()
        },
    )
    .expect("open");
    for id in ["x", "y", "z"] {
        store
            .submit(Event::Session(meta(id, Dialect::Anthropic)))
            .expect("session");
    }
    store.settle_blocking().expect("settle");
    fault(&store, 0);
    let first = warn_lines(&buf);
    assert_eq!(first.len(), 2, "{first:#?}");
    assert!(first.iter().any(|l| l.contains("commits failing")));
    assert!(first.iter().any(|l| l.contains("queue full")));
    let text = String::from_utf8_lossy(&buf.0.lock()).into_owned();
    assert!(text.contains("ledger commits recovered"), "{text}");
    // A second fault is a second pair of lines.
    fault(&store, 1);
    assert_eq!(warn_lines(&buf).len(), 4, "{:#?}", warn_lines(&buf));
}
