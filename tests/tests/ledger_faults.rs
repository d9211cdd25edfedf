//! Ledger faults through the running proxy (issue 12 items 1 and 2): the
//! database held by another process past the busy timeout while clients
//! keep working, with a write queue of 16 events. No request waits on the
//! ledger; health says it is degraded and why; once the lock goes, every
//! session — one created during the fault too — heals from its client's next
//! full resend, without a restart: the ledger then holds exactly what a
//! fault-free run would.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_ledger::store::StoreOptions;
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_testkit::eventually_async;
use oceancode_tests::{push_tool_step, Harness};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Longest a request may take while the ledger is stalled: the fake answers
/// at once, so anything near the lock's duration means it waited on the
/// ledger.
const NO_WAIT: Duration = Duration::from_millis(1_500);

struct Client {
    name: &'static str,
    history: Vec<Value>,
    /// The usage of each answer, in order.
    usages: Vec<Value>,
}

impl Client {
    fn new(name: &'static str) -> Client {
        Client {
            name,
            history: vec![json!({"role": "user", "content": format!("task of {name}")})],
            usages: Vec::new(),
        }
    }

    /// One step: send the whole history, append the answer and a tool result.
    async fn step(&mut self, h: &Harness, n: usize) -> Duration {
        let body = json!({
            "model": "claude-x",
            "max_tokens": 1000,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": self.history,
        })
        .to_string();
        let t0 = Instant::now();
        let got = h
            .post("/v1/messages", &[("x-oceancode-session", self.name)], body)
            .await;
        let took = t0.elapsed();
        assert_eq!(got.status, 200, "{}", got.text());
        self.usages.push(got.json()["usage"].clone());
        push_tool_step(
            &mut self.history,
            &got.json()["content"],
            &format!("{} output {n}", self.name),
        );
        took
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_ledger_holds_no_request_and_every_session_heals() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        json!({"command": "ls"}),
    )));
    let h = Harness::start(fake, |o| {
        o.store = Some(StoreOptions {
            // Far less than the fault's events, enough for one request's.
            queue_capacity: 16,
            batch_max: 1,
            busy_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        });
    })
    .await;
    let mut clients = vec![Client::new("one"), Client::new("two")];
    for n in 0..3 {
        for c in &mut clients {
            c.step(&h, n).await;
        }
    }
    h.settle().await;

    // Another process holds the database.
    let lock = rusqlite::Connection::open(h.store().db_path()).expect("open");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    let held = Instant::now();
    clients.push(Client::new("three"));
    let mut slowest = Duration::ZERO;
    for n in 3..8 {
        for c in &mut clients {
            slowest = slowest.max(c.step(&h, n).await);
        }
    }
    // Health tells once the writer's commits have failed for a while.
    let hr = &h;
    let health = eventually_async(
        Duration::from_secs(10),
        "health degraded",
        move || async move {
            let health = hr.admin("/_oceancode/health").await;
            let failing = health["ledger"]["reasons"]
                .to_string()
                .contains("commits failing");
            if health["status"] == "degraded" && failing {
                Ok(health)
            } else {
                Err(health)
            }
        },
    )
    .await;
    lock.execute_batch("COMMIT").expect("unlock");
    let held = held.elapsed();
    assert!(
        slowest < NO_WAIT,
        "a request took {slowest:?} while the ledger was stalled for {held:?}"
    );
    assert_eq!(health["ok"], true);
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health["ledger"]["lag_ms"].as_u64().unwrap_or(0) > 0,
        "{health}"
    );
    let reasons = health["ledger"]["reasons"].to_string();
    assert!(reasons.contains("commits failing"), "{reasons}");

    // The ledger missed what did not fit in its queue: those sessions
    // are behind until their clients' next full resend.
    h.settle().await;
    let m = h.store().metrics();
    assert!(m.shed > 0 && m.behind > 0, "{m:?}");
    let metrics = h
        .send(
            &h.url(),
            http::Method::GET,
            "/metrics",
            &[],
            bytes::Bytes::new(),
        )
        .await;
    let text = oceancode_tests::collect(metrics).await.text();
    assert!(!text.contains("oceancode_ledger_shed_total 0\n"), "{text}");
    assert!(
        !text.contains("oceancode_ledger_behind_sessions 0\n"),
        "{text}"
    );
    let health = h.admin("/_oceancode/health").await;
    assert_eq!(health["status"], "degraded", "{health}");
    let behind: Vec<&str> = health["ledger"]["behind_sessions"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|b| b["session"].as_str())
        .collect();
    assert!(!behind.is_empty(), "{health}");
    let live = h
        .admin(&format!("/_oceancode/sessions/{}", behind[0]))
        .await;
    assert!(live["ledger_behind"].is_object(), "{live}");

    // The next request of each client heals its session.
    for c in &mut clients {
        c.step(&h, 8).await;
    }
    h.settle().await;
    let health = h.admin("/_oceancode/health").await;
    assert_eq!(health["status"], "ok", "{health}");
    let store = h.store();
    let list = store.list_sessions().expect("list");
    assert_eq!(list.len(), 3, "no session was split by the heal: {list:?}");
    let by_key: HashMap<String, String> = list
        .iter()
        .filter_map(|s| {
            let meta = store.session_meta(&s.id).ok()??;
            Some((meta.client_session?, s.id.clone()))
        })
        .collect();
    for c in &clients {
        let id = by_key
            .iter()
            .find(|(k, _)| k.ends_with(c.name))
            .map(|(_, id)| id.clone())
            .unwrap_or_else(|| panic!("no ledger session for {}: {by_key:?}", c.name));
        let s = store.load_session(&id).expect("load").expect("session");
        assert!(s.hidden.is_empty(), "{}: no spurious branch", c.name);
        // Every message the client sent last, then its last (unechoed) answer.
        let sent = &c.history[..c.history.len() - 2];
        assert_eq!(s.rows.len(), sent.len() + 1, "{}", c.name);
        for (i, (row, msg)) in s.rows.iter().zip(sent).enumerate() {
            assert_eq!(row.seq, i as u64 + 1, "{}: gap-free", c.name);
            let raw: Value = serde_json::from_str(&row.raw).expect("json");
            assert_eq!(&raw, msg, "{} seq {}", c.name, row.seq);
        }
    }
}

/// Issue 40 item 9: the steps of requests whose events were shed (the
/// database locked, the write queue full) are kept with their usage, so
/// `status`, the exports and the spend after a restart count every request.
/// Before, 10 requests through an 8-event queue kept 2 of 10 steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_requests_keep_their_steps_across_a_restart() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        json!({"command": "ls"}),
    )));
    let opts = |o: &mut oceancode_proxy::runtime::ProxyOptions| {
        o.store = Some(StoreOptions {
            queue_capacity: 8,
            batch_max: 1,
            busy_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        });
    };
    let mut h = Harness::start(fake, opts).await;
    let mut c = Client::new("solo");
    let lock = rusqlite::Connection::open(h.store().db_path()).expect("open");
    lock.execute_batch("BEGIN EXCLUSIVE").expect("lock");
    for n in 0..10 {
        c.step(&h, n).await;
    }
    lock.execute_batch("COMMIT").expect("unlock");
    h.settle().await;
    let m = h.store().metrics();
    assert!(m.shed > 0, "rows were shed: {m:?}");
    h.restart(opts).await;
    let store = h.store();
    let list = store.list_sessions().expect("list");
    assert_eq!(list.len(), 1, "{list:?}");
    let steps = store.steps(&list[0].id).expect("steps");
    let got: Vec<(u32, u64, u64)> = steps
        .iter()
        .map(|s| (s.step, s.usage.input, s.usage.output))
        .collect();
    let want: Vec<(u32, u64, u64)> = c
        .usages
        .iter()
        .enumerate()
        .map(|(i, u)| {
            (
                i as u32 + 1,
                u["input_tokens"].as_u64().expect("input"),
                u["output_tokens"].as_u64().expect("output"),
            )
        })
        .collect();
    assert_eq!(got, want);
}
