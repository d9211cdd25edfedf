//! Gemini, the third dialect (issue 36), over real loopback servers: a Gemini
//! CLI-shaped session (`:streamGenerateContent?alt=sse`, `x-goog-api-key`,
//! GEMINI.md in a `<session_context>` part of the first user content) runs 40
//! function-call steps at a 20k line. Every upstream body passes the fake's
//! Gemini rules (a `functionResponse` right after its `functionCall` turn),
//! the stub is a `user` content first in every window after a cut, GEMINI.md
//! is in every window, the ledger holds the client's contents verbatim, the
//! meter reads `usageMetadata` (cached part = cache reads), and the key —
//! header or `?key=` — is in no ledger file. The router's JSON-schema call
//! is a side request: forwarded, never recorded.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{tool_output, Harness};
use oceancode_window::Dialect;
use serde_json::{json, Value};
use std::sync::Arc;

const STEPS: usize = 40;
const KEY: &str = "AIzaSy-not-a-real-key-4242";
const RULE: &str = "GEMINI_MD_RULE: answer in English.";
const STUB_PREFIX: &str = "[Earlier content of this session is past the tideline";
const MODEL: &str = "gemini-2.5-flash";

fn session_context() -> String {
    format!(
        "<session_context>\nThis is the Gemini CLI. We are setting up the context for our chat.\n<loaded_context>\n{RULE}\n</loaded_context>\n</session_context>"
    )
}

async fn harness() -> Harness {
    let script = Script::replies((0..STEPS).map(|_| {
        Reply::tool_call("run_shell_command", json!({"command": "ls"})).with_text("On it.")
    }))
    .then(Reply::text("All done."));
    Harness::start(FakeConfig::default().with_script(script), |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await
}

/// The model's content from a streamed answer: its parts joined over the chunks.
fn answer(sse: &str) -> Value {
    let mut parts: Vec<Value> = Vec::new();
    for line in sse.lines() {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        let v: Value = serde_json::from_str(d).expect("chunk JSON");
        for p in v["candidates"][0]["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            match (p.get("text"), parts.last_mut()) {
                (Some(t), Some(last)) if last.get("text").is_some() => {
                    let joined =
                        format!("{}{}", last["text"].as_str().unwrap(), t.as_str().unwrap());
                    last["text"] = Value::from(joined);
                }
                _ => parts.push(p.clone()),
            }
        }
    }
    json!({"role": "model", "parts": parts})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_session_cuts_stays_valid_and_keeps_gemini_md() {
    let h = harness().await;
    let path = format!("/v1beta/models/{MODEL}:streamGenerateContent?alt=sse&key={KEY}");
    let headers = [
        ("x-goog-api-key", KEY),
        (
            "user-agent",
            "GeminiCLI/0.61.0/gemini-2.5-flash (linux; x64)",
        ),
    ];
    let system = json!({"parts": [{"text": "You are Gemini CLI."}]});
    let tools = json!([{"functionDeclarations": [{"name": "run_shell_command", "parameters": {"type": "object"}}]}]);
    let mut contents = vec![
        json!({"role": "user", "parts": [{"text": session_context()}, {"text": "list the files"}]}),
    ];

    // The router's utility call: forwarded untouched, not recorded.
    let router = json!({"contents": contents, "systemInstruction": {"parts": [{"text": "route"}]},
        "generationConfig": {"responseMimeType": "application/json",
            "responseJsonSchema": {"type": "object", "properties": {"complexity_score": {"type": "integer"}}, "required": ["complexity_score"]}}});
    let got = h
        .post(
            &format!("/v1beta/models/gemini-2.5-flash-lite:generateContent?key={KEY}"),
            &headers,
            router.to_string(),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(
        got.json()["candidates"][0]["content"]["parts"][0]["text"],
        "{\"complexity_score\":0}"
    );

    for step in 0..=STEPS {
        let body = json!({"contents": contents, "systemInstruction": system, "tools": tools,
            "generationConfig": {"temperature": 1}});
        let got = h.post(&path, &headers, body.to_string()).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let model = answer(&got.text());
        let call = model["parts"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|p| p.get("functionCall"))
            .cloned();
        contents.push(model);
        let Some(call) = call else { break };
        contents.push(json!({"role": "user", "parts": [{"functionResponse": {
            "id": call["id"], "name": call["name"], "response": {"output": tool_output(step)}}}]}));
    }
    h.settle().await;

    let sent: Vec<Value> = h
        .requests_to(&format!("/v1beta/models/{MODEL}:"))
        .iter()
        .map(|r| {
            assert_eq!(
                r.status,
                200,
                "the fake refused a body: {}",
                String::from_utf8_lossy(&r.body)
            );
            assert!(
                r.path.contains(&format!("key={KEY}")),
                "the query goes upstream as sent"
            );
            r.json().expect("JSON")
        })
        .collect();
    assert_eq!(sent.len(), STEPS + 1);
    let stubbed: Vec<usize> = (0..sent.len())
        .filter(|&i| {
            sent[i]["contents"][0]["parts"][0]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with(STUB_PREFIX))
        })
        .collect();
    assert!(stubbed.len() >= 3, "cut at a 20k line: {stubbed:?}");
    for (i, body) in sent.iter().enumerate() {
        let c = body["contents"].to_string();
        assert!(c.contains(RULE), "request {i} lost GEMINI.md");
        assert_eq!(body["contents"][0]["role"], "user");
    }
    let last = &sent[sent.len() - 1]["contents"];
    let n = last.as_array().unwrap().len();
    assert!(
        n < contents.len() - 1,
        "the last window is cut ({n} of {})",
        contents.len()
    );

    let store = h.store();
    let list = store.list_sessions().expect("sessions");
    assert_eq!(list.len(), 1, "the router's call is not a session");
    let loaded = store
        .load_session(&list[0].id)
        .unwrap()
        .expect("the session");
    assert_eq!(loaded.meta.dialect, Dialect::Gemini);
    assert_eq!(loaded.meta.client, "gemini-cli");
    assert_eq!(loaded.meta.model, MODEL, "the model the path names");
    // Every content the client sent, the model's turns as it echoed them,
    // and the last answer as the proxy read it from the stream.
    let rows: Vec<Value> = loaded
        .rows
        .iter()
        .map(|r| serde_json::from_str(&r.raw).unwrap())
        .collect();
    assert_eq!(rows.len(), contents.len());
    let differ = (0..rows.len()).find(|&i| rows[i] != contents[i]);
    assert_eq!(differ, None, "the ledger holds what the client sent");
    let steps = store.steps(&list[0].id).expect("steps");
    assert!(
        steps.iter().any(|s| s.usage.cache_read > 0),
        "cachedContentTokenCount is a cache read"
    );
    assert!(steps.iter().all(|s| s.usage.input + s.usage.cache_read > 0));
    for f in walk(h.data.path()) {
        let bytes = std::fs::read(&f).unwrap();
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "the key is in {}",
            f.display()
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
