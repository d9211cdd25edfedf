//! The in-band recall tool's numbers (issue 16's closing note), measured
//! against the fake upstream on loopback, not asserted:
//!
//! 1. the cache-read ratio (cache read / all input tokens, over every
//!    upstream answer, internal ones included) of one scripted 12-turn
//!    session: the tool off, on and never called, on and called at turns
//!    4, 8 and 12; and the same session with the tool flipping in and out
//!    (injected only on the turns that recall: Headroom's #2671);
//! 2. the extra latency of one internal round trip (a request whose answer
//!    calls the tool once vs one answered directly, the tool on), and what
//!    holding the answer costs a streaming client's first byte.
//!
//! `cargo run --release -p oceancode-tests --example recall_numbers`
#![allow(clippy::unwrap_used, clippy::expect_used)] // a measurement: failures panic

use http_body_util::BodyExt;
use oceancode_fakeup::{Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::recall_tool::{RecallTool, NAME};
use oceancode_tests::{recall, Harness};
use oceancode_window::{Dialect, Usage};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TURNS: usize = 12;
const A: Dialect = Dialect::Anthropic;

fn turn_text(i: usize) -> String {
    oceancode_tests::tool_lines(i, 40, 3)
}

fn body(msgs: &[Value], tools: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024, "stream": true,
        "system": "You are a coding agent. ".repeat(200),
        "tools": tools, "messages": msgs,
    }))
    .unwrap()
}

fn client_tools() -> Value {
    json!([{"name":"Bash","description":"run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}])
}

fn script(recall: bool) -> Script {
    Script::replies((1..=TURNS).flat_map(|i| {
        let mut v = Vec::new();
        if recall && i % 4 == 0 {
            v.push(Reply::recall(json!({"match": format!("turn {}", i - 2)})));
        }
        v.push(Reply::text(format!("answer {i}: {}", "ok ".repeat(50))));
        v
    }))
}

async fn harness(script: Script, on: bool) -> Harness {
    recall::harness(
        script,
        RecallTool {
            enabled: on,
            max_rounds: 4,
            ..RecallTool::default()
        },
    )
    .await
}

/// Σ cache read / Σ (input + cache read + cache write) over the session's
/// upstream answers (internal ones are the steps' `extra`).
async fn session(name: &str, on: bool, recall: bool, flip: bool) -> (f64, u64) {
    let h = harness(script(recall || flip), on).await;
    let mut msgs: Vec<Value> = Vec::new();
    for i in 1..=TURNS {
        msgs.push(recall::user(A, &format!("turn {i}: {}", turn_text(i))));
        let tools = if flip && i % 4 == 0 {
            // What a flipping proxy sends: the tool only when it recalls.
            let mut t = client_tools();
            t.as_array_mut()
                .unwrap()
                .push(serde_json::from_str(oceancode_proxy::recall_tool::tool_json(A)).unwrap());
            t
        } else {
            client_tools()
        };
        let got = h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", name)],
                body(&msgs, tools),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        assert!(!got.text().contains(NAME) || flip);
        msgs.push(recall::assistant(
            A,
            &format!("answer {i}: {}", "ok ".repeat(50)),
        ));
        h.settle().await;
    }
    let store = h.store();
    let id = store.resolve_session(Some(name)).unwrap();
    let total = store
        .steps(&id)
        .unwrap()
        .iter()
        .fold(Usage::default(), |a, s| {
            a.plus(s.usage).plus(s.detail.extra)
        });
    let all = total.input + total.cache_read + total.cache_write;
    (total.cache_read as f64 / all as f64, all)
}

async fn timed(h: &Harness, name: &str, msgs: &[Value]) -> (Duration, Duration) {
    let t = Instant::now();
    let resp = h
        .send(
            &h.url(),
            http::Method::POST,
            "/v1/messages",
            &[("x-oceancode-session", name)],
            body(msgs, client_tools()).into(),
        )
        .await;
    let mut b = resp.into_body();
    let mut first = None;
    while let Some(f) = b.frame().await {
        if first.is_none() && f.is_ok_and(|f| f.data_ref().is_some_and(|d| !d.is_empty())) {
            first = Some(t.elapsed());
        }
    }
    (first.unwrap_or_default(), t.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    println!("cache-read ratio over a {TURNS}-turn scripted session (Anthropic, streaming):");
    for (label, on, recall, flip) in [
        ("tool off", false, false, false),
        ("tool on, never called", true, false, false),
        ("tool on, 3 recalls (turns 4, 8, 12)", true, true, false),
        (
            "tool flipping in on the recall turns (not this proxy)",
            false,
            false,
            true,
        ),
    ] {
        let (ratio, all) = session("numbers", on, recall, flip).await;
        println!(
            "  {label:<55} {:.1}% of {all} input tokens read from cache",
            ratio * 100.0
        );
    }
    const N: usize = 40;
    let ask = |i: usize| vec![recall::user(A, &format!("q {i}: {}", turn_text(i)))];
    // One internal round trip: answered directly vs through one recall.
    let plain = harness(Script::always(Reply::text("direct")), true).await;
    let mut direct = Vec::new();
    for i in 0..N {
        direct.push(timed(&plain, &format!("d{i}"), &ask(i)).await.1);
    }
    let rec = harness(
        Script::replies(
            (0..N).flat_map(|_| [Reply::recall(json!({"match": "q"})), Reply::text("after")]),
        ),
        true,
    )
    .await;
    let mut through = Vec::new();
    for i in 0..N {
        through.push(timed(&rec, &format!("r{i}"), &ask(i)).await.1);
    }
    let (d, r) = (median(direct), median(through));
    println!("one internal round trip (tool on, median of {N}): answered directly {d:?}, through one recall {r:?}: +{:?}", r.saturating_sub(d));
    // Holding the answer: first byte of a 2-second stream, tool off vs on.
    for on in [false, true] {
        let h = harness(
            Script::always(Reply::text("x".repeat(2000)).chunk_delay(10)),
            on,
        )
        .await;
        let mut firsts = Vec::new();
        let mut ends = Vec::new();
        for i in 0..5 {
            let (f, e) = timed(&h, &format!("s{i}"), &ask(i)).await;
            firsts.push(f);
            ends.push(e);
        }
        println!(
            "streamed answer, tool {}: first byte {:?}, last byte {:?} (median of 5)",
            if on { "on " } else { "off" },
            median(firsts),
            median(ends)
        );
    }
}
