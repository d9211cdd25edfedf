//! The ledger commands of the binary: `ledger rebuild [--merge]`,
//! `ledger vacuum`, `export`, `recall`, `status`, and `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::store::LedgerWrite;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_window::{Dialect, Event, RowKind, SessionMeta};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::ChildGuard;
use oceancode_testkit::eventually;
use oceancode_testkit::ledger::Sim;

const BIN: &str = env!("CARGO_BIN_EXE_oceancode-proxy");
const T0: i64 = 1_700_000_000_000;

/// The binary with an isolated environment (no user config or data dir).
fn cmd(home: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("share"))
        .env_remove("OCEANCODE_CONFIG")
        .env_remove("OCEANCODE_DATA_DIR")
        .env_remove("OCEANCODE_CONTEXT_TOKENS")
        .env_remove("OCEANCODE_TIDELINE")
        .env_remove("OCEANCODE_RETENTION_DAYS")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .stdin(Stdio::null());
    c
}

fn run(home: &Path, data: &Path, args: &[&str]) -> Output {
    cmd(home)
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .expect("run the binary")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8")
}

/// A session of the ledger kit as `ledger` commands find it (no client
/// session, created at `ts`).
fn session(store: &Store, id: &str, ts: i64) -> Sim {
    Sim::with_meta(
        store,
        SessionMeta {
            id: id.into(),
            client: "claude-code".into(),
            client_session: None,
            dialect: Dialect::Anthropic,
            model: "claude-opus-5-5".into(),
            parent: None,
            parent_seq: None,
            created_ms: ts,
            last_ms: ts,
        },
    )
}

/// One turn: an ask, a Bash call, its output and an answer, then the step.
fn turn(s: &mut Sim, ask: &str, command: &str, output: &str, answer: &str) {
    s.row(RowKind::Prompt, json!({"role": "user", "content": ask}));
    let id = format!("tu{}", s.seq);
    s.row(
        RowKind::Assistant,
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "Bash", "input": {"command": command}}]}),
    );
    s.row(
        RowKind::ToolResult,
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}),
    );
    s.row(
        RowKind::Assistant,
        json!({"role": "assistant", "content": [{"type": "text", "text": answer}]}),
    );
    s.end_step(100, 400, 30_000, 2_000);
}

/// A data dir with two sessions; the newest (`cli-main`) has three turns,
/// two of them past the tideline.
fn populate(data: &Path) {
    let store = Store::open(data, StoreOptions::default()).expect("store");
    let mut old = session(&store, "cli-older", T0);
    turn(
        &mut old,
        "tune the gearbox",
        "make gearbox",
        "ok",
        "Gearbox tuned.",
    );
    let mut s = session(&store, "cli-main", T0 + 10_000);
    turn(
        &mut s,
        "fix the flaky network test",
        "cargo test net",
        "Exit code 1\nnet::retry failed",
        "Found it: a race.",
    );
    turn(
        &mut s,
        "apply the fix",
        "cargo test net",
        "ok",
        "The network test passes.",
    );
    s.cut_at(s.seq, s.ts + 1);
    turn(
        &mut s,
        "write the release notes",
        "git log",
        "abc123 fix",
        "Notes written.",
    );
    store.shutdown().expect("shutdown");
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in ["", "transcript"] {
        let d = dir.join(sub);
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            if e.path().is_file() {
                out.insert(
                    format!("{sub}/{}", e.file_name().to_string_lossy()),
                    std::fs::read(e.path()).expect("read"),
                );
            }
        }
    }
    out
}

#[test]
fn cli_export_needs_exactly_one_format() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    let out = run(tmp.path(), &data, &["export"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--md"));
    let out = run(tmp.path(), &data, &["export", "--md", "--atif"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let help = ok(&run(tmp.path(), &data, &["export", "--help"]));
    assert!(help.contains("ATIF-v1.8"));
    // `ledger export`: the command to use instead.
    let out = run(tmp.path(), &data, &["ledger", "export", "--md", "cli-main"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`export` is a command of its own")
            && err.contains("oceancode-proxy export --md cli-main"),
        "{err}"
    );
}

#[test]
fn cli_rebuild_is_byte_identical() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    let dir = data.join("sessions/cli-main");
    let live = snapshot(&dir);
    assert!(live.contains_key("/SESSION.md"));
    std::fs::remove_dir_all(&dir).expect("rm");
    let out = ok(&run(tmp.path(), &data, &["ledger", "rebuild"]));
    assert!(
        out.starts_with(
            "rebuilt cli-main: 12 rows, 3 turn files, index.md, SESSION.md, search index"
        ),
        "{out}"
    );
    assert_eq!(snapshot(&dir), live);
    // --all and a prefix.
    let out = ok(&run(tmp.path(), &data, &["ledger", "rebuild", "--all"]));
    assert_eq!(out.lines().count(), 2, "{out}");
    let out = ok(&run(tmp.path(), &data, &["ledger", "rebuild", "cli-o"]));
    assert!(out.starts_with("rebuilt cli-older"));
    let out = run(tmp.path(), &data, &["ledger", "rebuild", "cli-"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"cli-\" is ambiguous: it names 2 sessions")
            && err.contains("\n  cli-main  ")
            && err.contains("\n  cli-older  "),
        "{err}"
    );
    let page = std::fs::read_to_string(dir.join("SESSION.md")).expect("page");
    assert!(page.contains("- t01 `cargo test net` → exit 1\n"), "{page}");
    assert!(page.contains("fixed t02"), "{page}");
}

#[test]
fn cli_export_md_and_atif() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    let md = ok(&run(tmp.path(), &data, &["export", "--md"]));
    assert!(md.starts_with("---\nsession: \"cli-main\"\n"), "{md}");
    assert!(md.contains("# Turn 1\n") && md.contains("# Turn 3\n"));
    assert!(md.contains("\n## Summary\n"));
    let md_old = ok(&run(tmp.path(), &data, &["export", "--md", "cli-older"]));
    assert!(md_old.contains("tune the gearbox"));

    let file = tmp.path().join("out.json");
    let out = run(
        tmp.path(),
        &data,
        &["export", "--atif", "--out", file.to_str().expect("path")],
    );
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("exported cli-main to"));
    let v: Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("json");
    assert_eq!(v["schema_version"], "ATIF-v1.8");
    let steps = v["steps"].as_array().expect("steps");
    assert!(steps
        .iter()
        .any(|s| s["extra"]["context_management"]["upto_seq"] == 8));
    let probe = Command::new("python3").args(["-c", "import atif"]).output();
    if probe.map(|o| o.status.success()).unwrap_or(false) {
        let out = Command::new("python3")
            .args([
                "-c",
                "import json,sys\nfrom atif import Trajectory\nTrajectory.model_validate(json.load(open(sys.argv[1])))",
            ])
            .arg(&file)
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        eprintln!("SKIPPED: ATIF validation needs python3 with the `atif` package");
    }
}

#[test]
fn cli_recall_log_entry_search() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    let out = ok(&run(tmp.path(), &data, &["recall", "--limit", "3"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[0].starts_with("seq 10 · t03 · assistant · Bash"),
        "{out}"
    );
    let out = ok(&run(
        tmp.path(),
        &data,
        &["recall", "--match", "network", "--before", "9"],
    ));
    assert_eq!(out.lines().count(), 2, "{out}");
    let out = ok(&run(tmp.path(), &data, &["recall", "entry", "3"]));
    // The result names its tool, from the call before it.
    assert!(out.contains("## seq 3 · user · result Bash"), "{out}");
    assert!(!out.contains("result ?"), "{out}");
    assert!(out.contains("net::retry failed"));
    let out = ok(&run(tmp.path(), &data, &["recall", "entry", "3", "--raw"]));
    let v: Value = serde_json::from_str(out.trim()).expect("raw json");
    assert_eq!(v["role"], "user");
    let out = ok(&run(
        tmp.path(),
        &data,
        &["recall", "entry", "1", "--session", "cli-older"],
    ));
    assert!(out.contains("tune the gearbox"));
    let out = ok(&run(
        tmp.path(),
        &data,
        &["recall", "search", "gearbox", "tuned"],
    ));
    assert!(
        out.starts_with("cli-older · seq 4 · t01 · assistant · [Gearbox] [tuned]"),
        "{out}"
    );
    let out = ok(&run(tmp.path(), &data, &["recall", "search", "cargo"]));
    assert_eq!(out.lines().count(), 2);
    assert!(out.lines().all(|l| l.starts_with("cli-main · ")));
    let out = run(tmp.path(), &data, &["recall", "entry", "99"]);
    assert!(!out.status.success());
}

#[test]
fn cli_status_meter_and_vacuum() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    let out = ok(&run(tmp.path(), &data, &["status"]));
    assert!(
        out.starts_with("session  cli-main (claude-code · claude-opus-5-5)\n"),
        "{out}"
    );
    assert!(
        out.contains("window 33k · line 80k · context 1.0M"),
        "{out}"
    );
    // No proxy holds it, and the ledger has no `Line` for it: the line of
    // its last cut, as recorded.
    assert!(
        out.contains("tideline @80k (80k, as it ran (recorded ")
            && out.contains("): no running proxy holds the session): 48k to go"),
        "{out}"
    );
    assert!(out.contains("┃"));
    assert!(out.contains("cache    hit ratio 93.5%"), "{out}");
    assert!(out.contains("spend    $0.0"), "{out}");
    assert!(out.contains("3 steps · 3 turns · 12 rows · 1 cut (rows ≤ seq 8 past the tideline)"));
    let json: Value = serde_json::from_str(&ok(&run(
        tmp.path(),
        &data,
        &["status", "--json", "cli-older"],
    )))
    .expect("json");
    assert_eq!(json["session"], "cli-older");
    assert_eq!(json["totals"]["cache_read"], 30_000);
    // Nothing recorded of its line: the configured one, said so.
    assert_eq!(json["line_source"]["kind"], "configured", "{json}");
    assert_eq!(json["line"], 400_000, "{json}");
    let out = ok(&run(tmp.path(), &data, &["status", "cli-older"]));
    assert!(
        out.contains(
            "tideline @40% (400k, as configured: none recorded, no running proxy holds the session)"
        ),
        "{out}"
    );

    let out = ok(&run(tmp.path(), &data, &["ledger", "vacuum"]));
    assert!(
        out.contains("retention: 2 sessions removed"),
        "old test sessions are idle: {out}"
    );
    let cfg = tmp.path().join("keep.json");
    std::fs::write(&cfg, r#"{"retention": {"days": 0}}"#).expect("cfg");
    populate(&data);
    let out = ok(&cmd(tmp.path())
        .arg("--data-dir")
        .arg(&data)
        .arg("--config")
        .arg(&cfg)
        .args(["ledger", "vacuum"])
        .output()
        .expect("run"));
    assert!(out.contains("retention: 0 sessions removed"), "{out}");
}

/// A one-shot fake Anthropic upstream: answers one request with `answer`
/// and hands back the request it got.
fn fake_upstream(answer: &'static str) -> (String, std::thread::JoinHandle<String>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut r = BufReader::new(s.try_clone().expect("clone"));
        let mut head = String::new();
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).expect("line");
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().expect("length");
            }
            head.push_str(&line);
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).expect("body");
        let reply = json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-haiku-4-5", "content": [{"type": "text", "text": answer}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}})
        .to_string();
        let _ = write!(
            s,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
            reply.len()
        );
        head + &String::from_utf8_lossy(&body)
    });
    (url, h)
}

#[test]
fn cli_rebuild_merge_asks_then_calls_the_model() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    populate(&data);
    // Merge off: a clear refusal.
    let out = run(
        tmp.path(),
        &data,
        &["ledger", "rebuild", "--merge", "--yes"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ledger.merge.model"));

    let (url, fake) = fake_upstream(
        "Decisions | t01 | retry the network call with backoff\nNext step | t02 | ship it\nnoise line",
    );
    let cfg = tmp.path().join("merge.json");
    std::fs::write(
        &cfg,
        json!({"ledger": {"merge": {"model": "claude-haiku-4-5"}},
               "providers": {"anthropic": {"upstream": url}}})
        .to_string(),
    )
    .expect("cfg");
    let base = |c: &mut Command| {
        c.arg("--data-dir")
            .arg(&data)
            .arg("--config")
            .arg(&cfg)
            .env("ANTHROPIC_API_KEY", "sk-test-merge");
    };
    // Asked y/N: "n" sends nothing.
    let mut c = cmd(tmp.path());
    base(&mut c);
    let mut child = c
        .args(["ledger", "rebuild", "--merge"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"n\n")
        .expect("answer");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--merge sends 2 turns of 1 session to claude-haiku-4-5"),
        "{err}"
    );
    assert!(err.contains("cancelled"));

    // --yes: one call to the session's provider with this process's key.
    let mut c = cmd(tmp.path());
    base(&mut c);
    let out = ok(&c
        .args(["ledger", "rebuild", "--merge", "--yes"])
        .output()
        .expect("run"));
    assert!(
        out.contains("merged cli-main: t01–t02 → 2 lines in SESSION.md"),
        "{out}"
    );
    let request = fake.join().expect("fake");
    assert!(
        request.starts_with("POST /v1/messages HTTP/1.1"),
        "{request}"
    );
    assert!(request.contains("x-api-key: sk-test-merge"));
    assert!(request.contains("\"model\":\"claude-haiku-4-5\""));
    assert!(request.contains("=== transcript of t02 ==="));
    let dir = data.join("sessions/cli-main");
    let page = std::fs::read_to_string(dir.join("SESSION.md")).expect("page");
    assert!(
        page.contains("## Decisions\n\n- t01 retry the network call with backoff\n"),
        "{page}"
    );
    assert!(page.contains("## Next step\n\n- t02 ship it\n"));
    // The call's tokens and cost are in the meter, apart from the spend.
    let status = ok(&run(tmp.path(), &data, &["status", "cli-main"]));
    assert!(
        status.contains(
            "merge    1 call · 10 in · 5 out · $0.0000 (claude-haiku-4-5; not in the spend above)"
        ),
        "{status}"
    );

    // The merged lines live in the database: a mechanical rebuild (no
    // model call; the fake is gone) writes the same page.
    let live = snapshot(&dir);
    std::fs::remove_dir_all(&dir).expect("rm");
    ok(&run(tmp.path(), &data, &["ledger", "rebuild"]));
    assert_eq!(snapshot(&dir), live);
    // Nothing left to merge.
    let mut c = cmd(tmp.path());
    base(&mut c);
    let out = ok(&c
        .args(["ledger", "rebuild", "--merge", "--yes"])
        .output()
        .expect("run"));
    assert!(out.contains("merge: no backlog"), "{out}");
}

#[test]
fn cli_metrics_prometheus_text() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    // Killed when the test ends, passed or not.
    let _child = ChildGuard(Some(
        cmd(tmp.path())
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    ));
    let get = |auth: &str| -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n{auth}connection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    };
    // The admin token is made at first start, in the data dir.
    let token = eventually(
        Duration::from_secs(20),
        "the proxy to listen and make its admin token",
        || {
            let t = std::fs::read_to_string(data.join("admin-token")).ok()?;
            get("").map(|_| t.trim().to_string())
        },
    );
    let refused = get("").unwrap_or_default();
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    let body = get(&format!("authorization: Bearer {token}\r\n")).unwrap_or_default();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("text/plain; version=0.0.4"));
    let text = &body[body.find("\r\n\r\n").expect("body") + 4..];
    for name in [
        "oceancode_requests_total 0",
        "oceancode_cuts_total 0",
        "oceancode_tokens_kept_out_total 0",
        "oceancode_cache_read_ratio 0",
        "oceancode_writer_lag_seconds 0",
        "oceancode_prepare_seconds_total 0",
        "oceancode_ledger_pages_written_total 0",
        "oceancode_retention_sessions_removed_total 0",
        "oceancode_ledger_commit_lag_seconds{quantile=\"0.99\"}",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    // This request's connection is open; earlier ones may still be closing.
    let open: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("oceancode_connections "))
        .and_then(|v| v.trim().parse().ok())
        .expect("oceancode_connections");
    assert!(open >= 1, "{text}");
    // Prometheus text: comments, or `name{labels} value`.
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (name, value) = line.rsplit_once(' ').expect("name value");
        assert!(value.parse::<f64>().is_ok(), "{line}");
        let bare = name.split('{').next().unwrap_or(name);
        assert!(
            bare.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{line}"
        );
    }
}

/// `ledger list` and `status` say what a sibling and a sub-agent are
/// linked to.
#[test]
fn cli_list_and_status_show_a_siblings_link() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let store = Store::open(&data, StoreOptions::default()).expect("store");
    let mut root = session(&store, "cli-first", T0);
    turn(&mut root, "fix the tests", "cargo test", "ok", "Fixed.");
    for (id, seq, ts) in [("cli-sibling", Some(1), T0 + 5), ("cli-sub", None, T0 + 9)] {
        store
            .submit(Event::Session(SessionMeta {
                id: id.into(),
                client: "unknown".into(),
                client_session: Some("fp:x".into()),
                dialect: Dialect::Anthropic,
                model: "claude-opus-5-5".into(),
                parent: Some("cli-first".into()),
                parent_seq: seq,
                created_ms: ts,
                last_ms: ts,
            }))
            .expect("session");
    }
    store.shutdown().expect("shutdown");
    let out = ok(&run(tmp.path(), &data, &["ledger", "list"]));
    let line = |id: &str| {
        out.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} listed:\n{out}"))
            .to_string()
    };
    assert!(
        line("cli-sibling").ends_with("  sibling of cli-first after seq 1"),
        "{out}"
    );
    assert!(
        line("cli-sub").ends_with("  sub-agent of cli-first"),
        "{out}"
    );
    assert_eq!(line("cli-first").split_whitespace().count(), 7, "{out}");
    let out = ok(&run(tmp.path(), &data, &["status", "cli-sibling"]));
    assert!(
        out.contains("\nlink     sibling of cli-first, diverged after its seq 1\n"),
        "{out}"
    );
    let json: Value = serde_json::from_str(&ok(&run(
        tmp.path(),
        &data,
        &["status", "--json", "cli-sibling"],
    )))
    .expect("json");
    assert_eq!(
        (json["parent"].as_str(), json["parent_seq"].as_u64()),
        (Some("cli-first"), Some(1))
    );
    let out = ok(&run(tmp.path(), &data, &["status", "cli-first"]));
    assert!(!out.contains("link"), "{out}");
}
