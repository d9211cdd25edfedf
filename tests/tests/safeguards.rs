//! Claude Code's auto mode through the proxy (issue 32.2): since 2.1.278
//! Claude Code sends `safeguards: [{"type": "dangerous_tool_use", …}]` on
//! every `/v1/messages` and reads `safeguard_results` (a verdict per tool
//! call) from the answer; without them it runs its own classifier. The
//! fake upstream answers the contract. Every request upstream — plain,
//! after a cut, the too-long and context-limit retries, the recall tool's
//! internal rounds — carries the client's `safeguards` and any member the
//! proxy does not know byte for byte, and every answer the client gets
//! (JSON and SSE) carries the verdicts on its own calls, none on a call it
//! never sees.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::{BlockSpec, LineSpec};
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script, RECALL_TOOL};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::dialect::ParsedBody;
use oceancode_proxy::recall_tool::RecallTool;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_testkit::{Conversation, Dialect};
use oceancode_tests::{tool_output, Harness};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The client's `safeguards`, with spacing no serializer would write: a
/// member parsed and written again would not keep these bytes.
const SAFEGUARDS: &str = r#"[ {"type": "dangerous_tool_use", "classifier_context": {"v": 1, "permission_mode": "auto", "rules": {"allow": [], "deny": []}, "refused_calls": [] } } ]"#;
/// A member the proxy knows nothing of.
const UNKNOWN: &str = r#"{"k": [1, 2.50, "x"], "nested": {"a": null}}"#;

fn body(msgs: &[Value], stream: bool) -> String {
    let head = Conversation::new(Dialect::Anthropic)
        .model("claude-sonnet-4-5")
        .max_tokens(1024)
        .stream(stream)
        .system("You are terse.")
        .tool(
            "Bash",
            Some("run"),
            json!({"type":"object","properties":{"command":{"type":"string"}}}),
        )
        .messages(msgs.iter().cloned())
        .body();
    // The two members as raw bytes, where a client puts them.
    format!(
        "{},\"safeguards\":{SAFEGUARDS},\"x_future_member\":{UNKNOWN}}}",
        head.strip_suffix('}').unwrap()
    )
}

/// One answer as the client reads it: its content blocks, and its
/// `safeguard_results` (top level in JSON, in `message_delta.delta` in SSE).
struct Answer {
    content: Vec<Value>,
    results: Option<Value>,
}

fn read_answer(text: &str, stream: bool) -> Answer {
    if !stream {
        let v: Value = serde_json::from_str(text).unwrap();
        return Answer {
            content: v["content"].as_array().cloned().unwrap_or_default(),
            results: v.get("safeguard_results").cloned(),
        };
    }
    let mut content: Vec<Value> = Vec::new();
    let mut args: Vec<String> = Vec::new();
    let mut results = None;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        match v["type"].as_str() {
            Some("content_block_start") => {
                content.push(v["content_block"].clone());
                args.push(String::new());
            }
            Some("content_block_delta") => {
                let i = v["index"].as_u64().unwrap() as usize;
                if let Some(p) = v["delta"]["partial_json"].as_str() {
                    args[i].push_str(p);
                }
                if let Some(t) = v["delta"]["text"].as_str() {
                    let old = content[i]["text"].as_str().unwrap_or("").to_string();
                    content[i]["text"] = json!(old + t);
                }
            }
            Some("message_delta") => results = v["delta"].get("safeguard_results").cloned(),
            _ => {}
        }
    }
    for (b, a) in content.iter_mut().zip(args) {
        if b["type"] == "tool_use" && !a.is_empty() {
            b["input"] = serde_json::from_str(&a).unwrap();
        }
    }
    Answer { content, results }
}

fn call_ids(content: &[Value]) -> BTreeSet<String> {
    content
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect()
}

/// The members every model request upstream must carry, byte for byte.
fn assert_members_kept(reqs: &[Recorded], what: &str) {
    assert!(!reqs.is_empty(), "{what}: no request upstream");
    for r in reqs {
        let p = ParsedBody::parse(&r.body, "messages").unwrap();
        assert_eq!(
            p.get("safeguards"),
            Some(SAFEGUARDS),
            "{what}: request {} upstream",
            r.seq
        );
        assert_eq!(
            p.get("x_future_member"),
            Some(UNKNOWN),
            "{what}: request {}",
            r.seq
        );
    }
}

fn model_requests(h: &Harness) -> Vec<Recorded> {
    h.fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/messages") && !r.path.contains("count_tokens"))
        .collect()
}

const HDR: [(&str, &str); 1] = [("x-oceancode-session", "auto-mode")];

/// A tool loop that cuts, then a `prompt is too long` and an `input length
/// and max_tokens exceed context limit` answer (cut and retried once), JSON
/// and SSE: every request upstream keeps the members, every answer the
/// client gets carries a verdict on each of its calls and on nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safeguards_pass_through_cuts_and_retries_and_verdicts_reach_the_client() {
    for stream in [false, true] {
        let bash = |i: usize| Reply::tool_call("Bash", json!({"command": format!("step {i}")}));
        let replies: Vec<Reply> = (0..8)
            .map(bash)
            .chain([Reply::too_long(), bash(8)])
            .chain((9..12).map(bash))
            .chain([Reply::context_limit(), bash(12)])
            .collect();
        let h = Harness::start(
            FakeConfig::default().with_script(Script::replies(replies).then(Reply::text("done"))),
            |o| {
                o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
                    context: Some(200_000),
                    max_output: Some(32_000),
                });
                o.sessions.line = LineSpec::Tokens(6_000);
                o.sessions.block = BlockSpec::Tokens(2_000);
            },
        )
        .await;
        let what = format!("stream={stream}");
        let mut msgs = vec![json!({"role": "user", "content": "Run the steps."})];
        let mut cut = false;
        for i in 0..14 {
            let got = h.post("/v1/messages", &HDR, body(&msgs, stream)).await;
            assert_eq!(got.status, 200, "{what} step {i}: {}", got.text());
            let a = read_answer(&got.text(), stream);
            let ids = call_ids(&a.content);
            let results = a
                .results
                .unwrap_or_else(|| panic!("{what} step {i}: no safeguard_results: {}", got.text()));
            assert_eq!(results[0]["type"], "dangerous_tool_use", "{what}");
            let verdicts: BTreeSet<String> = results[0]["status"]["tool_uses"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert_eq!(verdicts, ids, "{what} step {i}: a verdict per call");
            if ids.is_empty() {
                break;
            }
            let id = ids.into_iter().next().unwrap();
            msgs.push(json!({"role": "assistant", "content": a.content}));
            msgs.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": tool_output(i)}]}));
            h.settle().await;
            cut |= model_requests(&h)
                .last()
                .is_some_and(|r| String::from_utf8_lossy(&r.body).contains("past the tideline"));
        }
        let reqs = model_requests(&h);
        assert!(cut, "{what}: no cut, the test proves nothing after one");
        let refused: Vec<u16> = reqs
            .iter()
            .map(|r| r.status)
            .filter(|s| *s == 400)
            .collect();
        assert_eq!(refused.len(), 2, "{what}: the two context-limit answers");
        assert_members_kept(&reqs, &what);
    }
}

/// The recall tool's internal rounds: the continuation carries the
/// members; an answer with a recall call and a client call reaches the
/// client without the recall call and without its verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safeguards_pass_through_the_recall_rounds_and_hidden_calls_lose_their_verdicts() {
    for stream in [false, true] {
        let h = Harness::start(
            FakeConfig::default().with_script(
                Script::replies([
                    Reply::text("first"),
                    Reply::recall(json!({"match": "first"})),
                    Reply::recall(json!({"match": "again"}))
                        .with_tool_call("Bash", json!({"command": "ls"})),
                ])
                .then(Reply::text("done")),
            ),
            |o| o.front.recall = RecallTool::on(),
        )
        .await;
        let what = format!("stream={stream}");
        let mut msgs = vec![json!({"role": "user", "content": "hello"})];
        let got = h.post("/v1/messages", &HDR, body(&msgs, stream)).await;
        assert_eq!(got.status, 200, "{what}: {}", got.text());
        h.settle().await;
        msgs.push(json!({"role": "assistant", "content": [{"type": "text", "text": "first"}]}));
        msgs.push(json!({"role": "user", "content": "what came first?"}));
        let got = h.post("/v1/messages", &HDR, body(&msgs, stream)).await;
        let text = got.text();
        assert_eq!(got.status, 200, "{what}: {text}");
        assert!(!text.contains(RECALL_TOOL), "{what}: {text}");
        let a = read_answer(&text, stream);
        let ids = call_ids(&a.content);
        assert_eq!(ids.len(), 1, "{what}: the client's Bash call: {text}");
        let results = a.results.expect("safeguard_results");
        let verdicts: BTreeSet<String> = results[0]["status"]["tool_uses"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(
            verdicts, ids,
            "{what}: no verdict on the hidden call: {text}"
        );
        let reqs = model_requests(&h);
        assert_eq!(
            reqs.len(),
            3,
            "{what}: the first ask, the ask, its continuation"
        );
        assert_members_kept(&reqs, &what);
    }
}

/// Claude Code's own classifier requests (its fallback when the answers
/// carry no verdicts): a policy prompt, no tools, the conversation between
/// `<transcript>` blocks; and a `max_tokens: 0` review. Forwarded byte for
/// byte, and no session, row or cut of them, in memory or in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_classifier_requests_are_forwarded_and_never_recorded() {
    let h = Harness::start(
        FakeConfig::default().with_script(Script::always(Reply::text("<block>no</block>"))),
        |_| {},
    )
    .await;
    let policy = "You are a security monitor for autonomous AI coding agents. ".repeat(1_500);
    let classifier = json!({
        "model": "claude-opus-5-5",
        "max_tokens": 64,
        "temperature": 0,
        "stop_sequences": ["</block>"],
        "system": [{"type": "text", "text": policy}],
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "<transcript>\n"},
            {"type": "text", "text": "User: clean up the build directory\n"},
            {"type": "text", "text": "Bash: rm -rf build\n"},
            {"type": "text", "text": "</transcript>\n"},
            {"type": "text", "text": "Bash: rm -rf /tmp/victim"}]}],
    })
    .to_string();
    let review = format!(
        "{},\"safeguards\":{SAFEGUARDS}}}",
        json!({
            "model": "claude-opus-5-5",
            "max_tokens": 0,
            "tools": [{"name":"Bash","description":"run","input_schema":{"type":"object"}}],
            "messages": [{"role": "user", "content": "Run the tests."}],
        })
        .to_string()
        .strip_suffix('}')
        .unwrap()
    );
    let headers = [
        ("user-agent", "claude-cli/2.1.332 (external, sdk-cli)"),
        ("x-claude-code-session-id", "4b7f3c1e-auto-mode-session"),
    ];
    for body in [&classifier, &review] {
        let got = h.post("/v1/messages", &headers, body.clone()).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    h.settle().await;
    let sent: Vec<String> = model_requests(&h)
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(sent, vec![classifier, review], "forwarded byte for byte");
    assert!(
        h.store().list_sessions().unwrap().is_empty(),
        "no ledger session"
    );
    assert!(
        h.proxy().app.sessions.sessions().is_empty(),
        "no live session"
    );
}

/// A reply whose `safeguard_outcome` is `omit` answers without
/// `safeguard_results` (a provider without the auto-mode contract: what
/// makes Claude Code say "Auto mode can't check actions in this session"),
/// in JSON and in SSE; the proxy relays the answer as it came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_can_leave_the_verdicts_out() {
    for stream in [false, true] {
        let mut reply = Reply::tool_call("Bash", json!({"command": "rm -rf build"}));
        reply.safeguard_outcome = Some("omit".into());
        let h = Harness::start(
            FakeConfig::default().with_script(Script::always(reply)),
            |_| {},
        )
        .await;
        let msgs = vec![json!({"role": "user", "content": "Clean the build."})];
        let got = h.post("/v1/messages", &HDR, body(&msgs, stream)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let a = read_answer(&got.text(), stream);
        assert_eq!(call_ids(&a.content).len(), 1, "stream={stream}");
        assert!(a.results.is_none(), "stream={stream}: {}", got.text());
        assert!(!got.text().contains("safeguard_results"), "stream={stream}");
    }
}
