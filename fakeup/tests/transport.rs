//! Timing, gzip, h2c, concurrency, aborted streams, and the binary.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream, Reply, Script};
use oceancode_testkit::eventually;
use serde_json::{json, Value};

async fn fake(cfg: FakeConfig) -> FakeHandle {
    FakeUpstream::start(cfg).await.expect("start")
}

fn req() -> Value {
    json!({"model": "claude-opus-5-5", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "hello"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_are_measurable() {
    let f = fake(FakeConfig::default().with_script(Script::replies([
        Reply::text("one two three").delay_first(300),
        Reply::text("a").chunk_delay(120),
    ])))
    .await;
    let r = post(&f.url(), "/v1/messages", &req()).await;
    let ttfb = r.head_at - r.sent_at;
    assert!(ttfb >= Duration::from_millis(290), "{ttfb:?}");

    let r = post(&f.url(), "/v1/messages", &req()).await;
    let n = r.events().len();
    assert_eq!(n, 7);
    // Frames arrive one per event, each at least ~chunk_delay after the previous one.
    assert_eq!(r.frames.len(), n);
    for w in r.frames.windows(2) {
        let gap = w[1].0 - w[0].0;
        assert!(gap >= Duration::from_millis(60), "gap {gap:?}");
    }
    let total = r.frames[n - 1].0 - r.frames[0].0;
    assert!(
        total >= Duration::from_millis(120 * (n as u64 - 1) - 50),
        "{total:?}"
    );
    // The head arrived well before the last event.
    assert!(r.frames[n - 1].0 - r.head_at >= Duration::from_millis(600));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_streams_and_bodies() {
    let f = fake(
        FakeConfig::default()
            .with_gzip(true)
            .with_script(Script::always(
                Reply::text("compressed words here").chunk_delay(20),
            )),
    )
    .await;
    let c = client();
    let url = format!("{}/v1/messages", f.url());
    let body = serde_json::to_vec(&req()).unwrap();
    let r = send_with(
        &c,
        http::Method::POST,
        &url,
        &[("accept-encoding", "gzip, deflate, br, zstd")],
        body.clone(),
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    // The first frame alone decompresses to the first event (per-frame flush).
    let mut dec = flate2::write::GzDecoder::new(Vec::new());
    dec.write_all(&r.frames[0].1).unwrap();
    dec.flush().unwrap();
    let first = String::from_utf8(dec.get_ref().clone()).unwrap();
    assert!(first.starts_with("event: message_start\n"), "{first}");
    // The whole body is one valid gzip stream.
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&r.body()[..])
        .read_to_string(&mut plain)
        .unwrap();
    let ev = parse_sse(&plain);
    assert_eq!(ev.last().unwrap().0.as_deref(), Some("message_stop"));
    assert!(r.frames.len() >= ev.len());

    // Not accepted: identity.
    let r = send_with(
        &c,
        http::Method::POST,
        &url,
        &[("accept-encoding", "identity")],
        body.clone(),
    )
    .await;
    assert!(r.header("content-encoding").is_none());
    assert_eq!(r.event_names().last().unwrap(), "message_stop");

    // Non-streaming JSON is compressed too.
    let mut nb = req();
    nb["stream"] = json!(false);
    let r = send_with(
        &c,
        http::Method::POST,
        &url,
        &[("accept-encoding", "zstd,gzip")],
        serde_json::to_vec(&nb).unwrap(),
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&r.body()[..])
        .read_to_string(&mut plain)
        .unwrap();
    let j: Value = serde_json::from_str(&plain).unwrap();
    assert_eq!(j["content"][0]["text"], "compressed words here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge() {
    let f = fake(FakeConfig::default()).await;
    let c = h2c_client();
    let r = send_with(
        &c,
        http::Method::POST,
        &format!("{}/v1/messages", f.url()),
        &[],
        serde_json::to_vec(&req()).unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.version, http::Version::HTTP_2);
    assert_eq!(r.event_names().last().unwrap(), "message_stop");
    assert_eq!(f.requests()[0].version, http::Version::HTTP_2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_streams() {
    let f = fake(
        FakeConfig::default().with_script(Script::always(Reply::text("x y z").chunk_delay(10))),
    )
    .await;
    let url = f.url();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            // a fresh client per task = a fresh connection
            let mut body = req();
            body["messages"][0]["content"] = json!(format!("hello {i}"));
            send_with(
                &client(),
                http::Method::POST,
                &format!("{url}/v1/messages"),
                &[],
                serde_json::to_vec(&body).unwrap(),
            )
            .await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.event_names().last().unwrap(), "message_stop");
    }
    assert_eq!(f.request_count(), 64);
    assert!(started.elapsed() < Duration::from_secs(10));
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_stream_breaks_the_body() {
    let f = fake(FakeConfig::default().with_script(Script::replies([
        Reply::text("partial answer").abort_after(3),
    ])))
    .await;
    let r = post(&f.url(), "/v1/messages", &req()).await;
    assert_eq!(r.status, 200);
    assert!(r.body_error);
    assert!(r.text().contains("message_start"));
    assert!(!r.text().contains("message_stop"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_script_changes_and_waiting() {
    let f = fake(FakeConfig::default()).await;
    f.set_script(Script::replies([Reply::text("first")]));
    f.push_reply(Reply::text("second"));
    assert_eq!(f.replies_left(), 2);
    let url = f.url();
    let t = tokio::spawn(async move {
        let mut nb = req();
        nb["stream"] = json!(false);
        let a = post(&url, "/v1/messages", &nb).await.json();
        let b = post(&url, "/v1/messages", &nb).await.json();
        (
            a["content"][0]["text"].clone(),
            b["content"][0]["text"].clone(),
        )
    });
    let got = f
        .wait_for_requests(2, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(t.await.unwrap(), (json!("first"), json!("second")));
    assert!(got[0].received_at <= got[1].received_at);
    f.clear();
    assert!(f.requests().is_empty());
    assert!(f
        .wait_for_requests(1, Duration::from_millis(50))
        .await
        .is_err());
}

#[test]
fn background_runtime_for_sync_callers() {
    let f = FakeUpstream::start_background(FakeConfig::default()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(post(&f.url(), "/v1/messages", &req()));
    assert_eq!(r.status, 200);
    assert!(FakeUpstream::start_background(
        FakeConfig::default().with_listen("0.0.0.0:0".parse().unwrap())
    )
    .is_err());
}

#[test]
fn binary_prints_url_serves_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("fakeup-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("script.json");
    std::fs::write(&script, r#"[{"text": "from the script file"}]"#).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_oceancode-fakeup"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--max-context",
            "100000",
            "--gzip",
            "--script",
        ])
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line")
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut nb = req();
    nb["stream"] = json!(false);
    let r = rt.block_on(post(&url, "/v1/messages", &nb));
    assert_eq!(r.json()["content"][0]["text"], "from the script file");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = eventually(Duration::from_secs(10), "a stop on SIGTERM", || {
        child.try_wait().unwrap()
    });
    assert!(exit.success(), "{exit:?}");

    let out = Command::new(env!("CARGO_BIN_EXE_oceancode-fakeup"))
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("non-loopback"));
    let _ = std::fs::remove_dir_all(dir);
}
