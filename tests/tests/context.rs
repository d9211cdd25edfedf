//! The agent edits its own context end to end: `context` exports the
//! window to context.txt, an edit of the file (delete a 40k-token log, add a
//! note, rewrite, restore) is read at the next request, taken or refused
//! with its receipt, and holds on every later request, across idle
//! eviction; the fake upstream validates every request.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
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

    /// Until the file writer has written every refresh queued (a poll
    /// with a deadline, not a fixed sleep: a loaded machine writes late).
    async fn wait_for_writer(&self) {
        tokio::task::spawn_blocking(|| {
            oceancode_proxy::context::io::drain(std::time::Duration::from_secs(10))
        })
        .await
        .unwrap();
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
    assert!(
        !String::from_utf8_lossy(&before.body).contains("\\n[seq "),
        "context.seq_tags is off by default: tool results go as the client sent them"
    );
    // Export: the window as the upstream saw it on the last request.
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("[[context "), "{}", &text[..200]);
    let first = text.lines().next().unwrap();
    assert!(
        first.contains(" export e1-") && first.contains(" · seq 1–5 · 5 messages"),
        "{first}"
    );
    let nonce = export_of(&text).0;
    assert!(
        nonce.len() == "e1-".len() + 8 && nonce[3..].chars().all(|c| c.is_ascii_hexdigit()),
        "the nonce has a random part: {nonce}"
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_read_by_a_request_the_upstream_refuses_stays_recorded() {
    let step = Reply::tool_call("Bash", json!({"command": "make test"})).with_text("Testing.");
    let refused = Reply::error(
        401,
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
    );
    let fake = FakeConfig::default().with_script(
        Script::replies([step.clone(), step.clone(), step.clone(), refused]).then(step),
    );
    let h = Harness::start(fake, |_| {}).await;
    let mut a = Agent {
        h,
        history: vec![json!({"role":"user","content":"Fix the build, then run the tests."})],
    };
    a.step(&tool_lines(1, 300, 7)).await; // seq 3: the log
    a.step("2 tests failed").await;
    a.step("fixed").await;
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, without_block(&text, 3)).unwrap();
    // The request that reads the edit is refused by the upstream (a bad
    // key): nothing of the request is recorded, but the edit is the file
    // writer's and holds.
    let body = json!({
        "model": "claude-test-200k",
        "max_tokens": 4096,
        "tools": [{"name":"Bash","description":"Run","input_schema":{"type":"object"}}],
        "messages": a.history,
    });
    let got =
        a.h.post(
            "/v1/messages",
            &[("x-oceancode-session", SESSION)],
            body.to_string(),
        )
        .await;
    assert_eq!(got.status, 401, "{}", got.text());
    assert_eq!(
        a.h.proxy()
            .app
            .sessions
            .metrics
            .refused
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the request was rolled back"
    );
    let refused_req = a.h.fake.requests().into_iter().last().unwrap();
    assert!(
        !has_result(&messages(&refused_req), "step 1 line 299"),
        "the edit was in force on the refused request"
    );
    a.h.settle().await;
    a.wait_for_writer().await;
    let id = a.h.store().latest_session().unwrap().unwrap();
    let edits = a.h.store().context_edits(&id).unwrap();
    assert_eq!(edits.len(), 1, "the edit is recorded: {edits:?}");
    // It survives the session leaving memory: it came from the ledger.
    assert!(a.h.proxy().app.sessions.evict_idle(-1) > 0);
    let r = a.step("again").await;
    assert!(
        !has_result(&messages(&r), "step 1 line 299"),
        "the edit holds after eviction"
    );
}

/// The first line of the file: (nonce, last seq it covers).
fn export_of(text: &str) -> (String, u64) {
    let first = text.lines().next().unwrap();
    let nonce = first.split(" export ").nth(1).unwrap().split(' ').next();
    let last = first
        .split(" · seq ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|r| r.split('–').nth(1))
        .unwrap();
    (nonce.unwrap().to_string(), last.parse().unwrap())
}

/// A real restart (a new proxy on the same data dir) and idle eviction:
/// the exported file is still refreshed after every request, an edit made
/// while the proxy was down is read at the first request after it, and no
/// nonce is ever used twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_survives_a_restart_and_idle_eviction_and_nonces_never_repeat() {
    let mut a = Agent::start().await;
    a.step(&tool_lines(1, 400, 7)).await; // sends 1 (the ask)
    a.step("2 tests failed").await; // sends 1-3 (3: the log)
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let mut nonces = vec![export_of(&std::fs::read_to_string(&path).unwrap()).0];
    assert!(nonces[0].starts_with("e1-"), "{nonces:?}");
    let saved = path.with_file_name("context.state.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&saved).unwrap().permissions().mode() & 0o777,
        0o600,
        "the export's record is private like the file"
    );

    // Restart: nothing but the disk is kept.
    a.h.restart(|_| {}).await;
    a.step("fixed").await; // sends 1-5: the session is read back from the ledger
    let text = std::fs::read_to_string(&path).unwrap();
    let (nonce, last) = export_of(&text);
    assert_eq!(
        (nonce.as_str(), last),
        (nonces[0].as_str(), 5),
        "refreshed after the restart: {}",
        text.lines().next().unwrap()
    );
    assert!(
        text.contains(&format!("[[m:{nonce} 5 user]]")),
        "the new rows are in it"
    );

    // An edit made while the proxy is down: the log's block deleted.
    a.h.stop().await;
    std::fs::write(&path, without_block(&text, 3)).unwrap();
    a.h.restart(|_| {}).await;
    let r = a.step("ok").await; // sends 1-7
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("taken · export e1"), "{receipt}");
    assert!(receipt.contains("deleted seq 2, 3"), "{receipt}");
    assert!(
        !has_result(&messages(&r), "step 1 line 399"),
        "the log left"
    );
    let (nonce, last) = export_of(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(last, 7);
    nonces.push(nonce);

    // Idle eviction: the same.
    a.h.settle().await;
    assert!(a.h.proxy().app.sessions.evict_idle(-1) > 0);
    a.step("ok").await; // sends 1-9
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(export_of(&text).1, 9, "refreshed after eviction");
    let noted = text.replace(
        "[[end of context",
        "[[note]]\nThe log (seq 3) said: only net/ fails.\n\n[[end of context",
    );
    std::fs::write(&path, noted).unwrap();
    let r = a.step("ok").await;
    assert!(
        a.receipt(&path).starts_with("taken"),
        "{}",
        a.receipt(&path)
    );
    assert!(has_result(&messages(&r), "only net/ fails"));
    assert!(!has_result(&messages(&r), "step 1 line 399"), "still out");
    nonces.push(export_of(&std::fs::read_to_string(&path).unwrap()).0);

    // Another restart, then `context`: a fresh export with a new nonce.
    a.h.restart(|_| {}).await;
    a.step("ok").await;
    nonces.push(export_of(&std::fs::read_to_string(&path).unwrap()).0);
    let ans = a.context(json!({"session": SESSION})).await;
    nonces.push(ans["nonce"].as_str().unwrap().to_string());
    // The file removed and exported again after a restart: still new.
    std::fs::remove_file(&path).unwrap();
    a.step("ok").await;
    a.h.restart(|_| {}).await;
    a.step("ok").await;
    let ans = a.context(json!({"session": SESSION})).await;
    nonces.push(ans["nonce"].as_str().unwrap().to_string());
    let numbers: Vec<&str> = nonces
        .iter()
        .map(|n| n.split('-').next().unwrap())
        .collect();
    assert_eq!(numbers, ["e1", "e2", "e3", "e3", "e4", "e5"], "{nonces:?}");
    assert_eq!(nonces[2], nonces[3], "a refresh keeps the export's nonce");
    let distinct: std::collections::BTreeSet<&String> = nonces.iter().collect();
    assert_eq!(distinct.len(), 5, "{nonces:?}");
}

/// Each message of a body sent upstream, as its raw bytes.
fn raw_messages(r: &Recorded) -> Vec<String> {
    use serde_json::value::RawValue;
    let b: std::collections::HashMap<String, Box<RawValue>> =
        serde_json::from_slice(&r.body).unwrap();
    let msgs: Vec<Box<RawValue>> = serde_json::from_str(b["messages"].get()).unwrap();
    msgs.iter().map(|m| m.get().to_string()).collect()
}

/// `context.seq_tags` on: every tool result the upstream sees ends with
/// `[seq N]` (N its ledger row), the same bytes on every request and
/// across cuts (the prompt cache holds); the ledger keeps the client's
/// bytes without it; the file shows the tags and an untouched file is no edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_tags_end_every_tool_result_and_stay_the_same_bytes_between_cuts() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "make test"})).with_text("Testing."),
    ));
    let h = Harness::start(fake, |o| {
        o.sessions.models = std::sync::Arc::new(|_m: &str, _l: Option<u64>| {
            oceancode_proxy::sessions::ModelLimits {
                context: Some(200_000),
                max_output: Some(32_000),
            }
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
        o.sessions.seq_tags = true;
    })
    .await;
    let mut a = Agent {
        h,
        history: vec![json!({"role":"user","content":"Fix the build, then run the tests."})],
    };
    let mut sent = Vec::new();
    for i in 0..30 {
        sent.push(a.step(&oceancode_tests::tool_output(i)).await);
    }
    // The ledger's rows: the client's bytes, the seq of each result.
    let id = a.h.store().latest_session().unwrap().unwrap();
    let rows = a.h.store().session_rows(&id, true).unwrap();
    let mut seq_of = std::collections::HashMap::new();
    for (r, _) in &rows {
        assert!(
            !r.raw.contains("[seq "),
            "the ledger keeps the client's bytes"
        );
        let v: Value = serde_json::from_str(&r.raw).unwrap();
        if let Some(blocks) = v["content"].as_array() {
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                seq_of.insert(b["tool_use_id"].as_str().unwrap().to_string(), r.seq);
            }
        }
    }
    let mut bytes_of: std::collections::HashMap<String, String> = Default::default();
    let mut stubs = std::collections::BTreeSet::new();
    let mut results = 0;
    for r in &sent {
        let msgs = raw_messages(r);
        if let Some(s) = oceancode_tests::stub_seq(&serde_json::from_str(&msgs[0]).unwrap()) {
            stubs.insert(s);
        }
        for raw in msgs {
            let v: Value = serde_json::from_str(&raw).unwrap();
            let Some(blocks) = v["content"].as_array() else {
                continue;
            };
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                let call = b["tool_use_id"].as_str().unwrap().to_string();
                let want = format!("\n[seq {}]", seq_of[&call]);
                assert!(
                    b["content"].as_str().unwrap().ends_with(&want),
                    "{call} ends with {want:?}"
                );
                results += 1;
                let prev = bytes_of.entry(call.clone()).or_insert_with(|| raw.clone());
                assert_eq!(*prev, raw, "{call}: the same bytes on every request");
            }
        }
    }
    assert!(stubs.len() >= 2, "several cuts: {stubs:?}");
    assert!(results > 100, "{results}");
    // The file shows what the upstream saw; untouched, it is no edit.
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\n[seq "), "the tags are in the file");
    // An edit of the tagged file reads against what it shows: a result's
    // block deleted (every other block unchanged) is taken.
    let seq: u64 = text
        .lines()
        .filter(|l| l.starts_with("[[m:") && l.ends_with(" user]]"))
        .nth(2)
        .and_then(|l| l.split(' ').nth(1))
        .unwrap()
        .parse()
        .unwrap();
    std::fs::write(&path, without_block(&text, seq)).unwrap();
    let r = a.step("ok").await;
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("taken"), "{receipt}");
    assert!(
        !messages(&r)
            .iter()
            .any(|m| m.to_string().contains(&format!("[seq {seq}]"))),
        "seq {seq} left"
    );
}

/// A proxy at a 20k-token line (200k context): cuts come quickly.
async fn agent_20k(tweak: impl FnOnce(&mut oceancode_proxy::runtime::ProxyOptions)) -> Agent {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "make test"})).with_text("Testing."),
    ));
    let h = Harness::start(fake, |o| {
        o.sessions.models = std::sync::Arc::new(|_m: &str, _l: Option<u64>| {
            oceancode_proxy::sessions::ModelLimits {
                context: Some(200_000),
                max_output: Some(32_000),
            }
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
        tweak(o);
    })
    .await;
    Agent {
        h,
        history: vec![json!({"role":"user","content":"Fix the build, then run the tests."})],
    }
}

/// The lines of the block under `header` (to the next header line).
fn block_lines<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != header)
        .skip(1)
        .take_while(|l| !(l.starts_with("[[m:") || l.ends_with(" · not editable]]")))
        .collect()
}

/// After a cut the stub and the state block (issue 13) are blocks of their
/// own in context.txt that say they are not editable; an edit that changes
/// or removes the state block is refused with the line, nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_block_is_a_block_of_its_own_and_an_edit_of_it_is_refused() {
    let mut a = agent_20k(|_| {}).await;
    let mut last = None;
    for i in 0..16 {
        last = Some(a.step(&oceancode_tests::tool_output(i)).await);
    }
    let sent = messages(&last.unwrap());
    let stub = sent[0]["content"].to_string();
    assert!(
        stub.contains("[State at the tideline:"),
        "cut, with the state block after the stub: {stub:.300}"
    );
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "[[stub · not editable]]", "{text:.600}");
    let state = lines
        .iter()
        .position(|l| *l == "[[state · not editable]]")
        .expect("the state block is a block of its own");
    assert!(
        lines[state + 1].starts_with("[State at the tideline:"),
        "{}",
        lines[state + 1]
    );
    let stub_body = block_lines(&text, "[[stub · not editable]]").join("\n");
    assert!(stub_body.starts_with("[Earlier content of this session is past the tideline"));
    assert!(
        !stub_body.contains("[State at the tideline:"),
        "not in the stub's block"
    );

    // Changing a line of it: refused, with the line of its header.
    let changed = text.replacen(
        "[State at the tideline:",
        "[State (edited by the agent) at the tideline:",
        1,
    );
    std::fs::write(&path, changed).unwrap();
    let r = a.step("ok").await;
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("refused"), "{receipt}");
    assert!(
        receipt.contains(&format!("line {}", state + 1))
            && receipt.contains("the state block is not editable"),
        "{receipt}"
    );
    eprintln!("refused receipt (the state block changed):\n{receipt}");
    assert!(
        messages(&r)[0]["content"]
            .to_string()
            .contains("[State at the tideline:"),
        "the request went out with the proxy's state block"
    );
    assert!(!messages(&r)[0]["content"]
        .to_string()
        .contains("edited by the agent"));

    // Removing it: refused too.
    let text = std::fs::read_to_string(&path).unwrap();
    let body = block_lines(&text, "[[state · not editable]]").join("\n");
    let removed = text.replacen(&format!("[[state · not editable]]\n{body}\n"), "", 1);
    assert_ne!(removed, text);
    std::fs::write(&path, removed).unwrap();
    a.step("ok").await;
    let receipt = a.receipt(&path);
    assert!(
        receipt.starts_with("refused") && receipt.contains("the state block was removed"),
        "{receipt}"
    );
    // Untouched, the file is no edit; an edit elsewhere is still taken.
    let text = std::fs::read_to_string(&path).unwrap();
    let noted = text.replace(
        "[[end of context",
        "[[note]]\nThe state block says where to look.\n\n[[end of context",
    );
    std::fs::write(&path, noted).unwrap();
    let r = a.step("ok").await;
    assert!(
        a.receipt(&path).starts_with("taken"),
        "{}",
        a.receipt(&path)
    );
    assert!(has_result(
        &messages(&r),
        "The state block says where to look."
    ));
}

/// How a test client names its session.
#[derive(Debug, Clone, Copy)]
enum Ident {
    /// `x-oceancode-session`.
    Header,
    /// The `/s/<name>/` path prefix.
    Prefix,
    /// Claude Code's `metadata.user_id` session id.
    ClaudeCode,
    /// Nothing: the fingerprint of the opening.
    Fingerprint,
}

impl Agent {
    /// One request named as `ident`; the answer's tool call gets `result`.
    async fn step_as(&mut self, ident: Ident, result: &str) -> Recorded {
        let mut body = json!({
            "model": "claude-test-200k",
            "max_tokens": 4096,
            "tools": [{"name":"Bash","description":"Run","input_schema":{"type":"object"}}],
            "messages": self.history,
        });
        let (path, headers): (&str, Vec<(&str, &str)>) = match ident {
            Ident::Header => ("/v1/messages", vec![("x-oceancode-session", SESSION)]),
            Ident::Prefix => ("/s/ctx-prefix/v1/messages", vec![]),
            Ident::ClaudeCode => {
                body["metadata"] = json!({"user_id": json!({"device_id": "d1", "session_id": "5f1c0b9e-cc01-4c1a-9a77-0123456789ab"}).to_string()});
                (
                    "/v1/messages",
                    vec![("user-agent", "claude-cli/2.1.332 (external, cli)")],
                )
            }
            Ident::Fingerprint => ("/v1/messages", vec![]),
        };
        let got = self.h.post(path, &headers, body.to_string()).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let content = got.json()["content"].clone();
        push_tool_step(&mut self.history, &content, result);
        self.h.settle().await;
        self.wait_for_writer().await;
        let last = self.h.fake.requests().into_iter().last().unwrap();
        assert_eq!(last.status, 200, "the upstream found the request valid");
        last
    }
}

/// Issue 32.3: an edit (the file's, or `context --drop`) followed by the
/// agent's next steps (1, 2 and 5 of them, two messages each), for every
/// way a client names its session: every UPSTREAM request after the edit
/// lacks what it took out, and the receipt says taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_holds_on_the_agents_next_steps_for_every_kind_of_session_name() {
    for ident in [
        Ident::Header,
        Ident::Prefix,
        Ident::ClaudeCode,
        Ident::Fingerprint,
    ] {
        for by_file in [true, false] {
            for next in [1usize, 2, 5] {
                let what = format!("{ident:?}, by file {by_file}, {next} steps");
                let mut a = Agent::start().await;
                a.step_as(ident, &tool_lines(1, 300, 7)).await; // 1 ask, 2 call, 3 the log
                a.step_as(ident, "2 tests failed").await; // 4, 5
                a.step_as(ident, "fixed").await; // 6, 7 (sent: 1-5)
                if by_file {
                    let ans = a.context(json!({"session": "latest"})).await;
                    let path = PathBuf::from(ans["path"].as_str().unwrap());
                    let text = std::fs::read_to_string(&path).unwrap();
                    std::fs::write(&path, without_block(&text, 3)).unwrap();
                } else {
                    let ans = a.context(json!({"session": "latest", "drop": ["3"]})).await;
                    let receipt = ans["receipt"].as_str().unwrap();
                    assert!(receipt.starts_with("taken"), "{what}: {receipt}");
                }
                let sent_before = a.h.fake.requests().len();
                for i in 0..next {
                    a.step_as(ident, &format!("next {i}")).await;
                }
                let reqs = a.h.fake.requests();
                assert_eq!(reqs.len(), sent_before + next, "{what}");
                for (i, r) in reqs[sent_before..].iter().enumerate() {
                    let msgs = messages(r);
                    assert!(
                        !has_result(&msgs, "step 1 line 299"),
                        "{what}: request {i} after the edit still carries the log"
                    );
                    assert!(has_result(&msgs, "2 tests failed"), "{what}: request {i}");
                }
                let receipt = a
                    .context(json!({"session": "latest", "receipt": true}))
                    .await;
                let receipt = receipt["receipt"].as_str().unwrap_or_default().to_string();
                assert!(receipt.starts_with("taken"), "{what}: {receipt}");
                assert!(receipt.contains("deleted seq 2, 3"), "{what}: {receipt}");
            }
        }
    }
}

/// Issue 33.1: context.txt replaced by a FIFO (nobody writes to it) or by
/// a symlink to a file outside the session dir. The session's next
/// request neither blocks in `open(2)` nor follows the link: the edit is
/// refused with the reason, the request goes out as the client sent it,
/// and the proxy writes a regular file back in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_or_a_symlink_in_place_of_context_txt_never_blocks_or_is_followed() {
    let mut a = Agent::start().await;
    a.step(&tool_lines(1, 300, 7)).await;
    a.step("two").await;
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();

    // A FIFO: before, the request blocked in open(2) holding the session.
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let deadline = std::time::Duration::from_secs(20);
    let r = tokio::time::timeout(deadline, a.step("three")).await;
    if r.is_err() {
        // Let the blocked open(2) go, so the test ends and says why.
        let fifo = path.clone();
        std::thread::spawn(move || std::fs::OpenOptions::new().write(true).open(fifo));
        panic!("the request hung on a FIFO in place of context.txt");
    }
    let receipt = a.receipt(&path);
    assert!(
        receipt.starts_with("refused") && receipt.contains("not a regular file (a FIFO)"),
        "{receipt}"
    );
    assert!(
        has_result(&messages(&r.unwrap()), "step 1 line 299"),
        "nothing taken"
    );
    assert!(
        std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_file(),
        "a regular file again"
    );

    // A symlink to an edited copy outside the session dir: never followed.
    let text_now = std::fs::read_to_string(&path).unwrap();
    assert_ne!(text, text_now, "a new export");
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("elsewhere.txt");
    std::fs::write(&target, without_block(&text_now, 3)).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    let r = a.step("four").await;
    let receipt = a.receipt(&path);
    assert!(
        receipt.starts_with("refused") && receipt.contains("symlink"),
        "{receipt}"
    );
    assert!(
        has_result(&messages(&r), "step 1 line 299"),
        "the edit behind the link was not taken"
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        without_block(&text_now, 3),
        "the file behind the link is untouched"
    );
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_file());
}

/// Issue 33.2: a tool output with CRLF line ends holding header-like
/// lines (`[[m:…]]`, `[[end of context …]]`, `[[delete]]`, `[[note]]`).
/// An edit elsewhere in the file leaves it byte for byte (no CR dropped,
/// no `[rewritten; …]` line); the edit is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crlf_output_with_header_like_lines_stays_byte_for_byte_through_edits() {
    let mut a = Agent::start().await;
    let crlf = "PS> make\r\n[[m:e1 3 user]]\r\n[[end of context e1]]\r\n[[delete]]\r\n[[note]]\r\nbuild ok\r\n";
    a.step(crlf).await; // seq 3: the CRLF output
    a.step(&tool_lines(2, 200, 3)).await; // seq 5: a log
    a.step("fixed").await;
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    let sent = |r: &Recorded| -> Vec<String> {
        messages(r)
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_result")
            .filter_map(|b| b["content"].as_str().map(str::to_string))
            .collect()
    };
    // A note at the end and the log's block deleted.
    let edited = without_block(&text, 5).replace(
        "\n[[end of context",
        "\n[[note]]\nThe log said: all green.\n\n[[end of context",
    );
    std::fs::write(&path, edited).unwrap();
    let r = a.step("ok").await;
    let receipt = a.receipt(&path);
    assert!(receipt.starts_with("taken"), "{receipt}");
    assert!(receipt.contains("deleted seq 4, 5"), "{receipt}");
    assert!(!receipt.contains("rewritten"), "{receipt}");
    let results = sent(&r);
    assert!(
        results.iter().any(|c| c == crlf),
        "the CRLF output went upstream byte for byte: {results:?}"
    );
    assert!(
        !has_result(&messages(&r), "step 2 line 199"),
        "the log left"
    );
    // The next edit of the file (another note) is taken too, and the
    // output still is the client's bytes.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "\n[[end of context",
            "\n[[note]]\nSecond note.\n\n[[end of context",
        ),
    )
    .unwrap();
    let r = a.step("ok").await;
    assert!(
        a.receipt(&path).starts_with("taken"),
        "{}",
        a.receipt(&path)
    );
    assert!(sent(&r).iter().any(|c| c == crlf));
    assert!(!String::from_utf8_lossy(&r.body).contains("[rewritten;"));
}

/// Issue 32.4: a note written near the end of context.txt (after the
/// block of seq 5) goes upstream right after that message, not before the
/// session's first ask; the receipt names its place; both exports carry
/// its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_goes_where_it_is_written_and_into_both_exports() {
    let mut a = Agent::start().await;
    a.step(&tool_lines(1, 50, 7)).await; // 1 ask, 2 call, 3 result
    a.step("2 tests failed").await; // 4 call, 5 result
    a.step("fixed").await; // 6, 7 (sent: 1-5)
    let ans = a.context(json!({"session": SESSION})).await;
    let path = PathBuf::from(ans["path"].as_str().unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    let note = "Only net/ fails; the rest builds.";
    std::fs::write(
        &path,
        text.replace(
            "[[end of context",
            &format!("[[note]]\n{note}\n\n[[end of context"),
        ),
    )
    .unwrap();
    for i in 0..3 {
        let r = a.step(&format!("next {i}")).await;
        let msgs = messages(&r);
        let at = msgs
            .iter()
            .position(|m| m["role"] == "assistant" && m.to_string().contains(note))
            .expect("the note is in the window");
        assert!(
            msgs[at - 1].to_string().contains("2 tests failed"),
            "request {i}: the note follows seq 5, where it was written: {:?}",
            &msgs[..at]
        );
        assert_eq!(
            msgs[0]["content"], a.history[0]["content"],
            "the ask is first"
        );
    }
    let receipt = a.receipt(&path);
    assert!(
        receipt.contains("- note 1 added, after seq 5\n"),
        "{receipt}"
    );
    a.h.settle().await;
    let id = a.h.store().latest_session().unwrap().unwrap();
    let mut md = Vec::new();
    oceancode_ledger::export::markdown(a.h.store(), &id, &|_| None, &mut md, None).unwrap();
    let md = String::from_utf8(md).unwrap();
    assert!(
        md.contains(&format!("- note 1, after seq 5:\n\n  > {note}")),
        "{}",
        &md[md.find("## Context edits").unwrap_or(0)..]
    );
    let t = oceancode_ledger::atif::trajectory(a.h.store(), &id, &|_| None).unwrap();
    let edit = t["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["extra"]["context_management"]["type"] == "edit")
        .unwrap();
    assert_eq!(
        edit["extra"]["context_management"]["notes"][0]["text"],
        note
    );
    assert!(edit["message"].as_str().unwrap().contains(note), "{edit}");
    // `recall search` (the CLI, the recall tool, the viewer) finds it.
    let hits =
        a.h.store()
            .search(&["net".into(), "rest".into()], 10)
            .unwrap();
    assert_eq!(
        hits.first().map(|h| h.line(false)),
        Some("seq 5 · t01 · note 1 · Only [net]/ fails; the [rest] builds".to_string()),
        "{hits:?}"
    );
}

/// Issue 32.3 as Claude Code produced it: the client echoes an answer
/// without one of its tool calls (Claude Code leaves out a `tool_use` whose
/// id it saw before, and never sends a result for it). The edit set's
/// check must read the calls the client sent, not those of the answer as
/// the upstream gave it: the edit holds on every later request, a plain
/// answer and a new ask included, and the receipt says what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_holds_when_the_client_echoes_an_answer_without_one_of_its_calls() {
    let two_calls = |text: &str| {
        Reply::tool_call("Bash", json!({"command": "make test"}))
            .with_text(text)
            .with_tool_call("Read", json!({"file_path": "/tmp/seen"}))
    };
    let fake = FakeConfig::default().with_script(
        Script::replies([
            two_calls("Testing."),
            two_calls("Testing again."),
            two_calls("Testing once more."),
            Reply::text("Done: the build is fixed."),
        ])
        .then(Reply::tool_call("Bash", json!({"command": "make lint"})).with_text("Linting.")),
    );
    let h = Harness::start(fake, |_| {}).await;
    let mut a = Agent {
        h,
        history: vec![json!({"role":"user","content":"Fix the build, then run the tests."})],
    };
    // The answer as the client keeps it: its first call only, answered.
    let echo_first_call = |a: &mut Agent, got: &oceancode_tests::Got, result: &str| {
        let content = got.json()["content"].clone();
        let mut seen = false;
        let kept: Vec<Value> = content
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| {
                let call = b["type"] == "tool_use";
                let keep = !(call && seen);
                seen |= call;
                keep
            })
            .cloned()
            .collect();
        push_tool_step(&mut a.history, &Value::Array(kept), result);
    };
    let send = |a: &Agent| {
        json!({
            "model": "claude-test-200k",
            "max_tokens": 4096,
            "tools": [{"name":"Bash","description":"Run","input_schema":{"type":"object"}}],
            "messages": a.history,
        })
        .to_string()
    };
    let headers = [("x-oceancode-session", SESSION)];
    let got = a.h.post("/v1/messages", &headers, send(&a)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    echo_first_call(&mut a, &got, &tool_lines(1, 300, 7)); // 2 call (+ one dropped), 3 the log
    let got = a.h.post("/v1/messages", &headers, send(&a)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    echo_first_call(&mut a, &got, "2 tests failed"); // 4 call (+ one dropped), 5
    let got = a.h.post("/v1/messages", &headers, send(&a)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    echo_first_call(&mut a, &got, "fixed"); // 6 call (+ one dropped), 7
    a.h.settle().await;
    let ans = a.context(json!({"session": SESSION, "drop": ["3"]})).await;
    let receipt = ans["receipt"].as_str().unwrap();
    assert!(receipt.starts_with("taken"), "{receipt}");
    let sent_before = a.h.fake.requests().len();
    // The next steps: a plain answer, a new ask, a call and its result.
    let got = a.h.post("/v1/messages", &headers, send(&a)).await; // answer 8
    assert_eq!(got.status, 200, "{}", got.text());
    a.history
        .push(json!({"role": "assistant", "content": got.json()["content"].clone()}));
    a.history
        .push(json!({"role": "user", "content": "Now run the linter."})); // 9
    let got = a.h.post("/v1/messages", &headers, send(&a)).await; // answer 10
    assert_eq!(got.status, 200, "{}", got.text());
    let content = got.json()["content"].clone();
    push_tool_step(&mut a.history, &content, "lint clean"); // 10, 11
    let got = a.h.post("/v1/messages", &headers, send(&a)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    a.h.settle().await;
    a.wait_for_writer().await;
    let receipt = a
        .context(json!({"session": SESSION, "receipt": true}))
        .await;
    let receipt = receipt["receipt"].as_str().unwrap_or_default().to_string();
    let reqs = a.h.fake.requests();
    assert_eq!(reqs.len(), sent_before + 3);
    for (i, r) in reqs[sent_before..].iter().enumerate() {
        assert_eq!(r.status, 200, "request {i}: the upstream found it valid");
        let msgs = messages(r);
        assert!(
            !has_result(&msgs, "step 1 line 299"),
            "request {i} after the edit still carries the log; receipt:\n{receipt}"
        );
        assert!(has_result(&msgs, "2 tests failed"), "request {i}");
    }
    assert!(receipt.starts_with("taken"), "{receipt}");
    assert!(receipt.contains("deleted seq 2, 3"), "{receipt}");
}
