//! Commands find the running proxy by themselves (issue 21): a `run` and a
//! `serve` on one data dir each register; `status` and `tideline` from
//! another process reach the one that holds the session, without
//! `--proxy`; a killed proxy's stale entry is ignored with one note; a
//! finished session shows the line it ran with. Sessions are named by the
//! client's own key (issue 13, item 6) in every command, and an unknown or
//! ambiguous name exits 2 with the closest sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::{exited, output, proxy_cmd, serve, ChildGuard};
use oceancode_testkit::eventually;

const CONTEXT: (&str, &str) = ("OCEANCODE_CONTEXT_TOKENS", "100000");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

type Http = Client<HttpConnector, Full<Bytes>>;

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn fake() -> FakeHandle {
    FakeUpstream::start(FakeConfig::default())
        .await
        .expect("fake upstream")
}

/// POST `path` of the proxy at `url` with `turns` user/assistant pairs of a
/// conversation about `topic`, with `hdrs`.
async fn chat(c: &Http, url: &str, path: &str, hdrs: &[(&str, &str)], topic: &str, turns: usize) {
    let mut msgs = Vec::new();
    for t in 0..turns {
        msgs.push(json!({"role": "user", "content": format!("{topic} question {t}: {}", "words ".repeat(200))}));
        if t + 1 < turns {
            msgs.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    let body = json!({"model": "claude-test", "max_tokens": 256, "messages": msgs}).to_string();
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("{url}{path}"))
        .header("content-type", "application/json")
        .header("x-api-key", "k");
    for (k, v) in hdrs {
        b = b.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        c.request(b.body(Full::new(Bytes::from(body))).unwrap()),
    )
    .await
    .expect("in time")
    .expect("proxy answers");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 200, "{}", text(&bytes));
}

/// `oceancode-proxy ARGS --data-dir DATA` in a clean environment (no
/// `--proxy`, no proxy URL in the environment).
fn cli(home: &Path, data: &Path, args: &[&str]) -> Output {
    let mut c = proxy_cmd(home);
    c.env(CONTEXT.0, CONTEXT.1)
        .args(args)
        .arg("--data-dir")
        .arg(data);
    output(c)
}

fn ok(o: &Output, what: &str) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "{what}\nstdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

fn json_ok(o: &Output, what: &str) -> Value {
    let out = ok(o, what);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {out}"))
}

/// The registry's entry files.
fn entries(data: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data.join("proxies"))
        .map(|rd| rd.filter_map(Result::ok).map(|d| d.path()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The `run` child: a conversation of four turns as session `run-task`,
/// then `READY`; when the file in argv[1] appears, a fifth turn, `DONE`.
const CHILD: &str = r#"
import json, os, sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
base = os.environ["ANTHROPIC_BASE_URL"]
def send(turns):
    msgs = []
    for t in range(turns):
        msgs.append({"role": "user", "content": "run-task question %d: %s" % (t, "words " * 200)})
        if t + 1 < turns:
            msgs.append({"role": "assistant", "content": "answer %d" % t})
    body = json.dumps({"model": "claude-test", "max_tokens": 256, "messages": msgs}).encode()
    req = urllib.request.Request(base + "/v1/messages", data=body, method="POST",
                                 headers={"content-type": "application/json", "x-api-key": "k",
                                          "anthropic-version": "2023-06-01",
                                          "x-oceancode-session": "run-task"})
    json.load(opener.open(req, timeout=10))
for t in range(1, 5):
    send(t)
print("READY", flush=True)
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
send(5)
print("DONE", flush=True)
"#;

/// `run --tideline 20k -- python3 CHILD GO` in the background, its stdout
/// lines on a channel.
fn start_run(
    home: &Path,
    data: &Path,
    fake: &str,
    go: &Path,
) -> (ChildGuard, mpsc::Receiver<String>) {
    let mut c = proxy_cmd(home);
    c.env(CONTEXT.0, CONTEXT.1)
        .arg("run")
        .arg("--data-dir")
        .arg(data)
        .args(["--anthropic-upstream", fake, "--tideline", "20k", "--"])
        .args(["python3", "-c", CHILD])
        .arg(go)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().expect("spawn run");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (ChildGuard(Some(child)), rx)
}

fn wait_for(rx: &mpsc::Receiver<String>, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l == want => return,
            Ok(_) => {}
            Err(e) => panic!("no {want} from the run child: {e}"),
        }
    }
}

/// `tideline --json --session NAME` (show), which must succeed.
fn shown(home: &Path, data: &Path, name: &str) -> Value {
    json_ok(
        &cli(home, data, &["tideline", "--json", "--session", name]),
        &format!("tideline --session {name}"),
    )
}

/// The ledger id of the session `name` (from `ledger path NAME`).
fn id_of(home: &Path, data: &Path, name: &str) -> String {
    let out = ok(&cli(home, data, &["ledger", "path", name]), "ledger path");
    Path::new(out.trim())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_and_a_serve_on_one_data_dir_are_each_found() {
    assert!(
        std::process::Command::new("python3")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "python3 is needed for the run tests"
    );
    let fake = fake().await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let data = home.join("data");
    let go = home.join("go");

    // A `serve` (the configured 40% of 100k) and a `run --tideline 20k`.
    let mut served = serve(home, &data, &fake.url(), &[], &[CONTEXT]);
    let c = http();
    for t in 1..=3 {
        chat(
            &c,
            &served.url,
            "/v1/messages",
            &[("x-oceancode-session", "serve-task")],
            "serve-task",
            t,
        )
        .await;
    }
    let (mut run, lines) = start_run(home, &data, &fake.url(), &go);
    wait_for(&lines, "READY");

    // Both registered: two private entry files.
    let files = entries(&data);
    assert_eq!(files.len(), 2, "{files:?}");
    for f in &files {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
        let e: Value = serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap();
        assert!(
            e["url"].as_str().unwrap().starts_with("http://127.0.0.1:"),
            "{e}"
        );
        assert_eq!(
            e["token_file"],
            data.join("admin-token").display().to_string(),
            "{e}"
        );
        assert!(e["pid"].as_u64().unwrap() > 0 && e["started_ms"].as_i64().unwrap() > 0);
    }

    // `status` of each session reaches the proxy that holds it.
    let st = json_ok(
        &cli(home, &data, &["status", "--json", "run-task"]),
        "status run",
    );
    assert_eq!(st["line"], 20000, "{st}");
    assert_eq!(st["line_spec"], "20k", "{st}");
    assert_eq!(st["line_source"]["kind"], "live", "{st}");
    let proxy = st["line_source"]["proxy"].as_str().unwrap();
    assert!(proxy.starts_with("the run proxy (python3, pid "), "{st}");
    let st = json_ok(
        &cli(home, &data, &["status", "--json", "serve-task"]),
        "status serve",
    );
    assert_eq!(st["line"], 40000, "{st}");
    assert_eq!(st["line_spec"], "40%", "{st}");
    let proxy = st["line_source"]["proxy"].as_str().unwrap();
    assert!(
        proxy.starts_with("the serve proxy (pid ") && proxy.contains(&served.url),
        "{st}"
    );
    let human = ok(&cli(home, &data, &["status", "run-task"]), "status");
    assert!(
        human.contains("tideline @20k (20k, live from the run proxy (python3, pid "),
        "{human}"
    );

    // `tideline` (show) by name, each from its own proxy.
    let run_id = id_of(home, &data, "run-task");
    let serve_id = id_of(home, &data, "serve-task");
    let v = shown(home, &data, "run-task");
    assert_eq!(v["session"]["id"], run_id.as_str(), "{v}");
    assert_eq!(v["session"]["meter"]["line"], 20000, "{v}");
    let v = shown(home, &data, "serve-task");
    assert_eq!(v["session"]["id"], serve_id.as_str(), "{v}");
    assert_eq!(v["session"]["meter"]["line"], 40000, "{v}");
    // No session named: the proxy of the most recent session, said so.
    let o = cli(home, &data, &["tideline"]);
    let out = ok(&o, "tideline");
    assert!(
        out.starts_with(&format!("session {run_id}: line 20k")),
        "{out}"
    );
    assert!(
        text(&o.stderr).contains("note: 2 proxies run on this data dir; this is the run proxy"),
        "{}",
        text(&o.stderr)
    );

    // `tideline now` for the run's session: its proxy cuts at the child's
    // next request.
    let v = json_ok(
        &cli(
            home,
            &data,
            &["tideline", "--json", "--session", "run-task", "now"],
        ),
        "tideline now",
    );
    assert_eq!(v["action"], "now", "{v}");
    assert_eq!(v["scope"], run_id.as_str(), "{v}");
    assert!(v["cut_upto"].as_u64().unwrap() >= 1, "{v}");
    let before = fake.request_count();
    std::fs::write(&go, b"").unwrap();
    wait_for(&lines, "DONE");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), before + 1);
    let last = reqs.last().unwrap().json().unwrap();
    let first = last["messages"][0]["content"].to_string();
    assert!(
        first.contains("past the tideline") && !first.contains("serve-task"),
        "the run's request is cut: {first}"
    );
    // The serve's session was not touched.
    let v = shown(home, &data, "serve-task");
    assert_eq!(v["session"]["meter"]["cuts"], 0, "{v}");

    // The run ends: its entry goes, its session shows the line it ran with.
    let status = exited(&mut run, Duration::from_secs(20), "run to end");
    run.0 = None;
    assert!(status.success(), "{status:?}");
    assert_eq!(entries(&data).len(), 1, "the run's entry is removed");
    let st = json_ok(
        &cli(home, &data, &["status", "--json", "run-task"]),
        "status run",
    );
    assert_eq!(st["line"], 20000, "{st}");
    assert_eq!(st["line_spec"], "20k", "{st}");
    assert_eq!(st["line_source"]["kind"], "recorded", "{st}");
    assert_eq!(st["line_live"], false, "{st}");

    // A killed serve leaves its entry: ignored with one note; its session
    // shows the line it ran with, not the configured one.
    let serve_pid = served.guard.child().id();
    served.guard.child().kill().unwrap();
    served.guard.child().wait().unwrap();
    served.guard.0 = None;
    assert_eq!(entries(&data).len(), 1, "a SIGKILL leaves the entry");
    let o = cli(home, &data, &["status", "--json", "serve-task"]);
    let st = json_ok(&o, "status after kill");
    assert_eq!(st["line"], 40000, "{st}");
    assert_eq!(st["line_source"]["kind"], "recorded", "{st}");
    let err = text(&o.stderr);
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("stale")).collect();
    assert_eq!(notes.len(), 1, "one note: {err}");
    assert!(
        notes[0].starts_with("oceancode-proxy: note: ignoring 1 stale entry in ")
            && notes[0].contains(&format!("serve proxy (pid {serve_pid}, "))
            && notes[0].ends_with("has exited"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "nothing else on stderr: {err}");
    // `tideline` needs a running proxy: none is, and it says so.
    let o = cli(home, &data, &["tideline", "--session", "serve-task"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(text(&o.stderr).contains("no proxy answering"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_by_the_clients_own_name_and_errors_for_unknown_ones() {
    let fake = fake().await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let data = home.join("data");
    let mut served = serve(home, &data, &fake.url(), &[], &[CONTEXT]);
    let url = served.url.clone();
    let c = http();
    let cc_id = "3f1c9a2e-7b1d-4c55-9e0a-5d2b8c6f1e01";
    let codex_id = "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
    // x-oceancode-session, the /s/<name> path, Claude Code's session id,
    // Codex's session id.
    for t in 1..=2 {
        chat(
            &c,
            &url,
            "/v1/messages",
            &[("x-oceancode-session", "alpha-task")],
            "alpha",
            t,
        )
        .await;
        chat(
            &c,
            &url,
            "/v1/messages",
            &[("x-oceancode-session", "alpha-other")],
            "other",
            t,
        )
        .await;
        chat(&c, &url, "/s/by-path/v1/messages", &[], "path", t).await;
        chat(
            &c,
            &url,
            "/v1/messages",
            &[
                ("x-claude-code-session-id", cc_id),
                ("user-agent", "claude-cli/2.1.0 (external, cli)"),
            ],
            "claude",
            t,
        )
        .await;
        chat(
            &c,
            &url,
            "/v1/messages",
            &[("session-id", codex_id)],
            "codex",
            t,
        )
        .await;
    }
    let names = ["alpha-task", "alpha-other", "by-path", cc_id, codex_id];
    let ids: Vec<String> = names.iter().map(|n| id_of(home, &data, n)).collect();
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "one session each: {ids:?}");

    for (name, id) in names.iter().zip(&ids) {
        // status, tideline, recall, recall entry, export, ledger path, rebuild.
        let st = json_ok(&cli(home, &data, &["status", "--json", name]), "status");
        assert_eq!(st["session"], id.as_str(), "{name}: {st}");
        let v = shown(home, &data, name);
        assert_eq!(v["session"]["id"], id.as_str(), "{name}: {v}");
        let topic = match *name {
            "alpha-task" => "alpha",
            "alpha-other" => "other",
            "by-path" => "path",
            n if n == cc_id => "claude",
            _ => "codex",
        };
        let out = ok(
            &cli(home, &data, &["recall", name, "--match", "%question 1%"]),
            "recall",
        );
        assert!(
            out.contains(&format!("{topic} question 1")),
            "{name}: {out}"
        );
        let out = ok(
            &cli(home, &data, &["recall", "entry", "1", "--session", name]),
            "entry",
        );
        assert!(
            out.contains(&format!("<!-- {id} · seq 1 ")),
            "{name}: {out}"
        );
        assert!(
            out.contains(&format!("{topic} question 0")),
            "{name}: {out}"
        );
        let out = ok(&cli(home, &data, &["export", "--md", name]), "export");
        assert!(
            out.contains(id.as_str()) && out.contains(&format!("{topic} question 1")),
            "{name}"
        );
        let out = ok(&cli(home, &data, &["ledger", "path", name]), "path");
        assert!(out.trim().ends_with(id.as_str()), "{name}: {out}");
        let out = ok(&cli(home, &data, &["ledger", "rebuild", name]), "rebuild");
        assert!(out.starts_with(&format!("rebuilt {id}: ")), "{name}: {out}");
    }
    // A unique prefix of a client's name or id; the key as the proxy keeps it.
    let st = json_ok(
        &cli(home, &data, &["status", "--json", "3f1c9a"]),
        "cc prefix",
    );
    assert_eq!(st["session"], ids[3].as_str(), "{st}");
    let st = json_ok(
        &cli(home, &data, &["status", "--json", "name:by-path"]),
        "key",
    );
    assert_eq!(st["session"], ids[2].as_str(), "{st}");

    // Unknown: exit 2, no fallback to the latest session, the closest names
    // listed (the typo's own first).
    let unknown: [&[&str]; 8] = [
        &["status", "alpah-task"],
        &["tideline", "--session", "alpah-task"],
        &["tideline", "--session", "alpah-task", "now"],
        &["recall", "alpah-task"],
        &["recall", "entry", "1", "--session", "alpah-task"],
        &["export", "--md", "alpah-task"],
        &["ledger", "path", "alpah-task"],
        &["ledger", "rebuild", "alpah-task"],
    ];
    for args in unknown {
        let o = cli(home, &data, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o.stdout));
        let err = text(&o.stderr);
        assert!(
            err.starts_with("oceancode-proxy: no session \"alpah-task\" (a session is named by its ledger id, the client's session name or id, or a unique prefix of one); the closest of 5:\n"),
            "{args:?}: {err}"
        );
        let listed: Vec<&str> = err.lines().skip(1).collect();
        assert!(
            listed[0].starts_with(&format!("  {}  alpha-task  ", ids[0])),
            "{args:?}: {err}"
        );
        assert!(listed[1].contains("  alpha-other  "), "{args:?}: {err}");
    }
    // Ambiguous: exit 2, every match listed.
    for args in [
        &["status", "alpha"][..],
        &["tideline", "--session", "alpha", "50%"][..],
        &["ledger", "path", "alpha"][..],
    ] {
        let o = cli(home, &data, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
        let err = text(&o.stderr);
        assert!(
            err.starts_with("oceancode-proxy: session \"alpha\" is ambiguous: it names 2 sessions; give more of the id or the name:\n"),
            "{args:?}: {err}"
        );
        assert!(
            err.contains(&format!("\n  {}  alpha-task  ", ids[0])),
            "{err}"
        );
        assert!(
            err.contains(&format!("\n  {}  alpha-other  ", ids[1])),
            "{err}"
        );
    }
    // Nothing was changed by the refused `tideline … 50%`.
    let v = shown(home, &data, "alpha-task");
    assert_eq!(v["session"]["line_spec"], "40%", "{v}");

    // The admin API itself never answers an unknown session with the latest.
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let req = http::Request::builder()
        .uri(format!("{url}/_oceancode/tideline?session=probe"))
        .header("authorization", format!("Bearer {}", token.trim()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    let status = resp.status();
    let body = text(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no session \\\"probe\\\""), "{body}");
    let _ = served.guard.child().kill();
}

/// A loopback HTTP server that records the head of every request it gets
/// and answers each with `body` (issue 33, item 4: what a hostile registry
/// entry points commands at).
struct Listener {
    url: String,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

fn listener(body: &'static str) -> Listener {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for mut s in l.incoming().map_while(Result::ok) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            seen.lock().unwrap().push(text(&buf));
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Listener { url, heads }
}

/// Write a registry entry file with `mode`.
fn plant(data: &Path, name: &str, entry: &Value, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = data.join("proxies");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(entry).unwrap()).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_registry_entries_never_get_the_admin_token() {
    let fake = fake().await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let data = home.join("data");
    let served = serve(home, &data, &fake.url(), &[], &[CONTEXT]);
    let c = http();
    chat(
        &c,
        &served.url,
        "/v1/messages",
        &[("x-oceancode-session", "mine")],
        "mine",
        1,
    )
    .await;
    let real = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let real = real.trim();
    // A file of the attacker's choosing that an entry names as its token.
    let named = home.join("named-token");
    std::fs::write(&named, "FILESECRET0123456789\n").unwrap();
    // Something on loopback that answers like a proxy (any proof it likes).
    let evil = listener(r#"{"sessions": [], "proof": "00"}"#);
    let entry = |url: &str| {
        json!({"url": url, "pid": 1, "started_ms": i64::MAX, "kind": "serve",
               "token_file": named, "version": "0", "instance": "a".repeat(64)})
    };
    // Readable by others; private but failing the proof (a reused port);
    // not loopback; a symlink to a private entry.
    plant(&data, "1-1.json", &entry(&evil.url), 0o644);
    plant(&data, "1-2.json", &entry(&evil.url), 0o600);
    plant(&data, "1-3.json", &entry("http://10.1.2.3:8787"), 0o600);
    let outside = plant(&home.join("elsewhere"), "x.json", &entry(&evil.url), 0o600);
    std::os::unix::fs::symlink(&outside, data.join("proxies").join("1-4.json")).unwrap();

    for args in [
        &["status", "--json", "mine"][..],
        &["tideline", "--json", "--session", "mine"][..],
        &["ui"][..],
    ] {
        let o = cli(home, &data, args);
        let out = ok(&o, &format!("{args:?}"));
        let err = text(&o.stderr);
        assert!(
            err.contains("not trusting 4 entries"),
            "{args:?} says why it skips them: {err}"
        );
        for why in [
            "readable or writable by others",
            "did not prove",
            "not a loopback",
            "cannot be opened",
        ] {
            assert!(err.contains(why), "{args:?}: {why}: {err}");
        }
        if args[0] == "ui" {
            assert!(out.starts_with(&served.url), "{out}");
        }
    }
    // The real proxy was used; what answered at the planted URL never saw
    // a token (only the token-free challenge of the private entry).
    let heads = evil.heads.lock().unwrap().clone();
    assert!(!heads.is_empty(), "the private entry was challenged");
    for h in &heads {
        let lower = h.to_ascii_lowercase();
        assert!(!lower.contains("authorization"), "{h}");
        assert!(h.starts_with("GET /_oceancode/instance?challenge="), "{h}");
        assert!(!h.contains("FILESECRET") && !h.contains(real), "{h}");
    }
    // The guard kills and reaps it (a taken `Child` dropped would not).
    drop(served);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_data_dir_gets_the_token_and_the_entry_back() {
    let fake = fake().await;
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let data = home.join("data");
    let served = serve(home, &data, &fake.url(), &[], &[CONTEXT]);
    let c = http();
    let hdr = [("x-oceancode-session", "again")];
    chat(&c, &served.url, "/v1/messages", &hdr, "again", 1).await;
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    assert_eq!(entries(&data).len(), 1);
    // Every write committed and every file written (the transcripts and
    // SESSION.md trail the commit by up to a second), so the removal below
    // does not race the writer.
    let settle = http::Request::builder()
        .method("POST")
        .uri(format!("{}/_oceancode/settle", served.url))
        .header("authorization", format!("Bearer {}", token.trim()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let settled = c.request(settle).await.expect("the proxy answers");
    assert_eq!(settled.status(), 200);

    std::fs::remove_dir_all(&data).unwrap();
    // The next request reopens a fresh ledger in its place.
    chat(&c, &served.url, "/v1/messages", &hdr, "again", 2).await;
    eventually(
        Duration::from_secs(20),
        "the token file and the registry entry written again",
        || {
            if data.join("admin-token").exists() && entries(&data).len() == 1 {
                Ok(())
            } else {
                Err(std::fs::read_dir(&data).map(|d| {
                    d.filter_map(Result::ok)
                        .map(|e| e.path())
                        .collect::<Vec<_>>()
                }))
            }
        },
    );
    assert_eq!(
        std::fs::read_to_string(data.join("admin-token")).unwrap(),
        token,
        "the token the proxy still serves with"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&data.join("admin-token")), 0o600);
        assert_eq!(mode(&entries(&data)[0]), 0o600);
    }
    // Commands find the proxy again without --proxy.
    let v = json_ok(
        &cli(home, &data, &["tideline", "--json", "--session", "again"]),
        "tideline after the data dir was deleted",
    );
    assert_eq!(v["session"]["client_session"], "name:again", "{v}");
    drop(served);
}
