//! The tideline end to end: a scripted long tool-using session through the
//! proxy against the fake upstream (which validates every request and
//! simulates prompt caching).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::dialect::{self, ResponseCollector};
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{push_tool_step, stub_seq, tool_output, Got, Harness};
use serde_json::{json, Value};
use std::sync::Arc;

const CONTEXT: u64 = 200_000;
const LINE: u64 = 80_000; // 40%
const BLOCK: u64 = 56_000; // 70% of the line

fn upstream_messages(r: &Recorded) -> Vec<Value> {
    r.json()
        .and_then(|v| v["messages"].as_array().cloned())
        .unwrap_or_default()
}

/// The id of the session the proxy saw last.
async fn latest_id(h: &Harness) -> String {
    h.admin("/_oceancode/sessions/latest").await["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_step_session_stays_under_the_line_valid_and_cached() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call(
            "Bash",
            json!({"command": "cargo test", "description": "Run the tests"}),
        )
        .with_text("Running the tests."),
    ));
    let h = Harness::start(fake, models_200k).await;
    let tools = json!([{"name":"Bash","description":"Run a shell command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}]);
    let mut history: Vec<Value> = vec![
        json!({"role":"user","content":"Fix the failing tests in this repository. Run them after each change."}),
    ];
    let mut client_usage: Vec<Value> = Vec::new();
    let hdr = [("x-oceancode-session", "long-run")];
    const STEPS: usize = 300;
    for step in 0..STEPS {
        let stream = step % 5 == 0;
        let body = json!({
            "model": "claude-test-200k",
            "max_tokens": 8192,
            "stream": stream,
            "system": [{"type":"text","text":"You are a careful coding agent."}],
            "tools": tools,
            "messages": history,
        });
        let got = h.post("/v1/messages", &hdr, body.to_string()).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let (content, usage) = if stream {
            let mut c: Box<dyn ResponseCollector> =
                dialect::collector(oceancode_window::Dialect::Anthropic);
            let mut p = oceancode_proxy::sse::SseParser::new();
            p.feed(&got.body, &mut |e| c.on_event(&e.event, &e.data));
            let out = c.finish();
            let row: Value = serde_json::from_str(&out.rows[0]).unwrap();
            let u = out.usage.unwrap();
            (
                row["content"].clone(),
                json!({"input_tokens": u.input, "cache_read_input_tokens": u.cache_read, "cache_creation_input_tokens": u.cache_write}),
            )
        } else {
            let v = got.json();
            (v["content"].clone(), v["usage"].clone())
        };
        client_usage.push(usage);
        push_tool_step(&mut history, &content, &tool_output(step));
    }
    h.settle().await;

    let reqs = h.requests_to("/v1/messages");
    assert_eq!(reqs.len(), STEPS);
    let mut cuts = 0;
    let mut prev_stub: Option<String> = None;
    let (mut read_between, mut input_between) = (0u64, 0u64);
    let mut table = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "request {i} valid for the upstream");
        let u = r.usage.as_ref().unwrap();
        let total_in = u.total_input_tokens;
        assert!(
            total_in <= LINE + BLOCK,
            "request {i}: the upstream saw {total_in} > line + block"
        );
        // The client got the real usage of the cut window.
        assert_eq!(
            client_usage[i]["input_tokens"].as_u64().unwrap(),
            u.input_tokens,
            "step {i}"
        );
        assert_eq!(
            client_usage[i]["cache_read_input_tokens"].as_u64().unwrap(),
            u.cache_read_input_tokens,
            "step {i}"
        );
        let msgs = upstream_messages(r);
        let stub = stub_seq(&msgs[0]);
        let stub_text = stub.map(|_| msgs[0].to_string());
        match stub {
            Some(n) => {
                // Stub, pinned first ask, then the client's history from row n+1 on.
                assert_eq!(msgs[1], history[0], "the newest (only) ask is pinned");
                let retained = &msgs[2..];
                let client_len = 1 + 2 * i; // messages the client sent at step i
                assert_eq!(
                    retained.len(),
                    client_len - n as usize,
                    "request {i}: the stub names the last row cut"
                );
                assert_eq!(
                    retained[0], history[n as usize],
                    "request {i}: window starts right after seq {n}"
                );
                assert_eq!(
                    retained[0]["role"], "assistant",
                    "a tool result never opens the window"
                );
            }
            None => assert_eq!(msgs.len(), 1 + 2 * i),
        }
        let cut_here = stub_text != prev_stub;
        if cut_here && stub_text.is_some() {
            cuts += 1;
        } else if i > 0 {
            read_between += u.cache_read_input_tokens;
            input_between += total_in;
        }
        table.push((
            i,
            total_in,
            u.cache_read_input_tokens,
            cut_here && stub_text.is_some(),
        ));
        prev_stub = stub_text;
    }
    let ratio = read_between as f64 / input_between as f64;
    println!("steps={STEPS} cuts={cuts} cache_read/input between cuts={ratio:.3}");
    for (i, t, cr, cut) in table.iter().filter(|(i, ..)| i % 10 == 0 || table[*i].3) {
        println!(
            "step {i:>3} window {t:>7} cache_read {cr:>7}{}",
            if *cut { "  <- cut" } else { "" }
        );
    }
    assert!(
        cuts >= 5,
        "a 300-step session crosses the line many times: {cuts}"
    );
    assert!(ratio >= 0.9, "prompt cache hits between cuts: {ratio:.3}");

    // The ledger holds every row verbatim (nothing was lost to the cuts).
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let s = store.load_session(&id).unwrap().unwrap();
    assert_eq!(s.branch, 0, "cuts are not branches");
    assert!(s.rows.len() >= history.len() - 1);
    let r0: Value = serde_json::from_str(&s.rows[0].raw).unwrap();
    assert_eq!(r0, history[0]);
    assert!(s.cut_upto > 0);
}

/// A request of the `ct` session to `path`: `history`, with Bash as its tool.
async fn ct_post(h: &Harness, path: &str, history: &[Value]) -> Got {
    let body = json!({"model":"claude-x","max_tokens":1000,"tools":[{"name":"Bash","input_schema":{"type":"object"}}],"messages":history});
    h.post(path, &[("x-oceancode-session", "ct")], body.to_string())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_gets_the_same_window_and_too_long_cuts_and_retries_once() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        json!({"command":"ls"}),
    )));
    let h = Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, l: Option<u64>| ModelLimits {
            context: l.or(Some(CONTEXT)),
            max_output: Some(64_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await;
    let mut history: Vec<Value> = vec![json!({"role":"user","content":"go"})];
    for step in 0..40 {
        let got = ct_post(&h, "/v1/messages", &history).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let v = got.json();
        push_tool_step(&mut history, &v["content"], &tool_output(step));
    }
    // count_tokens with the same conversation gets the same window as the main request.
    h.fake.clear();
    let got = ct_post(&h, "/v1/messages/count_tokens", &history).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let main = ct_post(&h, "/v1/messages", &history).await;
    assert_eq!(main.status, 200);
    let reqs = h.fake.requests();
    let ct = upstream_messages(&reqs[0]);
    let mm = upstream_messages(&reqs[1]);
    assert!(stub_seq(&ct[0]).is_some(), "count_tokens is windowed");
    assert!(stub_seq(&mm[0]).is_some());
    assert!(
        stub_seq(&ct[0]) <= stub_seq(&mm[0]),
        "the count sees the window before this request's cut, if any"
    );
    assert_eq!(ct.last(), mm.last());
    if stub_seq(&ct[0]) == stub_seq(&mm[0]) {
        assert_eq!(ct, mm, "the same window");
    }
    let counted = got.json()["input_tokens"].as_u64().unwrap();
    assert!(counted < 20_000 + 14_000 + 4_000, "counted {counted}");

    // Now the upstream refuses with "prompt is too long": every closed block is cut, one retry.
    let v = main.json();
    push_tool_step(&mut history, &v["content"], &tool_output(99));
    h.fake.clear();
    h.fake.push_reply(Reply::too_long());
    let got = ct_post(&h, "/v1/messages", &history).await;
    assert_eq!(got.status, 200, "retried after the cut: {}", got.text());
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 2, "one retry");
    let first = upstream_messages(&reqs[0]).len();
    let retry = upstream_messages(&reqs[1]).len();
    assert!(
        retry < first,
        "the retry sends a smaller window ({retry} < {first})"
    );

    // A second too-long with nothing left to cut is relayed unchanged.
    h.fake.clear();
    h.fake.set_script(Script::always(Reply::too_long()));
    let got = ct_post(&h, "/v1/messages", &history).await;
    assert_eq!(got.status, 400);
    assert!(got.json()["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("prompt is too long"));
    assert!(h.fake.request_count() <= 2, "at most one retry");
    let _ = Bytes::new();
}

async fn admin_post(h: &Harness, body: Value) -> oceancode_tests::Got {
    oceancode_tests::collect(
        h.send(
            &h.url(),
            http::Method::POST,
            "/_oceancode/tideline",
            &[],
            Bytes::from(body.to_string()),
        )
        .await,
    )
    .await
}

/// A request of the `ctl-1` client: `messages`, with `tool` as its only
/// tool; answered with a 200.
async fn ctl_request(h: &Harness, tool: &str, messages: &[Value]) {
    let body = json!({"model":"claude-x","max_tokens":1000,"tools":[{"name":tool,"input_schema":{"type":"object"}}],"messages":messages});
    let hdr = [("x-claude-code-session-id", "ctl-1")];
    assert_eq!(
        h.post("/v1/messages", &hdr, body.to_string()).await.status,
        200
    );
}

/// The assistant's "ok", then the user's `ask`, appended to `history`.
fn ok_then(history: &mut Vec<Value>, ask: &str) {
    history.push(json!({"role":"assistant","content":"ok"}));
    history.push(json!({"role":"user","content":ask}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_control_applies_from_the_next_request_and_sub_agents_inherit() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::text("ok")));
    let h = Harness::start(fake, models_200k).await;
    let mut history = vec![json!({"role":"user","content":"main task"})];
    ctl_request(&h, "Bash", &history).await;
    let main_id = latest_id(&h).await;
    assert_eq!(
        h.admin(&format!("/_oceancode/sessions/{main_id}")).await["meter"]["line"],
        80_000
    );

    // Set 50% for the session: applies from the next request.
    let got = admin_post(&h, json!({"session": main_id, "value": "50%"})).await;
    assert_eq!(got.status, 200, "{}", got.text());
    ok_then(&mut history, "next");
    ctl_request(&h, "Bash", &history).await;
    let s = h.admin(&format!("/_oceancode/sessions/{main_id}")).await;
    assert_eq!(s["override"], "50%");
    assert_eq!(s["meter"]["line"], 100_000);

    // A sub-agent (other tools, other first message) is its own session, linked, inheriting.
    ctl_request(&h, "Read", &[json!({"role":"user","content":"sub task"})]).await;
    let sub_s = h.admin("/_oceancode/sessions/latest").await;
    assert_ne!(sub_s["id"], main_id.as_str());
    assert_eq!(sub_s["parent"], main_id.as_str());
    assert_eq!(sub_s["override"], "50%");
    assert_eq!(sub_s["meter"]["line"], 100_000);

    // Refused values answer with the usage line.
    let bad = admin_post(&h, json!({"session": main_id, "value": "10k"})).await;
    assert_eq!(bad.status, 400);
    assert!(bad.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("usage: oceancode-proxy tideline"));

    // `now` cuts at the next request: the upstream sees a stub.
    let got = admin_post(&h, json!({"session": main_id, "value": "now"})).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.fake.clear();
    ok_then(&mut history, "after the cut");
    ctl_request(&h, "Bash", &history).await;
    let msgs = upstream_messages(&h.fake.requests()[0]);
    let named = stub_seq(&msgs[0]);
    assert!(named.is_some(), "a stub opens the window: {}", msgs[0]);
    // The forced cut is recorded like any other: cuts table, the session's
    // cut_upto, the meter.
    h.settle().await;
    let cuts = h.store().cuts(&main_id).unwrap();
    assert_eq!(
        cuts.iter().map(|c| c.upto_seq).collect::<Vec<_>>(),
        vec![named.unwrap()]
    );
    let loaded = h.store().load_session(&main_id).unwrap().unwrap();
    assert_eq!(Some(loaded.cut_upto), named);
    let s = h.admin(&format!("/_oceancode/sessions/{main_id}")).await;
    assert_eq!(s["meter"]["cuts"], 1);
    assert_eq!(s["meter"]["cut_upto"], named.unwrap());

    // `default` restores the configured line.
    assert_eq!(
        admin_post(&h, json!({"session": main_id, "value": "default"}))
            .await
            .status,
        200
    );
    ok_then(&mut history, "again");
    ctl_request(&h, "Bash", &history).await;
    let s = h.admin(&format!("/_oceancode/sessions/{main_id}")).await;
    assert!(s["override"].is_null());
    assert_eq!(s["meter"]["line"], 80_000);
}

fn models_200k(o: &mut oceancode_proxy::runtime::ProxyOptions) {
    o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
        context: Some(CONTEXT),
        max_output: Some(64_000),
    });
}

/// One request of the `keep-line` session, then its answer and the next ask.
async fn keep_line_step(h: &Harness, history: &mut Vec<Value>) {
    let body = json!({"model":"claude-x","max_tokens":1000,"messages":history}).to_string();
    let hdr = [("x-claude-code-session-id", "keep-line")];
    assert_eq!(h.post("/v1/messages", &hdr, body).await.status, 200);
    ok_then(history, "next");
}

/// `value` set for the `keep-line` session `id`, then a request, a restart
/// and one more request: the session as the restarted proxy has it.
async fn set_then_restart(
    h: &mut Harness,
    history: &mut Vec<Value>,
    id: &str,
    value: &str,
) -> Value {
    let set = admin_post(h, json!({"session": id, "value": value})).await;
    assert_eq!(set.status, 200, "{value}: {}", set.text());
    keep_line_step(h, history).await;
    h.settle().await;
    h.restart(models_200k).await;
    keep_line_step(h, history).await;
    h.admin(&format!("/_oceancode/sessions/{id}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_override_survives_a_restart_and_so_does_clearing_it() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::text("ok")));
    let mut h = Harness::start(fake, models_200k).await;
    let mut history = vec![json!({"role":"user","content":"main task"})];
    keep_line_step(&h, &mut history).await;
    let id = latest_id(&h).await;
    let s = set_then_restart(&mut h, &mut history, &id, "50%").await;
    assert_eq!(
        s["override"], "50%",
        "the restarted proxy lost the override: {s}"
    );
    assert_eq!(s["meter"]["line"], 100_000);

    // Cleared, then a restart: the configured line, not the old override.
    let s = set_then_restart(&mut h, &mut history, &id, "default").await;
    assert!(s["override"].is_null(), "a cleared override came back: {s}");
    assert_eq!(s["meter"]["line"], 80_000);
}

/// A proxy whose models all have a `CONTEXT` window (32k output) and a
/// fixed 20k line.
async fn harness_20k(fake: FakeConfig) -> Harness {
    Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(CONTEXT),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await
}

/// `evict` (admin API) on the `one-prompt` session.
async fn evict(h: &Harness, value: &str) -> Got {
    oceancode_tests::collect(
        h.send(
            &h.url(),
            http::Method::POST,
            "/_oceancode/evict",
            &[],
            Bytes::from(json!({"session": "one-prompt", "value": value}).to_string()),
        )
        .await,
    )
    .await
}

/// One step of the `one-prompt` session (a headless run: one ask, then
/// tool rounds); the answer and a tool output of `lines` are appended.
async fn one_prompt_step(h: &Harness, history: &mut Vec<Value>, step: usize, lines: usize) {
    let body = json!({
        "model": "claude-x",
        "max_tokens": 1000,
        "tools": [{"name":"Bash","input_schema":{"type":"object"}}],
        "messages": history,
    });
    let hdr = [("x-oceancode-session", "one-prompt")];
    let got = h.post("/v1/messages", &hdr, body.to_string()).await;
    assert_eq!(got.status, 200, "step {step}: {}", got.text());
    let lines = oceancode_tests::tool_lines(step, lines, 1);
    push_tool_step(history, &got.json()["content"], &lines);
}

/// A one-prompt run is one long turn: `evict` cuts inside it (relative to
/// the session's own 20k line), keeps the ask and the newest step, and
/// says what would act when it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evict_cuts_inside_a_one_prompt_run_relative_to_the_sessions_line() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "make"})).with_text("Building."),
    ));
    let h = harness_20k(fake).await;
    let ask = "Make the build pass (one prompt, headless).";
    let mut history = vec![json!({"role":"user","content": ask})];
    one_prompt_step(&h, &mut history, 0, 100).await;
    // Only the ask and its first step: nothing can leave, and it says so.
    let got = evict(&h, "").await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert!(
        got.text().contains("nothing to evict yet"),
        "{}",
        got.text()
    );
    for step in 1..6 {
        one_prompt_step(&h, &mut history, step, 100).await;
    }
    let meter = h.admin("/_oceancode/sessions/latest").await["meter"].clone();
    let gauge = meter["gauge"].as_u64().unwrap();
    assert_eq!(meter["line"], 20_000, "{meter}");
    assert_eq!(meter["cuts"], 0, "{meter}");
    assert!(gauge > 10_000, "over half the line: {meter}");
    // A bare number could be a share or a turn: refused with both.
    let got = evict(&h, "5").await;
    assert_eq!(got.status, 400);
    assert!(
        got.text().contains("`5%`") && got.text().contains("`through 5`"),
        "{}",
        got.text()
    );
    // The default: down to 50% of the session's line, inside the one turn.
    let got = evict(&h, "").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let upto = got.json()["upto"].as_u64().unwrap();
    assert!(got.json()["tokens"].as_u64().unwrap() > 0, "{}", got.text());
    one_prompt_step(&h, &mut history, 6, 100).await;
    let msgs = upstream_messages(&h.fake.requests().into_iter().last().unwrap());
    assert_eq!(
        stub_seq(&msgs[0]),
        Some(upto),
        "the stub names the eviction"
    );
    assert!(
        msgs[1].to_string().contains(ask),
        "the ask stays: {}",
        msgs[1]
    );
    let sent = Value::Array(msgs.clone()).to_string();
    assert!(!sent.contains("step 0 line 1:"), "the oldest output left");
    assert!(sent.contains("step 5 line 1:"), "the newest steps stay");
    // `through 1` (the only turn) cuts what is left but the newest step.
    let got = evict(&h, "through 1").await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        got.json()["upto"].as_u64().unwrap() > upto,
        "{}",
        got.text()
    );
    one_prompt_step(&h, &mut history, 7, 100).await;
    let last = h.fake.requests().into_iter().last().unwrap();
    assert_eq!(last.status, 200, "the upstream found the window valid");
    let msgs = upstream_messages(&last);
    assert!(msgs[1].to_string().contains(ask), "the ask stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_parallel_calls_and_reasoning_are_never_split_by_a_cut() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("shell", json!({"cmd": "ls"}))
            .with_tool_call("shell", json!({"cmd": "cat a"}))
            .with_tool_call("shell", json!({"cmd": "cat b"}))
            .with_thinking("look around"),
    ));
    let h = harness_20k(fake).await;
    let mut input: Vec<Value> = vec![
        json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]}),
        json!({"type":"message","role":"user","content":[{"type":"input_text","text":"inspect the repo"}]}),
    ];
    let hdr = [("session-id", "par-1")];
    let mut cuts = 0;
    for step in 0..30 {
        if step % 4 == 3 {
            // Leave memory and come back from the ledger: blocks are then
            // re-seeded from row estimates, at arbitrary row boundaries.
            h.settle().await;
            h.proxy().app.sessions.evict_idle(-1);
        }
        let body = json!({"model":"gpt-5-codex","stream":false,"store":false,"tools":[{"type":"function","name":"shell","parameters":{"type":"object"}}],"input":input});
        let got = h.post("/v1/responses", &hdr, body.to_string()).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let v = got.json();
        let output = v["output"].as_array().unwrap().clone();
        let calls: Vec<String> = output
            .iter()
            .filter(|i| i["type"] == "function_call")
            .map(|i| i["call_id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(calls.len(), 3);
        input.extend(output);
        for (k, c) in calls.iter().enumerate() {
            input.push(json!({"type":"function_call_output","call_id":c,"output":format!("{} {step} {k}", "out ".repeat(600))}));
        }
        let sent = h.fake.requests().last().unwrap().json().unwrap();
        let items = sent["input"].as_array().unwrap();
        if items.iter().any(|i| {
            i["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("[Earlier content"))
        }) {
            cuts += 1;
            // The first retained conversation item after the stub and pinned ask
            // never answers a call that was cut, nor follows a cut reasoning item.
            let mut open = std::collections::HashSet::new();
            for it in items {
                match it["type"].as_str().unwrap_or("") {
                    "function_call" => {
                        open.insert(it["call_id"].as_str().unwrap().to_string());
                    }
                    "function_call_output" => {
                        assert!(
                            open.remove(it["call_id"].as_str().unwrap()),
                            "an output without its call: {it}"
                        );
                    }
                    _ => {}
                }
            }
            let first_conv = items.iter().position(|i| i["type"] != "message").unwrap();
            assert_ne!(items[first_conv]["type"], "function_call_output");
            if items[first_conv]["type"] == "function_call" {
                assert_eq!(
                    items[first_conv - 1]["type"],
                    "message",
                    "a call keeps its reasoning item"
                );
            }
        }
    }
    assert!(cuts > 3, "the line was crossed: {cuts}");
}

/// 8 turns of 3 tool calls each at a fixed 20k line, as QA ran them. For
/// every request that carries a stub naming seq N: no conversation row with
/// seq <= N is sent (system/developer rows aside), and what the stub names is
/// what the ledger records (cuts table, `sessions.cut_upto`, the meter).
async fn stub_names_only_rows_that_left(d: &str) {
    let fake = FakeConfig::default().with_script(Script::replies((0..8).flat_map(|_| {
        [
            Reply::tool_call("Bash", json!({"command": "ls"})),
            Reply::tool_call("Bash", json!({"command": "cat a"})),
            Reply::tool_call("Bash", json!({"command": "cat b"})),
            Reply::text("done with this turn"),
        ]
    })));
    let h = harness_20k(fake).await;
    let (path, key) = match d {
        "anthropic" => ("/v1/messages", "messages"),
        "chat" => ("/v1/chat/completions", "messages"),
        _ => ("/v1/responses", "input"),
    };
    let mut history: Vec<Value> = match d {
        "anthropic" => vec![],
        "chat" => vec![json!({"role":"system","content":"You are a coding agent."})],
        _ => vec![
            json!({"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]}),
        ],
    };
    let hdr = [("x-oceancode-session", "qa-8x3")];
    let mut stubs = Vec::new();
    let mut step = 0usize;
    for turn in 1..=8 {
        let ask = format!("turn {turn}: inspect part {turn} of the repo");
        history.push(match d {
            "responses" => {
                json!({"type":"message","role":"user","content":[{"type":"input_text","text":ask}]})
            }
            _ => json!({"role":"user","content":ask}),
        });
        for k in 0..4 {
            step += 1;
            let mut body = json!({"model":"m","max_tokens":4096,"stream":false});
            body[key] = Value::Array(history.clone());
            if d == "anthropic" {
                body["system"] = json!("You are a coding agent.");
            }
            let got = h.post(path, &hdr, body.to_string()).await;
            assert_eq!(got.status, 200, "{d} step {step}: {}", got.text());
            let sent = h.fake.requests().last().unwrap().json().unwrap();
            let items = sent[key].as_array().unwrap().clone();
            // The N of the stub (the spec's wording, exactly).
            let stub = items.iter().find_map(|m| {
                let t = m["content"][0]["text"].as_str().or(m["content"].as_str())?;
                let rest = t.strip_prefix(
                    "[Earlier content of this session is past the tideline: every row up to seq ",
                )?;
                let (n, tail) = rest.split_once(' ')?;
                assert!(tail.starts_with("left this window."), "{t}");
                n.parse::<u64>().ok()
            });
            if let Some(n) = stub {
                // Sent items map to seqs in order (history index + 1): the
                // window is a subsequence of the history. Rows ≤ N may be
                // sent only as system rows or as the pinned newest ask, the
                // first row after the stub.
                let mut still_sent = Vec::new();
                let mut from = 0;
                let mut first = true;
                for m in &items {
                    if let Some(i) = history[from..].iter().position(|x| x == m) {
                        let seq = (from + i) as u64 + 1;
                        from += i + 1;
                        let sys = matches!(m["role"].as_str(), Some("system" | "developer"));
                        let ask = first
                            && m["role"] == "user"
                            && m.to_string().contains(": inspect part ");
                        if !sys {
                            first = false;
                        }
                        if seq <= n && !sys && !ask {
                            still_sent.push(seq);
                        }
                    }
                }
                stubs.push((step, n, still_sent));
            }
            let v = got.json();
            match d {
                "anthropic" => {
                    let content = v["content"].clone();
                    history.push(json!({"role":"assistant","content":content}));
                    if k < 3 {
                        push_tool_step(&mut history, &content, &tool_output(step));
                        history.remove(history.len() - 2);
                    }
                }
                "chat" => {
                    let msg = v["choices"][0]["message"].clone();
                    history.push(msg.clone());
                    for c in msg["tool_calls"].as_array().cloned().unwrap_or_default() {
                        history.push(json!({"role":"tool","tool_call_id":c["id"],"content":tool_output(step)}));
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
    }
    h.settle().await;
    let id = latest_id(&h).await;
    let cuts = h.store().cuts(&id).unwrap();
    let meter = h.admin(&format!("/_oceancode/sessions/{id}")).await["meter"].clone();
    assert!(!stubs.is_empty(), "{d}: the line was crossed");
    for (step, n, still) in &stubs {
        assert!(
            still.is_empty(),
            "{d} step {step}: stub says up to seq {n} but rows {still:?} were sent"
        );
    }
    let mut named: Vec<u64> = stubs.iter().map(|s| s.1).collect();
    named.dedup();
    let recorded: Vec<u64> = cuts.iter().map(|c| c.upto_seq).collect();
    assert_eq!(
        named, recorded,
        "{d}: the stub and the cuts table name the same rows"
    );
    assert_eq!(meter["cut_upto"], *named.last().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stub_names_only_rows_that_left_anthropic() {
    stub_names_only_rows_that_left("anthropic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stub_names_only_rows_that_left_chat() {
    stub_names_only_rows_that_left("chat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stub_names_only_rows_that_left_responses() {
    stub_names_only_rows_that_left("responses").await;
}
