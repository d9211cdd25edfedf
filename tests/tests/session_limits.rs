//! Per-session limits (`limits.session`: spend, steps, time) end to end
//! through the proxy against the fake upstream: in every dialect, streamed
//! or not, the request after a session reached its bound gets an error in
//! the provider's own envelope (Anthropic: 402 `billing_error`; OpenAI: 400
//! `invalid_request_error`), with
//! `x-should-retry: false` and a message naming the bound and the amount,
//! and nothing more reaches the upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_config::Price;
use oceancode_fakeup::{FakeConfig, Reply, Script, UsageOverride};
use oceancode_ledger::status;
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::sessions::SessionLimits;
use oceancode_testkit::{Conversation, Dialect};
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
        // The shapes all three APIs take (answers as plain strings).
        for t in 0..turns {
            if t > 0 {
                msgs.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            }
            msgs.push(json!({"role": "user", "content": format!("ask {t}: list the files of the project and explain each one in detail")}));
        }
        let c = match self {
            Api::Messages => Conversation::new(Dialect::Anthropic)
                .model("claude-sonnet-4-5")
                .system_raw(json!([{"type": "text", "text": "You are a careful agent. ".repeat(40), "cache_control": {"type": "ephemeral"}}])),
            // Streamed, Chat Completions tells the usage only when asked.
            Api::Chat => Conversation::new(Dialect::OpenaiChat)
                .model("gpt-4o")
                .system("You are a careful agent.")
                .member("stream_options", json!(stream.then(|| json!({"include_usage": true})))),
            Api::Responses => Conversation::new(Dialect::OpenaiResponses)
                .model("gpt-5")
                .system("You are a careful agent."),
        };
        c.max_tokens(256).stream(stream).messages(msgs).body()
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
    let cap = 2.0;
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
            // The refused request left one trace: a step saying it stopped.
            let stops = steps
                .iter()
                .filter(|s| {
                    s.error
                        .as_deref()
                        .is_some_and(|e| e.starts_with(status::STOPPED))
                })
                .count();
            assert_eq!((steps.len() - stops, stops), (sent, 1));
            let (t, _) = status::totals(&steps, &|_| Some(PRICE));
            if matches!(api, Api::Messages) {
                assert!(
                    t.cache_read > 0 && t.cache_write > 0,
                    "the fake caches the system prompt: {t:?}"
                );
            }
            // The next request's reservation (its body's tokens in, its
            // max_tokens out) would have passed the cap: refused before.
            assert!(
                t.cost_usd <= cap,
                "{api:?}: the spend never passes the cap ({})",
                t.cost_usd
            );
            let says = format!(
                "would pass its spend limit: {} spent, $0.0000 reserved by 0 requests in flight, up to $",
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
    h.clock.advance(Duration::from_millis(1600));
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

/// A request of about `bytes` bytes asking for at most 100 output tokens.
fn sized_body(bytes: usize, extra: Value) -> String {
    let c = extra.as_object().into_iter().flatten().fold(
        Conversation::new(Dialect::Anthropic)
            .model("claude-sonnet-4-5")
            .max_tokens(100),
        |c, (k, v)| c.member(k, v.clone()),
    );
    let pad = bytes.saturating_sub(c.clone().user("").body().len());
    c.user(&"x".repeat(pad)).body()
}

/// The fake bills every answer $0.30 at [`PRICE`] (500 tokens in, 100
/// out), after `delay_ms` (the requests of a burst are in flight together).
fn billed_030(delay_ms: u64) -> FakeConfig {
    let usage = UsageOverride {
        input_tokens: Some(500),
        cache_creation_input_tokens: Some(0),
        cache_read_input_tokens: Some(0),
        output_tokens: Some(100),
    };
    FakeConfig::default().with_script(Script::always(Reply {
        usage: Some(usage),
        delay_first_ms: delay_ms,
        ..Reply::default()
    }))
}

async fn harness_with(fake: FakeConfig, limits: SessionLimits) -> Harness {
    Harness::start(fake, move |o| {
        o.limits = SessionLimits {
            pricer: Some(Arc::new(|_m: &str| Some(PRICE))),
            ..limits
        };
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_requests_cannot_pass_the_spend_cap_together() {
    // Each request reserves ~$0.33 (1,650 bytes ≈ 550 tokens in, 100 out)
    // and is billed $0.30: under a $1 cap three fit, whatever the timing.
    let h = harness_with(
        billed_030(300),
        SessionLimits {
            spend_usd: Some(1.0),
            ..SessionLimits::default()
        },
    )
    .await;
    let body = sized_body(1650, json!({}));
    let posts = (0..20).map(|_| {
        h.post(
            "/v1/messages",
            &[("x-oceancode-session", "race")],
            body.clone(),
        )
    });
    let got = futures_util::future::join_all(posts).await;
    let ok = got.iter().filter(|g| g.status == 200).count();
    assert_eq!(ok, 3, "three reservations fit under $1");
    assert_eq!(h.fake.request_count(), 3, "nothing else was forwarded");
    for g in got.iter().filter(|g| g.status != 200) {
        assert_refused(Api::Messages, g, "spend limit: $");
    }
    h.settle().await;
    let id = h.store().resolve_session(None).unwrap();
    let v = h.admin(&format!("/_oceancode/sessions/{id}")).await;
    let spent = v["limits"]["spent_usd"].as_f64().unwrap();
    assert!((spent - 0.9).abs() < 1e-9, "three answers at $0.30: {v}");
    assert_eq!(v["limits"]["reserved_usd"].as_f64(), Some(0.0), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_requests_cannot_pass_the_step_cap_together() {
    let h = harness_with(
        billed_030(200),
        SessionLimits {
            steps: Some(5),
            ..SessionLimits::default()
        },
    )
    .await;
    let body = sized_body(400, json!({}));
    let posts = (0..30).map(|_| {
        h.post(
            "/v1/messages",
            &[("x-oceancode-session", "steps")],
            body.clone(),
        )
    });
    let got = futures_util::future::join_all(posts).await;
    assert_eq!(got.iter().filter(|g| g.status == 200).count(), 5);
    assert_eq!(h.fake.request_count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_limit_no_form_of_request_is_forwarded() {
    let h = harness(SessionLimits {
        steps: Some(1),
        ..SessionLimits::default()
    })
    .await;
    let hdr = |ua: &'static str| [("x-oceancode-session", "capped"), ("user-agent", ua)];
    let got = h
        .post("/v1/messages", &hdr("test"), Api::Messages.body(1, false))
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let got = h
        .post("/v1/messages", &hdr("test"), Api::Messages.body(2, false))
        .await;
    assert_refused(Api::Messages, &got, "reached its step limit");
    // A repeated top-level key: the proxy cannot read it, so cannot count it.
    let dup = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"max_tokens":64000,"messages":[{"role":"user","content":"hi"}]}"#;
    let got = h.post("/v1/messages", &hdr("test"), dup).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert!(got.text().contains("a limit is in force"), "{}", got.text());
    // A structured-output request without tools (a title's form).
    let title = json!({"model": "claude-sonnet-4-5", "max_tokens": 64,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "messages": [{"role": "user", "content": "write a title"}]})
    .to_string();
    let got = h.post("/v1/messages", &hdr("test"), title).await;
    assert_refused(Api::Messages, &got, "reached its step limit");
    // opencode's form of a side request: no tools.
    let got = h
        .post(
            "/v1/chat/completions",
            &hdr("opencode/1.18.33 ai-sdk/provider-utils/4.0.46"),
            Api::Chat.body(1, false),
        )
        .await;
    assert_refused(Api::Chat, &got, "reached its step limit");
    // Remote compaction.
    let got = h
        .post(
            "/v1/responses/compact",
            &hdr("test"),
            Api::Responses.body(2, false),
        )
        .await;
    assert_refused(Api::Responses, &got, "reached its step limit");
    assert_eq!(h.fake.request_count(), 1, "only the first went upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_wide_budget_holds_every_name_and_counts_side_requests() {
    // Steps: ten requests, ten names, one budget of five.
    let h = harness(SessionLimits {
        steps: Some(5),
        run_wide: true,
        ..SessionLimits::default()
    })
    .await;
    let mut codes = Vec::new();
    for i in 0..10 {
        let name = format!("name-{i}");
        let got = h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", name.as_str())],
                Api::Messages.body(1, false),
            )
            .await;
        codes.push(got.status);
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 402, 402, 402, 402, 402]);
    assert_eq!(h.fake.request_count(), 5);
    let hits = h.proxy().app.sessions.limit_hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0]
        .describe()
        .starts_with("the run (every session) reached its step limit: 5 steps made of 5 steps"));

    // Spend: titles (side requests, never recorded) are charged to the run.
    let h = harness_with(
        billed_030(0),
        SessionLimits {
            spend_usd: Some(1.0),
            run_wide: true,
            ..SessionLimits::default()
        },
    )
    .await;
    let title = sized_body(
        1650,
        json!({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}),
    );
    // Each reserves ~$0.32 and is billed what the fake's structured answer
    // tells (a few cents): they are refused once what they spent leaves
    // less than a reservation under the cap.
    let mut ok = 0;
    let refused = loop {
        assert!(ok < 40, "the titles' spend was never counted");
        let name = format!("t-{ok}");
        let got = h
            .post(
                "/v1/messages",
                &[("x-oceancode-session", name.as_str())],
                title.clone(),
            )
            .await;
        if got.status != 200 {
            break got;
        }
        ok += 1;
    };
    assert_refused(Api::Messages, &refused, "would pass its spend limit: $0.");
    assert!(ok > 3, "{ok}");
    assert_eq!(h.fake.request_count(), ok);
    let hits = h.proxy().app.sessions.limit_hits();
    let spent: f64 = hits[0].used.trim_start_matches('$').parse().unwrap();
    assert!(spent > 0.6 && spent <= 1.0, "{hits:?}");
    assert!(
        h.proxy().app.sessions.sessions().is_empty(),
        "titles record nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_hold_with_the_ledger_off() {
    let h = Harness::start(FakeConfig::default(), |o| {
        o.sessions.tideline_enabled = false;
        o.store = None;
        o.limits = SessionLimits {
            steps: Some(2),
            pricer: Some(Arc::new(|_m: &str| Some(PRICE))),
            ..SessionLimits::default()
        };
    })
    .await;
    let hdr = [("x-oceancode-session", "off")];
    let mut codes = Vec::new();
    for turns in 1..=3 {
        let got = h
            .post("/v1/messages", &hdr, Api::Messages.body(turns, false))
            .await;
        codes.push(got.status);
    }
    assert_eq!(codes, [200, 200, 402]);
    assert_eq!(h.fake.request_count(), 2);
}

/// Issue 32.9: a session a bound stopped keeps a trace in the ledger once
/// the proxy is gone (a `run --max-steps N` that ended): one failed step
/// saying which bound and where, shown by `status`, however many requests
/// were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_session_says_so_in_the_ledger_and_in_status() {
    let h = harness(SessionLimits {
        steps: Some(2),
        ..SessionLimits::default()
    })
    .await;
    let hdr = [("x-oceancode-session", "stopped")];
    for turns in 1..=4 {
        let got = h
            .post("/v1/messages", &hdr, Api::Messages.body(turns, false))
            .await;
        assert_eq!(
            got.status,
            if turns <= 2 { 200 } else { 402 },
            "{}",
            got.text()
        );
    }
    h.settle().await;
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let steps = store.steps(&id).unwrap();
    let stops: Vec<_> = steps
        .iter()
        .filter(|s| {
            s.error
                .as_deref()
                .is_some_and(|e| e.starts_with(status::STOPPED))
        })
        .map(|s| (s.step, s.status))
        .collect();
    assert_eq!(stops, [(3, 402)], "one trace, after step 2: {steps:?}");
    let st = status::Status::new(
        &store.session_meta(&id).unwrap().unwrap(),
        &steps,
        &store.cuts(&id).unwrap(),
        2,
        4,
        80_000,
        "40%".into(),
        Some(200_000),
        &|_| Some(PRICE),
    );
    let text = st.render();
    assert!(
        text.contains("stopped  session ")
            && text.contains(
                "reached its step limit: 2 steps made of 2 steps (limits.session.steps, --max-steps) · the request after step 2 was refused"
            ),
        "{text}"
    );
    // The viewer's session page says it too.
    let get = |path: String, cookie: Option<String>| {
        let h = &h;
        async move {
            let headers: Vec<(&str, &str)> =
                cookie.iter().map(|c| ("cookie", c.as_str())).collect();
            oceancode_tests::collect(
                h.send(
                    &h.url(),
                    http::Method::GET,
                    &path,
                    &headers,
                    bytes::Bytes::new(),
                )
                .await,
            )
            .await
        }
    };
    let over = get(format!("/_oceancode/ui/?token={}", h.admin_token()), None).await;
    let cookie = over.headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = get(format!("/_oceancode/ui/s/{id}"), Some(cookie)).await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(
        page.text().contains("<dt>stopped</dt><dd>session ")
            && page
                .text()
                .contains("the request after step 2 was refused</dd>"),
        "{}",
        page.text()
    );
}
