//! Figures for issue 12's closing note, items 1-3 (not timed tests: run by
//! hand, `cargo test -p oceancode-tests --test ledger_fault_figures --
//! --ignored --nocapture --test-threads 1`). Only APIs the pre-fix tree also
//! has are used, so the same file measures before and after.
//!
//! 1. The database held (`BEGIN EXCLUSIVE`) for 12 s while three clients
//!    work and a fourth starts: rows in the ledger after the lock clears and
//!    every client sent one more request, against rows sent.
//! 2. `{"writer":{"queue_capacity":4,"batch_max":1}}` and a 25 s lock:
//!    request and health latency while the writer is stalled.
//! 3. The data dir deleted while serving: rows in the ledger (as a fresh
//!    store reads the dir after shutdown) against rows sent.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_tests::{push_tool_step, Harness};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Client {
    name: String,
    history: Vec<Value>,
}

impl Client {
    fn new(name: &str) -> Client {
        Client {
            name: name.to_string(),
            history: vec![json!({"role": "user", "content": format!("task of {name}")})],
        }
    }

    async fn step(&mut self, h: &Harness) -> Duration {
        let body = json!({
            "model": "claude-x",
            "max_tokens": 1000,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": self.history,
        })
        .to_string();
        let t0 = Instant::now();
        let got = h
            .post("/v1/messages", &[("x-oceancode-session", &self.name)], body)
            .await;
        let took = t0.elapsed();
        assert_eq!(got.status, 200, "{}", got.text());
        let n = self.history.len();
        push_tool_step(
            &mut self.history,
            &got.json()["content"],
            &format!("out {n}"),
        );
        took
    }

    /// Rows a complete ledger holds: the last request's messages and its answer.
    fn rows_sent(&self) -> usize {
        self.history.len() - 1
    }
}

fn harness_fake() -> FakeConfig {
    FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        json!({"command": "ls"}),
    )))
}

/// Rows recorded for each client (by its session key), from `store`.
fn rows_recorded(store: &Store, clients: &[Client]) -> Vec<usize> {
    let list = store.list_sessions().unwrap_or_default();
    clients
        .iter()
        .map(|c| {
            list.iter()
                .filter(|s| {
                    store
                        .session_meta(&s.id)
                        .ok()
                        .flatten()
                        .and_then(|m| m.client_session)
                        .is_some_and(|k| k.ends_with(&c.name))
                })
                .map(|s| s.rows as usize)
                .max()
                .unwrap_or(0)
        })
        .collect()
}

fn lock(store: &Store) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(store.db_path()).expect("open");
    c.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn figure_1_rows_after_a_12s_lock() {
    let h = Harness::start(harness_fake(), |_| {}).await;
    let mut clients: Vec<Client> = ["a", "b", "c"].iter().map(|n| Client::new(n)).collect();
    for _ in 0..3 {
        for c in &mut clients {
            c.step(&h).await;
        }
    }
    h.settle().await;
    let l = lock(h.store());
    let t0 = Instant::now();
    let mut i = 0;
    while t0.elapsed() < Duration::from_secs(12) {
        if i == 5 {
            clients.push(Client::new("new-during-fault"));
        }
        for c in &mut clients {
            c.step(&h).await;
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    l.execute_batch("COMMIT").expect("unlock");
    h.settle().await;
    for c in &mut clients {
        c.step(&h).await;
    }
    h.settle().await;
    let got = rows_recorded(h.store(), &clients);
    let sent: Vec<usize> = clients.iter().map(Client::rows_sent).collect();
    println!(
        "FIGURE 1: rows in the ledger after a 12 s lock and one more request each: {got:?} of {sent:?} ({} of {})",
        got.iter().sum::<usize>(),
        sent.iter().sum::<usize>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn figure_2_latency_with_a_full_queue_and_a_25s_lock() {
    let h = Harness::start(harness_fake(), |o| {
        o.store = Some(StoreOptions {
            queue_capacity: 4,
            batch_max: 1,
            ..StoreOptions::default()
        });
    })
    .await;
    let mut c = Client::new("q");
    c.step(&h).await;
    h.settle().await;
    let l = lock(h.store());
    let t0 = Instant::now();
    let mut lat = Vec::new();
    let mut health = Vec::new();
    while t0.elapsed() < Duration::from_secs(25) {
        lat.push(c.step(&h).await);
        let t = Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(30), h.admin("/_oceancode/health")).await;
        health.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    l.execute_batch("COMMIT").expect("unlock");
    lat.sort();
    health.sort();
    println!(
        "FIGURE 2: {} requests during a 25 s lock: median {:?}, max {:?}; health median {:?}, max {:?}",
        lat.len(),
        lat[lat.len() / 2],
        lat[lat.len() - 1],
        health[health.len() / 2],
        health[health.len() - 1]
    );
    h.settle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn figure_3_rows_after_the_data_dir_is_deleted() {
    let mut h = Harness::start(harness_fake(), |_| {}).await;
    let mut clients: Vec<Client> = ["x", "y"].iter().map(|n| Client::new(n)).collect();
    for _ in 0..3 {
        for c in &mut clients {
            c.step(&h).await;
        }
    }
    h.settle().await;
    std::fs::remove_dir_all(h.data.path()).expect("delete the data dir");
    for _ in 0..3 {
        for c in &mut clients {
            c.step(&h).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    h.settle().await;
    h.stop().await;
    let sent: Vec<usize> = clients.iter().map(Client::rows_sent).collect();
    let got = match Store::open(h.data.path(), StoreOptions::default()) {
        Ok(s) => rows_recorded(&s, &clients),
        Err(_) => vec![0; clients.len()],
    };
    println!(
        "FIGURE 3: rows in the data dir after it was deleted and 3 more requests each: {got:?} of {sent:?}"
    );
}
