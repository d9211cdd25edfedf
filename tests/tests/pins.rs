//! Standing instructions survive every cut (issue 22): what the client sends
//! as project instructions or context rather than conversation — Claude
//! Code's CLAUDE.md reminder in its first user message, Codex's AGENTS.md and
//! `<environment_context>` message — is in every upstream request after every
//! cut, byte for byte as the client sent it and byte-stable between cuts,
//! while the ask that shared its message leaves with its turn. Sessions are
//! built from real captures (`fixtures/captures/anthropic_11_claude_md`,
//! `fixtures/captures/openai_07_codex_agents_md`) at a fixed 20k line: 30 tool
//! steps, a second ask, 60 more steps.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{count_tokens, FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::dialect::ParsedBody;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{captured, tool_output, Captured, Harness};
use serde_json::{json, Value};
use std::sync::Arc;

const FIRST_STEPS: usize = 30;
const SECOND_STEPS: usize = 60;
const STUB_PREFIX: &str = "[Earlier content of this session is past the tideline";
const ASK2: &str = "Now also update the docs.";

/// `FIRST_STEPS` tool calls, the first ask's answer, `SECOND_STEPS` tool calls, the last answer.
fn script(tool: &str, input: Value) -> Script {
    let calls =
        |n: usize| (0..n).map(|_| Reply::tool_call(tool, input.clone()).with_text("On it."));
    Script::replies(
        calls(FIRST_STEPS)
            .chain([Reply::text("Done with the first ask.")])
            .chain(calls(SECOND_STEPS)),
    )
    .then(Reply::text("All done."))
}

/// A proxy at `serve --tideline 20k` whose models have a 200k context.
async fn harness_20k(fake: FakeConfig) -> Harness {
    Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await
}

fn headers(c: &Captured) -> Vec<(&str, &str)> {
    c.headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The text of a message's first content part (or its string content).
fn first_text(m: &Value) -> &str {
    m["content"][0]["text"]
        .as_str()
        .or(m["content"].as_str())
        .unwrap_or("")
}

fn is_stub(m: &Value) -> bool {
    first_text(m).starts_with(STUB_PREFIX)
}

/// One upstream request split into its raw conversation elements.
struct Sent<'a> {
    raw: Vec<&'a str>,
    msgs: Vec<Value>,
}

fn split<'a>(r: &'a Recorded, key: &str) -> Sent<'a> {
    let p = ParsedBody::parse(&r.body, key).expect("the upstream body is JSON");
    let msgs = p
        .messages
        .iter()
        .map(|m| serde_json::from_str(m).expect("message JSON"))
        .collect();
    Sent {
        raw: p.messages,
        msgs,
    }
}

/// Every request the upstream saw on `path`, once the ledger is written:
/// one per step of the session.
async fn settled_requests(h: &Harness, path: &str) -> Vec<Recorded> {
    h.settle().await;
    let reqs: Vec<Recorded> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with(path))
        .collect();
    assert_eq!(reqs.len(), FIRST_STEPS + SECOND_STEPS + 2);
    reqs
}

/// The session crossed the line many times and most cut windows are past
/// turn 1 (its ask left, its instructions stayed).
fn assert_cut_past_turn_1(what: &str, mut stubs: Vec<&str>, past_turn_1: usize) {
    stubs.dedup();
    println!(
        "{what}: cuts={} windows past turn 1={past_turn_1}",
        stubs.len()
    );
    assert!(
        stubs.len() >= 5,
        "{what}: the line was crossed many times: {}",
        stubs.len()
    );
    assert!(
        past_turn_1 >= 30,
        "{what}: most cut windows are past turn 1: {past_turn_1}"
    );
}

/// Between cuts the window only appends (byte for byte): the provider's
/// prompt cache keeps hitting.
fn assert_append_only(reqs: &[Recorded], key: &str, stub_at: impl Fn(&Sent<'_>) -> Option<usize>) {
    for (i, pair) in reqs.windows(2).enumerate() {
        let (a, b) = (split(&pair[0], key), split(&pair[1], key));
        let (sa, sb) = (stub_at(&a), stub_at(&b));
        if sa.is_none() || sa.map(|s| a.raw[s]) != sb.map(|s| b.raw[s]) {
            continue; // no window yet, or a cut
        }
        assert!(
            b.raw.len() >= a.raw.len() && b.raw[..a.raw.len()] == a.raw[..],
            "request {}: the window was rewritten without a cut",
            i + 1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_md_survives_every_cut_byte_for_byte() {
    let cap = &captured("anthropic_11_claude_md")[0];
    let mut body: Value = serde_json::from_slice(&cap.body).expect("captured body");
    body["stream"] = json!(false);
    // [user: CLAUDE.md reminder, attribution reminder, "say hi"], [system: environment, skills]
    let first: Vec<Value> = body["messages"].as_array().expect("messages").clone();
    let claude_md = first[0]["content"][0].to_string();
    let attribution = first[0]["content"][1].to_string();
    assert!(claude_md.contains("Codebase and user instructions are shown below"));
    assert!(claude_md.contains("ALWAYS run make lint before committing"));
    assert!(attribution.contains("Attribution for git commits"));
    let ask1 = first[0]["content"][2].to_string();
    let env = first[1].to_string();

    let fake = FakeConfig::default().with_script(script(
        "Bash",
        json!({"command": "cargo test", "description": "Run the tests"}),
    ));
    let h = harness_20k(fake).await;
    let mut history = first.clone();
    for step in 0..=FIRST_STEPS + 1 + SECOND_STEPS {
        if step == FIRST_STEPS + 1 {
            history.push(json!({"role":"user","content":[{"type":"text","text":ASK2}]}));
        }
        body["messages"] = Value::Array(history.clone());
        let got = h.post(&cap.path, &headers(cap), body.to_string()).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let content = got.json()["content"].clone();
        if content.to_string().contains("\"tool_use\"") {
            oceancode_tests::push_tool_step(&mut history, &content, &tool_output(step));
        } else {
            history.push(json!({"role":"assistant","content":content}));
        }
    }
    let reqs = settled_requests(&h, "/v1/messages").await;
    let pins = format!(",{claude_md},{attribution}]}}");
    let (mut cut_windows, mut ask_dropped) = (0, 0);
    let mut stubs: Vec<&str> = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "request {i} is valid for the upstream");
        let text = std::str::from_utf8(&r.body).expect("UTF-8 body");
        assert!(
            text.contains(&claude_md),
            "request {i}: the CLAUDE.md reminder is not in the window (byte for byte)"
        );
        let sent = split(r, "messages");
        if !is_stub(&sent.msgs[0]) {
            continue;
        }
        cut_windows += 1;
        stubs.push(sent.raw[0]);
        // The environment system message is kept right after the stub.
        assert_eq!(
            sent.raw[1], env,
            "request {i}: the system rows follow the stub"
        );
        let first_ask_kept = sent.raw.contains(&first[0].to_string().as_str());
        if !first_ask_kept {
            // Turn 1 left: its reminders are pinned into the stub's message,
            // in their original order, as the client sent them; its ask is not.
            ask_dropped += 1;
            assert!(
                sent.raw[0].ends_with(&pins),
                "request {i}: the stub message does not end with the pinned reminders: {}",
                &sent.raw[0][..sent.raw[0].len().min(400)]
            );
            assert!(
                !sent.raw[0].contains(&ask1),
                "request {i}: the cut ask came back"
            );
            assert_eq!(sent.msgs[0]["content"].as_array().map(Vec::len), Some(3));
            assert_eq!(
                text.matches(&claude_md).count(),
                1,
                "request {i}: the reminder is sent once"
            );
        }
        // Anthropic: one user message opens the window, then the system row,
        // then an assistant message or the pinned ask (a user message).
        assert_eq!(sent.msgs[0]["role"], "user");
        assert_eq!(sent.msgs[1]["role"], "system");
    }
    println!("requests={} windows with a stub={cut_windows}", reqs.len());
    assert_cut_past_turn_1("claude code", stubs, ask_dropped);
    assert_append_only(&reqs, "messages", |s| is_stub(&s.msgs[0]).then_some(0));

    // What the kept reminders cost per request, in the provider's tokens.
    let block_text = |raw: &str| -> String {
        serde_json::from_str::<Value>(raw).expect("block")["text"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let (t_md, t_attr) = (
        count_tokens(&block_text(&claude_md)),
        count_tokens(&block_text(&attribution)),
    );
    println!(
        "pinned per request: CLAUDE.md reminder {t_md} tokens, attribution reminder {t_attr} tokens (the environment system message, kept whole as before: {} tokens)",
        count_tokens(&block_text(&first[1]["content"][0].to_string()))
    );
    assert!(
        t_md + t_attr < 400,
        "the capture's reminders are small: {t_md} + {t_attr}"
    );

    // The ledger keeps the client's message as sent (the ask with its reminders).
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let s = store.load_session(&id).unwrap().unwrap();
    assert_eq!(&*s.rows[0].raw, first[0].to_string());
    assert!(s.cut_upto > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_md_and_environment_context_survive_every_cut_byte_for_byte() {
    let cap = &captured("openai_07_codex_agents_md")[0];
    let mut body: Value = serde_json::from_slice(&cap.body).expect("captured body");
    body["stream"] = json!(false);
    // [developer prompt], [developer: skills, permissions], [user: AGENTS.md, environment_context], [user: "say hi"]
    let first: Vec<Value> = body["input"].as_array().expect("input").clone();
    assert_eq!(first.len(), 4);
    let agents = first[2].to_string();
    assert!(agents.contains("# AGENTS.md instructions for /home/dev/proj"));
    assert!(agents.contains("<environment_context>"));
    let ask1 = first[3].to_string();

    let fake =
        FakeConfig::default().with_script(script("exec_command", json!({"cmd": "cargo test"})));
    let h = harness_20k(fake).await;
    let mut input = first.clone();
    for step in 0..=FIRST_STEPS + 1 + SECOND_STEPS {
        if step == FIRST_STEPS + 1 {
            input.push(json!({"type":"message","role":"user","content":[{"type":"input_text","text":ASK2}]}));
        }
        body["input"] = Value::Array(input.clone());
        let got = h.post(&cap.path, &headers(cap), body.to_string()).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let out = got.json()["output"].as_array().expect("output").clone();
        input.extend(out.iter().cloned());
        for c in out.iter().filter(|i| i["type"] == "function_call") {
            input.push(json!({"type":"function_call_output","call_id":c["call_id"],"output":tool_output(step)}));
        }
    }
    let reqs = settled_requests(&h, "/v1/responses").await;
    let stub_at = |s: &Sent<'_>| s.msgs.iter().position(is_stub);
    let (mut ask_dropped, mut stubs) = (0, Vec::new());
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "request {i} is valid for the upstream");
        let sent = split(r, "input");
        assert!(
            sent.raw.contains(&agents.as_str()),
            "request {i}: the AGENTS.md / environment_context message is not in the window (byte for byte)"
        );
        let Some(at) = stub_at(&sent) else { continue };
        stubs.push(sent.raw[at]);
        // Kept in its original place: with the developer messages, before the stub.
        assert_eq!(
            sent.raw[..at],
            [first[0].to_string(), first[1].to_string(), agents.clone()]
        );
        if !sent.raw.contains(&ask1.as_str()) {
            ask_dropped += 1;
        }
    }
    assert_cut_past_turn_1("codex", stubs, ask_dropped);
    assert_append_only(&reqs, "input", |s| stub_at(s));

    let texts: Vec<String> = first[2]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["text"].as_str().unwrap_or("").to_string())
        .collect();
    println!(
        "kept per request: AGENTS.md {} tokens, environment_context {} tokens",
        count_tokens(&texts[0]),
        count_tokens(&texts[1])
    );

    // The ledger: the instructions message is context (no turn of its own),
    // the ask opens turn 1.
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let s = store.load_session(&id).unwrap().unwrap();
    assert_eq!(&*s.rows[2].raw, agents);
    assert_eq!(s.rows[2].kind, oceancode_window::RowKind::System);
    assert_eq!(
        (s.rows[3].kind, s.rows[3].turn),
        (oceancode_window::RowKind::Prompt, 1)
    );
}

/// Chat Completions and Responses with instructions sharing the first ask's
/// message (`<user_instructions>` as a content part, as older Codex sent
/// it): the part is kept in the stub's message, after its text, byte for
/// byte; the ask leaves. Chat also opens like Qwen Code: its environment
/// message and the model's "Got it." before the ask — the environment
/// message is context, kept whole before the stub.
async fn mixed_instructions_survive_every_cut(d: &str) {
    let (path, key, ty) = match d {
        "chat" => ("/v1/chat/completions", "messages", "text"),
        _ => ("/v1/responses", "input", "input_text"),
    };
    let rules = json!({"type": ty, "text": "<user_instructions>\n\nALWAYS run make lint before committing. MIXED_RULE_MARKER\n\n</user_instructions>"});
    let ask = json!({"type": ty, "text": "fix the failing tests"});
    let mut history: Vec<Value> = match d {
        "chat" => vec![
            json!({"role":"system","content":"You are Qwen Code."}),
            json!({"role":"user","content":"This is the Qwen Code. We are setting up the context for our chat.\nToday's date is Monday.\nMy operating system is: linux\nI'm currently working in the directory: /home/dev/proj"}),
            json!({"role":"assistant","content":"Got it. Thanks for the context!"}),
            json!({"role":"user","content":[rules, ask]}),
        ],
        _ => vec![
            json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]}),
            json!({"type":"message","role":"user","content":[rules, ask]}),
        ],
    };
    let kept_whole: Vec<String> = history[..history.len() - 1]
        .iter()
        .filter(|m| m["role"] != "assistant")
        .map(Value::to_string)
        .collect();
    let first_ask = history.last().unwrap().to_string();
    let rules_raw = rules.to_string();
    let ask_raw = ask.to_string();
    let fake = FakeConfig::default().with_script(script("shell", json!({"cmd": "cargo test"})));
    let h = harness_20k(fake).await;
    let hdr = [("x-oceancode-session", "mixed")];
    for step in 0..=FIRST_STEPS + 1 + SECOND_STEPS {
        if step == FIRST_STEPS + 1 {
            history.push(match d {
                "chat" => json!({"role":"user","content":ASK2}),
                _ => json!({"type":"message","role":"user","content":[{"type":"input_text","text":ASK2}]}),
            });
        }
        let mut body = json!({"model":"m","max_tokens":4096,"stream":false});
        body[key] = Value::Array(history.clone());
        let got = h.post(path, &hdr, body.to_string()).await;
        assert_eq!(got.status, 200, "{d} step {step}: {}", got.text());
        let v = got.json();
        match d {
            "chat" => {
                let msg = v["choices"][0]["message"].clone();
                history.push(msg.clone());
                for c in msg["tool_calls"].as_array().cloned().unwrap_or_default() {
                    history.push(
                        json!({"role":"tool","tool_call_id":c["id"],"content":tool_output(step)}),
                    );
                }
            }
            _ => {
                let out = v["output"].as_array().unwrap().clone();
                history.extend(out.iter().cloned());
                for c in out.iter().filter(|i| i["type"] == "function_call") {
                    history.push(json!({"type":"function_call_output","call_id":c["call_id"],"output":tool_output(step)}));
                }
            }
        }
    }
    let reqs = h.fake.requests();
    let stub_at = |s: &Sent<'_>| s.msgs.iter().position(is_stub);
    let (mut dropped, mut stubs) = (0, Vec::new());
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "{d} request {i} is valid for the upstream");
        let text = std::str::from_utf8(&r.body).unwrap();
        assert_eq!(
            text.matches(&rules_raw).count(),
            1,
            "{d} request {i}: the rules, once, byte for byte"
        );
        let sent = split(r, key);
        let Some(at) = stub_at(&sent) else { continue };
        stubs.push(sent.raw[at]);
        assert_eq!(
            sent.raw[..at],
            kept_whole[..],
            "{d} request {i}: context kept whole before the stub"
        );
        if !sent.raw.contains(&first_ask.as_str()) {
            dropped += 1;
            assert!(
                sent.raw[at].ends_with(&format!(",{rules_raw}]}}")),
                "{d} request {i}: the rules are pinned into the stub's message: {}",
                sent.raw[at]
            );
            assert!(
                !text.contains(&ask_raw),
                "{d} request {i}: the cut ask came back"
            );
            // The stub names turn 1 by its ask, not by the instructions before it.
            assert!(
                first_text(&sent.msgs[at]).contains("\n- t01: fix the failing tests"),
                "{d} request {i}: {}",
                first_text(&sent.msgs[at])
            );
        }
    }
    assert_cut_past_turn_1(d, stubs, dropped);
    assert_append_only(&reqs, key, |s| stub_at(s));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_instructions_survive_every_cut_chat() {
    mixed_instructions_survive_every_cut("chat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_instructions_survive_every_cut_responses() {
    mixed_instructions_survive_every_cut("responses").await;
}
