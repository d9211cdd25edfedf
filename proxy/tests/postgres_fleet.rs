//! Many proxies, one PostgreSQL ledger (issue 17), at the binary level:
//! every command against PostgreSQL, and two `serve` processes behind a
//! real nginx (`hash $session consistent`) sharing one database, the one
//! serving a session killed with SIGKILL mid-conversation: nginx moves the
//! client to the other, which takes the session over once the dead one's
//! lease lapses and continues it with the same id and cut; the ledger stays
//! gap-free and verbatim, and export and recall work from a third process.
//!
//! Needs a PostgreSQL server (`OCEANCODE_TEST_DATABASE_URL`, as `.ci/run`
//! exports it) and `nginx` (Debian's package) for the fleet test; without
//! them the tests say SKIPPED, except under CI where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oceancode_fakeup::{FakeConfig, FakeUpstream, Reply, Script};
use oceancode_ledger::store::pg::PgStore;
use oceancode_ledger::store::{LedgerRead, StoreOptions};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{output, proxy_cmd, serve, ChildGuard};
use oceancode_testkit::eventually;

type Http = Client<HttpConnector, Full<Bytes>>;

fn skip_or_fail(what: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} is missing under CI: the PostgreSQL fleet tests must run");
    }
    eprintln!("SKIPPED: {what} is missing (see .ci/run for the setup)");
}

/// A fresh database on the test server (None = no server: skipped).
fn fresh_db() -> Option<String> {
    let url = match std::env::var("OCEANCODE_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            skip_or_fail("OCEANCODE_TEST_DATABASE_URL");
            return None;
        }
    };
    let name = format!(
        "oc_fleet_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let st = Command::new("psql")
        .arg(&url)
        .args(["-q", "-c", &format!("CREATE DATABASE {name}")])
        .status()
        .expect("psql");
    assert!(st.success(), "CREATE DATABASE failed");
    let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
    Some(format!("{base}/{name}"))
}

fn user_msg(turn: usize) -> String {
    let filler = "the quick brown fox jumps over the lazy dog ".repeat(300);
    format!(r#"{{"role": "user", "content": "turn {turn}: caf\u00e9 ✓ {filler}"}}"#)
}

fn body(msgs: &[String]) -> String {
    format!(
        r#"{{"model":"claude-test","max_tokens":256,"messages":[{}]}}"#,
        msgs.join(",")
    )
}

/// One non-streamed request; Ok(assistant content).
async fn send(client: &Http, url: &str, msgs: &[String]) -> Result<Value, String> {
    let req = http::Request::post(format!("{url}/v1/messages"))
        .header("content-type", "application/json")
        .header("x-api-key", "test-key")
        .header("anthropic-version", "2023-06-01")
        .header("x-oceancode-session", "fleet-1")
        .body(Full::new(Bytes::from(body(msgs))))
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
        let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(v["content"].clone())
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

fn config_file(dir: &Path, url: &str, lease_ms: u64) -> String {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        json!({
            "ledger": {
                "database": url,
                "lease_ms": lease_ms,
                "tideline": {"tokens": 20_000}
            }
        })
        .to_string(),
    )
    .unwrap();
    path.display().to_string()
}

/// Run the binary with `--database URL --data-dir DIR ARGS…`.
fn cli(home: &Path, url: &str, data: &Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = proxy_cmd(home);
    cmd.arg("--database").arg(url).arg("--data-dir").arg(data);
    cmd.args(args);
    let o = output(cmd);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Wait until the serving proxy committed `rows` rows of session
/// `fleet-1` (its writer trails the answer by a batch): the session's id.
fn committed(ledger: &PgStore, rows: u64) -> String {
    eventually(
        Duration::from_secs(10),
        &format!("{rows} rows committed"),
        || {
            let id = ledger.resolve_session(Some("fleet-1")).ok()?;
            (ledger.session_summary(&id).unwrap().map_or(0, |s| s.rows) >= rows).then_some(id)
        },
    )
}

fn nginx_bin() -> Option<String> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .find(|p| Path::new(p).exists())
        .map(|p| p.to_string())
}

/// nginx on a free port in front of `backends`, routing by the session
/// header with consistent hashing (the docs/deploy.md example).
fn start_nginx(dir: &Path, backends: &[&str]) -> (ChildGuard, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let servers: String = backends
        .iter()
        .map(|b| {
            format!(
                "        server {} max_fails=1 fail_timeout=30s;\n",
                b.trim_start_matches("http://")
            )
        })
        .collect();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let conf = format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    map $http_x_oceancode_session $oc_session {{
        ""      $http_x_claude_code_session_id$http_session_id$request_uri;
        default $http_x_oceancode_session;
    }}
    upstream oceancode {{
        hash $oc_session consistent;
{servers}        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 64m;
        location / {{
            proxy_pass http://oceancode;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 2;
        }}
    }}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let bin = nginx_bin().unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nginx");
    let guard = ChildGuard(Some(child));
    eventually(Duration::from_secs(10), "nginx to start", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    (guard, format!("http://127.0.0.1:{port}"))
}

/// Every command against PostgreSQL: serve records, and ledger, recall,
/// export and status read it back; `ledger rebuild` renders a session's
/// files on another "machine" (an empty data dir) from the database alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_against_postgres() {
    let Some(url) = fresh_db() else { return };
    let script = Script::replies((0..50).map(|n| Reply::text(format!("answer {n} ✓"))));
    let fake = FakeUpstream::start(FakeConfig::default().with_script(script))
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cfg = config_file(tmp.path(), &url, 10_000);
    let mut proxy = serve(tmp.path(), &data, &fake.url(), &["--config", &cfg], &[]);
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let mut convo = vec![user_msg(1)];
    for turn in 1..=3 {
        let content = send(&client, &proxy.url, &convo).await.unwrap();
        convo.push(json!({"role": "assistant", "content": content}).to_string());
        convo.push(user_msg(turn + 1));
    }
    // What the proxy recorded is committed (its writer trails the answer).
    let reader = PgStore::open(&url, &tmp.path().join("reader"), StoreOptions::default()).unwrap();
    committed(&reader, 6);
    drop(reader);
    // status asks the running proxy; the rest read the database.
    let home = tmp.path();
    let (ok, out, err) = cli(home, &url, &data, &["status", "fleet-1"]);
    assert!(ok, "status: {err}");
    assert!(
        out.contains("fleet-1") || out.contains("claude-test"),
        "{out}"
    );
    drop(proxy.guard.0.take().map(|mut c| {
        let _ = c.kill();
        c.wait()
    }));
    let (ok, out, err) = cli(home, &url, &data, &["ledger", "list"]);
    assert!(ok, "ledger list: {err}");
    assert!(out.contains("claude-test"), "{out}");
    let (ok, out, err) = cli(home, &url, &data, &["recall", "search", "quick", "fox"]);
    assert!(ok, "recall search: {err}");
    assert!(out.contains("turn 1"), "{out}");
    let (ok, out, err) = cli(home, &url, &data, &["recall", "fleet-1"]);
    assert!(ok && out.contains("answer 2"), "recall: {out}{err}");
    let (ok, out, err) = cli(home, &url, &data, &["status", "fleet-1"]);
    assert!(ok, "status from the ledger: {err}");
    assert!(!out.is_empty());
    let other = tmp.path().join("elsewhere");
    let (ok, _, err) = cli(home, &url, &other, &["ledger", "rebuild", "fleet-1"]);
    assert!(ok, "rebuild: {err}");
    let (ok, path, err) = cli(home, &url, &other, &["ledger", "path", "fleet-1"]);
    assert!(ok, "ledger path: {err}");
    let sdir = Path::new(path.trim());
    assert!(sdir.starts_with(&other), "{}", sdir.display());
    let t1 = std::fs::read_to_string(sdir.join("transcript/0001.md")).unwrap();
    let live = std::fs::read_to_string(
        data.join("sessions")
            .join(sdir.file_name().unwrap())
            .join("transcript/0001.md"),
    )
    .unwrap();
    assert_eq!(t1, live, "rebuilt from the database = rendered live");
    let (ok, md, err) = cli(
        home,
        &url,
        &other,
        &["export", "--md", "fleet-1", "--out", "-"],
    );
    assert!(ok, "export --md: {err}");
    assert!(md.contains("answer 1 ✓"), "{md}");
    let (ok, atif, err) = cli(
        home,
        &url,
        &other,
        &["export", "--atif", "fleet-1", "--out", "-"],
    );
    assert!(ok, "export atif: {err}");
    assert!(atif.contains("\"steps\""), "{atif}");
    let (ok, _, err) = cli(home, &url, &other, &["ledger", "vacuum"]);
    assert!(ok, "vacuum: {err}");
}

/// Two proxies behind nginx on one database; the serving one is killed
/// with SIGKILL mid-conversation and the other takes the session over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_fleet_takes_a_session_over_after_kill_9() {
    let Some(url) = fresh_db() else { return };
    if nginx_bin().is_none() {
        skip_or_fail("nginx");
        return;
    }
    let lease_ms = 3000;
    let script = Script::replies((0..200).map(|n| Reply::text(format!("answer {n} ✓"))));
    let fake = FakeUpstream::start(FakeConfig::default().with_script(script))
        .await
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config_file(tmp.path(), &url, lease_ms);
    let data_a = tmp.path().join("a");
    let data_b = tmp.path().join("b");
    let mut a = serve(tmp.path(), &data_a, &fake.url(), &["--config", &cfg], &[]);
    let mut b = serve(tmp.path(), &data_b, &fake.url(), &["--config", &cfg], &[]);
    let ngx_dir = tmp.path().join("nginx");
    let (_nginx, front) = start_nginx(&ngx_dir, &[&a.url, &b.url]);
    let client: Http = Client::builder(TokioExecutor::new()).build_http();
    let ledger = PgStore::open(&url, &tmp.path().join("reader"), StoreOptions::default()).unwrap();

    let mut convo = vec![user_msg(1)];
    let mut turn = 1;
    // Until a cut happened (the window starts past the first rows).
    while turn <= 20 {
        let content = send(&client, &front, &convo).await.unwrap();
        convo.push(json!({"role": "assistant", "content": content}).to_string());
        turn += 1;
        let id = committed(&ledger, convo.len() as u64);
        convo.push(user_msg(turn));
        if ledger.load_session(&id).unwrap().unwrap().cut_upto > 0 && turn >= 4 {
            break;
        }
    }
    let id = ledger.resolve_session(Some("fleet-1")).unwrap();
    let before = ledger.load_session(&id).unwrap().unwrap();
    assert!(before.cut_upto > 0, "a cut before the kill");
    // Which proxy serves it: the one whose data dir has its files.
    let a_serves = data_a.join("sessions").exists()
        && std::fs::read_dir(data_a.join("sessions")).unwrap().count() > 0;
    // The session's own line (30k over the fleet's 20k), set on the proxy
    // that serves it and recorded with its next request.
    let (serving_url, serving_dir, other_url) = if a_serves {
        (a.url.clone(), data_a.clone(), b.url.clone())
    } else {
        (b.url.clone(), data_b.clone(), a.url.clone())
    };
    let (ok, _, err) = cli(
        tmp.path(),
        &url,
        &serving_dir,
        &[
            "tideline",
            "--session",
            "fleet-1",
            "--proxy",
            &serving_url,
            "30k",
        ],
    );
    assert!(ok, "tideline --set: {err}");
    let content = send(&client, &front, &convo).await.unwrap();
    convo.push(json!({"role": "assistant", "content": content}).to_string());
    turn += 1;
    committed(&ledger, convo.len() as u64);
    convo.push(user_msg(turn));
    let before = ledger.load_session(&id).unwrap().unwrap();
    assert_eq!(before.line_override.as_deref(), Some(r#"{"tokens":30000}"#));
    let (dead, alive_dir) = if a_serves {
        (&mut a, &data_b)
    } else {
        (&mut b, &data_a)
    };
    let mut child = dead.guard.0.take().unwrap();
    child.kill().unwrap(); // SIGKILL
    let killed = Instant::now();
    child.wait().unwrap();

    // The next turn: nginx fails over, the survivor waits out the lease.
    let content = send(&client, &front, &convo).await.unwrap();
    let takeover = killed.elapsed();
    eprintln!(
        "takeover after kill -9: {:.2} s (lease {lease_ms} ms)",
        takeover.as_secs_f64()
    );
    assert!(
        takeover < Duration::from_millis(lease_ms + 3000),
        "{takeover:?}"
    );
    convo.push(json!({"role": "assistant", "content": content}).to_string());
    // The survivor runs the session on its own line.
    let (ok, shown, err) = cli(
        tmp.path(),
        &url,
        alive_dir,
        &[
            "tideline",
            "--session",
            "fleet-1",
            "--proxy",
            &other_url,
            "--json",
        ],
    );
    assert!(ok, "tideline: {err}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let session = &shown["session"];
    assert_eq!(
        session["override"], "30000",
        "the override was lost: {shown}"
    );
    assert_eq!(session["meter"]["line"], 30_000, "{shown}");
    // The window the survivor sent starts past the cut, like the dead one's.
    let last = fake.requests().last().unwrap().json().unwrap();
    let sent = last["messages"].as_array().unwrap().len();
    assert!(
        sent < convo.len() - 1,
        "the cut was kept: sent {sent} of {}",
        convo.len() - 1
    );
    for _ in 0..2 {
        turn += 1;
        convo.push(user_msg(turn));
        let content = send(&client, &front, &convo).await.unwrap();
        convo.push(json!({"role": "assistant", "content": content}).to_string());
    }
    committed(&ledger, convo.len() as u64);

    // One session, the same id, gap-free, every message verbatim in order.
    assert_eq!(
        ledger.sessions_for_client("name:fleet-1").unwrap(),
        vec![id.clone()]
    );
    let after = ledger.load_session(&id).unwrap().unwrap();
    assert!(after.cut_upto >= before.cut_upto);
    for (k, r) in after.rows.iter().enumerate() {
        assert_eq!(r.seq, k as u64 + 1, "gap at row {k}");
    }
    let visible: Vec<&str> = after
        .rows
        .iter()
        .filter(|r| !after.hidden.contains(&r.seq))
        .map(|r| &*r.raw)
        .collect();
    let users: Vec<&String> = convo.iter().step_by(2).collect();
    let recorded_users: Vec<&str> = visible
        .iter()
        .copied()
        .filter(|r| r.contains(r#""role": "user""#))
        .collect();
    assert_eq!(recorded_users.len(), users.len());
    for (got, want) in recorded_users.iter().zip(&users) {
        assert_eq!(got, &want.as_str(), "verbatim");
    }
    // The survivor rendered the session in its own data dir.
    assert!(alive_dir.join("sessions").exists());
    // Export and recall from a third process.
    let third = tmp.path().join("third");
    let (ok, md, err) = cli(
        tmp.path(),
        &url,
        &third,
        &["export", "--md", "fleet-1", "--out", "-"],
    );
    assert!(ok, "export: {err}");
    assert!(
        md.contains(&format!("turn {turn}:")),
        "export has the last turn"
    );
    let (ok, out, err) = cli(
        tmp.path(),
        &url,
        &third,
        &["recall", "search", "turn", "caf\u{e9}"],
    );
    assert!(ok && !out.is_empty(), "recall: {err}");
}
