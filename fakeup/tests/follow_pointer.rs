//! `follow_pointer`: a scripted tool call templated from the newest
//! `ledger.compress` pointer in the request and the stub's directory.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use common::*;
use oceancode_fakeup::{FakeConfig, FakeUpstream, FollowPointer, Reply, Script, NO_POINTER_TEXT};
use serde_json::{json, Value};

const STUB: &str = "[Earlier content of this session is past the tideline: every row up to seq 4 left this window. The verbatim record is /data/sessions/s1/transcript/ (one file per turn) and /data/sessions/s1/SESSION.md carries the merged state. Read them when you need what was said.]";

fn pointer(seq: u64, file: &str, from: u64, to: u64) -> String {
    format!("[pruned tool output: seq {seq} · 1500 tokens · transcript/{file} lines {from}–{to} · oceancode-proxy recall entry {seq}]")
}

/// A cut Anthropic window: the stub, two results sent as pointers (the
/// newer one second) and a verbatim one.
fn anthropic_window() -> Value {
    let call = |id: &str| json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Bash", "input": {"command": "seq 1 500"}}]});
    let result = |id: &str, c: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": c}]});
    json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 1000,
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": STUB}]},
            call("toolu_1"), result("toolu_1", &pointer(5, "0001.md", 10, 40)),
            call("toolu_2"), result("toolu_2", &pointer(7, "0002.md", 50, 90)),
            call("toolu_3"), result("toolu_3", "1\n2\n3"),
        ]
    })
}

async fn fake(script: Script) -> oceancode_fakeup::FakeHandle {
    FakeUpstream::start(FakeConfig::default().with_script(script))
        .await
        .expect("start")
}

fn read_call() -> Reply {
    Reply::follow_pointer(FollowPointer::new(
        "Read",
        json!({"file_path": "{file}", "offset": "{from}", "limit": "{count}"}),
    ))
    .with_text("Reading the pruned output.")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_read_follows_the_newest_pointer_with_numbers() {
    let f = fake(Script::replies([read_call(), read_call()])).await;
    let j = post(&f.url(), "/v1/messages", &anthropic_window())
        .await
        .json();
    let content = j["content"].as_array().unwrap();
    assert_eq!(content[0]["text"], "Reading the pruned output.");
    let call = content.iter().find(|b| b["type"] == "tool_use").unwrap();
    assert_eq!(call["name"], "Read");
    // The newest pointer (seq 7), the file under the stub's directory,
    // offset and limit as numbers.
    assert_eq!(
        call["input"],
        json!({"file_path": "/data/sessions/s1/transcript/0002.md", "offset": 50, "limit": 41})
    );
    assert_eq!(j["stop_reason"], "tool_use");

    // Streamed too, and a request without a pointer gets no call.
    let mut plain = anthropic_window();
    plain["messages"] = json!([{"role": "user", "content": STUB}]);
    plain["stream"] = json!(true);
    let r = post(&f.url(), "/v1/messages", &plain).await;
    let events = r.events();
    assert!(
        !events
            .iter()
            .any(|(_, d)| d["content_block"]["type"] == "tool_use"),
        "no pointer, no call"
    );
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, NO_POINTER_TEXT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_shell_calls_from_the_script_file_form_fresh_each_time() {
    let fresh = r#"{"follow_pointer": {"name": "exec_command", "fresh": true,
        "input": {"cmd": "sed -n '{from},{to}p' {file}", "seq": "{seq}", "tokens": "{tokens}"}},
        "tool_calls": [{"name": "exec_command", "input": {"cmd": "true"}}]}"#;
    let script = Script::from_json(&format!(r#"{{"replies": [{fresh}, {fresh}, {fresh}]}}"#))
        .expect("script");
    let f = fake(script).await;
    let body = json!({
        "model": "gpt-5-codex",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": STUB}]},
            {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": pointer(3, "0001.md", 2, 30)},
            {"type": "function_call", "call_id": "call_2", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_2", "output": pointer(12, "0003.md", 7, 9)},
        ],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    });
    let mut calls = Vec::new();
    for _ in 0..3 {
        let j = post(&f.url(), "/v1/responses", &body).await.json();
        let args: Vec<Value> = j["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["type"] == "function_call")
            .map(|o| serde_json::from_str(o["arguments"].as_str().unwrap()).unwrap())
            .collect();
        assert_eq!(
            args[0],
            json!({"cmd": "true"}),
            "the reply's own call first"
        );
        calls.push(args[1..].to_vec());
    }
    // The newest pointer, then the newest not followed yet, then none left.
    assert_eq!(
        calls[0],
        [
            json!({"cmd": "sed -n '7,9p' /data/sessions/s1/transcript/0003.md", "seq": 12, "tokens": 1500})
        ]
    );
    assert_eq!(
        calls[1],
        [
            json!({"cmd": "sed -n '2,30p' /data/sessions/s1/transcript/0001.md", "seq": 3, "tokens": 1500})
        ]
    );
    assert!(
        calls[2].is_empty(),
        "every pointer was followed: {:?}",
        calls[2]
    );
}
