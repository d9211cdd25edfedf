//! Scale: a 2,000-row tool-using session whose follow-up requests cost only
//! their new messages (old history is hashed, never parsed), and the ledger
//! writer's lag under a burst of concurrent sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_proxy::sessions::FULL_PARSES;
use oceancode_tests::Harness;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Messages in the first request (user prompt, then assistant tool_use /
/// user tool_result pairs; a new prompt every 40 messages; ends on a prompt).
const HISTORY: usize = 2_001;
const INCREMENTS: usize = 20;
/// Full parses allowed per incremental request: the echoed answer, the new
/// tool result, the new answer (and one spare).
const MAX_PARSES_PER_STEP: u64 = 4;

fn filler(i: usize, n: usize) -> String {
    let mut s = String::with_capacity(n + 64);
    let mut k = 0;
    while s.len() < n {
        s.push_str(&format!(
            "src/mod_{}/file_{}.rs:{} ok {:08x}; ",
            (i + k) % 13,
            (i * 7 + k) % 101,
            k,
            (i * 2_654_435_761 + k * 40_503) as u32
        ));
        k += 1;
    }
    s
}

/// Message `i` of the synthetic history, as raw JSON.
fn history_msg(i: usize) -> String {
    let size = 200 + (i * 37) % 900;
    match (i % 2, i % 40, (i + 1) % 40) {
        // A new task every 40 messages.
        (0, 0, _) => json!({"role": "user", "content": format!("task {i}: {}", filler(i, size))}),
        // The result of the previous message's tool call.
        (0, _, _) => json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": format!("toolu_{:05}", i - 1),
            "content": filler(i, size),
        }]}),
        // The task's final answer.
        (_, _, 0) => {
            json!({"role": "assistant", "content": [{"type": "text", "text": filler(i, size)}]})
        }
        _ => json!({"role": "assistant", "content": [
            {"type": "text", "text": format!("step {i}")},
            {"type": "tool_use", "id": format!("toolu_{i:05}"), "name": "Bash",
             "input": {"command": format!("grep -rn item_{i} src/")}},
        ]}),
    }
    .to_string()
}

fn body(msgs: &[String]) -> String {
    format!(
        r#"{{"model":"claude-sonnet-4-5","max_tokens":1024,"tools":[{{"name":"Bash","description":"Run a command","input_schema":{{"type":"object","properties":{{"command":{{"type":"string"}}}}}}}}],"messages":[{}]}}"#,
        msgs.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2000_row_session_parses_only_new_messages_and_the_writer_keeps_up() {
    let t_all = Instant::now();
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "ls -la"})).with_text("Looking."),
    ));
    let h = Harness::start(fake, |_| {}).await;
    let app = h.proxy().app.clone();
    let hdr = [("x-oceancode-session", "scale")];

    // ---- The 2,000-message request. ----
    let mut msgs: Vec<String> = (0..HISTORY).map(history_msg).collect();
    let first = body(&msgs);
    let parses0 = FULL_PARSES.load(Ordering::Relaxed);
    let prep0 = app.metrics.prepare_us.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let got = h.post("/v1/messages", &hdr, first.clone()).await;
    let first_wall = t0.elapsed();
    assert_eq!(got.status, 200, "{}", got.text());
    let first_prepare_us = app.metrics.prepare_us.load(Ordering::Relaxed) - prep0;
    let first_parses = FULL_PARSES.load(Ordering::Relaxed) - parses0;
    assert!(
        first_parses >= HISTORY as u64,
        "the first request parses its history once: {first_parses}"
    );

    // ---- 20 follow-ups, each appending the echoed answer and a tool result. ----
    let mut answer = got.json();
    let mut per_step_parses = Vec::new();
    let prep1 = app.metrics.prepare_us.load(Ordering::Relaxed);
    let spliced0 = app.sessions.metrics.bodies_spliced.load(Ordering::Relaxed);
    let t1 = Instant::now();
    for step in 0..INCREMENTS {
        let content = answer["content"].clone();
        let id = content
            .as_array()
            .and_then(|a| a.iter().find(|b| b["type"] == "tool_use"))
            .and_then(|b| b["id"].as_str())
            .unwrap_or_else(|| panic!("a tool call: {answer}"))
            .to_string();
        msgs.push(json!({"role": "assistant", "content": content}).to_string());
        msgs.push(
            json!({"role": "user", "content": [{
                "type": "tool_result", "tool_use_id": id, "content": filler(step, 1500),
            }]})
            .to_string(),
        );
        let before = FULL_PARSES.load(Ordering::Relaxed);
        let got = h.post("/v1/messages", &hdr, body(&msgs)).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        h.settle().await;
        per_step_parses.push(FULL_PARSES.load(Ordering::Relaxed) - before);
        answer = got.json();
    }
    let inc_wall = t1.elapsed();
    // Each follow-up starts like the previous body: split against its layout.
    assert_eq!(
        app.sessions.metrics.bodies_spliced.load(Ordering::Relaxed) - spliced0,
        INCREMENTS as u64
    );
    let inc_prepare_us = app.metrics.prepare_us.load(Ordering::Relaxed) - prep1;
    for (step, n) in per_step_parses.iter().enumerate() {
        assert!(
            *n <= MAX_PARSES_PER_STEP,
            "step {step}: {n} messages fully parsed (history is {} messages): {per_step_parses:?}",
            msgs.len()
        );
    }

    // The ledger holds every row, gap-free, on one line.
    h.settle().await;
    let store = h.store();
    let list = store.list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let s = store.load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 0);
    let want = HISTORY + 1 + 2 * INCREMENTS; // + each step's answer row
    assert_eq!(s.rows.len(), want, "rows");
    for (i, r) in s.rows.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1, "gap-free");
    }
    for (i, m) in msgs.iter().enumerate().take(HISTORY) {
        assert_eq!(&*s.rows[i].raw, m.as_str(), "row {} verbatim", i + 1);
    }
    // The history is far over the line: the proxy cut, and the fake (which
    // validates tool_use/tool_result pairing) accepted every window.
    let sent = h.fake.requests();
    let last: Value = sent.last().unwrap().json().unwrap();
    let window = last["messages"].as_array().unwrap().len();
    assert!(window < msgs.len(), "windowed: {window} of {}", msgs.len());

    eprintln!(
        "scale: first request {} messages, {} KB: prepare {:.1} ms (wall {:.0} ms, {} full parses)",
        HISTORY,
        first.len() / 1024,
        first_prepare_us as f64 / 1000.0,
        first_wall.as_secs_f64() * 1000.0,
        first_parses
    );
    eprintln!(
        "scale: {} increments (+2 messages each): prepare {:.2} ms/request (wall {:.0} ms/request), full parses per request {:?}",
        INCREMENTS,
        inc_prepare_us as f64 / 1000.0 / INCREMENTS as f64,
        inc_wall.as_secs_f64() * 1000.0 / INCREMENTS as f64,
        per_step_parses
    );

    // ---- Writer lag under a burst: 16 sessions x 8 steps, concurrently, on a
    // fresh proxy (so the lag window holds only the burst's events). ----
    let mut h = h;
    h.stop().await;
    drop(h);
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "ls -la"})).with_text("Looking."),
    ));
    let h = Harness::start(fake, |_| {}).await;
    let m0 = h.store().metrics();
    let t2 = Instant::now();
    let mut tasks = Vec::new();
    let h = std::sync::Arc::new(h);
    for c in 0..16 {
        let h = h.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("burst-{c}");
            let mut convo = vec![
                json!({"role": "user", "content": format!("burst {c}: {}", filler(c, 800))})
                    .to_string(),
            ];
            for step in 0..8 {
                let got = h
                    .post(
                        "/v1/messages",
                        &[("x-oceancode-session", name.as_str())],
                        body(&convo),
                    )
                    .await;
                assert_eq!(got.status, 200, "{}", got.text());
                let content = got.json()["content"].clone();
                let id = content
                    .as_array()
                    .and_then(|a| a.iter().find(|b| b["type"] == "tool_use"))
                    .and_then(|b| b["id"].as_str())
                    .unwrap()
                    .to_string();
                convo.push(json!({"role": "assistant", "content": content}).to_string());
                convo.push(
                    json!({"role": "user", "content": [{
                        "type": "tool_result", "tool_use_id": id, "content": filler(step, 600),
                    }]})
                    .to_string(),
                );
            }
        }));
    }
    for t in tasks {
        t.await.expect("burst client");
    }
    let burst_wall = t2.elapsed();
    h.settle().await;
    let m = h.store().metrics();
    assert_eq!(m.rejected, 0, "no ledger event refused: {m:?}");
    assert_eq!(m.commits_failed, 0, "{m:?}");
    assert_eq!(m.queued, 0, "settled: {m:?}");
    assert!(m.events > m0.events + 16 * 8 * 2, "{m:?}");
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 16, "{list:?}");
    for b in &list {
        // prompt, then 7 x (answer, tool result), then the last answer
        assert_eq!(b.rows, 1 + 7 * 2 + 1, "{b:?}");
    }
    eprintln!(
        "scale: burst of 16 sessions x 8 steps in {:.0} ms: writer lag p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} events in {} batches)",
        burst_wall.as_secs_f64() * 1000.0,
        m.lag_p50_us as f64 / 1000.0,
        m.lag_p99_us as f64 / 1000.0,
        m.lag_max_us as f64 / 1000.0,
        m.events,
        m.batches
    );
    eprintln!("scale: whole test {:.1} s", t_all.elapsed().as_secs_f64());
}
