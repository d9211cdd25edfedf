//! Foundation: transparent streaming passthrough, usage capture, header
//! handling and the error paths, over real loopback servers.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http::Method;
use oceancode_fakeup::{FakeConfig, Reply, Script};
use oceancode_testkit::{Conversation, Dialect};
use oceancode_tests::{collect, fixture, Harness, Replay};
use std::time::{Duration, Instant};

const SECRET_KEY: &str = "sk-ant-test-SECRET-9f8e7d";
const SECRET_BEARER: &str = "Bearer oauth-SECRET-token-1234";

fn anthropic_body(stream: bool, text: &str) -> String {
    Conversation::new(Dialect::Anthropic)
        .model("claude-sonnet-4-5")
        .max_tokens(1024)
        .stream(stream)
        .system("You are terse.")
        .user(text)
        .body()
}

fn sse_chunks(text: &str, pause: Duration) -> Vec<(Duration, Bytes)> {
    text.split_inclusive("\n\n")
        .map(|ev| (pause, Bytes::copy_from_slice(ev.as_bytes())))
        .collect()
}

async fn replay_harness(replay: &Replay) -> Harness {
    let url = replay.url();
    Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = url.clone();
        o.front.openai_upstream = url;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_capture_passes_through_byte_for_byte_with_usage() {
    for (file, path) in [
        ("sse/anthropic_tool_use.sse", "/v1/messages?beta=true"),
        ("sse/openai_chat_usage.sse", "/v1/chat/completions"),
        ("sse/openai_responses.sse", "/v1/responses"),
    ] {
        let sse = std::fs::read_to_string(fixture(file)).unwrap();
        let replay = Replay::start(
            200,
            vec![("content-type", "text/event-stream".into())],
            sse_chunks(&sse, Duration::from_millis(1)),
        )
        .await;
        let h = replay_harness(&replay).await;
        let body = if path.starts_with("/v1/messages") {
            anthropic_body(true, "list the files")
        } else if path == "/v1/responses" {
            serde_json::json!({"model":"gpt-4o-mini","stream":true,"input":[{"role":"user","content":"hi"}]}).to_string()
        } else {
            serde_json::json!({"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}).to_string()
        };
        let got = h
            .post(path, &[("x-oceancode-session", "bytes")], body)
            .await;
        assert_eq!(got.status, 200, "{file}");
        assert_eq!(
            got.text(),
            sse,
            "{file}: the client must get the upstream's bytes unchanged"
        );
        h.settle().await;
        let s = h.admin("/_oceancode/sessions/latest").await;
        let totals = &s["totals"];
        let total = totals["input"].as_u64().unwrap()
            + totals["cache_read"].as_u64().unwrap()
            + totals["cache_write"].as_u64().unwrap();
        assert!(total > 0, "{file}: usage captured: {s}");
        assert!(totals["output"].as_u64().unwrap() > 0, "{file}: {s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_chunk_reaches_the_client_before_the_stream_ends() {
    let sse = std::fs::read_to_string(fixture("sse/anthropic_tool_use.sse")).unwrap();
    let mut chunks = sse_chunks(&sse, Duration::ZERO);
    // The last event comes 600 ms after the others.
    let last = chunks.len() - 1;
    chunks[last].0 = Duration::from_millis(600);
    let replay = Replay::start(
        200,
        vec![("content-type", "text/event-stream".into())],
        chunks,
    )
    .await;
    let h = replay_harness(&replay).await;
    let t0 = Instant::now();
    let mut resp = h
        .send(
            &h.url(),
            Method::POST,
            "/v1/messages",
            &[],
            Bytes::from(anthropic_body(true, "hi")),
        )
        .await;
    use http_body_util::BodyExt;
    let first = resp.body_mut().frame().await.unwrap().unwrap();
    let first_at = t0.elapsed();
    assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
    let mut rest = Vec::new();
    while let Some(f) = resp.body_mut().frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            rest.push(d);
        }
    }
    let end_at = t0.elapsed();
    assert!(
        first_at + Duration::from_millis(400) < end_at,
        "first frame at {first_at:?}, end at {end_at:?}: frames must not be buffered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_matches_the_upstream_and_auth_is_forwarded_but_never_recorded() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    for stream in [true, false] {
        let got = h
            .post(
                "/v1/messages?beta=true",
                &[
                    ("x-api-key", SECRET_KEY),
                    ("authorization", SECRET_BEARER),
                    ("anthropic-version", "2023-06-01"),
                ],
                anthropic_body(stream, "say hi"),
            )
            .await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 2);
    for r in &reqs {
        assert_eq!(r.header("x-api-key"), Some(SECRET_KEY));
        assert_eq!(r.header("authorization"), Some(SECRET_BEARER));
        assert_eq!(r.path, "/v1/messages?beta=true");
    }
    h.settle().await;
    let s = h.admin("/_oceancode/sessions/latest").await;
    let fake_in: u64 = reqs
        .iter()
        .map(|r| r.usage.as_ref().unwrap().total_input_tokens)
        .sum();
    let t = &s["totals"];
    let ours = t["input"].as_u64().unwrap()
        + t["cache_read"].as_u64().unwrap()
        + t["cache_write"].as_u64().unwrap();
    assert_eq!(
        ours, fake_in,
        "usage recorded equals what the upstream reported: {s}"
    );
    // No secret in the database or any ledger file.
    let mut files = vec![];
    let mut stack = vec![h.data.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p)
            } else {
                files.push(p)
            }
        }
    }
    assert!(files.iter().any(|f| f.ends_with("oceancode.db")));
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("SECRET"), "{} holds a secret", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_are_relayed_unchanged() {
    let body = serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
    let fake =
        FakeConfig::default().with_script(Script::replies([Reply::error(529, body.clone())]));
    let h = Harness::start(fake, |_| {}).await;
    let got = h
        .post("/v1/messages", &[], anthropic_body(true, "hi"))
        .await;
    assert_eq!(got.status.as_u16(), 529);
    assert_eq!(got.json(), body);
    assert!(
        got.headers.get("x-oceancode-proxy").is_none(),
        "relayed, not made by the proxy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparseable_json_is_forwarded_unchanged() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let junk = "{\"model\": \"claude-x\", \"messages\": [ oops";
    let got = h.post("/v1/messages", &[], junk).await;
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].body, Bytes::from(junk), "forwarded byte for byte");
    assert_eq!(got.status, 400, "the upstream's own verdict is relayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_answers_in_each_providers_envelope() {
    // A port with nothing listening.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = format!("http://{dead}");
        o.front.openai_upstream = format!("http://{dead}");
    })
    .await;
    let a = h
        .post("/v1/messages", &[], anthropic_body(false, "hi"))
        .await;
    assert_eq!(a.status, 502);
    let v = a.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "api_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not reach the upstream"),
        "{v}"
    );
    let o = h
        .post(
            "/v1/chat/completions",
            &[],
            serde_json::json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
                .to_string(),
        )
        .await;
    assert_eq!(o.status, 502);
    assert_eq!(o.json()["error"]["code"], "upstream_unreachable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_and_slow_upstreams_504() {
    let h = Harness::start(FakeConfig::default(), |o| o.front.max_body_bytes = 1024).await;
    let big = anthropic_body(false, &"x".repeat(4096));
    let got = h.post("/v1/messages", &[], big).await;
    assert_eq!(got.status, 413);
    assert_eq!(got.json()["error"]["type"], "request_too_large");
    assert_eq!(h.fake.request_count(), 0, "nothing forwarded");

    let slow = Replay::start_with_head_delay(
        Duration::from_secs(5),
        200,
        vec![],
        vec![(Duration::ZERO, Bytes::from_static(b"{}"))],
    )
    .await;
    let url = slow.url();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.openai_upstream = url;
        o.upstream.header_timeout = Duration::from_millis(200);
    })
    .await;
    let got = h
        .post(
            "/v1/chat/completions",
            &[],
            serde_json::json!({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})
                .to_string(),
        )
        .await;
    // The replay sends its response head only after 5 s.
    assert_eq!(got.status, 504, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "upstream_timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_paths_pass_through_and_hop_by_hop_headers_are_dropped() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let resp = h
        .send(
            &h.url(),
            Method::GET,
            "/v1/models?limit=5",
            &[("x-api-key", "k"), ("x-custom", "kept"), ("te", "trailers")],
            Bytes::new(),
        )
        .await;
    let got = collect(resp).await;
    assert_eq!(got.status, 404, "the fake's own answer");
    let reqs = h.fake.requests();
    assert_eq!(reqs[0].path, "/v1/models?limit=5");
    assert_eq!(reqs[0].header("x-custom"), Some("kept"));
    assert_eq!(reqs[0].header("te"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_on_a_provider_route_is_refused_with_426_at_once() {
    // Codex's built-in OpenAI provider tries Responses over WebSocket first;
    // the proxy records HTTP only. 426 makes it fall back to HTTPS at once
    // (anything else: five reconnects with backoff first).
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let ws = [
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("authorization", "Bearer sk-test"),
    ];
    let got = collect(
        h.send(&h.url(), Method::GET, "/v1/responses", &ws, Bytes::new())
            .await,
    )
    .await;
    assert_eq!(got.status, 426, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "websocket_unsupported");
    assert!(
        h.fake.requests().is_empty(),
        "the upgrade reached the upstream"
    );
    // Other paths still pass through (the upstream decides).
    let got = collect(
        h.send(&h.url(), Method::GET, "/v1/realtime", &ws, Bytes::new())
            .await,
    )
    .await;
    assert_eq!(got.status, 404, "the fake's own answer");
    assert_eq!(h.fake.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_responses_stay_compressed_for_the_client_and_usage_is_read() {
    let h = Harness::start(FakeConfig::default().with_gzip(true), |_| {}).await;
    let got = h
        .post(
            "/v1/messages",
            &[("accept-encoding", "gzip")],
            anthropic_body(true, "hi there"),
        )
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.headers.get("content-encoding").unwrap(), "gzip");
    let mut d = flate2::read::GzDecoder::new(&got.body[..]);
    let mut s = String::new();
    std::io::Read::read_to_string(&mut d, &mut s).unwrap();
    assert!(s.contains("message_stop"));
    h.settle().await;
    let s = h.admin("/_oceancode/sessions/latest").await;
    assert!(s["totals"]["output"].as_u64().unwrap() > 0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_ended_with_an_error_event_after_the_idle_timeout() {
    let chunks = vec![
        (
            Duration::ZERO,
            Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        ),
        (
            Duration::from_secs(10),
            Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n"),
        ),
    ];
    let replay = Replay::start(
        200,
        vec![("content-type", "text/event-stream".into())],
        chunks,
    )
    .await;
    let url = replay.url();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = url;
        o.front.idle_stream_timeout = Duration::from_millis(300);
    })
    .await;
    let t0 = Instant::now();
    let resp = h
        .send(
            &h.url(),
            Method::POST,
            "/v1/messages",
            &[],
            Bytes::from(anthropic_body(true, "hi")),
        )
        .await;
    use http_body_util::BodyExt;
    let r = resp.into_body().collect().await;
    let body = String::from_utf8(r.expect("a clean end").to_bytes().to_vec()).unwrap();
    // Not a silent truncation: the dialect's error event ends it.
    assert!(
        body.ends_with("\n\n") && body.contains("event: error\ndata: {\"error\":{"),
        "{body}"
    );
    assert!(body.contains("overloaded_error"), "{body}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "ended by the idle timeout: {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_is_not_forwarded_with_a_body_already_read() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let got = h
        .post(
            "/v1/messages",
            &[("expect", "100-continue")],
            anthropic_body(false, "hi"),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(h.fake.requests()[0].header("expect"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_ledger_off_requests_are_relayed_as_sent_and_nothing_is_written() {
    let h = Harness::start(FakeConfig::default(), |o| {
        o.sessions.tideline_enabled = false;
        o.store = None;
        // A line every request crosses: had the tideline run, it would cut.
        o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    })
    .await;
    let big = "x ".repeat(60_000);
    let mut msgs = Vec::new();
    for i in 0..6 {
        msgs.push(serde_json::json!({"role": "user", "content": format!("ask {i}: {big}")}));
        msgs.push(serde_json::json!({"role": "assistant", "content": format!("answer {i}")}));
    }
    msgs.push(serde_json::json!({"role": "user", "content": "last ask"}));
    // Odd spacing the proxy would normalise if it re-rendered the body.
    let body = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true, "messages": msgs})
        .to_string()
        .replacen("{", "{ ", 1);
    let got = h
        .post("/v1/messages", &[("x-api-key", SECRET_KEY)], body.clone())
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = h.fake.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body,
        Bytes::from(body),
        "the body is relayed unchanged"
    );
    let app = h.proxy().app.clone();
    assert!(app.store.is_none());
    assert!(
        app.metrics
            .input_tokens
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the answer's usage still reaches /metrics"
    );
    let written: Vec<_> = std::fs::read_dir(h.data.path()).unwrap().collect();
    assert!(written.is_empty(), "nothing on disk: {written:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meter_endpoint_shows_the_sessions_meter() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let got = h
        .post(
            "/v1/messages",
            &[("x-oceancode-session", "metered")],
            anthropic_body(false, "hi"),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let latest = h.admin("/_oceancode/sessions/latest").await;
    let id = latest["id"].as_str().unwrap().to_string();
    // The gauge is the answer's real window.
    let u = &got.json()["usage"];
    let window: u64 = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "output_tokens",
    ]
    .iter()
    .map(|k| u[*k].as_u64().unwrap_or(0))
    .sum();
    assert!(window > 0, "{u}");
    assert_eq!(latest["meter"]["gauge"], window, "{latest}");
    for path in [
        "/_oceancode/meter".to_string(),
        format!("/_oceancode/meter/{id}"),
    ] {
        let m = h.admin(&path).await;
        assert_eq!(m["session"], id.as_str(), "{path}: {m}");
        assert_eq!(m["meter"], latest["meter"], "{path}: {m}");
        assert!(m["meter"]["line"].as_u64().unwrap() > 0, "{path}: {m}");
    }
    let missing = h.admin("/_oceancode/meter/no-such-session").await;
    assert_eq!(missing["type"], "error", "{missing}");
}
