//! Hardening of the front (issue 12): access rules (Host, Origin, admin token,
//! admin Content-Type, remote listening), request targets (`OPTIONS *`,
//! dot-segments), duplicate keys, error relay, streams cut mid-way, and the
//! resource bounds (body budget, connection timers and cap, upstream pool).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http::Method;
use oceancode_fakeup::FakeConfig;
use oceancode_ledger::store::LedgerRead;
use oceancode_testkit::{eventually_async, Conversation, Dialect};
use oceancode_tests::{collect, Harness, Replay};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn anthropic_body(stream: bool, text: &str) -> String {
    Conversation::new(Dialect::Anthropic)
        .model("claude-sonnet-4-5")
        .max_tokens(64)
        .stream(stream)
        .user(text)
        .body()
}

/// The address part of `http://addr`.
fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// Write `req` on a fresh connection and read until the server closes it.
fn raw(addr: &str, req: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

async fn raw_async(addr: String, req: Vec<u8>) -> String {
    tokio::task::spawn_blocking(move || raw(&addr, &req))
        .await
        .expect("join")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_another_host_or_coming_from_a_web_page_are_refused() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let port = h.proxy().addr.port();
    let body = Bytes::from(anthropic_body(false, "hi"));
    // What Claude Code and Codex send: Host 127.0.0.1:PORT, no Origin.
    let ok = h.post("/v1/messages", &[], body.clone()).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let own = format!("http://127.0.0.1:{port}");
    for (headers, why) in [
        (
            vec![("host", "attacker.example:8787".to_string())],
            "DNS rebinding",
        ),
        (
            vec![("origin", "https://attacker.example".to_string())],
            "cross-site page",
        ),
        (vec![("origin", "null".to_string())], "sandboxed page"),
        (
            vec![("sec-fetch-site", "cross-site".to_string())],
            "fetch metadata",
        ),
    ] {
        let hs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        for path in [
            "/v1/messages",
            "/s/x/v1/messages",
            "/_oceancode/sessions",
            "/v1/models",
        ] {
            let got = h.post(path, &hs, body.clone()).await;
            assert_eq!(got.status, 403, "{why} {path}: {}", got.text());
            assert_eq!(got.headers["x-oceancode-proxy"], "error");
        }
    }
    // Anthropic's envelope on an Anthropic route, OpenAI's on an OpenAI one.
    let hs = [("origin", "https://attacker.example")];
    let got = h.post("/v1/messages", &hs, body.clone()).await;
    assert_eq!(
        got.json()["error"]["type"],
        "permission_error",
        "{}",
        got.text()
    );
    let got = h.post("/v1/chat/completions", &hs, body.clone()).await;
    assert_eq!(got.json()["error"]["code"], "forbidden", "{}", got.text());
    // Only the first request reached the upstream, and nothing else was recorded.
    assert_eq!(h.fake.request_count(), 1);
    h.settle().await;
    assert_eq!(h.proxy().app.sessions.sessions().len(), 1);
    // The proxy's own origin passes.
    let got = h
        .post("/v1/messages", &[("origin", own.as_str())], body)
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_token_and_json_writes() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let token = h.admin_token();
    assert_eq!(token.len(), 64);
    let file = std::fs::read_to_string(h.data.path().join("admin-token")).unwrap();
    assert_eq!(file.trim(), token, "the token is the data dir's");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(h.data.path().join("admin-token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let none = [("authorization", "")];
    let wrong = [("authorization", "Bearer nope")];
    for path in [
        "/_oceancode/health",
        "/_oceancode/sessions",
        "/_oceancode/tideline",
        "/metrics",
    ] {
        for hs in [&none[..], &wrong[..]] {
            let got = collect(h.send(&h.url(), Method::GET, path, hs, Bytes::new()).await).await;
            assert_eq!(got.status, 401, "{path}: {}", got.text());
            assert_eq!(got.json()["error"]["type"], "authentication_error");
        }
    }
    // A cross-site form can POST text/plain; an admin write must be JSON.
    let bearer = format!("Bearer {token}");
    let set = Bytes::from_static(br#"{"value":"50%"}"#);
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let got = collect(
            h.send(
                &h.url(),
                Method::POST,
                "/_oceancode/tideline",
                &[("authorization", bearer.as_str()), ("content-type", ct)],
                set.clone(),
            )
            .await,
        )
        .await;
        assert_eq!(got.status, 415, "{ct}: {}", got.text());
    }
    let got = collect(
        h.send(
            &h.url(),
            Method::POST,
            "/_oceancode/tideline",
            &[
                ("authorization", bearer.as_str()),
                ("content-type", "application/json; charset=utf-8"),
            ],
            set,
        )
        .await,
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["value"], "50%");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_error_answers_carry_the_proxy_error_header() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    for path in ["/_oceancode/health", "/_oceancode/sessions", "/metrics"] {
        let got = collect(h.send(&h.url(), Method::GET, path, &[], Bytes::new()).await).await;
        assert_eq!(got.status, 200, "{path}");
        assert!(
            got.headers.get("x-oceancode-proxy").is_none(),
            "{path}: {:?}",
            got.headers
        );
    }
    let got = h.admin("/_oceancode/sessions/no-such").await;
    assert_eq!(got["type"], "error");
    let got = collect(
        h.send(&h.url(), Method::GET, "/_oceancode/nope", &[], Bytes::new())
            .await,
    )
    .await;
    assert_eq!(got.status, 404);
    assert_eq!(got.headers["x-oceancode-proxy"], "error");
}

/// A browser pointed at the proxy's address asks for `/` and
/// `/favicon.ico`: answered here, never sent to a provider.
/// A client connection's read buffer is bounded at 32 KiB (100 agents
/// sending their bodies at once each hold one): a request head must fit in
/// it, and one that does not is refused, not buffered further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_must_fit_in_the_32_kib_read_buffer() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let addr = addr_of(&h.url());
    let head = |filler: usize| {
        format!(
            "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nx-filler: {}\r\n\r\n",
            "a".repeat(filler)
        )
        .into_bytes()
    };
    let fits = raw_async(addr.clone(), head(28 << 10)).await;
    assert!(
        fits.starts_with("HTTP/1.1 200"),
        "{}",
        &fits[..fits.len().min(200)]
    );
    let too_long = raw_async(addr.clone(), head(40 << 10)).await;
    assert!(
        too_long.starts_with("HTTP/1.1 431"),
        "{}",
        &too_long[..too_long.len().min(200)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_and_the_favicon_are_answered_here_not_forwarded() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let root = collect(h.send(&h.url(), Method::GET, "/", &[], Bytes::new()).await).await;
    assert_eq!(root.status, 200, "{}", root.text());
    assert!(root.text().contains("/_oceancode/ui/"), "{}", root.text());
    assert!(
        root.text().contains("oceancode-proxy ui"),
        "{}",
        root.text()
    );
    let head = collect(h.send(&h.url(), Method::HEAD, "/", &[], Bytes::new()).await).await;
    assert_eq!(head.status, 200);
    let icon = collect(
        h.send(&h.url(), Method::GET, "/favicon.ico", &[], Bytes::new())
            .await,
    )
    .await;
    assert_eq!(icon.status, 404);
    assert!(h.fake.requests().is_empty(), "nothing reached the upstream");
    // Other paths still pass through.
    let models = collect(
        h.send(&h.url(), Method::GET, "/v1/models", &[], Bytes::new())
            .await,
    )
    .await;
    assert_ne!(models.status, 0);
    assert_eq!(h.fake.requests().len(), 1, "/v1/models is forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listen_address_needs_allow_remote() {
    let fake = oceancode_fakeup::FakeUpstream::start(FakeConfig::default())
        .await
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut opts = oceancode_tests::options(&fake.url(), data.path());
    opts.listen = "0.0.0.0:0".parse().unwrap();
    let e = oceancode_proxy::runtime::start(opts.clone())
        .await
        .err()
        .expect("refused without allow_remote");
    assert!(e.to_string().contains("--allow-remote"), "{e}");
    opts.listen = "[::]:0".parse().unwrap();
    assert!(oceancode_proxy::runtime::start(opts.clone()).await.is_err());
    // Allowed: it serves, and the admin API still needs the token.
    opts.listen = "0.0.0.0:0".parse().unwrap();
    opts.front.access.allow_remote = true;
    let p = oceancode_proxy::runtime::start(opts).await.expect("starts");
    let port = p.addr.port();
    let got = raw_async(
        format!("127.0.0.1:{port}"),
        format!("GET /_oceancode/sessions HTTP/1.1\r\nhost: 10.1.2.3:{port}\r\nconnection: close\r\n\r\n").into_bytes(),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 401"), "{got}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_star_is_answered_here_and_dot_segments_are_refused() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let addr = addr_of(&h.url());
    let got = raw_async(
        addr.clone(),
        format!("OPTIONS * HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").into_bytes(),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("allow: get, post, options"),
        "{got}"
    );
    for path in [
        "/../../admin/secret",
        "/v1/../../admin/secret",
        "/s/x/../../admin",
        "/v1/%2e%2e/admin",
        "/v1/messages/..",
    ] {
        let got = raw_async(
            addr.clone(),
            format!(
                "POST {path} HTTP/1.1\r\nhost: {addr}\r\nx-api-key: k\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            )
            .into_bytes(),
        )
        .await;
        assert!(got.starts_with("HTTP/1.1 400"), "{path}: {got}");
        assert!(got.contains("dot-segment"), "{path}: {got}");
    }
    assert_eq!(h.fake.request_count(), 0, "nothing was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_with_a_repeated_top_level_key_is_forwarded_untouched_and_not_recorded() {
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    // The ledger would record the first conversation; an upstream that takes
    // the last key sees the second.
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"recorded?"}],"messages":[{"role":"user","content":"what the upstream sees"}]}"#;
    // (The fake upstream refuses the repeat itself; the real ones may not.)
    let _ = h.post("/v1/messages", &[], body).await;
    let seen = h.fake.requests();
    assert_eq!(
        seen[0].body,
        Bytes::from_static(body.as_bytes()),
        "untouched"
    );
    h.settle().await;
    assert!(
        h.proxy().app.sessions.sessions().is_empty(),
        "no session recorded from a body the upstream reads otherwise"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_provider_error_is_relayed_unchanged() {
    let big = format!(
        "{{\"type\":\"error\",\"error\":{{\"type\":\"invalid_request_error\",\"message\":\"{}\"}}}}",
        "x".repeat(3 << 20)
    );
    for status in [400u16, 413] {
        let replay = Replay::start(
            status,
            vec![("content-type", "application/json".into())],
            big.as_bytes()
                .chunks(64 << 10)
                .map(|c| (Duration::ZERO, Bytes::copy_from_slice(c)))
                .collect(),
        )
        .await;
        let url = replay.url();
        let h = Harness::start(FakeConfig::default(), move |o| {
            o.front.anthropic_upstream = url;
        })
        .await;
        let got = h
            .post(
                "/v1/messages",
                &[("x-api-key", "k")],
                anthropic_body(false, "hi"),
            )
            .await;
        assert_eq!(got.status, status, "not a 502");
        assert!(got.headers.get("x-oceancode-proxy").is_none());
        assert_eq!(got.body.len(), big.len());
        assert!(got.body == big.as_bytes(), "byte for byte");
    }
}

/// An upstream that answers with a chunked SSE head and `first`, then
/// closes the connection mid-body.
async fn resetting_upstream(first: &'static [u8]) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 16];
                let mut got = Vec::new();
                // Read the request head and its body (Content-Length).
                loop {
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await;
                let _ = s
                    .write_all(format!("{:x}\r\n", first.len()).as_bytes())
                    .await;
                let _ = s.write_all(first).await;
                let _ = s.write_all(b"\r\n").await;
                let _ = s.flush().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Cut: close without the last chunk.
                drop(s);
            });
        }
    });
    format!("http://{addr}")
}

const MESSAGE_START: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude-sonnet-4-5\",\"content\":[],\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n";

/// SSE events of `body`, as (event, data JSON).
fn events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for l in e.lines() {
                if let Some(v) = l.strip_prefix("event: ") {
                    name = v.to_string();
                } else if let Some(v) = l.strip_prefix("data: ") {
                    data = v.to_string();
                }
            }
            (
                name,
                serde_json::from_str(&data).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_way_ends_with_the_dialects_error_event() {
    // A silent upstream (idle timeout): Anthropic's overloaded_error.
    let replay = Replay::start(
        200,
        vec![("content-type", "text/event-stream".into())],
        vec![
            (Duration::ZERO, Bytes::from_static(MESSAGE_START)),
            (
                Duration::from_secs(10),
                Bytes::from_static(b"event: ping\ndata: {}\n\n"),
            ),
        ],
    )
    .await;
    let url = replay.url();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = url;
        o.front.idle_stream_timeout = Duration::from_millis(300);
    })
    .await;
    let got = h
        .post("/v1/messages", &[], anthropic_body(true, "hi"))
        .await;
    let ev = events(&got.text());
    assert_eq!(ev[0].0, "message_start", "{}", got.text());
    let (name, data) = ev.last().unwrap();
    assert_eq!(name, "error", "{}", got.text());
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["type"], "overloaded_error", "{data}");
    assert!(data["error"]["message"].as_str().unwrap().contains("idle"));

    // An upstream reset: api_error (Anthropic), an error chunk (Chat), an
    // error event (Responses).
    let up = resetting_upstream(MESSAGE_START).await;
    let u2 = up.clone();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = u2.clone();
        o.front.openai_upstream = u2;
    })
    .await;
    let got = h
        .post("/v1/messages", &[], anthropic_body(true, "hi"))
        .await;
    let ev = events(&got.text());
    assert_eq!(ev.last().unwrap().0, "error", "{}", got.text());
    assert_eq!(ev.last().unwrap().1["error"]["type"], "api_error");
    let chat = serde_json::json!({"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}).to_string();
    let got = h.post("/v1/chat/completions", &[], chat).await;
    let ev = events(&got.text());
    let last = &ev.last().unwrap().1;
    assert_eq!(
        last["error"]["code"],
        "stream_interrupted",
        "{}",
        got.text()
    );
    assert_eq!(last["error"]["type"], "server_error");
    let resp = serde_json::json!({"model":"gpt-4o-mini","stream":true,"input":[{"role":"user","content":"hi"}]}).to_string();
    let got = h.post("/v1/responses", &[], resp).await;
    let ev = events(&got.text());
    let (name, last) = ev.last().unwrap();
    assert_eq!(name, "error", "{}", got.text());
    assert_eq!(last["type"], "error");
    assert_eq!(last["code"], "stream_interrupted");
    let m = collect(
        h.send(&h.url(), Method::GET, "/metrics", &[], Bytes::new())
            .await,
    )
    .await
    .text();
    assert!(m.contains("\noceancode_streams_cut_total 3\n"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_in_flight_share_a_budget_and_grow_with_what_arrives() {
    let h = Harness::start(FakeConfig::default(), |o| {
        o.front.max_body_bytes = 2 << 20;
        o.front.net.max_bodies_in_flight_bytes = 2 << 20;
    })
    .await;
    let addr = addr_of(&h.url());
    let budget = || h.proxy().app.bodies.in_use();
    let settle_at = |want: u64| async move {
        eventually_async(Duration::from_secs(5), "the budget in use", || {
            let got = budget();
            std::future::ready(if got == want { Ok(got) } else { Err(got) })
        })
        .await
    };
    // Heads that announce 2 MiB and send one byte reserve one growth step each.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{",
            2 << 20
        )
        .unwrap();
        held.push(s);
    }
    assert_eq!(
        settle_at(8 * (64 << 10)).await,
        8 * (64 << 10),
        "a Content-Length reserves nothing past the first growth step"
    );
    // A body that sends 1.5 MiB of its 2 MiB no longer fits: it takes the
    // overdraft (one body at a time may go past the budget).
    let mut big = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        big,
        "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{",
        2 << 20
    )
    .unwrap();
    big.write_all(&vec![b' '; 3 << 19]).unwrap();
    assert_eq!(
        settle_at(8 * (64 << 10) + (2 << 20)).await,
        8 * (64 << 10) + (2 << 20)
    );
    // Another whole body waits (its connection is not read) instead of
    // being refused, and goes through once bytes are given back.
    let pad = "lorem ipsum ".repeat(((2 << 20) - 200) / 12);
    let body = anthropic_body(false, &pad);
    let waiting = {
        let url = h.url();
        let body = body.clone();
        tokio::spawn(async move { post_raw(&url, body).await })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!waiting.is_finished(), "a body that does not fit waits");
    assert!(
        budget() <= (2 << 20) + (2 << 20),
        "within the budget plus one body"
    );
    drop(big);
    drop(held);
    let status = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting body goes through")
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(settle_at(0).await, 0, "everything is given back");
    let got = h.post("/v1/messages", &[], body).await;
    assert_eq!(got.status, 200, "{}", got.text());
}

/// POST `body` to `url`'s `/v1/messages` over a plain connection; the status.
async fn post_raw(url: &str, body: String) -> u16 {
    let addr = addr_of(url);
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body.as_bytes()).unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_bodies_and_idle_connections_are_closed() {
    let h = Harness::start(FakeConfig::default(), |o| {
        o.front.net.conn.header_read_timeout = Duration::from_millis(300);
        o.front.net.conn.keepalive_timeout = Duration::from_millis(600);
        o.front.net.body_read_timeout = Duration::from_millis(400);
    })
    .await;
    let addr = addr_of(&h.url());
    // Closed (an end of stream, or a reset for bytes the server left
    // unread) within `d`, rather than still open when the read times out.
    let closed_within = |mut s: std::net::TcpStream, d: Duration| -> bool {
        s.set_read_timeout(Some(d)).unwrap();
        let mut sink = Vec::new();
        match s.read_to_end(&mut sink) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        }
    };
    // A head that never ends (slowloris): closed after the header timeout.
    let a = addr.clone();
    let slow_head = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&a).unwrap();
        s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")
            .unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(100));
            let _ = s.write_all(b"x-slow: 1\r\n");
        }
        (closed_within(s, Duration::from_secs(3)), t0.elapsed())
    });
    // A body that trickles: 408 after the body timeout.
    let a = addr.clone();
    let slow_body = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&a).unwrap();
        write!(s, "POST /v1/messages HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    });
    // A connection that never sends a byte: closed after the header
    // timeout (its first request's head is timed from the opening).
    let a = addr.clone();
    let silent = tokio::task::spawn_blocking(move || {
        let s = std::net::TcpStream::connect(&a).unwrap();
        let t0 = Instant::now();
        (closed_within(s, Duration::from_secs(3)), t0.elapsed())
    });
    // An idle keep-alive connection, after one request: closed after the
    // keep-alive timeout.
    let a = addr.clone();
    let idle = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&a).unwrap();
        let body = anthropic_body(false, "hi");
        write!(
            s,
            "POST /v1/messages HTTP/1.1\r\nhost: {a}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let t0 = Instant::now();
        (closed_within(s, Duration::from_secs(3)), t0.elapsed())
    });
    let (closed, t) = slow_head.await.unwrap();
    assert!(closed, "the slow head's connection was closed");
    assert!(t < Duration::from_secs(2), "{t:?}");
    let answer = slow_body.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_read_timeout_ms"), "{answer}");
    let (closed, t) = silent.await.unwrap();
    assert!(closed, "the silent connection was closed");
    assert!(
        t < Duration::from_millis(550),
        "after the header timeout, not the keep-alive one: {t:?}"
    );
    let (closed, t) = idle.await.unwrap();
    assert!(closed, "the idle connection was closed");
    assert!(
        t >= Duration::from_millis(500),
        "not before the keep-alive timeout: {t:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_answer_outlives_the_connection_timers() {
    // Pauses longer than the keep-alive and header timeouts inside one answer.
    let chunks = (0..4)
        .map(|i| {
            (
                Duration::from_millis(if i == 0 { 0 } else { 400 }),
                Bytes::from(if i == 0 {
                    MESSAGE_START.to_vec()
                } else {
                    b"event: ping\ndata: {\"type\":\"ping\"}\n\n".to_vec()
                }),
            )
        })
        .collect();
    let replay = Replay::start(
        200,
        vec![("content-type", "text/event-stream".into())],
        chunks,
    )
    .await;
    let url = replay.url();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = url;
        o.front.net.conn.header_read_timeout = Duration::from_millis(150);
        o.front.net.conn.keepalive_timeout = Duration::from_millis(150);
    })
    .await;
    let got = h
        .post("/v1/messages", &[], anthropic_body(true, "hi"))
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.text().matches("event: ping").count(),
        3,
        "{}",
        got.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_request_to_end() {
    // Two slots, both with a request in flight (the upstream answers after
    // 1.5 s): a third connection's request waits until one of them ends.
    let slow = oceancode_fakeup::Script::always(oceancode_fakeup::Reply {
        delay_first_ms: 1500,
        ..Default::default()
    });
    let h = Harness::start(FakeConfig::default().with_script(slow), |o| {
        o.front.net.conn.max_connections = 2;
    })
    .await;
    let addr = addr_of(&h.url());
    let body = anthropic_body(false, "hi");
    let req = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes();
    let t0 = Instant::now();
    let busy: Vec<_> = (0..2)
        .map(|_| tokio::spawn(raw_async(addr.clone(), req.clone())))
        .collect();
    // Both are in flight once the upstream saw them.
    eventually_async(
        Duration::from_secs(5),
        "the two requests reached the upstream",
        || std::future::ready(h.fake.request_count() >= 2),
    )
    .await;
    // A health check is answered at once all the same (a reserved place).
    let token = h.proxy().app.admin_token.clone();
    let health = raw_async(
        addr.clone(),
        format!("GET /_oceancode/health HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n").into_bytes(),
    )
    .await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        h.fake.request_count() == 2 && t0.elapsed() < Duration::from_millis(800),
        "while both requests are in flight: {:?}",
        t0.elapsed()
    );
    let got = raw_async(addr.clone(), req.clone()).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "served after a slot's request ended: {:?}",
        t0.elapsed()
    );
    for b in busy {
        assert!(b.await.unwrap().starts_with("HTTP/1.1 200"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_at_the_cap_give_way_to_a_health_check() {
    // Long timers: only closing idle connections for new ones can serve it.
    let h = Harness::start(FakeConfig::default(), |o| {
        o.front.net.conn.max_connections = 64;
        o.front.net.conn.header_read_timeout = Duration::from_secs(30);
        o.front.net.conn.keepalive_timeout = Duration::from_secs(90);
    })
    .await;
    let addr = addr_of(&h.url());
    // 600 sockets that never send a byte (closed when the test ends).
    let a = addr.clone();
    let idle = tokio::task::spawn_blocking(move || {
        (0..600)
            .map(|_| std::net::TcpStream::connect(&a).unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    eventually_async(
        Duration::from_secs(5),
        "the idle sockets fill the slots",
        || std::future::ready(h.proxy().app.metrics.connections.load(Ordering::Relaxed) >= 64),
    )
    .await;
    let t0 = Instant::now();
    let token = h.proxy().app.admin_token.clone();
    let got = raw_async(
        addr.clone(),
        format!("GET /_oceancode/health HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\nconnection: close\r\n\r\n").into_bytes(),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "answered at once: {:?}",
        t0.elapsed()
    );
    let open = h.proxy().app.metrics.connections.load(Ordering::Relaxed);
    assert!(
        open <= 64,
        "idle sockets made room, took no reserved place: {open}"
    );
    drop(idle);
}

/// A plain upstream that counts its open connections.
async fn counting_upstream() -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let open = Arc::new(AtomicUsize::new(0));
    let o = open.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let o = o.clone();
            o.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(Bytes::from_static(b"{}")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
                o.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (url, open)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_are_closed_after_the_pool_timeout() {
    let (up, open) = counting_upstream().await;
    let u = up.clone();
    let h = Harness::start(FakeConfig::default(), move |o| {
        o.front.anthropic_upstream = u.clone();
        o.front.openai_upstream = u;
        o.upstream.pool_idle_timeout = Duration::from_millis(300);
    })
    .await;
    // Passthrough requests, some at once: several pooled connections.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let url = h.url();
        tasks.push(tokio::spawn(async move {
            let c = oceancode_tests::client();
            let req = http::Request::get(format!("{url}/v1/models"))
                .body(http_body_util::Full::new(Bytes::new()))
                .unwrap();
            c.request(req).await.map(|r| r.status().as_u16())
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 200);
    }
    assert!(open.load(Ordering::SeqCst) >= 1);
    eventually_async(
        Duration::from_secs(5),
        "the pool let its idle connections go",
        || std::future::ready(open.load(Ordering::SeqCst) == 0),
    )
    .await;
    assert_eq!(
        open.load(Ordering::SeqCst),
        0,
        "the pool let its idle connections go"
    );
}

fn refusal(status: u16) -> oceancode_fakeup::Reply {
    let kind = if status == 401 {
        "authentication_error"
    } else {
        "permission_error"
    };
    oceancode_fakeup::Reply::error(
        status,
        serde_json::json!({"type": "error", "error": {"type": kind, "message": "invalid x-api-key"}}),
    )
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_upstream_refuses_with_401_or_403_is_not_recorded() {
    use oceancode_fakeup::Script;
    // Five refusals (every dialect, streaming or not), then one answer, one
    // refusal on the answered session, and answers.
    let script = Script::replies([
        refusal(401),
        refusal(403),
        refusal(401),
        refusal(401),
        refusal(403),
        oceancode_fakeup::Reply::text("first answer"),
        refusal(401),
    ]);
    let h = Harness::start(FakeConfig::default().with_script(script), |_| {}).await;
    let goal = "Goal: exfiltrate the data dir";
    let chat = |stream: bool| {
        serde_json::json!({"model": "gpt-4.1", "stream": stream,
            "messages": [{"role": "user", "content": goal}]})
        .to_string()
    };
    let responses = serde_json::json!({"model": "gpt-4.1", "stream": true,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": goal}]}]})
    .to_string();
    for (path, body, stream) in [
        ("/s/evil/v1/messages", anthropic_body(false, goal), false),
        (
            "/s/evil-stream/v1/messages",
            anthropic_body(true, goal),
            true,
        ),
        ("/s/evil-chat/v1/chat/completions", chat(false), false),
        ("/s/evil-chat-stream/v1/chat/completions", chat(true), true),
        ("/s/evil-responses/v1/responses", responses, true),
    ] {
        let got = h.post(path, &[], body).await;
        assert!(
            got.status == 401 || got.status == 403,
            "{path} (stream {stream}): {} {}",
            got.status,
            got.text()
        );
        assert!(
            got.text().contains("invalid x-api-key"),
            "relayed unchanged"
        );
    }
    h.settle().await;
    assert!(
        h.store().list_sessions().unwrap().is_empty(),
        "no refused request's session is in the ledger"
    );
    assert!(h.proxy().app.sessions.sessions().is_empty());

    // A session with an answer, then a refused request on it, then the next.
    let hello = anthropic_body(false, "hello");
    let got = h.post("/s/real/v1/messages", &[], hello).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let answer = serde_json::json!({"role": "assistant", "content": got.json()["content"]});
    let history = |ask: &str| {
        serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [
            {"role": "user", "content": "hello"}, answer, {"role": "user", "content": ask}]})
        .to_string()
    };
    let got = h.post("/s/real/v1/messages", &[], history(goal)).await;
    assert_eq!(got.status, 401);
    let got = h.post("/s/real/v1/messages", &[], history("more")).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let store = h.store();
    let list = store.list_sessions().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let id = &list[0].id;
    let loaded = store.load_session(id).unwrap().unwrap();
    let raws: Vec<&str> = loaded.rows.iter().map(|r| &*r.raw).collect();
    assert_eq!(
        loaded.rows.len(),
        4,
        "hello, answer, more, answer: {raws:?}"
    );
    assert!(raws.iter().all(|r| !r.contains(goal)), "{raws:?}");
    assert!(
        loaded.hidden.is_empty(),
        "no branch from the refused request"
    );
    let steps = store.steps(id).unwrap();
    let numbered: Vec<(u32, u16)> = steps.iter().map(|s| (s.step, s.status)).collect();
    assert_eq!(
        numbered,
        vec![(1, 200), (2, 200)],
        "the refused step is not one"
    );
    for f in files_under(&h.data.path().join("sessions")) {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        assert!(!text.contains("exfiltrate"), "{}: {text}", f.display());
    }
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("oceancode_refused_requests_total 6"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_still_records_the_clients_rows_and_a_failed_step() {
    use oceancode_fakeup::Script;
    let body = serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
    let script = Script::replies([oceancode_fakeup::Reply::error(529, body)]);
    let h = Harness::start(FakeConfig::default().with_script(script), |_| {}).await;
    let got = h
        .post("/s/busy/v1/messages", &[], anthropic_body(true, "hello"))
        .await;
    assert_eq!(got.status, 529);
    h.settle().await;
    let store = h.store();
    let list = store.list_sessions().unwrap();
    assert_eq!(list.len(), 1);
    let loaded = store.load_session(&list[0].id).unwrap().unwrap();
    assert_eq!(loaded.rows.len(), 1, "the client's ask is recorded");
    let steps = store.steps(&list[0].id).unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, 529);
    assert_eq!(steps[0].error.as_deref(), Some("upstream_error"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_upstream_fails_is_recorded_with_its_status_and_why() {
    // A port nothing listens on: connection refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    // An upstream that never answers: the header timeout.
    let silent = Replay::start_with_head_delay(Duration::from_secs(30), 200, vec![], vec![]).await;
    let silent_url = silent.url();
    let h = Harness::start(FakeConfig::default(), |o| {
        o.front.anthropic_upstream = dead.clone();
        o.front.openai_upstream = silent_url.clone();
        o.upstream.header_timeout = Duration::from_millis(300);
    })
    .await;
    let got = h
        .post("/s/dead/v1/messages", &[], anthropic_body(true, "hello"))
        .await;
    assert_eq!(got.status, 502, "{}", got.text());
    let chat = serde_json::json!({"model": "gpt-4.1",
        "messages": [{"role": "user", "content": "hello"}]})
    .to_string();
    let got = h.post("/s/slow/v1/chat/completions", &[], chat).await;
    assert_eq!(got.status, 504, "{}", got.text());
    h.settle().await;
    let store = h.store();
    let mut seen = Vec::new();
    for s in store.list_sessions().unwrap() {
        let steps = store.steps(&s.id).unwrap();
        assert_eq!(steps.len(), 1, "{steps:?}");
        seen.push((steps[0].status, steps[0].error.clone().unwrap_or_default()));
        let rows = store.load_session(&s.id).unwrap().unwrap().rows;
        assert_eq!(rows.len(), 1, "the client's ask is recorded");
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (502, "upstream_unreachable".to_string()),
            (504, "upstream_timeout".to_string())
        ]
    );
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("oceancode_failed_steps_total 2"),
        "{metrics}"
    );
    // The live meter shows them.
    let sessions = h.admin("/_oceancode/sessions").await;
    let text = sessions.to_string();
    assert!(text.contains("\"failed_steps\":1"), "{text}");
    assert!(text.contains("upstream_unreachable"), "{text}");
}

/// `POST /_oceancode/tideline` with `body`: the status and the answer.
async fn set_line(h: &Harness, body: serde_json::Value) -> (u16, serde_json::Value) {
    let bearer = format!("Bearer {}", h.admin_token());
    let got = collect(
        h.send(
            &h.url(),
            Method::POST,
            "/_oceancode/tideline",
            &[
                ("authorization", bearer.as_str()),
                ("content-type", "application/json"),
            ],
            Bytes::from(body.to_string()),
        )
        .await,
    )
    .await;
    (got.status.as_u16(), got.json())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percentage_that_resolves_under_the_20k_floor_is_refused() {
    // D18 (issue 33, item 5): `tideline 0.0001%` gave a 1-token line.
    let h = Harness::start(FakeConfig::default(), |_| {}).await;
    let body = Bytes::from(anthropic_body(false, "hi"));
    let got = h
        .post(
            "/v1/messages",
            &[("x-oceancode-session", "floor")],
            body.clone(),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let id = h.proxy().app.sessions.sessions()[0].id.clone();
    // Under the floor on any model, with or without a session.
    for body in [
        serde_json::json!({"value": "0.0001%"}),
        serde_json::json!({"session": id, "value": "0.0001%"}),
    ] {
        let (status, v) = set_line(&h, body).await;
        assert_eq!(status, 400, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("20k-token floor"),
            "{v}"
        );
    }
    // 5% of claude-sonnet-4-5's 200k window is 10k: under the floor there,
    // for the session and for all sessions (it is one of them).
    for body in [
        serde_json::json!({"session": id, "value": "5%"}),
        serde_json::json!({"value": "5%"}),
    ] {
        let (status, v) = set_line(&h, body).await;
        assert_eq!(status, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("under the 20000-token floor") && msg.contains("at least 10%"),
            "{v}"
        );
    }
    let (status, v) = set_line(&h, serde_json::json!({"session": id, "value": "10%"})).await;
    assert_eq!(status, 200, "{v}");
    let got = h
        .post("/v1/messages", &[("x-oceancode-session", "floor")], body)
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let s = h.admin(&format!("/_oceancode/sessions/{id}")).await;
    assert_eq!(s["meter"]["line"], 20_000, "{s}");
}
