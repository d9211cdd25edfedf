//! Every context-limit error and every usage shape the providers send, end
//! to end through the proxy against the fake upstream: Anthropic's `input
//! length and max_tokens exceed context limit`, a Responses stream that fails
//! with `context_length_exceeded`, server-side compaction (usage iterations,
//! the compaction block, the window starting at it), context editing
//! (`applied_edits` in status and exports), OpenAI cached and reasoning tokens.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http_body_util::BodyExt;
use oceancode_config::Price;
use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script, StreamFail};
use oceancode_ledger::status;
use oceancode_ledger::store::LedgerRead;
use oceancode_ledger::store::StepRecord;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{stub_seq, Harness};
use oceancode_window::Usage;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// ~1.7k tokens of varied tool output.
fn tool_output(step: usize) -> String {
    oceancode_tests::tool_lines(step, 110, 1)
}

/// A proxy that knows no context window for its models but a learned one.
async fn harness_unknown_context(fake: FakeConfig, max_output: u64) -> Harness {
    Harness::start(fake, move |o| {
        o.sessions.models = Arc::new(move |_m: &str, l: Option<u64>| ModelLimits {
            context: l,
            max_output: Some(max_output),
        });
    })
    .await
}

/// A proxy whose models have a 200k context.
async fn harness_200k(fake: FakeConfig) -> Harness {
    Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(64_000),
        });
    })
    .await
}

/// The model's messages requests the fake received.
fn message_requests(h: &Harness) -> Vec<Recorded> {
    h.fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/messages"))
        .collect()
}

fn messages_of(r: &Recorded) -> Vec<Value> {
    r.json()
        .and_then(|v| v["messages"].as_array().cloned())
        .unwrap_or_default()
}

const PRICE: Price = Price {
    input: 3.0,
    output: 15.0,
    cache_read: 0.3,
    cache_write: 3.75,
};

/// The session's steps, status text and both exports, from the ledger.
async fn ledger_views(h: &Harness, id: &str) -> (Vec<StepRecord>, status::Status, String, Value) {
    h.settle().await;
    let store = h.store();
    let meta = store.session_meta(id).expect("meta").expect("session");
    let steps = store.steps(id).expect("steps");
    let cuts = store.cuts(id).expect("cuts");
    let st = status::Status::new(
        &meta,
        &steps,
        &cuts,
        1,
        1,
        80_000,
        "40%".into(),
        Some(200_000),
        &|_| Some(PRICE),
    );
    let mut md = Vec::new();
    oceancode_ledger::export::markdown(store, id, &|_| Some(PRICE), &mut md, None).expect("md");
    let atif = oceancode_ledger::atif::trajectory(store, id, &|_| Some(PRICE)).expect("atif");
    (steps, st, String::from_utf8(md).expect("utf8"), atif)
}

async fn session_id(h: &Harness) -> String {
    h.admin("/_oceancode/sessions/latest").await["id"]
        .as_str()
        .expect("a live session")
        .to_string()
}

fn usage_of(v: &Value) -> Usage {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    Usage {
        input: n("input_tokens"),
        output: n("output_tokens"),
        cache_read: n("cache_read_input_tokens"),
        cache_write: n("cache_creation_input_tokens"),
    }
}

// ---------------------------------------------------------------- Anthropic: input + max_tokens

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_input_plus_max_tokens_over_the_context_is_cut_and_retried_once() {
    const LIMIT: u64 = 30_000;
    const MAX_TOKENS: u64 = 8_000;
    let fake = FakeConfig::default()
        .with_max_context(LIMIT)
        .with_count_max_tokens(true)
        .with_script(Script::always(Reply::tool_call(
            "Bash",
            json!({"command": "ls"}),
        )));
    // The model's context is unknown to the proxy: only the error teaches it.
    let h = harness_unknown_context(fake, 64_000).await;
    let hdr = [("x-oceancode-session", "mt")];
    let body = |history: &Vec<Value>| {
        json!({"model": "claude-x", "max_tokens": MAX_TOKENS, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "messages": history}).to_string()
    };
    let mut history = vec![json!({"role": "user", "content": "go"})];
    let mut retried_at = None;
    for step in 0..30 {
        let before = h.fake.request_count();
        let got = h.post("/v1/messages", &hdr, body(&history)).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let reqs = h.fake.requests();
        let this: Vec<&Recorded> = reqs[before..].iter().collect();
        if this.len() == 2 {
            assert!(retried_at.is_none(), "a second retry at step {step}");
            retried_at = Some(step);
            let (first, retry) = (this[0], this[1]);
            assert_eq!(first.status, 400);
            assert_eq!(retry.status, 200);
            let n = first.input_tokens_total.unwrap();
            assert!(
                n <= LIMIT && n + MAX_TOKENS > LIMIT,
                "the input alone fits: {n}"
            );
            let m = retry.input_tokens_total.unwrap();
            assert!(
                m + MAX_TOKENS <= LIMIT,
                "the retry fits: {m} + {MAX_TOKENS}"
            );
            for r in [first, retry] {
                assert_eq!(r.json().unwrap()["max_tokens"], MAX_TOKENS, "never changed");
            }
            assert!(
                stub_seq(&messages_of(retry)[0]).is_some(),
                "cut: a stub leads"
            );
            // The answer the client got is the retry's.
            assert_eq!(
                got.json()["usage"]["input_tokens"],
                retry.usage.unwrap().input_tokens
            );
            eprintln!("input+max_tokens: {n} + {MAX_TOKENS} > {LIMIT}; retry {m} + {MAX_TOKENS}");
        } else {
            assert_eq!(this.len(), 1, "step {step}");
            assert_eq!(this[0].status, 200, "step {step}: no error once learned");
        }
        let v = got.json();
        oceancode_tests::push_tool_step(&mut history, &v["content"], &tool_output(step));
        if retried_at.is_some_and(|s| step >= s + 8) {
            break;
        }
    }
    let at = retried_at.expect("the limit was reached");
    // The ceiling is learned, and the line leaves room for the whole max_tokens.
    let id = session_id(&h).await;
    let meter = &h.admin(&format!("/_oceancode/sessions/{id}")).await["meter"];
    assert_eq!(meter["context"], LIMIT);
    assert!(
        meter["line"].as_u64().unwrap() <= LIMIT - MAX_TOKENS,
        "{meter}"
    );
    eprintln!("retried at step {at}; line now {}", meter["line"]);

    // Nothing to cut (a first request already over): relayed unchanged.
    let before = h.fake.request_count();
    // Over with its max_tokens, not alone.
    let big = vec![json!({"role": "user", "content": tool_output(1).repeat(8)})];
    let got = h
        .post(
            "/v1/messages",
            &[("x-oceancode-session", "mt2")],
            body(&big),
        )
        .await;
    assert_eq!(got.status, 400);
    assert_eq!(h.fake.request_count(), before + 1, "no retry");
    let msg = got.json()["error"]["message"].as_str().unwrap().to_string();
    let n = h.fake.requests()[before].input_tokens_total.unwrap();
    assert_eq!(
        msg,
        format!("input length and `max_tokens` exceed context limit: {n} + {MAX_TOKENS} > {LIMIT}, decrease input length or `max_tokens` and try again")
    );
}

// ---------------------------------------------------------------- Responses: overflow inside the stream

/// (type, data) of every SSE event of a body.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            let v: Value = serde_json::from_str(&data).ok()?;
            Some((v["type"].as_str().unwrap_or("").to_string(), v))
        })
        .collect()
}

fn types(text: &str) -> Vec<String> {
    events(text).into_iter().map(|(t, _)| t).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_failing_before_output_is_cut_and_retried_once() {
    const LIMIT: u64 = 20_000;
    let fake = FakeConfig::default()
        .with_max_context(LIMIT)
        .with_overflow_in_stream(true)
        .with_script(Script::always(Reply::tool_call(
            "shell",
            json!({"cmd": "ls"}),
        )));
    let h = harness_unknown_context(fake, 128_000).await;
    let hdr = [("session-id", "rs-1")];
    let body = |input: &Vec<Value>| {
        json!({"model": "gpt-x", "stream": true, "store": false, "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}], "input": input}).to_string()
    };
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "inspect the repo"}]}),
    ];
    let step_of = |input: &mut Vec<Value>, text: &str, step: usize| {
        for (t, v) in events(text) {
            if t == "response.output_item.done" {
                let item = v["item"].clone();
                let call = item["call_id"].as_str().map(str::to_string);
                input.push(item);
                if let Some(c) = call {
                    input.push(json!({"type": "function_call_output", "call_id": c, "output": tool_output(step)}));
                }
            }
        }
    };
    let mut retried = 0;
    let mut steps = 0u32;
    for step in 0..25 {
        let before = h.fake.request_count();
        let got = h.post("/v1/responses", &hdr, body(&input)).await;
        steps += 1;
        assert_eq!(got.status, 200);
        let text = got.text();
        let t = types(&text);
        assert_eq!(
            t.iter().filter(|x| *x == "response.created").count(),
            1,
            "step {step}: {t:?}"
        );
        assert_eq!(
            t.last().map(String::as_str),
            Some("response.completed"),
            "step {step}: {t:?}"
        );
        assert!(!t.iter().any(|x| x == "response.failed"), "step {step}");
        let reqs = h.fake.requests();
        let this = &reqs[before..];
        if this.len() == 2 {
            retried += 1;
            let (n, m) = (
                this[0].input_tokens_total.unwrap(),
                this[1].input_tokens_total.unwrap(),
            );
            assert!(n > LIMIT && m <= LIMIT, "{n} → {m}");
            eprintln!("responses overflow in stream: {n} > {LIMIT}, retry {m}");
        } else {
            assert_eq!(this.len(), 1);
        }
        step_of(&mut input, &text, step);
        if retried > 0 && step > 12 {
            break;
        }
    }
    // The Responses error names no limit: every overflow costs one retry.
    assert!(retried >= 1, "the limit was reached");
    h.settle().await;
    let id = session_id(&h).await;
    assert_eq!(
        h.store().steps(&id).expect("steps").len() as u32,
        steps,
        "one step per client request, the failed attempt is not a step"
    );

    // A failure after output events reached the client is relayed.
    h.fake.push_reply(Reply::fail(StreamFail {
        after_events: 2,
        ..StreamFail::context_length_exceeded()
    }));
    let before = h.fake.request_count();
    let got = h.post("/v1/responses", &hdr, body(&input)).await;
    let t = types(&got.text());
    assert_eq!(
        t.last().map(String::as_str),
        Some("response.failed"),
        "{t:?}"
    );
    assert!(t.contains(&"response.output_item.added".to_string()));
    assert_eq!(h.fake.request_count(), before + 1, "no retry after output");

    // Another failure before output is relayed too.
    h.fake.push_reply(Reply::fail(StreamFail {
        code: "insufficient_quota".into(),
        message: None,
        after_events: 0,
    }));
    let before = h.fake.request_count();
    let got = h.post("/v1/responses", &hdr, body(&input)).await;
    let ev = events(&got.text());
    assert_eq!(
        ev.last().unwrap().1["response"]["error"]["code"],
        "insufficient_quota"
    );
    assert_eq!(h.fake.request_count(), before + 1);

    // The opening is held back at most OPENING_HOLD: a slow first output
    // event does not hold the client's first bytes.
    h.fake
        .push_reply(Reply::tool_call("shell", json!({"cmd": "ls"})).open_delay(2_500));
    let t0 = Instant::now();
    let resp = h
        .send(
            &h.url(),
            http::Method::POST,
            "/v1/responses",
            &hdr,
            Bytes::from(body(&input)),
        )
        .await;
    let mut b = resp.into_body();
    let first = b.frame().await.expect("a frame").expect("data");
    let first_at = t0.elapsed();
    assert!(first
        .data_ref()
        .is_some_and(|d| d.starts_with(b"event: response.created")));
    let rest = b.collect().await.expect("rest").to_bytes();
    let all_at = t0.elapsed();
    assert!(String::from_utf8_lossy(&rest).contains("response.completed"));
    assert!(all_at >= Duration::from_millis(2_500));
    assert!(
        first_at < Duration::from_millis(1_500),
        "opening released at the bound, not with the output: {first_at:?}"
    );
    eprintln!("opening held {first_at:?}, stream done at {all_at:?}");

    // A first request already over (nothing to cut): not held, relayed.
    let before = h.fake.request_count();
    let big = vec![
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": tool_output(2).repeat(15)}]}),
    ];
    let got = h
        .post("/v1/responses", &[("session-id", "rs-2")], body(&big))
        .await;
    let t = types(&got.text());
    assert_eq!(
        t,
        [
            "response.created",
            "response.in_progress",
            "response.failed"
        ]
    );
    assert_eq!(h.fake.request_count(), before + 1);
}

// ---------------------------------------------------------------- Anthropic server-side compaction

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_is_billed_recorded_and_the_window_starts_at_its_block() {
    let fake = FakeConfig::default().with_script(Script::always(Reply::tool_call(
        "Bash",
        json!({"command": "ls"}),
    )));
    let h = harness_200k(fake).await;
    let hdr = [
        ("x-oceancode-session", "cmp"),
        ("anthropic-beta", "compact-2026-01-12"),
    ];
    let body = |history: &Vec<Value>| {
        json!({"model": "claude-opus-4-6", "max_tokens": 4000,
            "context_management": {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 9000}}]},
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "messages": history}).to_string()
    };
    let mut history = vec![json!({"role": "user", "content": "go"})];
    let mut answers: Vec<Value> = Vec::new();
    let mut compacted_at = None;
    for step in 0..10 {
        let got = h.post("/v1/messages", &hdr, body(&history)).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let v = got.json();
        if v["content"][0]["type"] == "compaction" && compacted_at.is_none() {
            compacted_at = Some(step);
            // The meter reads the window: the message iteration, never the
            // summary step's (much larger) input.
            let id = session_id(&h).await;
            let meter = &h.admin(&format!("/_oceancode/meter/{id}")).await["meter"];
            let top = usage_of(&v["usage"]);
            assert_eq!(meter["gauge"], top.window_total(), "{meter}");
            let comp = usage_of(&v["usage"]["iterations"][0]);
            assert!(comp.input_total() > 9_000 && top.input_total() < comp.input_total());
            eprintln!(
                "compaction: summary step {} in / {} out, answer window {}",
                comp.input_total(),
                comp.output,
                top.window_total()
            );
        }
        answers.push(v.clone());
        oceancode_tests::push_tool_step(&mut history, &v["content"], &tool_output(step));
        if compacted_at.is_some_and(|c| step >= c + 3) {
            break;
        }
    }
    let c = compacted_at.expect("the trigger was reached");
    // The compaction block is recorded verbatim in the assistant row.
    h.settle().await;
    let id = session_id(&h).await;
    let rows = h.store().session_rows(&id, false).expect("rows");
    let block_row = rows
        .iter()
        .map(|(r, _)| r)
        .find(|r| r.raw.contains("\"compaction\""))
        .expect("the compaction row");
    let raw: Value = serde_json::from_str(&block_row.raw).unwrap();
    assert_eq!(raw["content"][0], answers[c]["content"][0]);
    // From the next request on the window starts at the block: a stub that
    // accounts for every row before it, then the block's message as sent.
    let reqs = message_requests(&h);
    let next = &reqs[c + 1];
    let sent = messages_of(next);
    assert_eq!(stub_seq(&sent[0]), Some(block_row.seq - 1));
    assert_eq!(sent[1]["content"][0]["type"], "compaction");
    let own_msgs = history_upto(&history, c + 1);
    assert_eq!(
        &sent[1..],
        &own_msgs[1 + 2 * c..],
        "the rest as the client sent it"
    );
    // What the provider keeps is what it would have kept of the client's own
    // request: the same tokens counted.
    let mut own: Value = serde_json::from_str(&body(&history_upto(&history, c + 1))).unwrap();
    own.as_object_mut().unwrap().remove("context_management");
    let counted = oceancode_tests::collect(
        h.send(
            &h.fake.url(),
            http::Method::POST,
            "/v1/messages/count_tokens",
            &[],
            Bytes::from(own.to_string()),
        )
        .await,
    )
    .await
    .json()["input_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(next.input_tokens_total, Some(counted));
    // Between cuts the window only appends (the prompt cache keeps hitting).
    let after = messages_of(&reqs[c + 2]);
    assert_eq!(&after[..sent.len()], &sent[..]);
    let cuts = h.store().cuts(&id).expect("cuts");
    assert_eq!(cuts.last().unwrap().upto_seq, block_row.seq - 1);

    // The summary step is billed: in tokens and spend, not in the window.
    let (steps, st, md, atif) = ledger_views(&h, &id).await;
    let comp = usage_of(&answers[c]["usage"]["iterations"][0]);
    assert_eq!(steps[c].detail.compactions, 1);
    assert_eq!(steps[c].detail.extra, comp);
    assert_eq!(steps[c].usage, usage_of(&answers[c]["usage"]));
    let billed: Usage = answers
        .iter()
        .map(|a| usage_of(&a["usage"]))
        .fold(comp, Usage::plus);
    assert_eq!(
        (st.totals.input_total(), st.totals.output),
        (billed.input_total(), billed.output)
    );
    let want = steps
        .iter()
        .map(|s| {
            let u = s.usage.plus(s.detail.extra);
            PRICE.cost_usd(u.input, u.output, u.cache_read, u.cache_write)
        })
        .sum::<f64>();
    assert!((st.totals.cost_usd - want).abs() < 1e-9);
    assert_eq!(st.window, steps.last().unwrap().usage.window_total());
    let text = st.render();
    assert!(text.contains("1 compaction by the provider"), "{text}");
    assert!(md.contains("provider_compactions: 1"), "{md}");
    assert!(md.contains("| Step | Window | Compactions |"), "{md}");
    let agent = atif["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["extra"]["context_management"]["compactions"] == 1)
        .expect("the compacting step in ATIF");
    assert_eq!(
        agent["metrics"]["extra"]["beyond_window"]["uncached_input_tokens"],
        comp.input
    );
    eprintln!(
        "compaction totals: in {} out {} (beyond the window {}), window {}",
        st.totals.input_total(),
        st.totals.output,
        st.totals.beyond_window,
        st.window
    );
}

/// The history as the client sent it at request `n` (0-based): the first
/// message and two per answered step.
fn history_upto(history: &[Value], n: usize) -> Vec<Value> {
    history[..1 + 2 * n].to_vec()
}

// ---------------------------------------------------------------- Anthropic context editing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_context_edits_show_in_status_and_exports_and_the_gauge_stays_real() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "ls"})).with_thinking("plan the next command"),
    ));
    let h = harness_200k(fake).await;
    let hdr = [
        ("x-oceancode-session", "edits"),
        ("anthropic-beta", "context-management-2025-06-27"),
    ];
    let body = |history: &Vec<Value>| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 4000, "stream": true,
            "thinking": {"type": "enabled", "budget_tokens": 2000},
            "context_management": {"edits": [
                {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
                {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 5000}, "keep": {"type": "tool_uses", "value": 2}}]},
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}], "messages": history}).to_string()
    };
    let mut history = vec![json!({"role": "user", "content": "go"})];
    let mut reported: Vec<Value> = Vec::new();
    for step in 0..7 {
        let got = h.post("/v1/messages", &hdr, body(&history)).await;
        assert_eq!(got.status, 200);
        // Reassemble the answer and what it reported, as an SDK does.
        let mut c = oceancode_proxy::dialect::collector(oceancode_window::Dialect::Anthropic);
        let text = got.text();
        for (_, v) in events(&text) {
            c.on_event("", &v.to_string());
        }
        let md = events(&text)
            .into_iter()
            .find(|(t, _)| t == "message_delta")
            .unwrap()
            .1;
        reported.push(md["context_management"]["applied_edits"].clone());
        let out = c.finish();
        // The gauge is the real input after the edits.
        let id = session_id(&h).await;
        let meter = &h.admin(&format!("/_oceancode/meter/{id}")).await["meter"];
        let real = usage_of(&md["usage"]);
        assert_eq!(meter["gauge"], real.window_total(), "step {step}");
        let content: Value =
            serde_json::from_str::<Value>(&out.rows[0]).unwrap()["content"].clone();
        oceancode_tests::push_tool_step(&mut history, &content, &tool_output(step));
    }
    let edited: Vec<usize> = (0..reported.len())
        .filter(|&i| reported[i].as_array().is_some_and(|a| !a.is_empty()))
        .collect();
    assert!(edited.len() >= 3, "{reported:?}");
    let id = session_id(&h).await;
    let (steps, st, md, atif) = ledger_views(&h, &id).await;
    let mut tool_uses = 0;
    let mut cleared = 0;
    for (i, s) in steps.iter().enumerate() {
        let want: Vec<Value> = reported[i].as_array().cloned().unwrap_or_default();
        assert_eq!(
            serde_json::to_value(&s.detail.edits).unwrap(),
            json!(want),
            "step {i}"
        );
        for e in &want {
            tool_uses += e["cleared_tool_uses"].as_u64().unwrap_or(0);
            cleared += e["cleared_input_tokens"].as_u64().unwrap();
        }
    }
    let total: u64 = st.totals.edits.iter().map(|e| e.cleared_input_tokens).sum();
    assert_eq!(total, cleared);
    let text = st.render();
    let line = text
        .lines()
        .find(|l| l.contains("clear_tool_uses_20250919 ×"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(&format!("{tool_uses} tool uses")), "{line}");
    assert!(text.contains("clear_thinking_20251015 ×"), "{text}");
    assert!(md.contains("provider_context_edits:"), "{md}");
    assert!(md.contains("| Step | Window | Compactions | Billed beyond window | Edits applied |"));
    let with_edits = atif["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["extra"]["context_management"]["applied_edits"].is_array())
        .count();
    assert_eq!(with_edits, edited.len());
    eprintln!(
        "context edits on {} of {} steps: {tool_uses} tool uses, {cleared} tokens cleared; window {}",
        edited.len(),
        steps.len(),
        st.window
    );
}

// ---------------------------------------------------------------- OpenAI cached and reasoning tokens

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cached_tokens_are_cache_reads_and_reasoning_is_output_without_double_counting() {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::text("checked. FINAL_ANSWER_MARKER").with_thinking("think about the answer first"),
    ));
    let h = Harness::start(fake, |_| {}).await;
    // Chat, streamed with include_usage.
    let mut msgs = vec![
        json!({"role": "system", "content": tool_output(0)}),
        json!({"role": "user", "content": "check it"}),
    ];
    for _ in 0..2 {
        let b = json!({"model": "gpt-5", "stream": true, "stream_options": {"include_usage": true}, "messages": msgs});
        let got = h
            .post(
                "/v1/chat/completions",
                &[("x-oceancode-session", "chat")],
                b.to_string(),
            )
            .await;
        assert_eq!(got.status, 200);
        msgs.push(json!({"role": "assistant", "content": "checked. FINAL_ANSWER_MARKER"}));
        msgs.push(json!({"role": "user", "content": "again"}));
    }
    // Responses, not streamed.
    let mut input = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": tool_output(1)}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "check it"}]}),
    ];
    for _ in 0..2 {
        let b = json!({"model": "gpt-5", "input": input});
        let got = h
            .post(
                "/v1/responses",
                &[("x-oceancode-session", "resp")],
                b.to_string(),
            )
            .await;
        assert_eq!(got.status, 200);
        input.extend(got.json()["output"].as_array().unwrap().iter().cloned());
        input.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]}));
    }
    h.settle().await;
    let reqs = h.fake.requests();
    for (k, name) in [(0usize, "chat"), (2, "resp")] {
        let id = h
            .store()
            .list_sessions()
            .expect("sessions")
            .into_iter()
            .map(|s| s.id)
            .find(|id| {
                h.store()
                    .session_meta(id)
                    .ok()
                    .flatten()
                    .and_then(|m| m.client_session)
                    .is_some_and(|c| c.ends_with(name))
            })
            .unwrap_or_else(|| panic!("session {name}"));
        let steps = h.store().steps(&id).expect("steps");
        assert_eq!(steps.len(), 2);
        let second = reqs[k + 1].usage.expect("usage");
        assert!(
            second.cache_read_input_tokens > 0,
            "the second request reads the cache"
        );
        let u = steps[1].usage;
        assert_eq!(u.cache_read, second.cache_read_input_tokens, "{name}");
        assert_eq!(
            u.input + u.cache_read,
            second.input_tokens,
            "cached is a part of the prompt: {name}"
        );
        assert_eq!(
            u.window_total(),
            second.input_tokens + second.output_tokens,
            "prompt + completion, the cache counted once: {name}"
        );
        assert!(second.reasoning_tokens > 0);
        assert_eq!(steps[1].detail.reasoning, second.reasoning_tokens, "{name}");
        assert_eq!(
            u.output, second.output_tokens,
            "reasoning is in the output: {name}"
        );
        eprintln!(
            "{name}: prompt {} (cached {}) + completion {} (reasoning {}) → meter in {} cache read {} out {} window {}",
            second.input_tokens,
            second.cache_read_input_tokens,
            second.output_tokens,
            second.reasoning_tokens,
            u.input,
            u.cache_read,
            u.output,
            u.window_total()
        );
    }
}
