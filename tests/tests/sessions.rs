//! Sessions and the verbatim ledger: identity, longest-common-prefix matching
//! on real Claude Code and Codex traffic, branches, transcripts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::FakeConfig;
use oceancode_ledger::store::LedgerRead;
use oceancode_testkit::eventually_async;
use oceancode_tests::{captured, Harness};
use oceancode_window::RowKind;
use std::os::unix::fs::PermissionsExt;

async fn harness() -> Harness {
    // Captured conversations came from another fake: don't re-validate them.
    Harness::start(FakeConfig::default().with_validate(false), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_first_continue_resume_is_one_session_with_no_branch() {
    let h = harness().await;
    let mut last_len = 0;
    for run in [
        "anthropic_04a_first",
        "anthropic_04b_continue",
        "anthropic_04c_resume",
    ] {
        for c in captured(run) {
            let got = h.replay(&c).await;
            assert_eq!(got.status, 200, "{run}: {}", got.text());
            let v: serde_json::Value = serde_json::from_slice(&c.body).unwrap();
            last_len = v["messages"].as_array().unwrap().len();
        }
    }
    h.settle().await;
    let store = h.store();
    let list = store.list_sessions().unwrap();
    assert_eq!(list.len(), 1, "one ledger session: {list:?}");
    let s = store.load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 0, "no spurious branch");
    assert!(s.hidden.is_empty());
    assert_eq!(s.meta.client, "claude-code");
    assert_eq!(
        s.meta.client_session.as_deref(),
        Some("cc:5f13d5bb-4fd7-4b4d-8325-25f0e61fa59a")
    );
    // Every message of the last request, plus the last (unechoed) response.
    assert_eq!(s.rows.len(), last_len + 1);
    for (i, r) in s.rows.iter().enumerate() {
        assert_eq!(r.seq, i as u64 + 1, "gap-free seq");
    }
    // Rows are verbatim: the first is the client's bytes of messages[0].
    let first: serde_json::Value = serde_json::from_str(&s.rows[0].raw).unwrap();
    let sent: serde_json::Value =
        serde_json::from_slice(&captured("anthropic_04a_first")[0].body).unwrap();
    assert_eq!(first, sent["messages"][0]);
    assert_eq!(s.rows[0].kind, RowKind::Prompt);
    assert_eq!(
        s.rows[1].kind,
        RowKind::System,
        "Claude Code's role:system message is a row"
    );
    // Turn transcripts exist, private.
    let dir = store.session_dir(&s.meta.id);
    let t1 = dir.join("transcript").join("0001.md");
    let text = std::fs::read_to_string(&t1).unwrap();
    assert!(text.contains("list the files here"), "{text}");
    assert_eq!(
        std::fs::metadata(&t1).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(dir.join("transcript"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert!(dir.join("transcript").join("index.md").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn title_requests_are_forwarded_but_never_recorded() {
    let h = harness().await;
    let reqs = captured("anthropic_09_interactive_default_env");
    for c in &reqs {
        assert_eq!(h.replay(c).await.status, 200);
    }
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    let title_prompt = String::from_utf8_lossy(&reqs[0].body).to_string();
    assert!(title_prompt.contains("output_config"));
    assert_eq!(s.branch, 0);
    // The title request's lone message never became a row of the session.
    let title: serde_json::Value = serde_json::from_slice(&reqs[0].body).unwrap();
    let title_msg = &title["messages"][0];
    assert!(s
        .rows
        .iter()
        .all(|r| &serde_json::from_str::<serde_json::Value>(&r.raw).unwrap() != title_msg));
    assert_eq!(h.fake.request_count(), reqs.len(), "all forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_exec_and_resume_is_one_session_with_no_branch() {
    let h = harness().await;
    for run in [
        "openai_02_codex_model_my-custom-model",
        "openai_03_codex_resume",
    ] {
        for c in captured(run) {
            let got = h.replay(&c).await;
            assert_eq!(got.status, 200, "{run}: {}", got.text());
        }
    }
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.meta.client, "codex");
    assert_eq!(s.branch, 0, "no spurious branch");
    assert!(s
        .rows
        .iter()
        .any(|r| r.kind == RowKind::ToolResult && r.role == "function_call_output"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_records_a_branch_and_deletes_nothing() {
    let h = harness().await;
    let msgs = |tail: &[serde_json::Value]| {
        let mut m = vec![
            serde_json::json!({"role":"user","content":"first question"}),
            serde_json::json!({"role":"assistant","content":"first answer"}),
        ];
        m.extend_from_slice(tail);
        serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":100,"messages":m}).to_string()
    };
    let hdr = [("x-oceancode-session", "branchy")];
    assert_eq!(
        h.post(
            "/v1/messages",
            &hdr,
            msgs(&[serde_json::json!({"role":"user","content":"second question"})])
        )
        .await
        .status,
        200
    );
    // Same history but cache_control moved and string content as a block: still the same rows.
    let same = serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":100,"messages":[
        {"role":"user","content":[{"type":"text","text":"first question","cache_control":{"type":"ephemeral"}}]},
        {"role":"assistant","content":"first answer"},
        {"role":"user","content":"second question"},
    ]}).to_string();
    assert_eq!(h.post("/v1/messages", &hdr, same).await.status, 200);
    // Now the client rewinds: a different second question.
    assert_eq!(
        h.post(
            "/v1/messages",
            &hdr,
            msgs(&[serde_json::json!({"role":"user","content":"another second question"})])
        )
        .await
        .status,
        200
    );
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1);
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 1, "one branch");
    assert!(!s.hidden.is_empty());
    let texts: Vec<String> = s.rows.iter().map(|r| r.raw.to_string()).collect();
    assert!(
        texts.iter().any(|t| t.contains("\"second question\"")),
        "the old line is kept"
    );
    assert!(texts.iter().any(|t| t.contains("another second question")));
    let m = h.metrics().await;
    assert!(m.contains("\noceancode_branches_total 1\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_session_is_restored_from_the_ledger_without_a_branch() {
    let h = harness().await;
    let hdr = [("x-oceancode-session", "evict-me")];
    let body = |n: usize| {
        let mut m = vec![];
        for i in 0..n {
            m.push(serde_json::json!({"role":"user","content":format!("question {i}")}));
            m.push(serde_json::json!({"role":"assistant","content":format!("answer {i}")}));
        }
        m.push(serde_json::json!({"role":"user","content":format!("question {n}")}));
        serde_json::json!({"model":"claude-x","max_tokens":100,"messages":m}).to_string()
    };
    assert_eq!(h.post("/v1/messages", &hdr, body(3)).await.status, 200);
    let id = h.admin("/_oceancode/sessions/latest").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let app = &h.proxy().app;
    app.sessions
        .set_override(Some(&id), Some(oceancode_config::LineSpec::Percent(30.0)))
        .unwrap();
    h.settle().await;
    assert_eq!(app.sessions.evict_idle(-1), 1);
    assert!(app.sessions.get(&id).is_none(), "left memory");
    assert_eq!(h.post("/v1/messages", &hdr, body(5)).await.status, 200);
    let s = app.sessions.get(&id).expect("restored under the same id");
    assert_eq!(
        s.state.lock().override_line(),
        Some(oceancode_config::LineSpec::Percent(30.0))
    );
    h.settle().await;
    let l = h.store().load_session(&id).unwrap().unwrap();
    assert_eq!(l.branch, 0, "no branch after the restore");
    assert_eq!(h.store().list_sessions().unwrap().len(), 1);
    // 11 messages sent in the end; the first request's answer was echoed as "answer 3".
    let texts: Vec<String> = l
        .rows
        .iter()
        .filter(|r| !r.from_response)
        .map(|r| r.raw.to_string())
        .collect();
    for i in 0..5 {
        assert!(texts.iter().any(|t| t.contains(&format!("question {i}"))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_with_previous_response_id_are_appended_not_matched() {
    let h = harness().await;
    let hdr = [("session-id", "stateful-1"), ("originator", "codex_exec")];
    let first = serde_json::json!({"model":"gpt-5","input":[{"role":"user","content":"start"}]})
        .to_string();
    assert_eq!(h.post("/v1/responses", &hdr, first).await.status, 200);
    let next = serde_json::json!({"model":"gpt-5","previous_response_id":"resp_1","input":[{"role":"user","content":"continue"}]}).to_string();
    let got = h.post("/v1/responses", &hdr, next.clone()).await;
    assert_eq!(got.status, 200);
    let reqs = h.fake.requests();
    assert_eq!(
        reqs[1].body,
        bytes::Bytes::from(next),
        "forwarded untouched"
    );
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1);
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 0, "a delta input is not a rewind");
    let raws: Vec<&str> = s.rows.iter().map(|r| &*r.raw).collect();
    assert!(raws[0].contains("start"));
    assert!(raws.iter().any(|r| r.contains("continue")));
    assert_eq!(
        s.rows.iter().filter(|r| r.from_response).count(),
        2,
        "both answers recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_recorded_when_the_client_closes_right_after_the_terminal_event() {
    use http_body_util::BodyExt;
    use std::time::Duration;
    let sse =
        std::fs::read_to_string(oceancode_tests::fixture("sse/anthropic_tool_use.sse")).unwrap();
    let mut chunks: Vec<(Duration, bytes::Bytes)> = sse
        .split_inclusive("\n\n")
        .map(|e| (Duration::ZERO, bytes::Bytes::copy_from_slice(e.as_bytes())))
        .collect();
    // The upstream ends its stream late; the client does not wait for it.
    chunks.push((
        Duration::from_secs(3),
        bytes::Bytes::from_static(b": bye\n\n"),
    ));
    let replay = oceancode_tests::Replay::start(
        200,
        vec![("content-type", "text/event-stream".into())],
        chunks,
    )
    .await;
    let url = replay.url();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = url
    })
    .await;
    let body = serde_json::json!({"model":"claude-x","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"list the files"}]});
    let mut resp = h
        .send(
            &h.url(),
            http::Method::POST,
            "/v1/messages",
            &[("x-oceancode-session", "early-close")],
            bytes::Bytes::from(body.to_string()),
        )
        .await;
    let mut seen = String::new();
    while let Some(f) = resp.body_mut().frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            seen.push_str(&String::from_utf8_lossy(&d));
        }
        if seen.contains("message_stop") {
            break;
        }
    }
    drop(resp);
    // The tap finishes when the proxy notices the client went away.
    let hr = &h;
    let rows = eventually_async(Duration::from_secs(2), "both rows", move || async move {
        hr.settle().await;
        let rows = match hr.store().latest_session().unwrap() {
            Some(id) => hr.store().load_session(&id).unwrap().unwrap().rows.len(),
            None => 0,
        };
        if rows == 2 {
            Ok(rows)
        } else {
            Err(rows)
        }
    })
    .await;
    assert_eq!(rows, 2, "the prompt and the answer are both recorded");
    let s = h.admin("/_oceancode/sessions/latest").await;
    assert_eq!(s["totals"]["cache_write"], 12511, "usage kept: {s}");
}

fn stub_seq_of(body: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    oceancode_tests::stub_seq(&v["messages"][0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_session_keeps_its_cut() {
    use oceancode_fakeup::{Reply, Script};
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        serde_json::json!({"command":"ls"}),
    )));
    let h = Harness::start(fake, |o| {
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await;
    let hdr = [("x-oceancode-session", "keep-cut")];
    let mut history = vec![serde_json::json!({"role":"user","content":"go"})];
    let body = |h: &Vec<serde_json::Value>| {
        serde_json::json!({"model":"claude-x","max_tokens":1000,"tools":[{"name":"Bash","input_schema":{"type":"object"}}],"messages":h}).to_string()
    };
    let mut last_stub = None;
    for step in 0..30 {
        let got = h.post("/v1/messages", &hdr, body(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let v = got.json();
        oceancode_tests::push_tool_step(
            &mut history,
            &v["content"],
            &("x ".repeat(2500) + &step.to_string()),
        );
        last_stub = stub_seq_of(&h.fake.requests().last().unwrap().body);
    }
    assert!(last_stub.is_some(), "the session crossed the line");
    // One small step, then the same request again after the session left memory.
    let got = h.post("/v1/messages", &hdr, body(&history)).await;
    assert_eq!(got.status, 200);
    let before = stub_seq_of(&h.fake.requests().last().unwrap().body).expect("cut");
    h.settle().await;
    assert!(h.proxy().app.sessions.evict_idle(-1) >= 1);
    // A far higher line: nothing new is cut, and what was cut stays cut.
    h.proxy()
        .app
        .sessions
        .set_override(None, Some(oceancode_config::LineSpec::Tokens(900_000)))
        .unwrap();
    let got = h.post("/v1/messages", &hdr, body(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let after =
        stub_seq_of(&h.fake.requests().last().unwrap().body).expect("still cut after the restore");
    assert_eq!(
        after, before,
        "the restored session keeps its cut (never undone, not re-made)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_input_is_recorded_as_one_user_message_and_forwarded_as_is() {
    let h = harness().await;
    let body = serde_json::json!({"model":"gpt-5","input":"Say hello."}).to_string();
    let got = h
        .post(
            "/v1/responses",
            &[("x-oceancode-session", "str-input")],
            body.clone(),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(h.fake.requests()[0].body, bytes::Bytes::from(body));
    h.settle().await;
    let id = h.store().latest_session().unwrap().expect("a session");
    let s = h.store().load_session(&id).unwrap().unwrap();
    assert_eq!(s.rows[0].kind, RowKind::Prompt);
    assert!(s.rows[0].raw.contains("Say hello."));
    assert!(s.rows.len() >= 2, "the answer too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_data_dir_becomes_absolute_for_the_stub() {
    let rel = std::path::PathBuf::from(format!("target/oc-rel-{}", std::process::id()));
    let r2 = rel.clone();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.data_dir = r2.clone();
        o.sessions.data_dir = r2;
    })
    .await;
    assert!(h.proxy().app.cfg.data_dir.is_absolute());
    assert!(h.proxy().app.sessions.settings().data_dir.is_absolute());
    let mut h = h;
    h.stop().await;
    let _ = std::fs::remove_dir_all(&rel);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_conversations_without_headers_are_told_apart_by_their_first_user_message() {
    let h = harness().await;
    let body = |first: &str| {
        serde_json::json!({"model":"gpt-4o","messages":[
            {"role":"system","content":"You are helpful."},
            {"role":"user","content":first},
        ]})
        .to_string()
    };
    for first in [
        "first conversation about apples",
        "second unrelated conversation about rockets",
    ] {
        let got = h.post("/v1/chat/completions", &[], body(first)).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 2, "two conversations, two sessions: {list:?}");
    for meta in &list {
        let s = h.store().load_session(&meta.id).unwrap().unwrap();
        assert_eq!(s.branch, 0, "no branch");
        assert!(s.hidden.is_empty());
        let prompts: Vec<&str> = s
            .rows
            .iter()
            .filter(|r| r.kind == RowKind::Prompt)
            .map(|r| &*r.raw)
            .collect();
        assert_eq!(prompts.len(), 1, "one prompt per session: {prompts:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_started_before_the_first_echo_is_its_own_session_not_a_rewind() {
    use oceancode_fakeup::{Reply, Script};
    // (The title request is answered by the fake without using the script.)
    let fake = FakeConfig::default()
        .with_validate(false)
        .with_script(Script::replies([
            Reply::tool_call("Task", serde_json::json!({"prompt":"look at the tests"})),
            Reply::text("sub-agent findings"),
            Reply::text("main done"),
        ]));
    let h = Harness::start(fake, |_| {}).await;
    let hdr = [("x-claude-code-session-id", "sub-early")];
    // The sub-agent has the same tools: only its system and first message differ.
    let tools = serde_json::json!([{"name":"Task","input_schema":{"type":"object"}}]);
    let main = |msgs: &[serde_json::Value]| {
        serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":1000,
            "system":"You are Claude Code, Anthropic's official CLI for Claude.",
            "tools":tools,"messages":msgs})
        .to_string()
    };
    let mut history = vec![serde_json::json!({"role":"user","content":"fix the failing tests"})];
    let got = h.post("/v1/messages", &hdr, main(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let answer = got.json();
    let title = serde_json::json!({"model":"claude-haiku-4-5","max_tokens":100,
        "system":"Generate a title.","tools":[],
        "output_config":{"format":{"type":"json_schema"}},
        "messages":[{"role":"user","content":"fix the failing tests"}]});
    assert_eq!(
        h.post("/v1/messages", &hdr, title.to_string()).await.status,
        200
    );
    let sub = serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":1000,
        "system":"You are a sub-agent. Answer the task.","tools":tools,
        "messages":[{"role":"user","content":"look at the tests"}]});
    assert_eq!(
        h.post("/v1/messages", &hdr, sub.to_string()).await.status,
        200
    );
    oceancode_tests::push_tool_step(&mut history, &answer["content"], "the tests fail on x");
    let got = h.post("/v1/messages", &hdr, main(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;

    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 2, "main and sub-agent: {list:?}");
    let loaded: Vec<_> = list
        .iter()
        .map(|m| h.store().load_session(&m.id).unwrap().unwrap())
        .collect();
    let (main_s, sub_s): (Vec<_>, Vec<_>) =
        loaded.into_iter().partition(|s| s.meta.parent.is_none());
    let (main_s, sub_s) = (&main_s[0], &sub_s[0]);
    assert_eq!(sub_s.meta.parent.as_deref(), Some(main_s.meta.id.as_str()));
    for s in [main_s, sub_s] {
        assert_eq!(s.branch, 0, "no branch in {}", s.meta.id);
        assert!(s.hidden.is_empty(), "nothing hidden in {}", s.meta.id);
    }
    // Main: prompt, the Task call (echoed), its result, the final answer.
    let kinds: Vec<RowKind> = main_s.rows.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [
            RowKind::Prompt,
            RowKind::Assistant,
            RowKind::ToolResult,
            RowKind::Assistant
        ]
    );
    assert!(main_s.rows[0].raw.contains("fix the failing tests"));
    assert!(main_s.rows[1].raw.contains("Task"));
    assert_eq!(
        main_s
            .rows
            .iter()
            .filter(|r| r.raw.contains("fix the failing tests"))
            .count(),
        1,
        "the main prompt is recorded once"
    );
    // Sub-agent: its prompt and its answer.
    assert_eq!(sub_s.rows.len(), 2);
    assert!(sub_s.rows[0].raw.contains("look at the tests"));
    assert!(
        sub_s.rows[1].raw.contains("sub-agent findings"),
        "{}",
        sub_s.rows[1].raw
    );
    // The main transcript's first turn opens with its prompt.
    let t1 = h
        .store()
        .session_dir(&main_s.meta.id)
        .join("transcript")
        .join("0001.md");
    let text = std::fs::read_to_string(&t1).unwrap();
    assert!(text.contains("fix the failing tests"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_hides_the_abandoned_lines_unechoed_last_answer() {
    use oceancode_fakeup::{Reply, Script};
    let fake = FakeConfig::default().with_script(
        Script::replies([
            Reply::text("answer one"),
            Reply::text("answer two"),
            Reply::text("answer three"),
        ])
        .then(Reply::text("answer to the edit")),
    );
    let h = Harness::start(fake, |_| {}).await;
    let hdr = [("x-oceancode-session", "rewind-tail")];
    let body = |msgs: &[serde_json::Value]| {
        serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":100,"messages":msgs})
            .to_string()
    };
    let mut history = Vec::new();
    for q in ["question one", "question two", "question three"] {
        history.push(serde_json::json!({"role":"user","content":q}));
        let got = h.post("/v1/messages", &hdr, body(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        history.push(serde_json::json!({"role":"assistant","content":got.json()["content"]}));
    }
    // Back to after the first answer, with the second question edited.
    history.truncate(2);
    history.push(serde_json::json!({"role":"user","content":"question two EDITED"}));
    let got = h.post("/v1/messages", &hdr, body(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;

    let id = h.store().latest_session().unwrap().expect("a session");
    let s = h.store().load_session(&id).unwrap().unwrap();
    assert_eq!(s.branch, 1);
    assert!(s.rows[5].from_response && s.rows[5].raw.contains("answer three"));
    assert_eq!(
        s.hidden,
        [3, 4, 5, 6],
        "the whole abandoned line, its last answer too"
    );
    let atif = tokio::task::block_in_place(|| {
        oceancode_ledger::atif::trajectory(h.store(), &id, &|_: &str| None)
    })
    .unwrap();
    let text = atif.to_string();
    assert!(!text.contains("answer three"), "{text}");
    assert!(!text.contains("question three"));
    assert!(text.contains("answer to the edit"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_own_compaction_is_a_branch_of_its_session_not_a_new_one() {
    use oceancode_fakeup::{Reply, Script};
    let fake = FakeConfig::default()
        .with_validate(false)
        .with_script(Script::always(Reply::text("ok")));
    let h = Harness::start(fake, |_| {}).await;
    let hdr = [("x-claude-code-session-id", "compacting")];
    let tools = serde_json::json!([{"name":"Bash","input_schema":{"type":"object"}}]);
    let main = |msgs: &[serde_json::Value]| {
        serde_json::json!({"model":"claude-sonnet-4-5","max_tokens":1000,
            "system":"You are Claude Code, Anthropic's official CLI for Claude.",
            "tools":tools,"messages":msgs})
        .to_string()
    };
    let mut history = vec![serde_json::json!({"role":"user","content":"first task"})];
    for ask in ["second task", "third task"] {
        let got = h.post("/v1/messages", &hdr, main(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        history.push(serde_json::json!({"role":"assistant","content": got.json()["content"]}));
        history.push(serde_json::json!({"role":"user","content": ask}));
    }
    // The client compacts: same system prompt and tools, the history
    // replaced by its summary.
    let compacted = vec![serde_json::json!({"role":"user",
        "content":"This session is being continued from a previous conversation. Summary: two tasks done. Continue with the third task."})];
    let got = h.post("/v1/messages", &hdr, main(&compacted)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;

    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1, "one session: {list:?}");
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 1, "the compaction is recorded as a branch");
    // Nothing deleted: the first task is still in the ledger, hidden.
    let first = s
        .rows
        .iter()
        .find(|r| r.raw.contains("first task"))
        .expect("the first task is kept");
    assert!(s.hidden.contains(&first.seq), "hidden: {:?}", s.hidden);
    assert!(s
        .rows
        .iter()
        .any(|r| r.raw.contains("Summary: two tasks done")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_names_follow_one_rule_and_a_bad_one_is_refused_in_the_providers_format() {
    use bytes::Bytes;
    use http_body_util::Full;
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let ant = |meta: Option<&str>| {
        let mut v = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
            "messages": [{"role": "user", "content": "name me"}]});
        if let Some(id) = meta {
            let uid = serde_json::json!({"session_id": id}).to_string();
            v["metadata"] = serde_json::json!({"user_id": uid});
        }
        v.to_string()
    };
    let chat = serde_json::json!({"model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "name me"}]})
    .to_string();
    // A NUL in Claude Code's metadata session id: Anthropic's error envelope.
    let got = h.post("/v1/messages", &[], ant(Some("a\u{0}b"))).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(got.json()["type"], "error");
    assert_eq!(got.json()["error"]["type"], "invalid_request_error");
    assert!(got.text().contains("metadata.user_id"), "{}", got.text());
    // A header name over 128 bytes: OpenAI's envelope.
    let long = "n".repeat(129);
    let got = h
        .post(
            "/v1/chat/completions",
            &[("x-oceancode-session", &long)],
            chat.clone(),
        )
        .await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "invalid_request");
    // An escape sequence in the path's name.
    let got = h.post("/s/x%1B%5D0%3Bt/v1/messages", &[], ant(None)).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(h.fake.requests().len(), 0, "nothing refused went upstream");
    // UTF-8 is a name, the same in the header and the path.
    let req = http::Request::post(format!("{}/v1/messages", h.url()))
        .header("content-type", "application/json")
        .header(
            "x-oceancode-session",
            http::HeaderValue::from_bytes("café".as_bytes()).unwrap(),
        )
        .body(Full::new(Bytes::from(ant(None))))
        .unwrap();
    let got = oceancode_tests::collect(oceancode_tests::client().request(req).await.unwrap()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let got = h.post("/s/caf%C3%A9/v1/messages", &[], ant(None)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let meta = h.store().session_meta(&list[0].id).unwrap().unwrap();
    assert_eq!(meta.client_session.as_deref(), Some("name:café"));
}

/// A Codex-like Responses session (session-id header, developer message,
/// prompt, `exec_command` steps with ~3k-token outputs) against a proxy whose
/// line is 20k (a 50k-token model).
mod remote_compaction {
    use super::*;
    use oceancode_fakeup::{Reply, Script};
    use oceancode_proxy::sessions::ModelLimits;
    use oceancode_testkit::{Conversation, Dialect};
    use serde_json::{json, Value};
    use std::sync::Arc;

    pub const HDR: [(&str, &str); 2] = [("session-id", "cx-compact"), ("originator", "codex_exec")];

    pub async fn harness() -> Harness {
        let fake = FakeConfig::default().with_script(Script::always(
            Reply::tool_call("exec_command", json!({"cmd": "cat big.txt"})).with_text("Next step."),
        ));
        Harness::start(fake, |o| {
            o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
                context: Some(50_000),
                max_output: Some(8_000),
            });
        })
        .await
    }

    pub fn body(input: &[Value], extra: Option<Value>) -> String {
        let c = Conversation::new(Dialect::OpenaiResponses)
            .model("gpt-5-codex")
            .system("You are Codex.")
            .tool(
                "exec_command",
                None,
                json!({"type": "object", "properties": {"cmd": {"type": "string"}}}),
            )
            .messages(input.iter().cloned());
        extra
            .iter()
            .flat_map(|e| e.as_object().unwrap().clone())
            .fold(c, |c, (k, v)| c.member(&k, v))
            .body()
    }

    /// Codex's instructions item; re-injected after a compaction with a new
    /// id and without its `create_time`.
    pub fn developer(id: &str) -> Value {
        let mut m = json!({"type": "message", "id": id, "role": "developer",
            "content": [{"type": "input_text", "text": "Follow the repository's rules."}],
            "internal_chat_message_metadata_passthrough": {"turn_id": "t1"}});
        if id.ends_with("_1") {
            m["internal_chat_message_metadata_passthrough"]["create_time"] = json!(1796153450.45);
        }
        m
    }

    /// One step: send `input`, append the answer's items and a big output.
    pub async fn step(h: &Harness, input: &mut Vec<Value>, n: usize) {
        let got = h.post("/v1/responses", &HDR, body(input, None)).await;
        assert_eq!(got.status, 200, "step {n}: {}", got.text());
        let out = got.json()["output"].as_array().cloned().unwrap();
        let call = out
            .iter()
            .find(|i| i["type"] == "function_call")
            .cloned()
            .unwrap();
        input.extend(out);
        let text: String = (0..240)
            .map(|i| format!("step {n} line {i}: the quick brown fox jumps over the lazy dog\n"))
            .collect();
        input.push(
            json!({"type": "function_call_output", "call_id": call["call_id"], "output": text}),
        );
    }

    /// Whether the upstream's copy of a request carries the tideline stub.
    pub fn has_stub(r: &oceancode_fakeup::Recorded) -> bool {
        String::from_utf8_lossy(&r.body).contains("past the tideline")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_remote_compaction_passes_through_untouched_and_is_a_branch_across_the_tideline() {
    use remote_compaction::*;
    use serde_json::{json, Value};
    let h = harness().await;
    let mut input: Vec<Value> = vec![
        developer("msg_dev_1"),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Work through the steps."}]}),
    ];
    for n in 0..12 {
        step(&h, &mut input, n).await;
    }
    assert!(
        h.fake.requests().iter().any(has_stub),
        "no cut before the compaction: the test proves nothing"
    );

    // V1: the whole history to /v1/responses/compact, byte for byte (no stub,
    // though the session is cut), and nothing of it recorded.
    let rows_before = {
        h.settle().await;
        let list = h.store().list_sessions().unwrap();
        h.store()
            .load_session(&list[0].id)
            .unwrap()
            .unwrap()
            .rows
            .len()
    };
    let sent = body(&input, None);
    let got = h.post("/v1/responses/compact", &HDR, sent.clone()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let compacted = got.json()["output"].as_array().cloned().unwrap();
    assert_eq!(compacted.last().unwrap()["type"], "compaction");
    let upstream = h.fake.requests().last().unwrap().clone();
    assert_eq!(upstream.path, "/v1/responses/compact");
    assert_eq!(
        upstream.body,
        sent.as_bytes(),
        "the compact request was rewritten"
    );

    // Codex replaces its history: its instructions again (new item ids),
    // the compacted output, and goes on.
    let mut input: Vec<Value> = vec![developer("msg_dev_2")];
    input.extend(compacted);
    for n in 12..24 {
        step(&h, &mut input, n).await;
    }
    // V2: the trailing compaction_trigger, byte for byte, not recorded.
    input.push(json!({"type": "compaction_trigger"}));
    let sent = body(&input, Some(json!({"stream": true})));
    let got = h.post("/v1/responses", &HDR, sent.clone()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        got.text().contains("\"type\":\"compaction\""),
        "{}",
        got.text()
    );
    assert_eq!(h.fake.requests().last().unwrap().body, sent.as_bytes());
    let item: Value = got
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|e| e["type"] == "response.output_item.done")
        .map(|e| e["item"].clone())
        .unwrap();
    let mut input = vec![
        developer("msg_dev_3"),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Work through the steps."}]}),
        item,
    ];
    for n in 24..30 {
        step(&h, &mut input, n).await;
    }
    h.settle().await;

    let list = h.store().list_sessions().unwrap();
    assert_eq!(
        list.len(),
        1,
        "one session across both compactions: {list:?}"
    );
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.meta.client, "codex");
    assert_eq!(s.branch, 2, "each compaction is a branch");
    assert!(
        !s.rows.iter().any(|r| r.raw.contains("compaction_trigger")),
        "the trigger was recorded"
    );
    let compactions: Vec<_> = s
        .rows
        .iter()
        .filter(|r| r.raw.contains("\"type\":\"compaction\""))
        .collect();
    assert_eq!(compactions.len(), 2, "each compaction item is a row");
    assert!(
        s.rows[2..rows_before]
            .iter()
            .all(|r| s.hidden.contains(&r.seq)),
        "the pre-compaction line is hidden"
    );
    assert!(
        !s.hidden.contains(&1) && !s.hidden.contains(&2),
        "the root (instructions, prompt) stays on the line: the branch is after it"
    );
    // The tideline goes on across both branches: cuts after each compaction,
    // every window valid (the fake validates), the compaction item kept.
    let cuts = h.store().cuts(&s.meta.id).unwrap();
    let last_branch_row = compactions[1].seq;
    assert!(
        cuts.iter().any(|c| c.upto_seq > compactions[0].seq),
        "no cut after the first compaction: {cuts:?}"
    );
    assert!(
        cuts.iter().any(|c| c.upto_seq > last_branch_row),
        "no cut after the second compaction: {cuts:?}"
    );
    let last = h.fake.requests().last().unwrap().clone();
    assert!(has_stub(&last));
    assert!(
        String::from_utf8_lossy(&last.body).contains("\"type\":\"compaction\""),
        "the cut dropped the compaction item"
    );
    assert!(h.fake.requests().iter().all(|r| r.status == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_prune_is_an_echo_and_its_compaction_a_branch_of_one_session() {
    use oceancode_fakeup::{Reply, Script};
    use serde_json::{json, Value};
    let fake = FakeConfig::default().with_script(
        Script::always(Reply::tool_call(
            "bash",
            json!({"command": "cat notes.txt"}),
        ))
        .with_no_tools(Reply::text("Summary: notes were read.")),
    );
    let h = Harness::start(fake, |_| {}).await;
    let hdr = [
        (
            "user-agent",
            "opencode/1.18.33 ai-sdk/provider-utils/4.0.46 runtime/bun/1.3.14",
        ),
        ("x-session-id", "ses_prune"),
    ];
    let tools = json!([{"name": "bash", "input_schema": {"type": "object"}}]);
    let main = |msgs: &[Value]| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 1000, "system": "You are OpenCode.",
            "tools": tools, "messages": msgs})
        .to_string()
    };
    let side = |system: &str, text: &str| {
        json!({"model": "claude-haiku-4-5", "max_tokens": 1000, "system": system,
            "messages": [{"role": "user", "content": text}]})
        .to_string()
    };
    // The title request: no tools, forwarded, not recorded.
    let got = h
        .post(
            "/v1/messages",
            &hdr,
            side("You are a title generator.", "work through the steps"),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let mut history = vec![json!({"role": "user", "content": "work through the steps"})];
    let output = |n: usize| format!("output {n}: {}", "the quick brown fox ".repeat(200));
    for n in 0..4 {
        let got = h.post("/v1/messages", &hdr, main(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        oceancode_tests::push_tool_step(&mut history, &got.json()["content"], &output(n));
    }
    // opencode prunes: old outputs come back cleared.
    for m in history.iter_mut().take(5).skip(1) {
        if m["role"] == "user" {
            m["content"][0]["content"] = json!("[Old tool result content cleared]");
        }
    }
    let got = h.post("/v1/messages", &hdr, main(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let upstream = String::from_utf8_lossy(&h.fake.requests().last().unwrap().body).into_owned();
    assert!(
        upstream.contains("[Old tool result content cleared]"),
        "the client's bytes go upstream"
    );
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(
        (s.meta.client.as_str(), s.branch),
        ("opencode", 0),
        "a pruned output is not a rewind"
    );
    assert_eq!(s.meta.client_session.as_deref(), Some("opencode:ses_prune"));
    assert!(
        s.rows.iter().any(|r| r.raw.contains("output 0: the quick")),
        "the ledger keeps the output"
    );
    assert!(!s.rows.iter().any(|r| r.raw.contains("content cleared")));
    let rows = s.rows.len();

    // opencode compacts: its summary request (no tools) is forwarded
    // untouched, then the conversation restarts from the summary.
    let summary = side(
        "You are a context summarization agent.",
        "Here is the conversation so far: ...",
    );
    let got = h.post("/v1/messages", &hdr, summary.clone()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(h.fake.requests().last().unwrap().body, summary.as_bytes());
    let restarted = vec![
        json!({"role": "user", "content": "What did we do so far?"}),
        json!({"role": "assistant", "content": "Summary: notes were read."}),
        json!({"role": "user", "content": "Continue if you have next steps."}),
    ];
    let got = h.post("/v1/messages", &hdr, main(&restarted)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let list = h.store().list_sessions().unwrap();
    assert_eq!(
        list.len(),
        1,
        "the compaction is not a new session: {list:?}"
    );
    let s = h.store().load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(s.branch, 1, "the compaction is a branch");
    assert_eq!(
        s.rows.len(),
        rows + 3 + 1,
        "the restarted line and its answer, nothing of the side requests"
    );
    assert!(!s
        .rows
        .iter()
        .any(|r| r.raw.contains("title generator") || r.raw.contains("conversation so far")));
    assert!(
        s.hidden.len() >= rows - 1,
        "the old line is hidden: {:?}",
        s.hidden
    );
}
