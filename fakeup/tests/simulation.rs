//! Prompt-cache arithmetic, context limits, validation, scripted errors and tool loops.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use common::*;
use oceancode_fakeup::{
    FakeConfig, FakeHandle, FakeUpstream, Reply, Script, ToolLoop, UsageOverride,
};
use serde_json::{json, Value};

async fn fake(cfg: FakeConfig) -> FakeHandle {
    FakeUpstream::start(cfg).await.expect("start")
}

fn fixture(name: &str) -> Vec<u8> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/fakeup/");
    std::fs::read(format!("{p}{name}")).expect("fixture")
}

fn base() -> Value {
    json!({
        "model": "claude-opus-5-5", "max_tokens": 100, "stream": true,
        "system": [{"type": "text", "text": "You are a careful coding agent working in a repository.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "Executes a bash command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "list the files here", "cache_control": {"type": "ephemeral"}}]}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appended_messages_read_previous_prefix_from_cache() {
    let f = fake(FakeConfig::default()).await;
    let first = base();
    post(&f.url(), "/v1/messages", &first).await;
    let u1 = f.requests()[0].usage.unwrap();
    assert_eq!(u1.cache_read_input_tokens, 0);
    assert!(u1.cache_creation_input_tokens > 0);
    assert_eq!(
        u1.input_tokens + u1.cache_creation_input_tokens,
        u1.total_input_tokens
    );

    // Claude Code's next request: the old last message loses cache_control and turns
    // into a plain string; new messages are appended.
    let mut second = base();
    second["messages"] = json!([
        {"role": "user", "content": "list the files here"},
        {"role": "assistant", "content": [{"type": "text", "text": "I'll list the files."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt\nb.py",
            "cache_control": {"type": "ephemeral"}}]}
    ]);
    let r = post(&f.url(), "/v1/messages", &second).await;
    let u2 = f.requests()[1].usage.unwrap();
    assert_eq!(u2.cache_read_input_tokens, u1.total_input_tokens);
    assert!(u2.input_tokens > 0 && u2.cache_creation_input_tokens > 0);
    assert_eq!(
        u2.input_tokens + u2.cache_creation_input_tokens + u2.cache_read_input_tokens,
        u2.total_input_tokens
    );
    let start = &r.events()[0].1["message"]["usage"];
    assert_eq!(start["cache_read_input_tokens"], u2.cache_read_input_tokens);
    assert_eq!(
        start["cache_creation_input_tokens"],
        u2.cache_creation_input_tokens
    );
    assert_eq!(start["input_tokens"], u2.input_tokens);

    // A rewritten (cut) window only reads the unchanged head: tools + system.
    let mut cut = base();
    cut["messages"] = json!([{"role": "user", "content": "[Earlier content is past the tideline]"},
        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "continue"}]);
    post(&f.url(), "/v1/messages", &cut).await;
    let u3 = f.requests()[2].usage.unwrap();
    assert!(u3.cache_read_input_tokens > 0 && u3.cache_read_input_tokens < u1.total_input_tokens);

    // Another model has its own cache.
    let mut other = second.clone();
    other["model"] = json!("claude-haiku");
    post(&f.url(), "/v1/messages", &other).await;
    assert_eq!(f.requests()[3].usage.unwrap().cache_read_input_tokens, 0);

    f.reset_prompt_cache();
    post(&f.url(), "/v1/messages", &second).await;
    assert_eq!(f.requests()[4].usage.unwrap().cache_read_input_tokens, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cached_tokens() {
    let f = fake(FakeConfig::default()).await;
    let mut req = json!({"model": "gpt-4o-mini", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]});
    post(&f.url(), "/v1/chat/completions", &req).await;
    let t1 = f.requests()[0].usage.unwrap().total_input_tokens;
    req["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "hello"}),
        json!({"role": "user", "content": "more"}),
    ]);
    let r = post(&f.url(), "/v1/chat/completions", &req).await;
    let ev = r.events();
    let usage = &ev[ev.len() - 2].1["usage"];
    let u = f.requests()[1].usage.unwrap();
    assert_eq!(u.cache_read_input_tokens, t1);
    assert_eq!(u.input_tokens, u.total_input_tokens);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], t1);
    assert_eq!(usage["prompt_tokens"], u.total_input_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_claude_code_and_codex_requests() {
    let f = fake(FakeConfig::default().with_script(Script::replies([
        Reply::text("I'll list the files.").with_tool_call(
            "Bash",
            json!({"command": "ls -la", "description": "List files"}),
        ),
    ])))
    .await;
    let c = client();
    for name in ["cc_01_first.json", "cc_01_second.json"] {
        let r = send_with(
            &c,
            http::Method::POST,
            &format!("{}/v1/messages?beta=true", f.url()),
            &[("anthropic-version", "2023-06-01")],
            fixture(name),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let reqs = f.requests();
    let (u1, u2) = (reqs[0].usage.unwrap(), reqs[1].usage.unwrap());
    assert!(u1.total_input_tokens > 5_000, "{u1:?}");
    // The system message went from a cached block list to a string: still a cache hit.
    assert_eq!(
        u2.cache_read_input_tokens, u1.total_input_tokens,
        "{u1:?} {u2:?}"
    );
    assert_eq!(reqs[1].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(reqs[0].body, fixture("cc_01_first.json"));

    for name in ["codex_02_first.json", "codex_02_second.json"] {
        let r = send_with(
            &c,
            http::Method::POST,
            &format!("{}/v1/responses", f.url()),
            &[],
            fixture(name),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.event_names().last().unwrap(), "response.completed");
    }
    let reqs = f.requests();
    let (u3, u4) = (reqs[2].usage.unwrap(), reqs[3].usage.unwrap());
    assert_eq!(u4.cache_read_input_tokens, u3.total_input_tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_limit_errors_match_providers() {
    let f = fake(
        FakeConfig::default()
            .with_max_context(100)
            .with_script(Script::replies([Reply::text("after retry")])),
    )
    .await;
    let mut big = base();
    big["messages"][0]["content"][0]["text"] = json!("lorem ipsum ".repeat(200));
    let r = post(&f.url(), "/v1/messages", &big).await;
    assert_eq!(r.status, 400);
    let j = r.json();
    let msg = j["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(j["type"], "error");
    assert_eq!(j["error"]["type"], "invalid_request_error");
    assert!(
        msg.starts_with("prompt is too long: ") && msg.ends_with(" tokens > 100 maximum"),
        "{msg}"
    );
    let tokens: u64 = msg["prompt is too long: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens > 100);
    assert!(j["request_id"].as_str().unwrap().starts_with("req_"));
    assert!(r.header("request-id").is_some());
    assert!(f.requests()[0].usage.is_none());
    assert_eq!(f.requests()[0].input_tokens_total, Some(tokens));
    // The limit did not consume the script.
    assert_eq!(f.replies_left(), 1);

    let mut chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "lorem ipsum ".repeat(200)}]});
    let r = post(&f.url(), "/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 400);
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error");
    assert_eq!(e["param"], "messages");
    assert_eq!(e["code"], "context_length_exceeded");
    let m = e["message"].as_str().unwrap();
    assert!(m.starts_with("This model's maximum context length is 100 tokens. However, your messages resulted in "), "{m}");
    assert!(m.ends_with(" tokens. Please reduce the length of the messages."));

    let resp = json!({"model": "gpt-5-codex", "stream": true, "input": [{"role": "user", "content": "lorem ipsum ".repeat(200)}]});
    let r = post(&f.url(), "/v1/responses", &resp).await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}})
    );

    // Raising the limit at runtime lets the same request through, with the scripted reply.
    f.set_max_context_tokens(None);
    chat["stream"] = json!(false);
    let r = post(&f.url(), "/v1/chat/completions", &chat).await;
    assert_eq!(r.json()["choices"][0]["message"]["content"], "after retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_too_long_and_errors() {
    let overloaded =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let mut err = Reply::error(529, overloaded.clone());
    err.error
        .as_mut()
        .unwrap()
        .headers
        .insert("retry-after".into(), "2".into());
    let f = fake(FakeConfig::default().with_script(Script::replies([
        Reply::too_long(),
        Reply {
            too_long: Some(oceancode_fakeup::TooLong::Max(5)),
            ..Reply::default()
        },
        err,
        Reply::text("ok").with_usage(UsageOverride {
            cache_read_input_tokens: Some(970_000),
            ..UsageOverride::default()
        }),
    ])))
    .await;
    let r = post(&f.url(), "/v1/messages", &base()).await;
    assert_eq!(r.status, 400);
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(m.ends_with("tokens > 200000 maximum"), "{m}");
    let r = post(&f.url(), "/v1/messages", &base()).await;
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(m.ends_with("tokens > 5 maximum"), "{m}");
    let r = post(&f.url(), "/v1/messages", &base()).await;
    assert_eq!(r.status, 529);
    assert_eq!(r.header("retry-after"), Some("2"));
    assert_eq!(r.json(), overloaded);
    let r = post(&f.url(), "/v1/messages", &base()).await;
    let md = &r.events()[r.events().len() - 2].1;
    assert_eq!(md["usage"]["cache_read_input_tokens"], 970_000);
    assert_eq!(
        f.requests()[3].usage.unwrap().cache_read_input_tokens,
        970_000
    );
    assert_eq!(f.requests()[2].status, 529);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_failures_explain_the_problem() {
    let f = fake(FakeConfig::default()).await;
    let mut orphan = base();
    orphan["messages"] = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "sure"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}
    ]);
    let r = post(&f.url(), "/v1/messages", &orphan).await;
    assert_eq!(r.status, 400);
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.contains("messages.2.content.0") && m.contains("toolu_9"),
        "{m}"
    );

    let mut unanswered = base();
    unanswered["messages"] = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": "what happened?"}
    ]);
    let r = post(&f.url(), "/v1/messages", &unanswered).await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("toolu_1"));

    let mut starts_with_assistant = base();
    starts_with_assistant["messages"] =
        json!([{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]);
    assert_eq!(
        post(&f.url(), "/v1/messages", &starts_with_assistant)
            .await
            .status,
        400
    );
    let mut empty = base();
    empty["messages"] = json!([]);
    assert_eq!(post(&f.url(), "/v1/messages", &empty).await.status, 400);

    let chat = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "call_7", "content": "x"}]});
    let r = post(&f.url(), "/v1/chat/completions", &chat).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "messages.[1].role");

    let resp = json!({"model": "gpt-5", "input": [{"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"role": "user", "content": "no output given"}]});
    let r = post(&f.url(), "/v1/responses", &resp).await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("call_1"));

    // With validation off the same request is served.
    f.set_validate(false);
    assert_eq!(post(&f.url(), "/v1/messages", &orphan).await.status, 200);
}

/// Plays a client: runs the tool loop until the final text, appending results.
async fn run_anthropic_loop(f: &FakeHandle) -> (Vec<String>, String) {
    let mut req = base();
    let mut inputs = Vec::new();
    loop {
        let r = post(&f.url(), "/v1/messages", &req).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let ev = r.events();
        let tool = ev
            .iter()
            .find(|(_, d)| d["content_block"]["type"] == "tool_use");
        let text: String = ev
            .iter()
            .filter_map(|(_, d)| d["delta"]["text"].as_str().map(String::from))
            .collect();
        let Some((_, tool)) = tool else {
            return (inputs, text);
        };
        let id = tool["content_block"]["id"].as_str().unwrap().to_string();
        let partial: String = ev
            .iter()
            .filter_map(|(_, d)| d["delta"]["partial_json"].as_str().map(String::from))
            .collect();
        let input: Value = serde_json::from_str(&partial).unwrap();
        inputs.push(input["command"].as_str().unwrap().to_string());
        let msgs = req["messages"].as_array_mut().unwrap();
        msgs.push(
            json!({"role": "assistant", "content": [{"type": "text", "text": text},
            {"type": "tool_use", "id": id, "name": "Bash", "input": input}]}),
        );
        msgs.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_loop_runs_a_multi_step_session() {
    let tl = ToolLoop::new(3, "Bash", json!({"command": "echo step {step} of {steps}"}));
    let f = fake(FakeConfig::default().with_script(Script::always(Reply::tool_loop(tl)))).await;
    let (inputs, final_text) = run_anthropic_loop(&f).await;
    assert_eq!(
        inputs,
        ["echo step 1 of 3", "echo step 2 of 3", "echo step 3 of 3"]
    );
    assert_eq!(final_text, "All 3 steps done. FINAL_ANSWER_MARKER");
    // Every step after the first reads the previous request from the cache.
    let reqs = f.requests();
    for w in reqs.windows(2) {
        let (a, b) = (w[0].usage.unwrap(), w[1].usage.unwrap());
        assert_eq!(b.cache_read_input_tokens, a.total_input_tokens);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_loop_in_responses_dialect() {
    let tl = ToolLoop::new(2, "Bash", json!({"command": "ls"})).for_dialect(
        "responses",
        "exec_command",
        json!({"cmd": "echo {step}"}),
    );
    let f = fake(FakeConfig::default().with_script(Script::always(Reply::tool_loop(tl)))).await;
    let mut req = json!({"model": "gpt-5-codex", "stream": true,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}]});
    let mut cmds = Vec::new();
    for _ in 0..5 {
        let r = post(&f.url(), "/v1/responses", &req).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let done = r.events().last().unwrap().1["response"].clone();
        let outputs = done["output"].as_array().unwrap().clone();
        let Some(fc) = outputs.iter().find(|o| o["type"] == "function_call") else {
            assert_eq!(
                outputs[0]["content"][0]["text"],
                "All 2 steps done. FINAL_ANSWER_MARKER"
            );
            break;
        };
        assert_eq!(fc["name"], "exec_command");
        let args: Value = serde_json::from_str(fc["arguments"].as_str().unwrap()).unwrap();
        cmds.push(args["cmd"].as_str().unwrap().to_string());
        let items = req["input"].as_array_mut().unwrap();
        items.extend(outputs.iter().cloned());
        items.push(
            json!({"type": "function_call_output", "call_id": fc["call_id"], "output": "done"}),
        );
    }
    assert_eq!(cmds, ["echo 1", "echo 2"]);
}
