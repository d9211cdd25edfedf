//! The agent edits its own context end to end: `context` exports the
//! window to context.txt, an edit of the file (delete a 40k-token log, add a
//! note, rewrite, restore) is read at the next request, taken or refused
//! with its receipt, and holds on every later request, across idle
//! eviction; the fake upstream validates every request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_tests::{push_tool_step, tool_lines, Harness};
use serde_json::{json, Value};
use std::path::PathBuf;

const SESSION: &str = "ctx";

struct Agent {
    h: Harness,
    history: Vec<Value>,
}

impl Agent {
    async fn start() -> Agent {
        let fake = FakeConfig::default().with_script(Script::always(
            Reply::tool_call("Bash", json!({"command": "make test"})).with_text("Testing."),
        ));
        let h = Harness::start(fake, |_| {}).await;
        Agent {
            h,
            history: vec![json!({"role":"user","content":"Fix the build, then run the tests."})],
        }
    }

    /// One request; the answer's tool call gets `result`.
    async fn step(&mut self, result: &str) -> Recorded {
        let body = json!({
            "model": "claude-test-200k",
            "max_tokens": 4096,
            "tools": [{"name":"Bash","description":"Run","input_schema":{"type":"object"}}],
            "messages": self.history,
        });
        let got = self
            .h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", SESSION)],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        let content = got.json()["content"].clone();
        push_tool_step(&mut self.history, &content, result);
        self.h.settle().await;
        self.wait_for_writer().await;
        let last = self.h.fake.requests().into_iter().last().unwrap();
        assert_eq!(last.status, 200, "the upstream found the request valid");
        last
    }

    async fn wait_for_writer(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    }

    async fn context(&self, body: Value) -> Value {
        let got = oceancode_tests::collect(
            self.h
                .send(
                    &self.h.url(),
                    http::Method::POST,
                    "/_oceancode/context",
                    &[],
                    Bytes::from(body.to_string()),
                )
                .await,
        )
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        got.json()
    }

    fn receipt(&self, path: &std::path::Path) -> String {
        std::fs::read_to_string(path.with_file_name("context.receipt.txt")).unwrap_or_default()
    }
}

fn messages(r: &Recorded) -> Vec<Value> {
    r.json().unwrap()["messages"].as_array().cloned().unwrap()
}

fn has_result(msgs: &[Value], needle: &str) -> bool {
    msgs.iter().any(|m| m.to_string().contains(needle))
}

/// The block of `seq` (header to the next header) cut out of the file.
fn without_block(text: &str, seq: u64) -> String {
    let mut out = Vec::new();
    let mut skipping = false;
    for line in text.split('\n') {
        if line.starts_with("[[") && !line.starts_with("[[tool_") && !line.starts_with("[[text") {
            skipping = line.starts_with("[[m:") && line.split(' ').nth(1) == Some(&seq.to_string());
        }
        if !skipping {
            out.push(line);
        }
    }
    out.join("\n")
}

fn header_of(text: &str, seq: u64) -> String {
    text.lines()
        .find(|l| l.starts_with("[[m:") && l.split(' ').nth(1) == Some(&seq.to_string()))
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_drops_a_big_log_adds_a_note_and_the_edit_holds() {
    let mut a = Agent::start().await;
    let log = tool_lines(1, 2_500, 7); // ~35k tokens of build log
    a.step(&log).await; // seq 1 ask, 2 call, 3 the log
    a.step("2 tests failed").await; // 4 call, 5 result
    let before = a.step("fixed").await; // 6 call, 7 result
                                        // Export: the window as the upstream saw it on the last request.
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("[[context "), "{}", &text[..200]);
    assert!(
        text.contains("export e1 · seq 1–5 · 5 messages"),
        "{}",
        text.lines().next().unwrap()
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(
        text.contains("[[tool_result toolu_"),
        "tool results read as blocks"
    );
    // The agent deletes the log's block and adds a note at the end.
    let edited = without_block(&text, 3).replace(
        "[[end of context",
        "[[note]]\nThe build log (seq 3) said: only net/ fails; the rest builds.\n\n[[end of context",
    );
    std::fs::write(&path, edited).unwrap();
    let after = a.step("tests pass").await;
    let msgs = messages(&after);
    assert!(has_result(
        &before.json().unwrap()["messages"]
            .as_array()
            .unwrap()
            .clone(),
        "step 1 line 2499"
    ));
    assert!(
        !has_result(&msgs, "step 1 line 2499"),
        "the log is gone from the window"
    );
    assert!(
        !msgs.iter().any(|m| m.to_string().contains(
            &a.history[1]["content"][1]["id"]
                .as_str()
                .unwrap_or("none")
                .to_string()
        ) && m["role"] == "assistant"),
        "its call went with it"
    );
    let note = msgs
        .iter()
        .position(|m| m["role"] == "assistant" && m.to_string().contains("only net/ fails"))
        .expect("the note is in the window");
    assert!(note > 0);
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("taken · export e1"), "{receipt}");
    assert!(receipt.contains("deleted seq 2, 3"), "{receipt}");
    assert!(receipt.contains("note 1 added"), "{receipt}");
    // Tokens saved, as the upstream counted them.
    let saved = before.usage.as_ref().unwrap().total_input_tokens as i64
        - after.usage.as_ref().unwrap().total_input_tokens as i64;
    eprintln!("tokens saved by the edit (upstream's count): {saved}; receipt:\n{receipt}");
    assert!(saved > 25_000, "saved {saved}");
    // The byte-identical prefix: the first message (before the first
    // edited block) is the same bytes as before the edit.
    let prefix_end = |r: &Recorded| {
        let b = String::from_utf8(r.body.to_vec()).unwrap();
        let start = b.find("\"messages\":[").unwrap() + 12;
        let first = serde_json::to_string(&a.history[0]).unwrap();
        assert!(b[start..].starts_with(&first));
        b[..start + first.len()].to_string()
    };
    assert_eq!(prefix_end(&before), prefix_end(&after));
    // The ledger keeps the original.
    let rows =
        a.h.store()
            .session_rows(&a.h.store().latest_session().unwrap().unwrap(), true)
            .unwrap();
    assert!(rows
        .iter()
        .any(|(r, _)| r.seq == 3 && r.raw.contains("step 1 line 2499")));
    // The edit holds on the next requests, and the file was refreshed.
    let next = a.step("ok").await;
    assert!(!has_result(&messages(&next), "step 1 line 2499"));
    assert!(has_result(&messages(&next), "only net/ fails"));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("export e2"),
        "a taken edit is a new export: {}",
        text.lines().next().unwrap()
    );
    assert!(text.contains("[[note 1]]"));

    // A concurrent edit against the older export is refused.
    let stale = text
        .replace("export e2", "export e1")
        .replace("[[m:e2 ", "[[m:e1 ");
    std::fs::write(&path, stale).unwrap();
    let r = a.step("ok").await;
    assert!(
        has_result(&messages(&r), "only net/ fails"),
        "nothing changed"
    );
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("refused · export e2"), "{receipt}");
    assert!(receipt.contains("older one than the latest"), "{receipt}");
    eprintln!("refused receipt:\n{receipt}");

    // Restore: the removed block's header written back.
    let text = std::fs::read_to_string(&path).unwrap();
    let nonce = text
        .split(" export ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let restored = text.replace(
        "[[end of context",
        &format!("[[m:{nonce} 3 user]]\n\n[[end of context"),
    );
    std::fs::write(&path, restored).unwrap();
    let r = a.step("ok").await;
    assert!(
        has_result(&messages(&r), "step 1 line 2499"),
        "the log is back: {}",
        a.receipt(&path)
    );
    assert!(
        a.receipt(&path).contains("restored seq 2, 3"),
        "{}",
        a.receipt(&path)
    );
    // The exports record the edits; the log itself is never edited.
    let id = a.h.store().latest_session().unwrap().unwrap();
    let t = oceancode_ledger::atif::trajectory(a.h.store(), &id, &|_| None).unwrap();
    let edits: Vec<&Value> = t["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["extra"]["context_management"]["type"] == "edit")
        .collect();
    assert_eq!(edits.len(), 2, "the drop and the restore");
    assert_eq!(edits[0]["source"], "system");
    assert_eq!(
        edits[0]["extra"]["context_management"]["seqs"],
        json!([2, 3])
    );
    let mut md = Vec::new();
    oceancode_ledger::export::markdown(a.h.store(), &id, &|_| None, &mut md, None).unwrap();
    let md = String::from_utf8(md).unwrap();
    assert!(md.contains("context_edits: 2"), "frontmatter");
    assert!(md.contains("## Context edits"));
    assert!(
        md.contains("step 1 line 2499"),
        "the transcript keeps the original"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_are_refused_with_a_clear_receipt_and_nothing_changes() {
    let mut a = Agent::start().await;
    a.step("one").await;
    a.step("two").await;
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    type Spoil = fn(&str) -> Vec<u8>;
    let cases: Vec<(&str, Spoil, &str)> = vec![
        ("empty", |_| Vec::new(), "the file is empty"),
        ("binary", |_| b"\x7fELF\0\0\x01".to_vec(), "binary"),
        (
            "100 MB",
            |g| {
                let mut s = g.to_string();
                s.push_str(&"x".repeat(100 << 20));
                s.into_bytes()
            },
            "over the",
        ),
        (
            "mangled header",
            |g| {
                let h = header_of(g, 3);
                g.replacen(&h, &h.replacen(" 3 ", " three ", 1), 1)
                    .into_bytes()
            },
            "header mangled",
        ),
        (
            "duplicate seq",
            |g| {
                let h = header_of(g, 3);
                g.replacen(&h, &format!("{h}\nx\n\n{h}"), 1).into_bytes()
            },
            "appears twice",
        ),
        (
            "first line",
            |g| g.replacen("[[context ", "[[context! ", 1).into_bytes(),
            "first line changed",
        ),
        (
            "truncated",
            |g| g.as_bytes()[..g.len() - 25].to_vec(),
            "truncated",
        ),
    ];
    for (what, spoil, want) in cases {
        // Each case spoils the file as it is now (its nonce).
        let good = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, spoil(&good)).unwrap();
        let r = a.step("ok").await;
        let receipt = a.receipt(&path);
        assert!(receipt.starts_with("refused"), "{what}: {receipt}");
        assert!(receipt.contains(want), "{what}: {receipt}");
        assert!(has_result(&messages(&r), "one"), "{what}: nothing dropped");
        assert!(!messages(&r)
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"].to_string().contains("[[")));
        // The refusal wrote a fresh export (a new nonce) over the bad file.
        let now = std::fs::read_to_string(&path).unwrap();
        assert!(
            now.starts_with("[[context "),
            "{what}: the file was written again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edit_without_the_file_drops_tool_rounds_and_survives_idle_eviction() {
    let mut a = Agent::start().await;
    for i in 0..4 {
        a.step(&tool_lines(i, 200, 3)).await;
    }
    // The newest ask and the running round are never dropped.
    let ans = a
        .context(
            json!({"session": SESSION, "drop": ["t"], "keep": ["3"], "note": "rounds 1-3 passed"}),
        )
        .await;
    let receipt = ans["receipt"].as_str().unwrap();
    assert!(receipt.starts_with("taken"), "{receipt}");
    let r = a.step("last").await;
    let msgs = messages(&r);
    assert!(has_result(&msgs, "step 0 line 1"), "seq 3 kept");
    assert!(!has_result(&msgs, "step 1 line 1"), "dropped");
    assert!(
        has_result(&msgs, "step 3 line 1"),
        "the running round of the edit's time stays"
    );
    assert!(has_result(&msgs, "rounds 1-3 passed"));
    // Idle eviction: the session leaves memory and is read back from the
    // ledger with its edit set.
    a.h.settle().await;
    assert!(a.h.proxy().app.sessions.evict_idle(-1) > 0);
    let r = a.step("again").await;
    let msgs = messages(&r);
    assert!(
        !has_result(&msgs, "step 1 line 1"),
        "the edit survived eviction"
    );
    assert!(has_result(&msgs, "rounds 1-3 passed"));
    // A refused one: the newest ask.
    let ans = a.context(json!({"session": SESSION, "drop": ["1"]})).await;
    let receipt = ans["receipt"].as_str().unwrap();
    assert!(
        receipt.starts_with("refused") && receipt.contains("newest ask"),
        "{receipt}"
    );
    let got = a
        .context(json!({"session": SESSION, "receipt": true}))
        .await;
    assert_eq!(got["receipt"].as_str(), Some(receipt));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_by_hand_cuts_through_a_turn_and_keeps_the_newest() {
    let mut a = Agent::start().await;
    a.step(&tool_lines(0, 100, 1)).await;
    // Turn 2 and 3: a new ask after the tool round.
    for (turn, ask) in [(2, "Now the docs."), (3, "And the changelog.")] {
        a.history.push(json!({"role":"assistant","content":[{"type":"text","text": format!("Turn {} done.", turn - 1)}]}));
        a.history.push(json!({"role":"user","content": ask}));
        a.step(&tool_lines(turn, 100, 1)).await;
    }
    let got = evict(&a.h, "through 1").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let upto = got.json()["upto"].as_u64().unwrap();
    assert!(upto >= 2, "{}", got.text());
    let r = a.step("ok").await;
    let msgs = messages(&r);
    assert_eq!(
        oceancode_tests::stub_seq(&msgs[0]),
        Some(upto),
        "the stub names the eviction"
    );
    assert!(!has_result(&msgs, "step 0 line 1"), "turn 1 left");
    assert!(
        has_result(&msgs, "And the changelog."),
        "the newest turn stays"
    );
    // Nothing older than the newest turn is left to evict through turn 1.
    assert_eq!(evict(&a.h, "through 1").await.status, 400);
    assert_eq!(evict(&a.h, "nonsense words here").await.status, 400);
}

async fn evict(h: &Harness, v: &str) -> oceancode_tests::Got {
    oceancode_tests::collect(
        h.send(
            &h.url(),
            http::Method::POST,
            "/_oceancode/evict",
            &[],
            Bytes::from(json!({"session": SESSION, "value": v}).to_string()),
        )
        .await,
    )
    .await
}

/// The Responses API (Codex's shape): a reasoning item bound to its call,
/// a function_call_output deleted with `[[delete]]` takes its call and the
/// reasoning item with it; the request stays valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_session_deletes_an_output_with_its_call_and_reasoning() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("shell", json!({"cmd": "make"})).with_thinking("Build it."),
    ));
    let h = Harness::start(fake, |_| {}).await;
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "build the repo"}]}),
    ];
    let mut last = None;
    for step in 0..3 {
        let body = json!({"model": "gpt-x", "store": false, "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}], "input": input});
        let got = h
            .post(
                "/v1/responses",
                &[("session-id", "codex-ctx")],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        for item in got.json()["output"].as_array().unwrap() {
            input.push(item.clone());
            if let Some(c) = item["call_id"].as_str() {
                let out = if step == 0 {
                    tool_lines(9, 800, 2)
                } else {
                    format!("ok {step}")
                };
                input.push(json!({"type": "function_call_output", "call_id": c, "output": out}));
            }
        }
        h.settle().await;
        last = h.fake.requests().into_iter().last();
        assert_eq!(last.as_ref().unwrap().status, 200);
        if step == 1 {
            let got = oceancode_tests::collect(
                h.send(
                    &h.url(),
                    http::Method::POST,
                    "/_oceancode/context",
                    &[],
                    Bytes::from(json!({"session": "codex-ctx"}).to_string()),
                )
                .await,
            )
            .await;
            let path = PathBuf::from(got.json()["path"].as_str().unwrap().to_string());
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.contains("[[reasoning · kept as is]]"), "{text}");
            let marker = text
                .lines()
                .find(|l| l.starts_with("[[tool_result "))
                .unwrap()
                .to_string();
            std::fs::write(
                &path,
                text.replacen(&marker, &format!("[[delete]]\n{marker}"), 1),
            )
            .unwrap();
        }
    }
    let r = last.unwrap();
    let items = r.json().unwrap()["input"].as_array().cloned().unwrap();
    let s = serde_json::to_string(&items).unwrap();
    assert!(!s.contains("step 9 line 799"), "the output left");
    let calls = items
        .iter()
        .filter(|i| i["type"] == "function_call")
        .count();
    let reasoning = items.iter().filter(|i| i["type"] == "reasoning").count();
    assert_eq!(
        (calls, reasoning),
        (1, 1),
        "the first call and its reasoning left with its output; the second stays"
    );
}
