//! Crash safety of the verbatim ledger, at the binary level.
//!
//! A real `oceancode-proxy serve` process takes a burst of concurrent,
//! growing Anthropic conversations (streamed and not) and is SIGKILLed in the
//! middle of it. What is on disk must be, for every session, a gap-free,
//! in-order prefix of what its client sent. A restarted proxy on the same
//! data dir must then let each client's full resend heal its session: every
//! message verbatim, in order, gap-free, with no spurious branch.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)] // a test: failures panic; libc calls

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream, Reply, Script};
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_ledger::store::{LoadedSession, Store, StoreOptions};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{exited, serve, Served};
use oceancode_testkit::eventually_async;

const SESSIONS: usize = 8;
/// Completed requests (over all clients) before the SIGKILL.
const KILL_AFTER: usize = 40;

type Http = Client<HttpConnector, Full<Bytes>>;

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One user message, hand-written JSON with odd spacing, `\u` escapes and
/// non-ASCII text: the ledger must keep these bytes exactly.
fn user_msg(session: usize, turn: usize) -> String {
    let filler = "lorem ipsum dolor sit amet ".repeat(20 + (session * 7 + turn * 13) % 60);
    match turn % 3 {
        0 => format!(
            r#"{{"role":"user","content":[{{"type":"text","text":"s{session} turn {turn}: caf\u00e9 ✓ {filler}"}}]}}"#
        ),
        _ => format!(
            r#"{{"role": "user",  "content": "s{session} turn {turn}: na\u00efve — {filler}"}}"#
        ),
    }
}

/// How a client echoes the assistant's answer back. Even sessions use the
/// same bytes the proxy records (serde_json, sorted keys); odd sessions use
/// their own spelling, so the proxy must confirm (rewrite) the row.
fn echo(session: usize, content: &Value) -> String {
    match session % 2 {
        0 => json!({"role": "assistant", "content": content}).to_string(),
        _ => format!(r#"{{"role": "assistant", "content": {content}}}"#),
    }
}

fn body(msgs: &[String], stream: bool) -> String {
    format!(
        r#"{{"model":"claude-test","max_tokens":256,"stream":{stream},"messages":[{}]}}"#,
        msgs.join(",")
    )
}

/// Assistant content blocks reassembled from an Anthropic SSE stream.
fn content_from_sse(text: &str) -> Result<Value, String> {
    let mut blocks: Vec<Value> = Vec::new();
    let mut stopped = false;
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data:") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
            continue;
        };
        let idx = v["index"].as_u64().unwrap_or(0) as usize;
        match v["type"].as_str() {
            Some("content_block_start") => {
                if blocks.len() <= idx {
                    blocks.resize(idx + 1, Value::Null);
                }
                blocks[idx] = v["content_block"].clone();
            }
            Some("content_block_delta") => {
                let b = blocks.get_mut(idx).ok_or("delta before start")?;
                if let Some(t) = v["delta"]["text"].as_str() {
                    let cur = b["text"].as_str().unwrap_or("").to_string();
                    b["text"] = Value::String(cur + t);
                }
            }
            Some("message_stop") => stopped = true,
            _ => {}
        }
    }
    if !stopped || blocks.is_empty() {
        return Err(format!("incomplete stream: {text}"));
    }
    Ok(Value::Array(blocks))
}

/// Send one request; Ok(assistant content) when it completed.
async fn send(
    client: &Http,
    url: &str,
    session: usize,
    msgs: &[String],
    stream: bool,
) -> Result<Value, String> {
    let req = http::Request::post(format!("{url}/v1/messages"))
        .header("content-type", "application/json")
        .header("x-api-key", "test-key")
        .header("anthropic-version", "2023-06-01")
        .header("x-oceancode-session", format!("s{session}"))
        .body(Full::new(Bytes::from(body(msgs, stream))))
        .map_err(|e| e.to_string())?;
    let fut = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status != 200 {
            return Err(format!("status {status}: {text}"));
        }
        if stream {
            content_from_sse(&text)
        } else {
            let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            Ok(v["content"].clone())
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

fn open_store(data: &Path) -> Store {
    Store::open(data, StoreOptions::default()).expect("open the ledger")
}

/// The one ledger session of client `s<i>` (None if none was committed).
fn session_of(store: &Store, i: usize) -> Option<LoadedSession> {
    let ids = store
        .sessions_for_client(&format!("name:s{i}"))
        .expect("sessions_for_client");
    assert!(ids.len() <= 1, "s{i}: one ledger session, got {ids:?}");
    ids.first()
        .map(|id| store.load_session(id).expect("load").expect("session"))
}

fn assert_gap_free(i: usize, s: &LoadedSession) {
    for (k, r) in s.rows.iter().enumerate() {
        assert_eq!(r.seq, k as u64 + 1, "s{i}: seq gap at row {k}");
    }
}

fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn integrity_ok(data: &Path) {
    let c = rusqlite::Connection::open_with_flags(
        data.join("oceancode.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open db");
    let r: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(r, "ok");
}

fn check_modes(root: &Path) -> (usize, usize) {
    let (mut files, mut dirs) = (0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).expect("metadata");
        let mode = md.permissions().mode() & 0o777;
        if md.is_dir() {
            assert_eq!(mode, 0o700, "{} is {mode:o}, want 700", p.display());
            dirs += 1;
            for e in std::fs::read_dir(&p).expect("read_dir") {
                stack.push(e.expect("entry").path());
            }
        } else {
            assert_eq!(mode, 0o600, "{} is {mode:o}, want 600", p.display());
            files += 1;
        }
    }
    (files, dirs)
}

fn sigterm_and_wait(s: &mut Served) {
    let child = s.guard.child();
    let pid = child.id() as libc::pid_t;
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let st = exited(
        &mut s.guard,
        Duration::from_secs(15),
        "serve to stop on SIGTERM",
    );
    assert!(
        st.success(),
        "serve exits 0 on SIGTERM, got {st:?}; stderr:\n{}",
        s.stderr.lock().unwrap()
    );
    s.guard.0 = None;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_mid_burst_leaves_gap_free_prefixes_and_a_resend_heals() {
    let started = Instant::now();
    // Every answer is different, so a misplaced row cannot pass for another.
    let script = Script::replies((0..2000).map(|n| Reply::text(format!("answer {n} ✓"))));
    let fake: FakeHandle = FakeUpstream::start(FakeConfig::default().with_script(script))
        .await
        .expect("fake upstream");
    let tmp = tempfile::tempdir().expect("tempdir");
    let data: PathBuf = tmp.path().join("data");
    let mut proxy = serve(tmp.path(), &data, &fake.url(), &[], &[]);
    let client = http();

    // ---- The burst, killed in the middle. ----
    let attempts: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(vec![Vec::new(); SESSIONS]));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..SESSIONS {
        let (client, url, attempts, done) = (
            client.clone(),
            proxy.url.clone(),
            attempts.clone(),
            done.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut convo = vec![user_msg(i, 1)];
            let mut turn = 1;
            let mut ok = 0usize;
            loop {
                attempts.lock().unwrap()[i] = convo.clone();
                let stream = (turn + i) % 2 == 0;
                match send(&client, &url, i, &convo, stream).await {
                    Ok(content) => {
                        convo.push(echo(i, &content));
                        turn += 1;
                        convo.push(user_msg(i, turn));
                        ok += 1;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => return ok,
                }
                if turn > 200 {
                    return ok; // the kill never came: caught below
                }
            }
        }));
    }
    eventually_async(Duration::from_secs(10), "the burst", || {
        let n = done.load(Ordering::SeqCst);
        std::future::ready(if n >= KILL_AFTER {
            Ok(())
        } else {
            Err(format!(
                "burst too slow: {n} done; stderr:\n{}",
                proxy.stderr.lock().unwrap()
            ))
        })
    })
    .await;
    proxy.guard.child().kill().expect("SIGKILL"); // std: SIGKILL on unix
    let status = proxy.guard.child().wait().expect("wait");
    proxy.guard.0 = None;
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }
    let burst_log = proxy.stderr.lock().unwrap().clone();
    assert!(
        !burst_log.contains("refused") && !burst_log.contains("ERROR"),
        "no ledger event was refused during the burst:\n{burst_log}"
    );
    let mut per_client = Vec::new();
    for t in tasks {
        per_client.push(t.await.expect("client task"));
    }
    let completed: usize = per_client.iter().sum();
    assert!(completed >= KILL_AFTER, "{per_client:?}");
    assert!(
        per_client.iter().all(|&n| n < 200),
        "every client was interrupted by the kill: {per_client:?}"
    );
    let attempts = attempts.lock().unwrap().clone();

    // ---- After the crash: gap-free, in-order prefixes. ----
    integrity_ok(&data);
    let store = open_store(&data);
    let mut on_disk = 0usize;
    let mut known = 0usize;
    let mut sessions_seen = 0;
    for (i, sent) in attempts.iter().enumerate() {
        known += sent.len();
        let Some(s) = session_of(&store, i) else {
            continue;
        };
        sessions_seen += 1;
        assert_gap_free(i, &s);
        assert_eq!(s.branch, 0, "s{i}: no branch before the crash");
        assert!(s.hidden.is_empty());
        assert!(
            s.rows.len() <= sent.len() + 1,
            "s{i}: {} rows on disk, client sent {} messages",
            s.rows.len(),
            sent.len()
        );
        for (k, r) in s.rows.iter().enumerate() {
            match sent.get(k) {
                // A client message: verbatim bytes, or a response row whose
                // echo (confirm) the crash lost.
                Some(m) if !r.from_response => {
                    assert_eq!(&*r.raw, m.as_str(), "s{i} seq {}: verbatim", r.seq)
                }
                Some(m) => assert!(
                    r.role == "assistant" && same_json(&r.raw, m),
                    "s{i} seq {}: response row {} vs client echo {m}",
                    r.seq,
                    r.raw
                ),
                // One answer the client never got to echo.
                None => assert!(r.from_response && k == sent.len(), "s{i}: extra row {k}"),
            }
        }
        on_disk += s.rows.len();
    }
    assert!(
        sessions_seen >= SESSIONS / 2,
        "most sessions reached the disk"
    );
    store.shutdown().expect("store shutdown");
    drop(store);
    eprintln!(
        "crash: {completed} requests completed before SIGKILL; {on_disk} rows on disk of {known} messages the clients sent ({sessions_seen}/{SESSIONS} sessions)"
    );

    // ---- Restart on the same data dir; every client resends. ----
    let mut proxy = serve(tmp.path(), &data, &fake.url(), &[], &[]);
    let mut finals = Vec::new();
    let mut tasks = Vec::new();
    for (i, sent) in attempts.iter().enumerate() {
        let (client, url, sent) = (client.clone(), proxy.url.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            // The request the crash interrupted, retried as it was...
            let a = send(&client, &url, i, &sent, i % 2 == 0)
                .await
                .unwrap_or_else(|e| panic!("s{i} retry: {e}"));
            // ...then the conversation goes on with one new message.
            let mut next = sent.clone();
            next.push(echo(i, &a));
            next.push(user_msg(i, 1000));
            let last = send(&client, &url, i, &next, i % 2 == 1)
                .await
                .unwrap_or_else(|e| panic!("s{i} continue: {e}"));
            (next, last)
        }));
    }
    for t in tasks {
        finals.push(t.await.expect("resend task"));
    }
    sigterm_and_wait(&mut proxy);
    let restart_log = proxy.stderr.lock().unwrap().clone();
    assert!(
        !restart_log.contains("refused") && !restart_log.contains("ERROR"),
        "no ledger event was refused after the restart:\n{restart_log}"
    );

    // ---- Healed: every message verbatim, in order, gap-free. ----
    integrity_ok(&data);
    let store = open_store(&data);
    for (i, (sent, last)) in finals.iter().enumerate() {
        let s = session_of(&store, i).unwrap_or_else(|| panic!("s{i}: no session after resend"));
        assert_gap_free(i, &s);
        assert_eq!(
            s.branch, 0,
            "s{i}: the resend after a restart must not record a branch; rows:\n{}\nproxy log:\n{restart_log}",
            s.rows
                .iter()
                .map(|r| format!(
                    "  {} {} resp={} hidden={} {:.60}",
                    r.seq,
                    r.role,
                    r.from_response,
                    s.hidden.contains(&r.seq),
                    r.raw
                ))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(s.hidden.is_empty(), "s{i}: hidden rows {:?}", s.hidden);
        // Walk the rows: every message of the conversation, verbatim, in
        // order; the only other rows allowed are answers a client never got
        // to echo (recorded, but not on its line), and the last answer.
        let mut j = 0;
        let mut orphans = 0;
        for r in &s.rows {
            if j < sent.len() && &*r.raw == sent[j].as_str() {
                j += 1;
            } else if j == sent.len() && r.from_response {
                assert!(
                    same_json(
                        &r.raw,
                        &json!({"role":"assistant","content":last}).to_string()
                    ),
                    "s{i}: the last answer, got {}",
                    r.raw
                );
                j += 1;
            } else {
                assert!(
                    r.from_response && r.role == "assistant",
                    "s{i} seq {}: unexpected row {} (expected message {j}: {})",
                    r.seq,
                    r.raw,
                    sent.get(j).map_or("<end>", |m| m.as_str())
                );
                orphans += 1;
            }
        }
        assert_eq!(
            j,
            sent.len() + 1,
            "s{i}: all {} messages and the last answer are in the ledger",
            sent.len()
        );
        assert!(orphans <= 1, "s{i}: {orphans} unechoed answers");
        // The transcript of turn 1 holds the first message's text.
        let t1 = store
            .session_dir(&s.meta.id)
            .join("transcript")
            .join("0001.md");
        let text = std::fs::read_to_string(&t1).unwrap_or_else(|e| panic!("{}: {e}", t1.display()));
        assert!(text.contains(&format!("s{i} turn 1:")), "{text}");
    }
    store.shutdown().expect("store shutdown");
    drop(store);

    // ---- Private files. ----
    let (files, dirs) = check_modes(&data);
    assert!(
        files > SESSIONS * 2 && dirs > SESSIONS * 2,
        "{files} files, {dirs} dirs"
    );
    eprintln!("crash test took {:?}", started.elapsed());
}
