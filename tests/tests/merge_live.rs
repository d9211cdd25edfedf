//! The live model merge of SESSION.md (issue 13 part 4), against the fake
//! upstream only: opt-in (`ledger.merge.model` and a key of the proxy's
//! own), run in the background after a turn wholly passes the tideline,
//! its lines in SESSION.md's merged sections, its usage and cost in the
//! meter, `status` and `/metrics`; a hung or failing merge model never
//! holds a request up.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::{LedgerRead, LedgerStore};
use oceancode_proxy::merge::{Auth, MergeOptions, Provider, Secret};
use oceancode_proxy::sessions::ModelLimits;
use oceancode_testkit::eventually_async;
use oceancode_tests::{tool_lines, Harness};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const STEPS: usize = 60;
const MERGE_KEY: &str = "sk-merge-own-key";
const CLIENT_KEY: &str = "sk-client-key";
const ANSWER: &str = "Decisions | t01 | keep the retry loop in net.rs\nCode map | t02 | src/mod_3 holds the parser\nNext step | t02 | port module 4\nnot a fact line";

/// A proxy at a 20k line (200k context) in front of a fake whose tool-less
/// requests (the merge's) get `merge_reply`; the live merge on when `on`.
async fn harness(merge_reply: Reply, on: bool) -> Harness {
    let replies: Vec<Reply> = (0..STEPS)
        .map(|i| {
            if i % 12 == 11 {
                Reply::text(format!("Round {} done.", i / 12))
            } else {
                Reply::tool_call("Read", json!({"file_path": format!("/w/src/f_{i}.rs")}))
            }
        })
        .collect();
    let fake =
        FakeConfig::default().with_script(Script::replies(replies).with_no_tools(merge_reply));
    Harness::start(fake, move |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
        if on {
            o.merge = Some(MergeOptions {
                model: "claude-haiku-4-5".into(),
                provider: Provider::Anthropic,
                upstream: o.front.anthropic_upstream.clone(),
                auth: Auth::ApiKey(Secret::new(MERGE_KEY)),
                price: oceancode_config::lookup("claude-haiku-4-5").and_then(|i| i.price),
            });
        }
    })
    .await
}

/// A Claude Code-like session of `STEPS` requests: tool steps, and every
/// 12th a text answer and the next ask (a new turn).
async fn session(h: &Harness) {
    let mut history =
        vec![json!({"role": "user", "content": "Port the modules and keep the tests green."})];
    for i in 0..STEPS {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1000,
            "system": "You are Claude Code, Anthropic's official CLI for Claude.",
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": history});
        let got = h
            .post(
                "/v1/messages",
                &[
                    ("x-claude-code-session-id", "merge-live"),
                    ("x-api-key", CLIENT_KEY),
                ],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "step {i}: {}", got.text());
        let content = got.json()["content"].clone();
        history.push(json!({"role": "assistant", "content": content.clone()}));
        match content
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
        {
            Some(call) => history.push(json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": call["id"], "content": tool_lines(i, 120, 7)}]})),
            None => history
                .push(json!({"role": "user", "content": format!("Next: round {}.", i / 12 + 1)})),
        }
    }
}

/// The merge model's requests (no tools), and the client's.
fn split(reqs: Vec<Recorded>) -> (Vec<Recorded>, Vec<Recorded>) {
    reqs.into_iter()
        .filter(|r| r.path.starts_with("/v1/messages"))
        .partition(|r| r.json().is_some_and(|v| v.get("tools").is_none()))
}

/// Wait (bounded) until `done` holds.
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    eventually_async(Duration::from_secs(30), what, || std::future::ready(done())).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_merge_writes_session_md_in_the_background_with_its_own_key_and_meters_it() {
    let h = harness(Reply::text(ANSWER), true).await;
    session(&h).await;
    h.settle().await;
    let id = h.store().latest_session().unwrap().unwrap();
    let merger = h.proxy().app.merge.clone().expect("the live merge is on");
    wait_for("a merge", || {
        merger
            .session(&id)
            .is_some_and(|s| s.calls > 0 && !s.running)
    })
    .await;
    let (merges, client) = split(h.fake.requests());
    assert_eq!(client.len(), STEPS);
    assert!(!merges.is_empty());
    let cuts = h.store().cuts(&id).unwrap();
    assert!(!cuts.is_empty(), "the session was cut");
    for r in &merges {
        // The proxy's own key, never the client's; the merge model.
        assert_eq!(r.header("x-api-key"), Some(MERGE_KEY));
        let v = r.json().unwrap();
        assert_eq!(v["model"], "claude-haiku-4-5");
        let prompt = v["messages"][0]["content"].as_str().unwrap();
        assert!(
            prompt.contains("=== transcript of t"),
            "whole turns past the tideline"
        );
        assert!(prompt.contains("=== SESSION.md ==="));
    }
    let first = merges[0].json().unwrap();
    let first = first["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        first.contains("=== transcript of t01 ==="),
        "the first merge starts at t01"
    );
    for r in &client {
        assert_eq!(r.header("x-api-key"), Some(CLIENT_KEY));
        assert!(!String::from_utf8_lossy(&r.body).contains("SESSION.md merged by"));
    }
    // Its lines are in the page's merged sections, stamped with their turn.
    let page = std::fs::read_to_string(h.store().data_dir().session_md(&id)).unwrap();
    assert!(
        page.contains("## Decisions\n\n- t01 keep the retry loop in net.rs\n"),
        "{page}"
    );
    // (A turn outside the merged ones is clamped into them.)
    assert!(
        page.contains("## Code map\n\n- t01 src/mod_3 holds the parser\n"),
        "{page}"
    );
    assert!(
        page.contains("## Next step\n\n- t01 port module 4\n"),
        "{page}"
    );
    assert!(!page.contains("not a fact line"));
    // Its cost: in the meter of the session (admin), in status (from the
    // ledger, so also after a restart) and in /metrics.
    let s = merger.session(&id).unwrap();
    assert!(s.usage.input > 0 && s.usage.output > 0, "{s:?}");
    assert!(s.cost_usd.is_some_and(|c| c > 0.0), "{s:?}");
    assert_eq!(s.failures, 0);
    let admin = h.admin(&format!("/_oceancode/sessions/{id}")).await;
    assert_eq!(admin["merge"]["calls"], json!(s.calls), "{admin}");
    let uses = h.store().merge_uses(&id).unwrap();
    assert_eq!(uses.len(), s.calls as usize);
    assert_eq!(uses[0].model, "claude-haiku-4-5");
    let price = |m: &str| oceancode_config::lookup(m).and_then(|i| i.price);
    let spend = oceancode_ledger::status::MergeSpend::of(&uses, &price).unwrap();
    assert_eq!(spend.usage, s.usage);
    assert!(
        spend.line().starts_with(&format!("{} call", s.calls)),
        "{}",
        spend.line()
    );
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(&format!("oceancode_merge_calls_total {}", s.calls)),
        "{metrics}"
    );
    assert!(metrics.contains("oceancode_merge_cost_usd "));
    // The page is the ledger's: a rebuild writes the same bytes, no model call.
    let n = h.fake.request_count();
    tokio::task::block_in_place(|| h.store().rebuild(&id, None)).unwrap();
    assert_eq!(
        std::fs::read_to_string(h.store().data_dir().session_md(&id)).unwrap(),
        page
    );
    assert_eq!(h.fake.request_count(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_merge_model_never_holds_a_request_up() {
    // The merge's answer never comes within the test: every client step
    // still completes while it waits.
    let h = harness(Reply::text(ANSWER).delay_first(600_000), true).await;
    session(&h).await;
    let id = h.store().latest_session().unwrap().unwrap();
    let merger = h.proxy().app.merge.clone().unwrap();
    wait_for("the merge request", || {
        !split(h.fake.requests()).0.is_empty()
    })
    .await;
    let s = merger.session(&id).unwrap();
    assert!(s.running && s.calls == 0, "{s:?}");
    assert_eq!(split(h.fake.requests()).1.len(), STEPS);
    let page = std::fs::read_to_string(h.store().data_dir().session_md(&id)).unwrap();
    assert!(!page.contains("## Decisions"), "nothing merged yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_merge_model_is_counted_and_the_session_goes_on() {
    let h = harness(
        Reply::error(529, json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        true,
    )
    .await;
    session(&h).await;
    let id = h.store().latest_session().unwrap().unwrap();
    let merger = h.proxy().app.merge.clone().unwrap();
    wait_for("a failed merge", || {
        merger
            .session(&id)
            .is_some_and(|s| s.failures > 0 && !s.running)
    })
    .await;
    let s = merger.session(&id).unwrap();
    assert_eq!(s.calls, 0);
    assert!(s.last_error.as_deref().unwrap().contains("529"), "{s:?}");
    assert_eq!(split(h.fake.requests()).1.len(), STEPS);
    assert!(h.store().merge_uses(&id).unwrap().is_empty());
    assert!(h
        .metrics()
        .await
        .contains("oceancode_merge_failures_total "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_of_its_own_the_proxy_never_merges() {
    let h = harness(Reply::text(ANSWER), false).await;
    session(&h).await;
    h.settle().await;
    assert!(h.proxy().app.merge.is_none());
    assert!(!h
        .store()
        .cuts(&h.store().latest_session().unwrap().unwrap())
        .unwrap()
        .is_empty());
    assert!(
        split(h.fake.requests()).0.is_empty(),
        "no tool-less request was sent"
    );
    assert!(!h.metrics().await.contains("oceancode_merge_"));
}
