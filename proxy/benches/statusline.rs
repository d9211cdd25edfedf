//! Criterion benchmark of `oceancode-proxy statusline` as Claude Code runs
//! it on every refresh: a new process that reads the JSON on stdin, finds
//! the running proxy in the data dir's registry (its proof, then its
//! sessions) and prints one line. A real `serve` (a child process, against
//! the fake upstream) holds one Claude Code session.
//!
//! `cargo bench -p oceancode-proxy --bench statusline` (not part of `cargo test`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench: failures panic

use criterion::{criterion_group, criterion_main, Criterion};
use oceancode_fakeup::{FakeConfig, FakeUpstream};
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_oceancode-proxy");
const SESSION: &str = "0b5c6f1e-bench-4c1a-9f2e-statusline01";

/// One statusline run: the line it printed.
fn statusline(data: &std::path::Path) -> String {
    let mut child = Command::new(BIN)
        .args(["--data-dir", data.to_str().unwrap(), "statusline"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let json = format!(
        r#"{{"session_id":"{SESSION}","model":{{"id":"claude-x","display_name":"X"}},"workspace":{{"current_dir":"/tmp"}}}}"#
    );
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// One Anthropic request through the proxy at `addr` (plain HTTP/1.1).
fn one_request(addr: &str) {
    let body =
        r#"{"model":"claude-x","max_tokens":100,"messages":[{"role":"user","content":"hello"}]}"#;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/messages HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\nx-claude-code-session-id: {SESSION}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let fake = rt
        .block_on(FakeUpstream::start(FakeConfig::default()))
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut serve = Command::new(BIN)
        .args([
            "--data-dir",
            data.path().to_str().unwrap(),
            "serve",
            "--listen",
            &addr,
        ])
        .args(["--anthropic-upstream", &fake.url()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "serve did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    one_request(&addr);
    let line = statusline(data.path());
    assert!(
        line.starts_with("oceancode ") && line.contains(" cuts"),
        "{line}"
    );
    c.bench_function("statusline: process, registry, one session", |b| {
        b.iter(|| statusline(data.path()))
    });
    let _ = serve.kill();
    let _ = serve.wait();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(50).measurement_time(Duration::from_secs(10));
    targets = bench
}
criterion_main!(benches);
