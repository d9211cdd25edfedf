//! The in-band recall tool (`ledger.recall_tool`, issue 16) end to end
//! against the fake upstream scripted to call it: the traps of Headroom's
//! injected retrieve tool are regression tests here — the tool is
//! byte-identical in every request of a session (#2671), its call never
//! reaches the client (#1450), a recall next to a client tool call in one
//! answer is handled (#2089), and a continuation's 429 reaches the client
//! as a 429 (#2959).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::{BlockSpec, LineSpec};
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script, StreamFail, RECALL_TOOL};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::recall_tool::{tool_json, RecallTool};
use oceancode_testkit::Conversation;
use oceancode_tests::recall::{self, assistant, model_requests, path, split, user};
use oceancode_tests::Harness;
use oceancode_window::Dialect;
use serde_json::{json, Value};

/// The tool on, at most `max_rounds` continuations.
async fn harness(script: Script, max_rounds: u32) -> Harness {
    recall::harness(
        script,
        RecallTool {
            enabled: true,
            max_rounds,
            ..RecallTool::default()
        },
    )
    .await
}

fn client_tools(d: Dialect) -> Value {
    match d {
        Dialect::Anthropic => {
            json!([{"name":"Bash","description":"run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}}])
        }
        Dialect::OpenaiChat => {
            json!([{"type":"function","function":{"name":"Bash","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}])
        }
        Dialect::OpenaiResponses => {
            json!([{"type":"function","name":"Bash","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}])
        }
        Dialect::Gemini => unreachable!("these recall tests run the Anthropic and OpenAI dialects"),
    }
}

fn body(d: Dialect, msgs: &[Value], stream: bool) -> Vec<u8> {
    let c = Conversation::new(d)
        .stream(stream)
        .tools_raw(client_tools(d))
        .messages(msgs.iter().cloned());
    let c = match d {
        Dialect::Anthropic => c
            .model("claude-sonnet-4-5")
            .max_tokens(1024)
            .system("You are terse."),
        Dialect::OpenaiChat if stream => c
            .model("gpt-4.1")
            .max_tokens(1024)
            .member("stream_options", json!({"include_usage": true})),
        Dialect::OpenaiChat => c.model("gpt-4.1").max_tokens(1024),
        Dialect::OpenaiResponses => c.model("gpt-4.1").system("You are terse."),
        Dialect::Gemini => unreachable!("these recall tests run the Anthropic and OpenAI dialects"),
    };
    c.body().into_bytes()
}

const HDR: [(&str, &str); 1] = [("x-oceancode-session", "recall-test")];

const ALL: [Dialect; 3] = [
    Dialect::Anthropic,
    Dialect::OpenaiChat,
    Dialect::OpenaiResponses,
];

/// #1450: the internal call never reaches the client, in every dialect,
/// streaming and not; the continuation carries the call and its result.
#[tokio::test]
async fn an_internal_call_never_reaches_the_client() {
    for d in ALL {
        for stream in [false, true] {
            let h = harness(
                Script::replies([
                    Reply::text("first answer about the parser"),
                    Reply::recall(json!({"match": "parser"})),
                ])
                .then(Reply::text("FINAL after recall")),
                4,
            )
            .await;
            let m1 = [user(d, "tell me about the parser")];
            let got = h.post(path(d), &HDR, body(d, &m1, stream)).await;
            assert_eq!(got.status, 200, "{d:?} {stream}: {}", got.text());
            h.settle().await;
            let m2 = [
                user(d, "tell me about the parser"),
                assistant(d, "first answer about the parser"),
                user(d, "what did you say before?"),
            ];
            let got = h.post(path(d), &HDR, body(d, &m2, stream)).await;
            assert_eq!(got.status, 200, "{d:?} {stream}: {}", got.text());
            let text = got.text();
            assert!(
                text.contains("FINAL after recall"),
                "{d:?} {stream}: {text}"
            );
            assert!(
                !text.contains(RECALL_TOOL),
                "{d:?} {stream}: the client saw the call: {text}"
            );
            let reqs = model_requests(&h, d);
            assert_eq!(reqs.len(), 3, "{d:?} {stream}: one continuation");
            let (_, cont) = split(d, &reqs[2]);
            let (_, asked) = split(d, &reqs[1]);
            assert_eq!(
                &cont[..asked.len()],
                &asked[..],
                "{d:?}: the continuation extends the request"
            );
            let tail = cont[asked.len()..].join("\n");
            assert!(
                tail.contains(RECALL_TOOL),
                "{d:?}: the model's call: {tail}"
            );
            assert!(
                tail.contains("first answer about the parser"),
                "{d:?}: the recall found the row: {tail}"
            );
            h.settle().await;
            let metrics = h.metrics().await;
            assert!(metrics.contains("oceancode_recalls_total 1"), "{metrics}");
        }
    }
}

/// #2671: the tools array is byte-identical in every request of a session
/// (with and without recalls, with a cut), and the exchange is re-inserted
/// byte for byte in the next request: the continuation's conversation is
/// a prefix of the next request's.
#[tokio::test]
async fn the_tools_and_the_hidden_exchange_are_byte_identical_across_the_session() {
    for d in ALL {
        let h = harness(
            Script::replies([
                Reply::text("one"),
                Reply::recall(json!({"search": "one"})),
                Reply::text("two"),
                Reply::text("three"),
            ]),
            4,
        )
        .await;
        let mut msgs = vec![user(d, "first")];
        for (i, answer) in ["one", "two", "three"].iter().enumerate() {
            let got = h.post(path(d), &HDR, body(d, &msgs, true)).await;
            assert_eq!(got.status, 200, "{d:?} step {i}: {}", got.text());
            assert!(!got.text().contains(RECALL_TOOL));
            h.settle().await;
            msgs.push(assistant(d, answer));
            msgs.push(user(d, &format!("next {i}")));
        }
        let reqs = model_requests(&h, d);
        assert_eq!(reqs.len(), 4, "{d:?}");
        let tools: Vec<String> = reqs.iter().map(|r| split(d, r).0).collect();
        assert!(tools.iter().all(|t| t == &tools[0]), "{d:?}: {tools:?}");
        assert!(
            tools[0].ends_with(&format!(",{}]", tool_json(d))),
            "{d:?}: appended after the client's"
        );
        let (_, cont) = split(d, &reqs[2]);
        let (_, next) = split(d, &reqs[3]);
        assert_eq!(
            &next[..cont.len()],
            &cont[..],
            "{d:?}: the next request starts with the continuation"
        );
        // The ledger keeps what the client sent: no row holds the call.
        let store = h.store();
        let id = store.resolve_session(Some("recall-test")).unwrap();
        let rows = store.session_rows(&id, true).unwrap();
        assert!(
            rows.iter().all(|(r, _)| !r.raw.contains(RECALL_TOOL)),
            "{d:?}"
        );
        let steps = store.steps(&id).unwrap();
        let recalls: usize = steps.iter().map(|s| s.detail.recalls.len()).sum();
        assert_eq!(recalls, 1, "{d:?}: the call is in the step's detail");
    }
}

/// #2089: a recall next to a client tool call in one answer: the client
/// gets its own call only (no 502), and its next request — the tool's
/// result — is valid upstream with the recall pair re-inserted.
#[tokio::test]
async fn a_recall_next_to_a_client_call_is_answered_and_hidden() {
    for d in ALL {
        for stream in [false, true] {
            let h = harness(
                Script::replies([Reply::recall(json!({"match": "x"}))
                    .with_tool_call("Bash", json!({"command": "ls"}))])
                .then(Reply::text("done")),
                4,
            )
            .await;
            let m1 = [user(d, "list the files")];
            let got = h.post(path(d), &HDR, body(d, &m1, stream)).await;
            assert_eq!(got.status, 200, "{d:?} {stream}: {}", got.text());
            let text = got.text();
            assert!(!text.contains(RECALL_TOOL), "{d:?} {stream}: {text}");
            assert!(
                text.contains("Bash"),
                "{d:?} {stream}: the client's call: {text}"
            );
            assert_eq!(model_requests(&h, d).len(), 1, "no continuation");
            // The client's echo of its call and the result.
            let (call_id, echo, result) = client_call(d, stream, &text);
            let m2 = [user(d, "list the files"), echo, result];
            let _ = call_id;
            let got = h.post(path(d), &HDR, body(d, &m2, stream)).await;
            assert_eq!(
                got.status,
                200,
                "{d:?} {stream}: the fake's validator took it: {}",
                got.text()
            );
            let reqs = model_requests(&h, d);
            let (_, sent) = split(d, &reqs[1]);
            assert_eq!(
                sent.len(),
                5,
                "{d:?}: ask, the recall pair, the echo, the result: {sent:?}"
            );
            assert!(sent[1].contains(RECALL_TOOL), "{d:?}: {sent:?}");
        }
    }
}

/// The client's call (id, its echo, a result for it) from its answer.
fn client_call(d: Dialect, stream: bool, text: &str) -> (String, Value, Value) {
    let id = if stream {
        let key = match d {
            Dialect::Anthropic => "\"id\":\"toolu",
            Dialect::OpenaiChat => "\"id\":\"call",
            Dialect::OpenaiResponses => "\"call_id\":\"",
            Dialect::Gemini => {
                unreachable!("these recall tests run the Anthropic and OpenAI dialects")
            }
        };
        let at = text.find(key).expect("a call id");
        let rest = &text[at + key.len()..];
        let id: String = rest.chars().take_while(|c| *c != '"').collect();
        match d {
            Dialect::Anthropic => format!("toolu{id}"),
            Dialect::OpenaiChat => format!("call{id}"),
            _ => id,
        }
    } else {
        let v: Value = serde_json::from_str(text).unwrap();
        match d {
            Dialect::Anthropic => v["content"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["type"] == "tool_use")
                .unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
            Dialect::OpenaiChat => v["choices"][0]["message"]["tool_calls"][0]["id"]
                .as_str()
                .unwrap()
                .to_string(),
            Dialect::OpenaiResponses => v["output"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["type"] == "function_call")
                .unwrap()["call_id"]
                .as_str()
                .unwrap()
                .to_string(),
            Dialect::Gemini => {
                unreachable!("these recall tests run the Anthropic and OpenAI dialects")
            }
        }
    };
    match d {
        Dialect::Anthropic => (
            id.clone(),
            json!({"role":"assistant","content":[{"type":"tool_use","id":id,"name":"Bash","input":{"command":"ls"}}]}),
            json!({"role":"user","content":[{"type":"tool_result","tool_use_id":id,"content":"a.txt"}]}),
        ),
        Dialect::OpenaiChat => (
            id.clone(),
            json!({"role":"assistant","content":null,"tool_calls":[{"id":id,"type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}}]}),
            json!({"role":"tool","tool_call_id":id,"content":"a.txt"}),
        ),
        Dialect::OpenaiResponses => (
            id.clone(),
            json!({"type":"function_call","call_id":id,"name":"Bash","arguments":"{\"command\":\"ls\"}"}),
            json!({"type":"function_call_output","call_id":id,"output":"a.txt"}),
        ),
        Dialect::Gemini => unreachable!("these recall tests run the Anthropic and OpenAI dialects"),
    }
}

/// #2959: a 429 on the continuation reaches the client as a 429 with the
/// upstream's body, never a 200 the client would not retry.
#[tokio::test]
async fn a_429_on_the_continuation_reaches_the_client_as_429() {
    for d in ALL {
        for stream in [false, true] {
            let h = harness(
                Script::replies([
                    Reply::recall(json!({"match": "x"})),
                    Reply::error(429, json!({"type":"error","error":{"type":"rate_limit_error","message":"slow down"}})),
                ]),
                4,
            )
            .await;
            let got = h
                .post(path(d), &HDR, body(d, &[user(d, "hi")], stream))
                .await;
            assert_eq!(got.status, 429, "{d:?} {stream}: {}", got.text());
            assert!(got.text().contains("slow down"));
            assert_eq!(model_requests(&h, d).len(), 2);
            h.settle().await;
            let store = h.store();
            let id = store.resolve_session(Some("recall-test")).unwrap();
            let steps = store.steps(&id).unwrap();
            assert_eq!(steps.len(), 1, "recorded once");
            assert_eq!(steps[0].status, 429);
        }
    }
}

/// At most `max_rounds` continuations: a model that keeps calling the
/// tool gets its last answer to the client without the call.
#[tokio::test]
async fn max_rounds_bounds_the_internal_round_trips() {
    for d in ALL {
        let h = harness(
            Script::always(Reply::recall(json!({"match": "x"})).with_text("still looking")),
            2,
        )
        .await;
        let got = h.post(path(d), &HDR, body(d, &[user(d, "hi")], true)).await;
        assert_eq!(got.status, 200, "{d:?}: {}", got.text());
        assert!(!got.text().contains(RECALL_TOOL), "{d:?}: {}", got.text());
        assert_eq!(
            model_requests(&h, d).len(),
            3,
            "{d:?}: the request and two continuations"
        );
        h.settle().await;
        let store = h.store();
        let id = store.resolve_session(Some("recall-test")).unwrap();
        let steps = store.steps(&id).unwrap();
        let r = &steps[0].detail.recalls;
        assert_eq!(r.len(), 3, "{d:?}");
        assert_eq!(r.iter().filter(|c| c.continued).count(), 2);
        assert!(
            steps[0].detail.extra.input > 0,
            "{d:?}: internal answers billed beyond the window"
        );
        // status counts them, the ATIF export marks them internal.
        let meta = store.session_meta(&id).unwrap().unwrap();
        let cuts = store.cuts(&id).unwrap();
        let st = oceancode_ledger::status::Status::new(
            &meta,
            &steps,
            &cuts,
            1,
            1,
            80_000,
            "40%".into(),
            Some(200_000),
            &|_| None,
        );
        let text = st.render();
        assert!(
            text.contains("recall   3 oceancode_recall calls answered by the proxy"),
            "{text}"
        );
        let atif = oceancode_ledger::atif::trajectory(store, &id, &|_| None).unwrap();
        let internal: Vec<&Value> = atif["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["extra"]["oceancode_internal"].as_array())
            .flatten()
            .collect();
        assert_eq!(internal.len(), 3, "{d:?}: {atif}");
        assert_eq!(internal[0]["function_name"], RECALL_TOOL);
    }
}

/// With a cut: the stub names the tool, the tools array keeps its bytes
/// across the cut, and a recall reads back a row that left the window.
#[tokio::test]
async fn a_cut_window_names_the_tool_and_keeps_its_bytes() {
    let d = Dialect::Anthropic;
    let h = harness(Script::always(Reply::text("ok")), 4).await;
    let mut msgs = vec![user(d, "first: the secret word is PELICAN")];
    for i in 0..4 {
        let got = h.post(path(d), &HDR, body(d, &msgs, false)).await;
        assert_eq!(got.status, 200);
        h.settle().await;
        msgs.push(assistant(d, "ok"));
        msgs.push(user(d, &format!("next {i}")));
    }
    let cut = h
        .post(
            "/_oceancode/tideline",
            &[("authorization", &format!("Bearer {}", h.admin_token()))],
            serde_json::to_vec(&json!({"session": "recall-test", "value": "now"})).unwrap(),
        )
        .await;
    assert_eq!(cut.status, 200, "{}", cut.text());
    h.fake.set_script(
        Script::replies([Reply::recall(json!({"search": "PELICAN"}))])
            .then(Reply::text("it was PELICAN")),
    );
    let got = h.post(path(d), &HDR, body(d, &msgs, false)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.text().contains("it was PELICAN"));
    let reqs = model_requests(&h, d);
    let tools: Vec<String> = reqs.iter().map(|r| split(d, r).0).collect();
    assert!(tools.iter().all(|t| t == &tools[0]));
    let (_, last) = split(d, reqs.last().unwrap());
    assert!(
        last[0].contains("oceancode_recall tool reads that record back"),
        "the stub names the tool: {}",
        last[0]
    );
    let first = serde_json::to_string(&user(d, "first: the secret word is PELICAN")).unwrap();
    assert!(!last.contains(&first), "the first ask left the window");
    assert!(
        last.iter()
            .any(|m| m.contains("PELICAN") && m.contains("tool_result")),
        "the recall found it: {last:?}"
    );
}

/// Off (the default): nothing is injected, the answer streams through.
#[tokio::test]
async fn with_the_tool_off_nothing_is_injected() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let d = Dialect::Anthropic;
    let got = h.post(path(d), &HDR, body(d, &[user(d, "hi")], true)).await;
    assert_eq!(got.status, 200);
    let reqs = model_requests(&h, d);
    assert!(!split(d, &reqs[0]).0.contains(RECALL_TOOL));
}

/// How the proxy loses its memory between two requests of the session.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Break {
    None,
    Restart,
    Evict,
    /// Restarted with the tool off.
    RestartOff,
}

/// One client request of [`restart_session`]: a clean 200.
async fn client_step(h: &Harness, d: Dialect, stream: bool, msgs: &[Value]) -> String {
    let got = h.post(path(d), &HDR, body(d, msgs, stream)).await;
    assert_eq!(got.status, 200, "{d:?} {stream}: {}", got.text());
    assert!(!got.text().contains(RECALL_TOOL), "{d:?}: {}", got.text());
    h.settle().await;
    got.text()
}

/// A session with a continued recall (step 2) and a recall next to a
/// client call (step 3), then two more steps; `brk` happens before step 4.
/// Returns the model requests the fake received, in order.
async fn restart_session(d: Dialect, stream: bool, brk: Break) -> Vec<Recorded> {
    let tweak = |o: &mut oceancode_proxy::runtime::ProxyOptions| {
        o.front.recall = RecallTool::on();
    };
    let mut h = Harness::start(
        FakeConfig::default().with_id_seed(16).with_script(
            Script::replies([
                Reply::text("one about the parser"),
                Reply::recall(json!({"match": "parser"})),
                Reply::text("two"),
                Reply::recall(json!({"match": "two"}))
                    .with_tool_call("Bash", json!({"command": "ls"})),
                Reply::text("three"),
            ])
            .then(Reply::text("four")),
        ),
        tweak,
    )
    .await;
    let mut msgs = vec![user(d, "tell me about the parser")];
    client_step(&h, d, stream, &msgs).await;
    msgs.push(assistant(d, "one about the parser"));
    msgs.push(user(d, "what did you say?"));
    client_step(&h, d, stream, &msgs).await;
    msgs.push(assistant(d, "two"));
    msgs.push(user(d, "list the files"));
    let text = client_step(&h, d, stream, &msgs).await;
    let (_, echo, result) = client_call(d, stream, &text);
    msgs.push(echo);
    msgs.push(result);
    match brk {
        Break::None => {}
        Break::Restart => h.restart(tweak).await,
        Break::RestartOff => h.restart(|_| {}).await,
        Break::Evict => assert!(h.proxy().app.sessions.evict_idle(-1) >= 1),
    }
    client_step(&h, d, stream, &msgs).await;
    msgs.push(assistant(d, "three"));
    msgs.push(user(d, "and now?"));
    client_step(&h, d, stream, &msgs).await;
    model_requests(&h, d)
}

/// The internal exchanges survive a restart (and an eviction): rebuilt
/// from the steps' `detail.recalls`, the requests after it are the bytes
/// the proxy would have sent without it, so the cached prefix holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hidden_exchanges_survive_a_restart_byte_for_byte() {
    for d in ALL {
        for stream in [true, false] {
            let want = restart_session(d, stream, Break::None).await;
            assert_eq!(want.len(), 6, "{d:?}: five steps, one continuation");
            for r in &want[4..] {
                let (_, sent) = split(d, r);
                assert_eq!(
                    sent.iter().filter(|m| m.contains(RECALL_TOOL)).count(),
                    2,
                    "{d:?} {stream}: both exchanges' calls are re-inserted: {sent:?}"
                );
            }
            // Restarted with the tool off: the requests are the client's,
            // no call of a tool they lack (and the fake's validator takes them).
            let off = restart_session(d, stream, Break::RestartOff).await;
            for r in &off[4..] {
                let (tools, sent) = split(d, r);
                assert!(!tools.contains(RECALL_TOOL), "{d:?} {stream}");
                assert!(
                    sent.iter().all(|m| !m.contains(RECALL_TOOL)),
                    "{d:?} {stream}: no exchange without the tool: {sent:?}"
                );
            }
            for brk in [Break::Restart, Break::Evict] {
                let got = restart_session(d, stream, brk).await;
                assert_eq!(got.len(), want.len(), "{d:?} {stream} {brk:?}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.body == w.body,
                        "{d:?} {stream} {brk:?}: request {i} differs:\n got {}\nwant {}",
                        String::from_utf8_lossy(&g.body),
                        String::from_utf8_lossy(&w.body)
                    );
                }
            }
        }
    }
}

/// Where a too-long answer comes in [`a_too_long_answer_is_cut_and_retried_inside_the_recall_loop`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Over {
    /// The client's request: its retry's answer calls the tool.
    First,
    /// The continuation (the recall result made it too long).
    Continuation,
}

/// A context-limit answer while the tool is on, on the client's request or
/// on a continuation: the 400 "too long" (every dialect), or the Responses
/// stream failing with `context_length_exceeded` before any output. The
/// answer was held, so nothing reached the client: every closed block is
/// cut and the request retried once, the exchange so far appended; the
/// client gets one clean answer and never sees the tool, the retry keeps
/// the tools' bytes, the step is recorded once with the cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_long_answer_is_cut_and_retried_inside_the_recall_loop() {
    for d in ALL {
        for stream in [false, true] {
            for over in [Over::First, Over::Continuation] {
                let too_long = if d == Dialect::OpenaiResponses && stream {
                    Reply::fail(StreamFail::context_length_exceeded())
                } else {
                    Reply::too_long()
                };
                let recall = Reply::recall(json!({"match": "turn"}));
                let last = match over {
                    Over::First => [too_long, recall],
                    Over::Continuation => [recall, too_long],
                };
                let h = Harness::start(
                    FakeConfig::default().with_script(
                        Script::replies(
                            (0..4)
                                .map(|i| Reply::text(format!("answer {i}")))
                                .chain(last)
                                .chain([Reply::text("after the cut")]),
                        )
                        .then(Reply::text("later")),
                    ),
                    |o| {
                        o.front.recall = RecallTool::on();
                        // Blocks close every turn; nothing is cut before the error.
                        o.sessions.line = LineSpec::Tokens(150_000);
                        o.sessions.block = BlockSpec::Tokens(1_500);
                    },
                )
                .await;
                let what = format!("{d:?} stream={stream} {over:?}");
                let mut msgs = Vec::new();
                for i in 0..4 {
                    msgs.push(user(
                        d,
                        &format!("turn {i}: {}", oceancode_tests::tool_output(i)),
                    ));
                    let got = h.post(path(d), &HDR, body(d, &msgs, stream)).await;
                    assert_eq!(got.status, 200, "{what}: {}", got.text());
                    h.settle().await;
                    msgs.push(assistant(d, &format!("answer {i}")));
                }
                msgs.push(user(d, "what was turn 1?"));
                let before = model_requests(&h, d).len();
                let got = h.post(path(d), &HDR, body(d, &msgs, stream)).await;
                let text = got.text();
                assert_eq!(got.status, 200, "{what}: {text}");
                assert!(text.contains("after the cut"), "{what}: {text}");
                assert!(!text.contains(RECALL_TOOL), "{what}: {text}");
                assert!(
                    !text.contains("context_length_exceeded"),
                    "{what}: the failed stream never reached the client: {text}"
                );
                let reqs = model_requests(&h, d);
                let this = &reqs[before..];
                assert_eq!(this.len(), 3, "{what}: the request, the error, the retry");
                let failed = match over {
                    Over::First => &this[0],
                    Over::Continuation => &this[1],
                };
                let retry = match over {
                    Over::First => &this[1],
                    Over::Continuation => &this[2],
                };
                let (tools_failed, conv_failed) = split(d, failed);
                let (tools_retry, conv_retry) = split(d, retry);
                assert_eq!(
                    tools_retry, tools_failed,
                    "{what}: the retry keeps the tools"
                );
                assert!(
                    tools_retry.ends_with(&format!(",{}]", tool_json(d))),
                    "{what}"
                );
                assert!(
                    conv_retry.len() < conv_failed.len()
                        && conv_retry[0].contains("past the tideline"),
                    "{what}: cut, a stub leads: {conv_retry:?}"
                );
                if over == Over::Continuation {
                    // The exchange so far goes with the retry, byte for byte.
                    let tail = |c: &[String]| c[c.len() - 2..].to_vec();
                    assert_eq!(tail(&conv_retry), tail(&conv_failed), "{what}");
                    assert!(
                        conv_retry[conv_retry.len() - 2].contains(RECALL_TOOL),
                        "{what}"
                    );
                } else {
                    // The continuation extends the retry.
                    let (_, cont) = split(d, &this[2]);
                    assert_eq!(&cont[..conv_retry.len()], &conv_retry[..], "{what}");
                }
                h.settle().await;
                let store = h.store();
                let id = store.resolve_session(Some("recall-test")).unwrap();
                let steps = store.steps(&id).unwrap();
                assert_eq!(steps.len(), 5, "{what}: one step per client request");
                assert_eq!(steps[4].status, 200, "{what}");
                assert_eq!(steps[4].detail.recalls.len(), 1, "{what}");
                assert!(
                    !store.cuts(&id).unwrap().is_empty(),
                    "{what}: the cut is recorded"
                );
            }
        }
    }
}

/// Issue 40.3: the tool's search read every session of the ledger, so a
/// prompt-injected session read other projects' rows. By default it reads
/// the calling session and its relatives (parent, children, siblings);
/// `ledger.recall_tool.search = "all"` widens it.
#[tokio::test]
async fn a_search_reads_only_the_sessions_relatives_unless_widened() {
    let d = Dialect::Anthropic;
    for all in [false, true] {
        let h = recall::harness(
            Script::replies([
                Reply::text("noted: the quokka password is hunter2"),
                Reply::recall(json!({"search": "quokka"})),
            ])
            .then(Reply::text("FINAL")),
            RecallTool {
                enabled: true,
                max_rounds: 4,
                search_all: all,
            },
        )
        .await;
        let alpha = [("x-oceancode-session", "alpha-project")];
        let got = h
            .post(
                path(d),
                &alpha,
                body(d, &[user(d, "remember the quokka password")], false),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        h.settle().await;
        let beta = [("x-oceancode-session", "beta-project")];
        let got = h
            .post(
                path(d),
                &beta,
                body(d, &[user(d, "what is the quokka password?")], false),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
        assert!(got.text().contains("FINAL"), "{}", got.text());
        let reqs = model_requests(&h, d);
        assert_eq!(reqs.len(), 3, "one continuation");
        let (_, asked) = split(d, &reqs[1]);
        let (_, cont) = split(d, &reqs[2]);
        let result = cont[asked.len()..].join("\n");
        assert!(result.contains("quokka"), "its own row is found: {result}");
        assert_eq!(
            result.contains("hunter2"),
            all,
            "search_all={all}: the other session's row: {result}"
        );
    }
}

/// Issue 40.8: an answer longer than the proxy holds was relayed as it
/// came, the internal call in it (JSON and SSE). The loop fails closed:
/// the client gets a 502 in the provider's format, never the call.
#[tokio::test]
async fn an_answer_too_long_to_hold_never_carries_the_internal_call() {
    for d in ALL {
        for stream in [false, true] {
            let h = Harness::start(
                FakeConfig {
                    script: Script::always(
                        Reply::recall(json!({"match": "parser"})).pad_text(200_000),
                    ),
                    ..FakeConfig::default()
                },
                |o| {
                    o.front.recall = RecallTool::on();
                    o.front.net.tap.max_kept = 64 << 10;
                },
            )
            .await;
            let got = h
                .post(path(d), &HDR, body(d, &[user(d, "hello")], stream))
                .await;
            let text = got.text();
            assert!(
                !text.contains(RECALL_TOOL),
                "{d:?} stream={stream}: the client got the internal call ({} bytes)",
                text.len()
            );
            assert_eq!(got.status, 502, "{d:?} stream={stream}: {text}");
            assert!(
                text.contains("could not read the model's answer whole"),
                "{text}"
            );
            assert_eq!(model_requests(&h, d).len(), 1, "no continuation");
        }
    }
}

/// Attack on issue 40.8: a 200 whose content type is neither JSON nor an
/// event stream (a gateway that labels its answers `text/plain`) was
/// relayed unread, the internal call in it. It fails closed too.
#[tokio::test]
async fn a_mislabelled_answer_never_carries_the_internal_call() {
    for d in ALL {
        for stream in [false, true] {
            let h = Harness::start(
                FakeConfig {
                    script: Script::always(
                        Reply::recall(json!({"match": "parser"})).with_content_type("text/plain"),
                    ),
                    ..FakeConfig::default()
                },
                |o| o.front.recall = RecallTool::on(),
            )
            .await;
            let got = h
                .post(path(d), &HDR, body(d, &[user(d, "hello")], stream))
                .await;
            let text = got.text();
            assert!(
                !text.contains(RECALL_TOOL),
                "{d:?} stream={stream}: the client got the internal call: {text}"
            );
            assert_eq!(got.status, 502, "{d:?} stream={stream}: {text}");
            assert_eq!(model_requests(&h, d).len(), 1, "no continuation");
        }
    }
}
