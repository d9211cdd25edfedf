//! Per-session limits (`limits.session`: spend, steps, time) end to end
//! through the proxy against the fake upstream: in every dialect, streamed
//! or not, the request after a session reached its bound gets an error in
//! the provider's own envelope (Anthropic: 402 `billing_error`; OpenAI: 400
//! `invalid_request_error`), with
//! `x-should-retry: false` and a message naming the bound and the amount,
//! and nothing more reaches the upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::Price;
use oceancode_fakeup::FakeConfig;
use oceancode_ledger::status;
use oceancode_proxy::sessions::SessionLimits;
use oceancode_tests::{Got, Harness};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const PRICE: Price = Price {
    input: 300.0,
    output: 1500.0,
    cache_read: 30.0,
    cache_write: 375.0,
};

#[derive(Clone, Copy, Debug)]
enum Api {
    Messages,
    Chat,
    Responses,
}

impl Api {
    const ALL: [Api; 3] = [Api::Messages, Api::Chat, Api::Responses];

    fn path(self) -> &'static str {
        match self {
            Api::Messages => "/v1/messages",
            Api::Chat => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
        }
    }

    /// A conversation of `turns` asks (answers between them), as the
    /// client would resend it.
    fn body(self, turns: usize, stream: bool) -> String {
        let mut msgs = Vec::new();
        for t in 0..turns {
            if t > 0 {
                msgs.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            }
            msgs.push(json!({"role": "user", "content": format!("ask {t}: list the files of the project and explain each one in detail")}));
        }
        match self {
            Api::Messages => json!({
                "model": "claude-sonnet-4-5", "max_tokens": 256, "stream": stream,
                "system": [{"type": "text", "text": "You are a careful agent. ".repeat(40), "cache_control": {"type": "ephemeral"}}],
                "messages": msgs,
            }),
            Api::Chat => {
                msgs.insert(0, json!({"role": "system", "content": "You are a careful agent."}));
                // Streamed, Chat Completions tells the usage only when asked.
                json!({"model": "gpt-4o", "stream": stream, "messages": msgs,
                       "stream_options": stream.then(|| json!({"include_usage": true}))})
            }
            Api::Responses => json!({
                "model": "gpt-5", "stream": stream, "instructions": "You are a careful agent.",
                "input": msgs,
            }),
        }
        .to_string()
    }
}

async fn harness(limits: SessionLimits) -> Harness {
    Harness::start(FakeConfig::default(), move |o| {
        o.limits = SessionLimits {
            pricer: Some(Arc::new(|_m: &str| Some(PRICE))),
            ..limits
        };
    })
    .await
}

/// The refusal as the provider would say it, final: Anthropic's 402
/// `billing_error`, OpenAI's 400 `invalid_request_error`.
fn assert_refused(api: Api, got: &Got, says: &str) {
    let want = if matches!(api, Api::Messages) {
        402
    } else {
        400
    };
    assert_eq!(got.status, want, "{api:?}: {}", got.text());
    assert_eq!(
        got.headers
            .get("x-should-retry")
            .map(|v| v.to_str().unwrap()),
        Some("false"),
        "{api:?}"
    );
    assert_eq!(
        got.headers.get("content-type").map(|v| v.to_str().unwrap()),
        Some("application/json")
    );
    let v = got.json();
    let (kind, message) = match api {
        Api::Messages => {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], "billing_error", "{v}");
            (&v["error"]["type"], &v["error"]["message"])
        }
        Api::Chat | Api::Responses => {
            assert_eq!(v["error"]["code"], "session_limit_reached", "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            (&v["error"]["type"], &v["error"]["message"])
        }
    };
    assert!(kind.is_string());
    let message = message.as_str().unwrap();
    assert!(message.contains(says), "{api:?}: {message}");
    assert!(
        !message.contains("prompt is too long") && !message.contains("context"),
        "nothing a client would compact on: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_step_limit_refuses_the_next_request_in_every_dialect_streamed_or_not() {
    let h = harness(SessionLimits {
        steps: Some(2),
        ..SessionLimits::default()
    })
    .await;
    for api in Api::ALL {
        for stream in [false, true] {
            let name = format!("steps-{api:?}-{stream}");
            let hdr = [("x-oceancode-session", name.as_str())];
            let before = h.fake.request_count();
            for turns in 1..=2 {
                let got = h.post(api.path(), &hdr, api.body(turns, stream)).await;
                assert_eq!(got.status, 200, "{api:?} {stream}: {}", got.text());
            }
            assert_eq!(h.fake.request_count(), before + 2);
            // The third, and any after it: refused, nothing forwarded.
            for turns in 3..=4 {
                let got = h.post(api.path(), &hdr, api.body(turns, stream)).await;
                assert_refused(api, &got, "reached its step limit: 2 steps made of 2 steps");
            }
            assert_eq!(h.fake.request_count(), before + 2, "{api:?} {stream}");
        }
    }
    // Another session has its own count.
    let got = h
        .post(
            "/v1/messages",
            &[("x-oceancode-session", "fresh")],
            Api::Messages.body(1, false),
        )
        .await;
    assert_eq!(got.status, 200);
    let m = h.metrics().await;
    assert!(m.contains("oceancode_limit_refusals_total 12"), "{m}");
    let hits = h.proxy().app.sessions.limit_hits();
    assert_eq!(hits.len(), 6, "one per session: {hits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spend_limit_counts_cache_reads_and_writes_at_list_price() {
    let cap = 0.5;
    for api in Api::ALL {
        for stream in [false, true] {
            let h = harness(SessionLimits {
                spend_usd: Some(cap),
                ..SessionLimits::default()
            })
            .await;
            let hdr = [("x-oceancode-session", "spend")];
            let mut sent = 0;
            let refused = loop {
                assert!(
                    sent < 40,
                    "{api:?} {stream}: the spend limit was never reached"
                );
                let got = h.post(api.path(), &hdr, api.body(sent + 1, stream)).await;
                if got.status != 200 {
                    break got;
                }
                sent += 1;
            };
            assert!(sent >= 2, "{api:?}: more than one step fits under the cap");
            assert_eq!(h.fake.request_count(), sent, "{api:?} {stream}");
            // What the ledger recorded, at the same prices.
            h.settle().await;
            let store = h.store();
            let id = store.resolve_session(None).unwrap();
            let steps = store.steps(&id).unwrap();
            assert_eq!(steps.len(), sent);
            let (t, _) = status::totals(&steps, &|_| Some(PRICE));
            if matches!(api, Api::Messages) {
                assert!(
                    t.cache_read > 0 && t.cache_write > 0,
                    "the fake caches the system prompt: {t:?}"
                );
            }
            let last = status::totals(&steps[..sent - 1], &|_| Some(PRICE)).0;
            assert!(
                last.cost_usd < cap && t.cost_usd >= cap,
                "{api:?}: the step that crossed the cap completed, the next was refused ({} then {})",
                last.cost_usd,
                t.cost_usd
            );
            let says = format!(
                "reached its spend limit: {} spent of $0.5000",
                status::usd(t.cost_usd)
            );
            assert_refused(api, &refused, &says);
            let again = h.post(api.path(), &hdr, api.body(sent + 1, stream)).await;
            assert_refused(api, &again, &says);
            assert_eq!(h.fake.request_count(), sent);
            // The admin API's view (what `status` shows while it runs).
            let v = h.admin(&format!("/_oceancode/sessions/{id}")).await;
            let l = &v["limits"];
            assert!(
                (l["spent_usd"].as_f64().unwrap() - t.cost_usd).abs() < 1e-9,
                "{v}"
            );
            assert_eq!(l["spend_cap_usd"], cap);
            assert_eq!(l["hit"]["limit"], "spend");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_time_limit_refuses_requests_after_it_in_every_dialect() {
    let h = harness(SessionLimits {
        time: Some(Duration::from_millis(1500)),
        ..SessionLimits::default()
    })
    .await;
    for api in Api::ALL {
        let name = format!("time-{api:?}");
        let hdr = [("x-oceancode-session", name.as_str())];
        let got = h.post(api.path(), &hdr, api.body(1, true)).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    let before = h.fake.request_count();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for api in Api::ALL {
        let name = format!("time-{api:?}");
        let hdr = [("x-oceancode-session", name.as_str())];
        for stream in [true, false] {
            let got = h.post(api.path(), &hdr, api.body(2, stream)).await;
            assert_refused(api, &got, "reached its time limit: ");
            assert!(got.text().contains("elapsed of 1s"), "{}", got.text());
        }
    }
    assert_eq!(h.fake.request_count(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_is_charged_to_its_parent_and_count_tokens_is_never_refused() {
    let h = harness(SessionLimits {
        steps: Some(3),
        ..SessionLimits::default()
    })
    .await;
    let hdr = [("x-oceancode-session", "parent")];
    for turns in 1..=2 {
        let got = h
            .post("/v1/messages", &hdr, Api::Messages.body(turns, false))
            .await;
        assert_eq!(got.status, 200);
    }
    // A sub-agent: the same client session, another system prompt.
    let sub = |ask: &str| {
        json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
               "system": "You are a sub-agent that searches the code.",
               "messages": [{"role": "user", "content": ask}]})
        .to_string()
    };
    let got = h.post("/v1/messages", &hdr, sub("find the parser")).await;
    assert_eq!(got.status, 200);
    let sessions = h.proxy().app.sessions.sessions();
    assert_eq!(sessions.len(), 2, "the sub-agent is a session of its own");
    let got = h.post("/v1/messages", &hdr, sub("find the parser")).await;
    assert_refused(
        Api::Messages,
        &got,
        "reached its step limit: 3 steps made of 3 steps",
    );
    let got = h
        .post("/v1/messages", &hdr, Api::Messages.body(3, true))
        .await;
    assert_refused(Api::Messages, &got, "step limit");
    assert_eq!(h.fake.request_count(), 3);
    // Counting tokens costs nothing: it is forwarded.
    let got = h
        .post(
            "/v1/messages/count_tokens",
            &hdr,
            Api::Messages.body(3, false),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(h.fake.request_count(), 4);
    let v: Value = h.admin("/_oceancode/sessions").await;
    let text = v.to_string();
    assert!(text.contains("\"steps_cap\":3"), "{text}");
}
