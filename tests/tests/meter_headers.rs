//! The meter on every answer: `x-oceancode-window`, `-line`, `-cut` and
//! `-session` headers on the responses to recorded steps, across a cut.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{push_tool_step, Got, Harness};
use serde_json::{json, Value};
use std::sync::Arc;

fn header(got: &Got, name: &str) -> String {
    got.headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header: {:?}", got.headers))
        .to_str()
        .unwrap()
        .to_string()
}

fn number(got: &Got, name: &str) -> u64 {
    header(got, name).parse().unwrap()
}

/// A proxy whose upstream answers every step with a `Bash` call, for a
/// model of `context` tokens, with `set` applied to its sessions.
async fn building(
    context: u64,
    set: impl FnOnce(&mut oceancode_proxy::sessions::Settings) + Send + 'static,
) -> Harness {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "make"})).with_text("Building."),
    ));
    Harness::start(fake, move |o| {
        o.sessions.models = Arc::new(move |_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(context),
            max_output: Some(32_000),
        });
        set(&mut o.sessions);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_carries_the_meter_and_the_cut_step_says_how_many_rows() {
    let h = building(200_000, |s| {
        s.line = oceancode_config::LineSpec::Tokens(20_000)
    })
    .await;
    let mut history = vec![json!({"role": "user", "content": "Make the build pass."})];
    let mut cut_steps = Vec::new();
    let mut cut_rows = 0;
    let mut cuts_before = 0;
    for step in 0..30 {
        let body = json!({
            "model": "claude-x",
            "max_tokens": 1000,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": history,
        });
        let got = h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", "meter")],
                body.to_string(),
            )
            .await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        let s = h.admin("/_oceancode/sessions/latest").await;
        assert_eq!(
            header(&got, "x-oceancode-session"),
            s["id"].as_str().unwrap()
        );
        assert_eq!(number(&got, "x-oceancode-line"), 20_000);
        assert!(number(&got, "x-oceancode-window") > 0, "step {step}");
        // Only headers: the model's content does not carry the meter.
        assert!(!got.text().contains("oceancode"), "{}", got.text());
        let cuts = s["meter"]["cuts"].as_u64().unwrap();
        let cut = number(&got, "x-oceancode-cut");
        if cuts > cuts_before {
            assert!(cut > 0, "step {step} cut: {:?}", got.headers);
            cut_steps.push(step);
            cut_rows += cut;
        } else {
            assert_eq!(cut, 0, "step {step} did not cut");
        }
        cuts_before = cuts;
        let lines = oceancode_tests::tool_lines(step, 100, 1);
        push_tool_step(&mut history, &got.json()["content"], &lines);
    }
    assert!(!cut_steps.is_empty(), "the session was cut");
    // The rows the headers counted are the rows that left: every seq up
    // to the cut (one row a message here).
    let s = h.admin("/_oceancode/sessions/latest").await;
    assert_eq!(cut_rows, s["meter"]["cut_upto"].as_u64().unwrap(), "{s}");
    // The upstream never saw the meter either.
    for r in h.fake.requests() {
        let sent: Value = r.json().unwrap();
        assert!(!sent.to_string().contains("x-oceancode"));
    }
}

/// A "prompt is too long" answer is retried after cutting every closed
/// block: the answer to the retry carries the window that was sent, not the
/// one the upstream refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_to_a_too_long_retry_carries_the_window_sent() {
    // A line the steps below stay under: nothing is cut before the
    // too-long answer, and blocks close every 5% of it.
    let h = building(1_000_000, |s| {
        s.line = oceancode_config::LineSpec::Tokens(400_000);
        s.block = oceancode_config::BlockSpec::PercentOfLine(5.0);
    })
    .await;
    let mut history = vec![json!({"role": "user", "content": "Make the build pass."})];
    let body = |history: &[Value]| {
        json!({
            "model": "claude-x",
            "max_tokens": 1000,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": history,
        })
        .to_string()
    };
    let post = |history: &[Value]| {
        h.post(
            "/v1/messages",
            &[("x-oceancode-session", "long")],
            body(history),
        )
    };
    let mut last = None;
    for step in 0..30 {
        let got = post(&history).await;
        assert_eq!(got.status, 200, "step {step}: {}", got.text());
        assert_eq!(number(&got, "x-oceancode-cut"), 0, "step {step}");
        push_tool_step(
            &mut history,
            &got.json()["content"],
            &oceancode_tests::tool_lines(step, 100, 1),
        );
        last = Some(got);
    }
    let before = number(&last.unwrap(), "x-oceancode-window");
    h.fake.clear();
    h.fake.push_reply(Reply::too_long());
    let got = post(&history).await;
    assert_eq!(got.status, 200, "retried after the cut: {}", got.text());
    assert_eq!(h.fake.request_count(), 2, "one retry");
    assert!(number(&got, "x-oceancode-cut") > 0, "{:?}", got.headers);
    let after = number(&got, "x-oceancode-window");
    assert!(
        after < before / 2,
        "the retry's window {after} is what was sent, not the refused one (last step {before})"
    );
    let s = h.admin("/_oceancode/sessions/latest").await;
    assert!(s["meter"]["cut_upto"].as_u64().unwrap() > 0, "{s}");
}
