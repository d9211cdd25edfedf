//! The providers' other context shapes: Anthropic's `input length and
//! max_tokens exceed context limit`, a Responses stream that fails with
//! `context_length_exceeded`, Anthropic server-side compaction (the summary
//! block, `usage.iterations[]`, what precedes the block dropped next time) and
//! context editing (`context_management.applied_edits`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use common::*;
use oceancode_fakeup::{FakeConfig, FakeUpstream, Reply, Script, StreamFail};
use serde_json::{json, Value};
use std::time::Duration;

fn anthropic(messages: Value, max_tokens: u64) -> Value {
    json!({"model": "claude-opus-4-6", "max_tokens": max_tokens, "messages": messages})
}

fn long(n: usize) -> String {
    "lorem ipsum dolor ".repeat(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_and_max_tokens_over_the_context_get_anthropics_error() {
    let f = FakeUpstream::start(
        FakeConfig::default()
            .with_max_context(2_000)
            .with_count_max_tokens(true),
    )
    .await
    .expect("start");
    let msgs = json!([{"role": "user", "content": long(100)}]);
    // Fits alone, not with its max_tokens.
    let r = post(&f.url(), "/v1/messages", &anthropic(msgs.clone(), 1_900)).await;
    assert_eq!(r.status, 400);
    let j = r.json();
    assert_eq!(j["error"]["type"], "invalid_request_error");
    let m = j["error"]["message"].as_str().unwrap();
    let n = f.requests()[0].input_tokens_total.unwrap();
    assert_eq!(
        m,
        format!("input length and `max_tokens` exceed context limit: {n} + 1900 > 2000, decrease input length or `max_tokens` and try again")
    );
    let r = post(&f.url(), "/v1/messages", &anthropic(msgs.clone(), 100)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Scripted, whatever the sizes.
    f.set_count_max_tokens(false);
    f.set_max_context_tokens(None);
    f.push_reply(Reply::context_limit());
    let r = post(&f.url(), "/v1/messages", &anthropic(msgs, 21_333)).await;
    assert_eq!(r.status, 400);
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.starts_with(
            "input length and `max_tokens` exceed context limit: 178668 + 21333 > 200000"
        ),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_can_fail_with_context_length_exceeded() {
    let f = FakeUpstream::start(
        FakeConfig::default()
            .with_max_context(100)
            .with_overflow_in_stream(true),
    )
    .await
    .expect("start");
    let body = json!({"model": "gpt-5-codex", "stream": true, "input": [{"role": "user", "content": long(100)}]});
    let r = post(&f.url(), "/v1/responses", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.event_names(),
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    let (_, failed) = &r.events()[2];
    assert_eq!(failed["sequence_number"], 2);
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(failed["response"]["usage"], Value::Null);
    assert_eq!(
        failed["response"]["error"],
        json!({"code": "context_length_exceeded", "message": "Your input exceeds the context window of this model. Please adjust your input and try again."})
    );
    // Not streamed: the 400 as before.
    let mut plain = body.clone();
    plain["stream"] = json!(false);
    assert_eq!(post(&f.url(), "/v1/responses", &plain).await.status, 400);

    // Scripted: after two events of output, and with a pause after the opening.
    f.set_max_context_tokens(None);
    f.push_reply(Reply::fail(StreamFail {
        after_events: 2,
        ..StreamFail::context_length_exceeded()
    }));
    f.push_reply(Reply::text("late").open_delay(300));
    let small = json!({"model": "gpt-5-codex", "stream": true, "input": [{"role": "user", "content": "hi"}]});
    let r = post(&f.url(), "/v1/responses", &small).await;
    assert_eq!(
        r.event_names(),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.failed"
        ]
    );
    let r = post(&f.url(), "/v1/responses", &small).await;
    assert_eq!(r.event_names().last().unwrap(), "response.completed");
    let gap = r.frames[2].0 - r.frames[1].0;
    assert!(gap >= Duration::from_millis(250), "{gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_summarizes_bills_iterations_and_drops_what_precedes_it() {
    let f = FakeUpstream::start(FakeConfig::default())
        .await
        .expect("start");
    let cm = json!({"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1000}}]});
    let mut history = vec![
        json!({"role": "user", "content": long(400)}),
        json!({"role": "assistant", "content": "noted"}),
        json!({"role": "user", "content": "go on"}),
    ];
    let mut req = anthropic(json!(history), 1000);
    req["context_management"] = cm.clone();
    let r = post(&f.url(), "/v1/messages", &req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["content"][0]["type"], "compaction");
    let summary = j["content"][0]["content"].as_str().unwrap().to_string();
    assert!(summary.starts_with("FAKE_COMPACTION_SUMMARY"), "{summary}");
    assert_eq!(j["content"][1]["type"], "text");
    let u = &j["usage"];
    let its = u["iterations"].as_array().unwrap();
    assert_eq!(its[0]["type"], "compaction");
    assert_eq!(its[1]["type"], "message");
    let full = f.requests()[0].input_tokens_total.unwrap();
    let input_all = |v: &Value| {
        [
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ]
        .iter()
        .map(|k| v[*k].as_u64().unwrap())
        .sum::<u64>()
    };
    assert_eq!(input_all(&its[0]), full, "the summary step reads it all");
    assert_eq!(
        u["input_tokens"], its[1]["input_tokens"],
        "top level = the message"
    );
    assert!(input_all(u) < 200, "{u}");

    // Next request: everything before the compaction block is dropped.
    history.push(json!({"role": "assistant", "content": j["content"]}));
    history.push(json!({"role": "user", "content": "and now?"}));
    let mut req = anthropic(json!(history), 1000);
    req["context_management"] = cm;
    let r = post(&f.url(), "/v1/messages", &req).await;
    assert_eq!(r.status, 200);
    assert_ne!(
        r.json()["content"][0]["type"],
        "compaction",
        "under the trigger"
    );
    let after = f.requests()[1].input_tokens_total.unwrap();
    assert!(
        after < 200,
        "only the block and what follows count: {after}"
    );

    // Streamed, forced by the script.
    f.push_reply(Reply::text("streamed").with_compaction("SUMMARY-X"));
    let mut req = anthropic(json!([{"role": "user", "content": "hi"}]), 100);
    req["stream"] = json!(true);
    let r = post(&f.url(), "/v1/messages", &req).await;
    let evs = r.events();
    let start = evs
        .iter()
        .find(|(n, _)| n.as_deref() == Some("content_block_start"))
        .unwrap();
    assert_eq!(start.1["content_block"]["type"], "compaction");
    let delta = evs
        .iter()
        .find(|(n, _)| n.as_deref() == Some("content_block_delta"))
        .unwrap();
    assert_eq!(
        delta.1["delta"],
        json!({"type": "compaction_delta", "content": "SUMMARY-X"})
    );
    let md = evs
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(md.1["usage"]["iterations"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_edits_are_applied_reported_and_left_out_of_the_input() {
    let f = FakeUpstream::start(FakeConfig::default())
        .await
        .expect("start");
    let mut msgs = vec![json!({"role": "user", "content": "run the steps"})];
    for i in 0..5 {
        let id = format!("toolu_{i}");
        msgs.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("step {i}: {}", long(10)), "signature": "sig"},
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "ls"}}]}));
        msgs.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": long(50)}]}));
    }
    let base = anthropic(json!(msgs), 500);
    let plain = post(&f.url(), "/v1/messages", &base).await.json();
    let mut req = base.clone();
    req["context_management"] = json!({"edits": [
        {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}},
        {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 100}, "keep": {"type": "tool_uses", "value": 2}}
    ]});
    let r = post(&f.url(), "/v1/messages", &req).await;
    let j = r.json();
    let edits = j["context_management"]["applied_edits"].as_array().unwrap();
    assert_eq!(edits.len(), 2, "{j}");
    assert_eq!(edits[0]["type"], "clear_thinking_20251015");
    assert_eq!(edits[0]["cleared_thinking_turns"], 3);
    assert_eq!(edits[1]["type"], "clear_tool_uses_20250919");
    assert_eq!(edits[1]["cleared_tool_uses"], 3);
    let cleared: u64 = edits
        .iter()
        .map(|e| e["cleared_input_tokens"].as_u64().unwrap())
        .sum();
    let total = |u: &Value| {
        [
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
        ]
        .iter()
        .map(|k| u[*k].as_u64().unwrap())
        .sum::<u64>()
    };
    assert!(cleared > 0);
    assert_eq!(total(&j["usage"]), total(&plain["usage"]) - cleared);
    // Streamed: in message_delta.
    req["stream"] = json!(true);
    let r = post(&f.url(), "/v1/messages", &req).await;
    let md = r
        .events()
        .into_iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap()
        .1;
    assert_eq!(
        md["context_management"]["applied_edits"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let _ = Script::default();
}
