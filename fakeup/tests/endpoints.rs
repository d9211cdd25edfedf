//! Endpoint shapes and event order for every dialect, streaming and not.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use common::*;
use oceancode_fakeup::{Endpoint, FakeConfig, FakeUpstream, Reply, Script, ToolCall, DEFAULT_TEXT};
use serde_json::{json, Value};

async fn fake(script: Script) -> oceancode_fakeup::FakeHandle {
    FakeUpstream::start(FakeConfig::default().with_script(script))
        .await
        .expect("start")
}

fn anthropic_req(stream: bool) -> Value {
    json!({
        "model": "claude-opus-5-5",
        "max_tokens": 1000,
        "stream": stream,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": "list the files here"}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_stream_default_text() {
    let f = fake(Script::default()).await;
    let r = post(&f.url(), "/v1/messages?beta=true", &anthropic_req(true)).await;
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let names = r.event_names();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let ev = r.events();
    // event name and data type agree everywhere
    for (n, d) in &ev {
        assert_eq!(n.as_deref(), d["type"].as_str());
    }
    let text: String = ev
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, DEFAULT_TEXT);
    assert!(
        ev.iter()
            .filter(|(_, d)| d["delta"]["type"] == "text_delta")
            .count()
            >= 2
    );
    let start = &ev[0].1["message"];
    assert_eq!(start["model"], "claude-opus-5-5");
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(start["usage"]["output_tokens"], 1);
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    let rec = f.requests();
    assert_eq!(rec.len(), 1);
    assert_eq!(rec[0].path, "/v1/messages?beta=true");
    assert_eq!(rec[0].endpoint, Endpoint::Messages);
    assert!(rec[0].stream);
    let u = rec[0].usage.expect("usage");
    assert_eq!(delta["usage"]["input_tokens"], u.input_tokens);
    assert_eq!(
        delta["usage"]["cache_creation_input_tokens"],
        u.cache_creation_input_tokens
    );
    assert_eq!(delta["usage"]["cache_read_input_tokens"], 0);
    assert_eq!(delta["usage"]["output_tokens"], u.output_tokens);
    assert_eq!(
        u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens,
        u.total_input_tokens
    );
    // Each SSE event is its own frame.
    assert_eq!(r.frames.len(), ev.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_text_and_tool_use() {
    let reply = Reply::text("I'll list the files.")
        .with_thinking("The user wants a listing, so I should run ls in the directory.")
        .with_tool_call(
            "Bash",
            json!({"command": "ls -la", "description": "List files"}),
        );
    let f = fake(Script::replies([reply.clone(), reply])).await;
    let r = post(&f.url(), "/v1/messages", &anthropic_req(true)).await;
    let ev = r.events();
    let blocks: Vec<&str> = ev
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("content_block_start"))
        .map(|(_, d)| d["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(blocks, ["thinking", "text", "tool_use"]);
    let of = |t: &str| -> Vec<Value> {
        ev.iter()
            .filter(|(_, d)| d["delta"]["type"] == t)
            .map(|(_, d)| d.clone())
            .collect()
    };
    assert!(!of("thinking_delta").is_empty());
    let sig = of("signature_delta");
    assert_eq!(sig.len(), 1);
    assert!(!sig[0]["delta"]["signature"].as_str().unwrap().is_empty());
    // signature_delta comes right before the thinking block stops
    let sig_pos = ev
        .iter()
        .position(|(_, d)| d["delta"]["type"] == "signature_delta")
        .unwrap();
    assert_eq!(ev[sig_pos + 1].0.as_deref(), Some("content_block_stop"));
    let parts = of("input_json_delta");
    assert!(parts.len() >= 3, "several partial_json chunks");
    assert_eq!(parts[0]["delta"]["partial_json"], "");
    let joined: String = parts
        .iter()
        .map(|p| p["delta"]["partial_json"].as_str().unwrap())
        .collect();
    let input: Value = serde_json::from_str(&joined).unwrap();
    assert_eq!(
        input,
        json!({"command": "ls -la", "description": "List files"})
    );
    let tool_start = ev
        .iter()
        .find(|(_, d)| d["content_block"]["type"] == "tool_use")
        .unwrap();
    assert!(tool_start.1["content_block"]["id"]
        .as_str()
        .unwrap()
        .starts_with("toolu_"));
    assert_eq!(tool_start.1["content_block"]["input"], json!({}));
    let md = &ev[ev.len() - 2].1;
    assert_eq!(md["delta"]["stop_reason"], "tool_use");
    let u = f.requests()[0].usage.unwrap();
    assert!(u.reasoning_tokens > 5 && u.output_tokens > u.reasoning_tokens);

    // Non-streaming JSON with the same content.
    let r = post(&f.url(), "/v1/messages", &anthropic_req(false)).await;
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["type"], "message");
    assert_eq!(j["stop_reason"], "tool_use");
    let types: Vec<&str> = j["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["thinking", "text", "tool_use"]);
    assert!(j["content"][0]["signature"].as_str().unwrap().len() > 10);
    assert_eq!(j["content"][2]["input"]["command"], "ls -la");
    assert!(j["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);
    assert!(r.header("request-id").unwrap().starts_with("req_"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_does_not_consume_script() {
    let f = fake(Script::replies([Reply::text("scripted one")])).await;
    let mut req = anthropic_req(false);
    req.as_object_mut().unwrap().remove("stream");
    req.as_object_mut().unwrap().remove("max_tokens");
    let r = post(&f.url(), "/v1/messages/count_tokens?beta=true", &req).await;
    assert_eq!(r.status, 200);
    let n = r.json()["input_tokens"].as_u64().unwrap();
    assert!(n > 20, "{n}");
    assert_eq!(f.requests()[0].endpoint, Endpoint::CountTokens);
    assert_eq!(f.requests()[0].usage.unwrap().total_input_tokens, n);
    assert_eq!(f.replies_left(), 1);
    let r = post(&f.url(), "/v1/messages", &anthropic_req(false)).await;
    assert_eq!(r.json()["content"][0]["text"], "scripted one");
    assert_eq!(f.requests()[1].usage.unwrap().total_input_tokens, n);
    // Script exhausted: deterministic default.
    let r = post(&f.url(), "/v1/messages", &anthropic_req(false)).await;
    assert_eq!(r.json()["content"][0]["text"], DEFAULT_TEXT);
}

fn chat_req(stream: bool, include_usage: bool) -> Value {
    let mut v = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    });
    if stream {
        v["stream"] = json!(true);
    }
    if include_usage {
        v["stream_options"] = json!({"include_usage": true});
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_with_and_without_usage() {
    let f = fake(Script::default()).await;
    let r = post(&f.url(), "/v1/chat/completions", &chat_req(true, true)).await;
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert!(ev.iter().all(|(n, _)| n.is_none()));
    assert_eq!(ev.last().unwrap().1, json!("[DONE]"));
    let chunks: Vec<&Value> = ev[..ev.len() - 1].iter().map(|(_, d)| d).collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let u = &usage_chunk["usage"];
    let rec = f.requests()[0].usage.unwrap();
    assert_eq!(u["prompt_tokens"], rec.input_tokens);
    assert_eq!(u["completion_tokens"], rec.output_tokens);
    assert_eq!(u["total_tokens"], rec.input_tokens + rec.output_tokens);
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 0);
    let finish = chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["usage"].is_null() && c.get("usage").is_some()));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, DEFAULT_TEXT);

    let r = post(&f.url(), "/v1/chat/completions", &chat_req(true, false)).await;
    let ev = r.events();
    assert_eq!(ev.last().unwrap().1, json!("[DONE]"));
    assert!(ev[..ev.len() - 1]
        .iter()
        .all(|(_, d)| d.get("usage").is_none()));
    assert_eq!(ev[ev.len() - 2].1["choices"][0]["finish_reason"], "stop");

    let r = post(&f.url(), "/v1/chat/completions", &chat_req(false, false)).await;
    let j = r.json();
    assert_eq!(j["object"], "chat.completion");
    assert_eq!(j["choices"][0]["message"]["content"], DEFAULT_TEXT);
    assert_eq!(j["choices"][0]["finish_reason"], "stop");
    assert!(j["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(r.header("x-request-id").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_tool_calls() {
    let reply = Reply {
        tool_calls: vec![
            ToolCall::new("get_weather", json!({"city": "Paris", "unit": "celsius"})),
            ToolCall::new("get_time", json!({"tz": "Europe/Paris"})),
        ],
        ..Reply::default()
    };
    let f = fake(Script::replies([reply.clone(), reply])).await;
    let r = post(&f.url(), "/v1/chat/completions", &chat_req(true, true)).await;
    let ev = r.events();
    let chunks: Vec<&Value> = ev[..ev.len() - 1].iter().map(|(_, d)| d).collect();
    assert!(chunks[0]["choices"][0]["delta"]["content"].is_null());
    let mut args = [String::new(), String::new()];
    let mut ids = vec![];
    for c in &chunks {
        for tc in c["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = tc["index"].as_u64().unwrap() as usize;
            if let Some(id) = tc["id"].as_str() {
                ids.push(id.to_string());
                assert_eq!(tc["type"], "function");
                assert!(tc["function"]["name"].is_string());
            }
            args[i].push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|i| i.starts_with("call_")));
    assert_eq!(
        serde_json::from_str::<Value>(&args[0]).unwrap()["city"],
        "Paris"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&args[1]).unwrap()["tz"],
        "Europe/Paris"
    );
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "tool_calls"
    );

    let j = post(&f.url(), "/v1/chat/completions", &chat_req(false, false))
        .await
        .json();
    let calls = j["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(j["choices"][0]["finish_reason"], "tool_calls");
}

fn responses_req(stream: bool) -> Value {
    json!({
        "model": "gpt-5-codex",
        "stream": stream,
        "instructions": "You are Codex.",
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list the files here"}]}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_stream_text_reasoning_and_function_call() {
    let reply = Reply::text("Listing now.")
        .with_thinking("Need ls.")
        .with_tool_call("exec_command", json!({"cmd": "ls -la"}));
    let f = fake(Script::replies([reply.clone(), reply, Reply::default()])).await;
    let r = post(&f.url(), "/v1/responses", &responses_req(true)).await;
    assert_eq!(r.status, 200);
    let ev = r.events();
    for (i, (n, d)) in ev.iter().enumerate() {
        assert_eq!(n.as_deref(), d["type"].as_str());
        assert_eq!(d["sequence_number"], i as u64);
    }
    let names = r.event_names();
    let expect = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
    ];
    assert_eq!(names[..expect.len()], expect);
    assert_eq!(
        names[names.len() - 3..],
        [
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let fc_added = &ev[14].1["item"];
    assert_eq!(fc_added["type"], "function_call");
    assert_eq!(fc_added["arguments"], "");
    assert!(fc_added["call_id"].as_str().unwrap().starts_with("call_"));
    let deltas: String = ev
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("response.function_call_arguments.delta"))
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&deltas).unwrap(),
        json!({"cmd": "ls -la"})
    );
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"].as_array().unwrap().len(), 3);
    let u = &done["usage"];
    let rec = f.requests()[0].usage.unwrap();
    assert_eq!(u["input_tokens"], rec.total_input_tokens);
    assert_eq!(u["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(u["output_tokens"], rec.output_tokens);
    assert_eq!(
        u["output_tokens_details"]["reasoning_tokens"],
        rec.reasoning_tokens
    );
    assert_eq!(
        u["total_tokens"],
        rec.total_input_tokens + rec.output_tokens
    );

    let j = post(&f.url(), "/v1/responses", &responses_req(false))
        .await
        .json();
    assert_eq!(j["object"], "response");
    assert_eq!(j["status"], "completed");
    assert_eq!(j["output"][2]["type"], "function_call");
    assert!(
        j["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // Default text, string input.
    let r = post(
        &f.url(),
        "/v1/responses",
        &json!({"model": "gpt-5", "stream": true, "input": "hi"}),
    )
    .await;
    let done = r.events().last().unwrap().1.clone();
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        DEFAULT_TEXT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_custom_tool_call() {
    let reply = Reply {
        tool_calls: vec![ToolCall {
            name: "exec".into(),
            input: json!("console.log(1)"),
            custom: true,
        }],
        ..Reply::default()
    };
    let f = fake(Script::replies([reply])).await;
    let r = post(&f.url(), "/v1/responses", &responses_req(true)).await;
    let names = r.event_names();
    assert!(names.contains(&"response.custom_tool_call_input.delta".to_string()));
    let done = r.events().last().unwrap().1.clone();
    let item = &done["response"]["output"][0];
    assert_eq!(item["type"], "custom_tool_call");
    assert_eq!(item["input"], "console.log(1)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_compaction_v1_endpoint() {
    let f = fake(Script::replies([Reply::text("main answer")])).await;
    let mut req = responses_req(false);
    req["input"].as_array_mut().unwrap().extend([
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]}),
        json!({"role": "user", "content": "and the tests"}),
    ]);
    let r = post(&f.url(), "/v1/responses/compact", &req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["object"], "response.compaction");
    let out = j["output"].as_array().unwrap();
    // The user messages (as input_text parts), then one opaque compaction item.
    assert_eq!(out.len(), 3, "{j}");
    assert_eq!(out[0]["role"], "user");
    assert_eq!(out[0]["content"][0]["text"], "list the files here");
    assert_eq!(
        out[1]["content"][0],
        json!({"type": "input_text", "text": "and the tests"})
    );
    assert_eq!(out[2]["type"], "compaction");
    assert!(out[2]["id"].as_str().unwrap().starts_with("cmp_"));
    let enc = out[2]["encrypted_content"].as_str().unwrap().to_string();
    assert!(enc.len() > 40);
    let rec = &f.requests()[0];
    assert_eq!(rec.endpoint, Endpoint::ResponsesCompact);
    assert_eq!(j["usage"]["input_tokens"], rec.input_tokens_total.unwrap());
    assert_eq!(f.replies_left(), 1, "compaction consumed a scripted reply");

    // The compacted history continues; the item comes back verbatim...
    let mut next = responses_req(true);
    next["input"] = json!([out[0], out[1], out[2], {"role": "user", "content": "go on"}]);
    let r = post(&f.url(), "/v1/responses", &next).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(f.replies_left(), 0);
    // ...and a changed one is refused, as the provider refuses what it cannot decrypt.
    let mut forged = next.clone();
    let bad = format!("{}A{}", &enc[..20], &enc[21..]);
    forged["input"][2]["encrypted_content"] = json!(bad);
    let r = post(&f.url(), "/v1/responses", &forged).await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("could not be verified"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_compaction_v2_trigger_item() {
    let f = fake(Script::replies([Reply::text("main answer")])).await;
    let mut req = responses_req(true);
    req["input"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "compaction_trigger"}));
    let r = post(&f.url(), "/v1/responses", &req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.event_names(),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let ev = r.events();
    let done = &ev.last().unwrap().1["response"];
    let out = done["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "exactly one compaction item: {done}");
    assert_eq!(out[0]["type"], "compaction");
    assert_eq!(ev[3].1["item"], out[0]);
    assert!(done["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert_eq!(f.replies_left(), 1, "compaction consumed a scripted reply");
    // Not streamed: the same item in one response.
    req["stream"] = json!(false);
    let j = post(&f.url(), "/v1/responses", &req).await.json();
    assert_eq!(j["output"][0]["type"], "compaction");
    assert_ne!(
        j["output"][0]["encrypted_content"],
        out[0]["encrypted_content"]
    );
    // The trigger must be the last input item.
    let mut early = responses_req(true);
    early["input"]
        .as_array_mut()
        .unwrap()
        .insert(0, json!({"type": "compaction_trigger"}));
    let r = post(&f.url(), "/v1/responses", &early).await;
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains("must be the final input item"),
        "{}",
        r.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tools_reply_does_not_consume() {
    let script = Script::replies([Reply::tool_call("bash", json!({"command": "ls"}))])
        .with_no_tools(Reply::text("A summary."));
    let f = fake(script).await;
    let mut summary = anthropic_req(false);
    summary.as_object_mut().unwrap().remove("tools");
    let j = post(&f.url(), "/v1/messages", &summary).await.json();
    assert_eq!(j["content"][0]["text"], "A summary.");
    assert_eq!(f.replies_left(), 1);
    let j = post(&f.url(), "/v1/messages", &anthropic_req(false))
        .await
        .json();
    assert_eq!(j["content"][0]["name"], "bash");
    assert_eq!(f.replies_left(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_gets_schema_stub_without_consuming() {
    let f = fake(Script::replies([Reply::text("main answer")])).await;
    let title = json!({
        "model": "claude-opus-5-5", "stream": true, "tools": [],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "make a title"}]}],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object",
            "properties": {"title": {"type": "string"}}, "required": ["title"], "additionalProperties": false}}}
    });
    let r = post(&f.url(), "/v1/messages", &title).await;
    let text: String = r
        .events()
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"title": "Fake title"})
    );
    assert_eq!(f.replies_left(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_paths_are_404() {
    let f = fake(Script::default()).await;
    let c = client();
    let r = send_with(
        &c,
        http::Method::GET,
        &format!("{}/api/hello", f.url()),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "not_found_error", "message": "Not found: GET /api/hello"}})
    );
    let r = send_with(
        &c,
        http::Method::HEAD,
        &format!("{}/api/hello", f.url()),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    assert!(r.body().is_empty());
    let r = send_with(
        &c,
        http::Method::GET,
        &format!("{}/v1/models", f.url()),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = send_with(
        &c,
        http::Method::GET,
        &format!("{}/v1/messages", f.url()),
        &[],
        vec![],
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(f.requests().len(), 4);
    assert!(f
        .requests()
        .iter()
        .all(|r| r.endpoint == Endpoint::Other && r.usage.is_none()));
    // Bad JSON on a model endpoint: 400 in the provider's envelope.
    let r = send_with(
        &c,
        http::Method::POST,
        &format!("{}/v1/messages", f.url()),
        &[],
        b"{nope".to_vec(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
}
