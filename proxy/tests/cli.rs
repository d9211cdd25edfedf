//! The `oceancode-proxy` command line, as a user runs it: `ledger list|path`,
//! `tideline` against a running `serve`, the `run` wrapper (exit code, ledger
//! path, base URLs, `--tideline`), and config-file errors and warnings.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)] // a test: failures panic; libc calls

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oceancode_fakeup::{FakeConfig, FakeHandle, FakeUpstream};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{exited, output, proxy_cmd, serve, ChildGuard, Served};
use oceancode_testkit::eventually_async;

const USAGE: &str = "usage: oceancode-proxy tideline [--session S] [50% | 500k | now | default]";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sigterm_and_wait(s: &mut Served) {
    let child = s.guard.child();
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let st = exited(
        &mut s.guard,
        Duration::from_secs(15),
        "serve to stop on SIGTERM",
    );
    assert!(st.success(), "serve exits 0 on SIGTERM, got {st:?}");
    s.guard.0 = None;
}

type Http = Client<HttpConnector, Full<Bytes>>;

fn http() -> Http {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn request(
    c: &Http,
    method: &str,
    url: &str,
    hdrs: &[(&str, &str)],
    body: String,
) -> (u16, Value) {
    let mut b = http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in hdrs {
        b = b.header(*k, *v);
    }
    let fut = async {
        let resp = c
            .request(b.body(Full::new(Bytes::from(body))).expect("request"))
            .await
            .expect("proxy answers");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("request timed out")
}

/// One Anthropic turn of session `name`: `turns` user/assistant pairs so far.
async fn chat(c: &Http, url: &str, name: &str, turns: usize) -> Value {
    let mut msgs = Vec::new();
    for t in 0..turns {
        msgs.push(json!({"role": "user", "content": format!("{name} question {t}: {}", "words ".repeat(200))}));
        if t + 1 < turns {
            msgs.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    let body = json!({"model": "claude-test", "max_tokens": 256, "messages": msgs}).to_string();
    let (status, v) = request(
        c,
        "POST",
        &format!("{url}/v1/messages"),
        &[("x-oceancode-session", name), ("x-api-key", "k")],
        body,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

/// What each test starts from: a fake upstream, a temporary home, and the
/// ledger's data dir in it (`<home>/data`, not created).
struct Setup {
    fake: FakeHandle,
    data: PathBuf,
    tmp: tempfile::TempDir,
}

impl Setup {
    async fn new() -> Setup {
        // The chat helper writes its own assistant turns: no validation
        // needed, but they are valid anyway.
        let fake = FakeUpstream::start(FakeConfig::default())
            .await
            .expect("fake upstream");
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        Setup { fake, data, tmp }
    }

    fn home(&self) -> &Path {
        self.tmp.path()
    }

    /// `serve` on the data dir, in front of the fake upstream.
    fn serve(&self, extra: &[&str], env: &[(&str, &str)]) -> Served {
        serve(self.home(), &self.data, &self.fake.url(), extra, env)
    }
}

/// The binary with `args`, then `--data-dir <data>`.
fn with_data(home: &Path, data: &Path, args: &[&str]) -> Command {
    let mut c = proxy_cmd(home);
    c.args(args).arg("--data-dir").arg(data);
    c
}

/// `run --data-dir <data> <flags> -- <child>`.
fn run_cmd(home: &Path, data: &Path, flags: &[&str], child: &[&str]) -> Command {
    let mut c = proxy_cmd(home);
    c.arg("run")
        .arg("--data-dir")
        .arg(data)
        .args(flags)
        .arg("--")
        .args(child);
    c
}

fn ledger_cmd(home: &Path, data: &Path, args: &[&str]) -> Output {
    output(with_data(home, data, &[&["ledger"], args].concat()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_list_and_path_after_a_served_session() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());

    // No ledger yet: a clear error, non-zero exit, nothing created.
    let o = ledger_cmd(home, data, &["path"]);
    assert!(!o.status.success(), "{o:?}");
    let err = text(&o.stderr);
    assert!(
        err.contains("no ledger in") && err.contains(&data.display().to_string()),
        "{err}"
    );
    assert!(!data.join("oceancode.db").exists());
    let o = ledger_cmd(home, data, &["list"]);
    assert!(!o.status.success(), "{o:?}");

    // A short served session: two turns.
    let mut p = t.serve(&[], &[]);
    let c = http();
    chat(&c, &p.url, "cli-a", 1).await;
    chat(&c, &p.url, "cli-a", 2).await;
    sigterm_and_wait(&mut p);
    // One start line, and the new session logged at info (named).
    let log = p.stderr.lock().unwrap().clone();
    assert_eq!(log.matches("listening").count(), 1, "{log}");
    let opened: Vec<&str> = log.lines().filter(|l| l.contains("new session")).collect();
    assert_eq!(opened.len(), 1, "{log}");
    assert!(
        opened[0].contains("INFO") && opened[0].contains("name=cli-a"),
        "{log}"
    );

    let o = ledger_cmd(home, data, &["list"]);
    assert!(o.status.success(), "{o:?}");
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "header + one session:\n{out}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["id", "name", "client", "model", "turns", "rows", "last", "activity"],
        "{out}"
    );
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cols.len(), 7, "{out}");
    let id = cols[0];
    assert!(
        id.contains("-s-"),
        "an id tagged for an unknown client: {id}"
    );
    // The name the user gave (`x-oceancode-session`) is listed.
    assert_eq!(cols[1], "cli-a", "{out}");
    assert_eq!(cols[2], "unknown", "{out}");
    assert_eq!(cols[3], "claude-test", "{out}");
    assert_eq!(cols[4], "2", "two turns: {out}");
    // question 0, answer 0 (echoed), question 1, and the last answer.
    assert_eq!(cols[5], "4", "four rows: {out}");
    assert!(
        cols[6].len() >= 19 && cols[6].as_bytes()[4] == b'-' && cols[6].contains('T'),
        "an ISO time: {out}"
    );
    // `status` names it in its header too.
    let o = output(with_data(home, data, &["status", id]));
    assert!(o.status.success(), "{o:?}");
    let st = text(&o.stdout);
    assert!(
        st.starts_with(&format!("session  {id} \"cli-a\" (unknown · claude-test)")),
        "{st}"
    );

    // A relative --data-dir still prints an absolute path.
    let mut cmd = proxy_cmd(home);
    cmd.current_dir(home)
        .args(["ledger", "path", "--data-dir", "data"]);
    let o = output(cmd);
    assert!(o.status.success(), "{o:?}");
    let path = PathBuf::from(text(&o.stdout).trim());
    assert!(path.is_absolute(), "{path:?}");
    assert_eq!(
        path.canonicalize().unwrap(),
        data.join("sessions").join(id).canonicalize().unwrap()
    );
    for args in [&["path"][..], &["path", id][..]] {
        let o = ledger_cmd(home, data, args);
        assert!(o.status.success(), "{args:?}: {o:?}");
        let path = PathBuf::from(text(&o.stdout).trim());
        assert_eq!(path, data.join("sessions").join(id), "{args:?}");
        let t1 = path.join("transcript").join("0001.md");
        let t = std::fs::read_to_string(&t1).unwrap_or_else(|e| panic!("{}: {e}", t1.display()));
        assert!(t.contains("cli-a question 0"), "{t}");
        assert!(path.join("transcript").join("0002.md").exists());
    }
    // An unknown session is an error, not a made-up path.
    let o = ledger_cmd(home, data, &["path", "no-such-session"]);
    assert!(!o.status.success(), "{o:?}");
    assert!(text(&o.stderr).contains("no-such-session"), "{o:?}");
}

/// `tideline … --json --proxy URL`; the admin token comes from `data`.
fn tideline_cmd(home: &Path, data: &Path, url: &str, args: &[&str]) -> Output {
    let args = [&["tideline"], args, &["--json", "--proxy", url]].concat();
    output(with_data(home, data, &args))
}

/// `Authorization: Bearer <the admin token in data>`.
fn bearer(data: &Path) -> String {
    let t = std::fs::read_to_string(data.join("admin-token")).expect("the admin token");
    format!("Bearer {}", t.trim())
}

/// `method` on the admin path `path` of the proxy at `url`, with the token
/// in `data`.
async fn admin(c: &Http, method: &str, url: &str, path: &str, data: &Path) -> (u16, Value) {
    let auth = bearer(data);
    let url = format!("{url}{path}");
    request(c, method, &url, &[("authorization", &auth)], String::new()).await
}

async fn latest(c: &Http, url: &str, data: &Path) -> Value {
    let (status, v) = admin(c, "GET", url, "/_oceancode/sessions/latest", data).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// Every write of the proxy at `url` is committed.
async fn settle(c: &Http, url: &str, data: &Path) {
    let (status, _) = admin(c, "POST", url, "/_oceancode/settle", data).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_tideline_show_the_live_line_of_serve() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let mut p = t.serve(
        &["--tideline", "20k"],
        &[("OCEANCODE_CONTEXT_TOKENS", "200000")],
    );
    let url = p.url.clone();
    let c = http();
    chat(&c, &url, "live", 2).await;
    let id = latest(&c, &url, data).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let status = |proxy: &str, json: bool| {
        let mut cmd = with_data(home, data, &["status", "--proxy", proxy, &id]);
        cmd.env("OCEANCODE_CONTEXT_TOKENS", "200000");
        if json {
            cmd.arg("--json");
        }
        let o = output(cmd);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    // The live line is the fixed 20k of `serve --tideline`, labelled as such.
    let st: Value = serde_json::from_str(&status(&url, true)).unwrap();
    assert_eq!(st["line"], 20000, "{st}");
    assert_eq!(st["line_spec"], "20k", "{st}");
    assert_eq!(st["line_live"], true, "{st}");
    assert_eq!(st["line_source"]["kind"], "live", "{st}");
    let human = status(&url, false);
    assert!(
        human.contains(&format!(
            "tideline @20k (20k, live from the proxy at {url}):"
        )),
        "{human}"
    );
    // No proxy answering: the line the session ran with, said to be the
    // recorded one (not the configured 40%).
    let human = status("http://127.0.0.1:9", false);
    assert!(
        human.contains("tideline @20k (20k, as it ran (recorded ")
            && human.contains("): no running proxy holds the session)"),
        "{human}"
    );

    // `tideline` prints one line for a person; JSON only with --json, clean.
    let o = output(with_data(home, data, &["tideline", "--proxy", &url]));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        out.starts_with(&format!("session {id}: line 20k (20k) · gauge ")),
        "{out}"
    );
    assert!(out.contains(" rows · never cut"), "{out}");
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    let o = output(with_data(home, data, &["tideline", "--proxy", &url, "50%"]));
    let out = text(&o.stdout);
    assert!(
        out.starts_with("line set to 50% for all sessions (from the next request)\n"),
        "{out}"
    );
    // The line in force until then, and the one that comes: not a line
    // that reads as if the set failed.
    assert!(
        out.contains(&format!(
            "session {id}: line 20k (20k) now, 50% (100k) from its next request · gauge "
        )),
        "{out}"
    );
    let v = json_of(&tideline_cmd(home, data, &url, &["500k"]));
    assert_eq!(v["action"], "set", "{v}");
    assert_eq!(v["value"], "500k", "{v}");
    assert!(!v.to_string().contains("Set("), "no Rust debug text: {v}");
    sigterm_and_wait(&mut p);
}

fn json_of(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tideline_command_against_a_running_proxy() {
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let mut p = t.serve(&[], &[("OCEANCODE_CONTEXT_TOKENS", "100000")]);
    let url = p.url.clone();
    let c = http();
    for t in 1..=3 {
        chat(&c, &url, "tl", t).await;
    }
    let s = latest(&c, &url, data).await;
    let id = s["id"].as_str().unwrap().to_string();
    assert_eq!(s["meter"]["context"], 100000, "{s}");
    assert_eq!(s["meter"]["line"], 40000, "default 40%: {s}");
    assert_eq!(s["override"], Value::Null);

    let json_ok = |o: &Output, what: &str| -> Value {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{what}: {}\n{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}", text(&o.stdout)))
    };

    // Show.
    let v = json_ok(&tideline_cmd(home, data, &url, &[]), "show");
    assert_eq!(v["action"], "show", "{v}");
    assert!(v.get("cut_upto").is_none(), "only `now` names a cut: {v}");
    assert_eq!(v["session"]["id"], id.as_str(), "{v}");
    assert_eq!(v["session"]["meter"]["line"], 40000, "{v}");

    // A share of the context, for all sessions: applies from the next request.
    let v = json_ok(&tideline_cmd(home, data, &url, &["50%"]), "50%");
    assert_eq!(v["action"], "set", "{v}");
    assert_eq!(v["value"], "50%", "{v}");
    assert_eq!(v["scope"], "all sessions", "{v}");
    assert_eq!(
        latest(&c, &url, data).await["meter"]["line"],
        40000,
        "not before the next request"
    );
    chat(&c, &url, "tl", 4).await;
    assert_eq!(latest(&c, &url, data).await["meter"]["line"], 50000);

    // A fixed line, clamped to context − max_tokens.
    json_ok(&tideline_cmd(home, data, &url, &["500k"]), "500k");
    chat(&c, &url, "tl", 5).await;
    assert_eq!(latest(&c, &url, data).await["meter"]["line"], 100000 - 256);

    // One session: the admin API shows its override.
    let v = json_ok(
        &tideline_cmd(home, data, &url, &["--session", &id, "30%"]),
        "--session 30%",
    );
    assert_eq!(v["scope"], id.as_str(), "{v}");
    let s = latest(&c, &url, data).await;
    assert_eq!(s["override"], "30%", "{s}");
    chat(&c, &url, "tl", 6).await;
    assert_eq!(latest(&c, &url, data).await["meter"]["line"], 30000);
    // `status` shows the running proxy's line for the session, not the
    // configured one; without a proxy answering, the one it ran with.
    for (proxy, line, spec) in [
        (url.as_str(), 30000, "30%"),
        ("http://127.0.0.1:9", 30000, "30%"),
    ] {
        let mut cmd = with_data(home, data, &["status", "--json", "--proxy", proxy, &id]);
        cmd.env("OCEANCODE_CONTEXT_TOKENS", "100000");
        let st = json_ok(&output(cmd), "status");
        assert_eq!(st["line"], line, "{proxy}: {st}");
        assert_eq!(st["line_spec"], spec, "{proxy}: {st}");
    }

    // Cut now.
    let before = latest(&c, &url, data).await["meter"]["cuts"]
        .as_u64()
        .unwrap();
    let v = json_ok(&tideline_cmd(home, data, &url, &["now"]), "now");
    let upto = v["cut_upto"].as_u64().unwrap_or(0);
    assert!(upto >= 1, "a cut point: {v}");
    chat(&c, &url, "tl", 7).await;
    let s = latest(&c, &url, data).await;
    assert!(s["meter"]["cut_upto"].as_u64().unwrap() >= upto, "{s}");
    assert!(
        s["meter"]["window_rows"].as_u64().unwrap() < s["meter"]["active_rows"].as_u64().unwrap(),
        "the next window is cut: {s} (cuts before: {before})"
    );
    let last = fake.requests().last().unwrap().json().unwrap();
    let first = last["messages"][0]["content"].to_string();
    assert!(first.contains("past the tideline"), "stub first: {first}");

    // Back to the configured line (the session override, then the global
    // one); a unique prefix of the id names the session, as elsewhere.
    let prefix = &id[..id.len() - 2];
    let v = json_ok(
        &tideline_cmd(home, data, &url, &["--session", prefix, "default"]),
        "--session default",
    );
    assert_eq!(v["scope"], id.as_str(), "{v}");
    json_ok(&tideline_cmd(home, data, &url, &["default"]), "default");
    assert_eq!(latest(&c, &url, data).await["override"], Value::Null);
    chat(&c, &url, "tl", 8).await;
    assert_eq!(latest(&c, &url, data).await["meter"]["line"], 40000);

    // Refused values: non-zero exit and the usage line.
    for bad in [&["10k"][..], &["wide"][..], &["50%", "60%"][..]] {
        let o = tideline_cmd(home, data, &url, bad);
        assert!(!o.status.success(), "{bad:?}: {o:?}");
        let err = text(&o.stderr);
        assert!(err.contains(USAGE), "{bad:?}: {err}");
    }
    // Nothing changed.
    chat(&c, &url, "tl", 9).await;
    assert_eq!(latest(&c, &url, data).await["meter"]["line"], 40000);

    // No proxy answering: a clear error.
    sigterm_and_wait(&mut p);
    let o = tideline_cmd(home, data, &url, &["50%"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("no proxy answering"), "{o:?}");
}

const CHILD: &str = r#"
import json, os, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
base = os.environ["ANTHROPIC_BASE_URL"]
print("ANTHROPIC_BASE_URL=" + base)
print("OPENAI_BASE_URL=" + os.environ["OPENAI_BASE_URL"])
print("GOOGLE_GEMINI_BASE_URL=" + os.environ.get("GOOGLE_GEMINI_BASE_URL", "unset"))
body = json.dumps({"model": "claude-test", "max_tokens": 256,
                   "messages": [{"role": "user", "content": "hello from the child"}]}).encode()
req = urllib.request.Request(base + "/v1/messages", data=body, method="POST",
                             headers={"content-type": "application/json", "x-api-key": "k",
                                      "anthropic-version": "2023-06-01"})
answer = json.load(opener.open(req, timeout=10))
print("ANSWER=" + answer["content"][0]["text"])
admin = urllib.request.Request(os.environ["OCEANCODE_PROXY_URL"] + "/_oceancode/sessions/latest",
                               headers={"authorization": "Bearer " + os.environ["OCEANCODE_ADMIN_TOKEN"]})
meta = json.load(opener.open(admin, timeout=10))
print("LINE=%d" % meta["meter"]["line"])
sys.stdout.flush()
sys.exit(3)
"#;

fn python3() -> bool {
    Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn run_child(home: &Path, data: &Path, fake: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let flags = [&["--anthropic-upstream", fake], extra].concat();
    let mut c = run_cmd(home, data, &flags, &["python3", "-c", CHILD]);
    c.envs(env.iter().copied());
    output(c)
}

fn line_value(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_wraps_a_child_and_reports_its_ledger() {
    assert!(python3(), "python3 is needed for the run tests");
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let o = run_child(home, data, &fake.url(), &[], &[]);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(3),
        "the child's exit code\n{out}\n{err}"
    );

    let anthropic = line_value(&out, "ANTHROPIC_BASE_URL=");
    let openai = line_value(&out, "OPENAI_BASE_URL=");
    assert!(anthropic.starts_with("http://127.0.0.1:"), "{anthropic}");
    assert_ne!(
        anthropic, "http://127.0.0.1:8787",
        "a free port, not the default"
    );
    assert_eq!(openai, format!("{anthropic}/v1"));
    // Gemini CLI (`@google/genai`) appends `/v1beta/models/…` itself.
    assert_eq!(line_value(&out, "GOOGLE_GEMINI_BASE_URL="), anthropic);
    assert_eq!(line_value(&out, "ANSWER="), "Done. FINAL_ANSWER_MARKER");
    assert_eq!(fake.request_count(), 1, "the child's request went upstream");

    let prefix = format!("oceancode-proxy: ledger {}/sessions/", data.display());
    let dirs: Vec<&str> = err.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(dirs.len(), 1, "one ledger path printed:\n{err}");
    let dir = PathBuf::from(dirs[0].trim_start_matches("oceancode-proxy: ledger "));
    assert!(dir.is_dir(), "{}", dir.display());
    let t = std::fs::read_to_string(dir.join("transcript").join("0001.md")).unwrap();
    assert!(t.contains("hello from the child"), "{t}");
    assert!(
        t.contains("Done. FINAL_ANSWER_MARKER"),
        "the answer is recorded: {t}"
    );

    // A failing command: `run` still exits with the child's code.
    let url = fake.url();
    let o = output(run_cmd(
        home,
        data,
        &["--anthropic-upstream", &url],
        &["sh", "-c", "exit 7"],
    ));
    assert_eq!(o.status.code(), Some(7), "{o:?}");
    assert!(text(&o.stderr).contains("no session was recorded"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_tideline_sets_the_line_for_the_child() {
    assert!(python3(), "python3 is needed for the run tests");
    let t = Setup::new().await;
    let (fake, home) = (&t.fake, t.home());
    let env = [("OCEANCODE_CONTEXT_TOKENS", "100000")];
    // Each run on a data dir of its own.
    let run =
        |dir: &str, extra: &[&str]| run_child(home, &home.join(dir), &fake.url(), extra, &env);
    let with = run("a", &["--tideline", "50%"]);
    assert_eq!(with.status.code(), Some(3), "{with:?}");
    assert_eq!(line_value(&text(&with.stdout), "LINE="), "50000");
    let without = run("b", &[]);
    assert_eq!(without.status.code(), Some(3), "{without:?}");
    assert_eq!(
        line_value(&text(&without.stdout), "LINE="),
        "40000",
        "the default 40%"
    );
    let bad = run("c", &["--tideline", "wide"]);
    assert!(!bad.status.success(), "{bad:?}");
    // `run`'s own forms, not the `tideline` command's usage.
    let err = text(&bad.stderr);
    assert!(err.contains("--tideline wide: not a number"), "{err}");
    assert!(err.contains("--tideline takes a share"), "{err}");
    assert!(!err.contains(USAGE), "{err}");
    let small = run("c", &["--tideline", "10k"]);
    let err = text(&small.stderr);
    assert_eq!(small.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tideline 10k: a fixed tideline must be at least 20k tokens\n"),
        "{err}"
    );
    assert!(!err.contains(USAGE), "{err}");
    // A bare small number: both readings offered.
    let bare = run("c", &["--tideline", "20"]);
    let err = text(&bare.stderr);
    assert_eq!(bare.status.code(), Some(2), "{err}");
    assert!(
        err.contains("did you mean 20% ") && err.contains(" or 20k "),
        "{err}"
    );
    assert_eq!(fake.request_count(), 2, "the refused runs started no child");
}

/// A `claude` child is given the data dir as a directory it may read (the
/// transcripts the stub and pointers name), in the `=` form that leaves a
/// prompt after it alone; another child is given nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_lets_a_claude_child_read_the_data_dir() {
    use std::os::unix::fs::PermissionsExt;
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let bin = home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["claude", "other"] {
        let p = bin.join(name);
        std::fs::write(&p, "#!/bin/sh\nfor a in \"$@\"; do echo \"ARG=$a\"; done\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let url = fake.url();
    let args = |name: &str| {
        let prog = bin.join(name);
        let o = output(run_cmd(
            home,
            data,
            &["--anthropic-upstream", &url],
            &[prog.to_str().unwrap(), "-p", "fix it"],
        ));
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        text(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("ARG="))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let dir = std::path::absolute(data).unwrap();
    assert_eq!(
        args("claude"),
        [
            format!("--add-dir={}", dir.display()),
            "-p".into(),
            "fix it".into()
        ]
    );
    assert_eq!(args("other"), ["-p", "fix it"]);
}

/// One request with a system prompt of ~13k tokens (Claude Code's system
/// prompt and tools take 13–15k), then `status`; exits 0.
const FIXED_CHILD: &str = r#"
import json, os, subprocess, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = json.dumps({"model": "claude-test", "max_tokens": 256,
                   "system": "You are a coding agent." + " rule" * 13000,
                   "messages": [{"role": "user", "content": "fix the build"}]}).encode()
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages", data=body,
                             method="POST",
                             headers={"content-type": "application/json", "x-api-key": "k",
                                      "x-oceancode-session": "cramped",
                                      "anthropic-version": "2023-06-01"})
opener.open(req, timeout=10).read()
st = subprocess.run([os.environ["T_BIN"], "--data-dir", os.environ["T_DATA"], "status", "cramped"],
                    capture_output=True, text=True)
print(st.stdout)
sys.stdout.flush()
"#;

/// A line the fixed part of every request fills more than half of is
/// said in `status` and at the end of `run`, with a line that works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_the_fixed_part_nearly_fills_is_warned_with_one_that_works() {
    assert!(python3(), "python3 is needed for the run tests");
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let url = fake.url();
    let flags = ["--anthropic-upstream", &url, "--tideline", "20k"];
    let mut c = run_cmd(home, data, &flags, &["python3", "-c", FIXED_CHILD]);
    c.env("T_BIN", env!("CARGO_BIN_EXE_oceancode-proxy"))
        .env("T_DATA", data);
    let o = output(c);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        out.contains("         fixed: 13k of every request (system prompt, tools, the ask) stays whatever is cut: over half the 20k line"),
        "{out}"
    );
    assert!(out.contains("a line of 30k or more leaves room"), "{out}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("oceancode-proxy: session ")
            && last.contains("over half the 20k line")
            && last.ends_with("(--tideline 30k)"),
        "{err}"
    );
    // Under a line with room: no warning.
    let flags = ["--anthropic-upstream", &url, "--tideline", "40k"];
    let mut c = run_cmd(
        home,
        &home.join("roomy"),
        &flags,
        &["python3", "-c", FIXED_CHILD],
    );
    c.env("T_BIN", env!("CARGO_BIN_EXE_oceancode-proxy"))
        .env("T_DATA", home.join("roomy"));
    let o = output(c);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(!text(&o.stdout).contains("fixed:"), "{o:?}");
    assert!(!text(&o.stderr).contains("leaves room"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_config_unknown_key_fails_and_removed_keys_warn() {
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());

    let bad = home.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"ledger": {"tideline": {"percent": 40}, "bogus_key": 1}}"#,
    )
    .unwrap();
    let mut c = proxy_cmd(home);
    c.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .args(["--anthropic-upstream", &fake.url(), "--config"])
        .arg(&bad);
    let o = output(c);
    assert!(!o.status.success(), "{o:?}");
    let err = text(&o.stderr);
    assert!(err.contains("bogus_key"), "names the key: {err}");
    assert!(err.contains("bad.json"), "names the file: {err}");
    assert!(!err.contains("listening"), "{err}");

    let old = home.join("old.json");
    std::fs::write(&old, r#"{"ledger": {"low": 1}}"#).unwrap();
    let mut p = t.serve(&["--config", old.to_str().unwrap()], &[]);
    let c = http();
    chat(&c, &p.url, "cfg", 1).await;
    sigterm_and_wait(&mut p);
    let log = p.stderr.lock().unwrap().clone();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("ledger.low")).collect();
    assert_eq!(warnings.len(), 1, "one warning naming ledger.low:\n{log}");
    assert!(warnings[0].contains("WARN"), "{log}");
    // Other commands reading the same file warn too.
    let mut cmd = with_data(home, data, &["ledger", "list"]);
    cmd.args(["--config", old.to_str().unwrap()]);
    let o = output(cmd);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(text(&o.stderr).matches("ledger.low").count(), 1, "{o:?}");
    // A log filter that does not parse is an error naming its source.
    let mut cmd = with_data(home, data, &["serve", "--listen", "127.0.0.1:0"]);
    cmd.env("OCEANCODE_LOG", "[[[");
    let o = output(cmd);
    assert!(!o.status.success(), "{o:?}");
    assert!(text(&o.stderr).contains("OCEANCODE_LOG"), "{o:?}");

    // `ledger.enabled: false`: a plain relay, nothing on disk.
    let off = home.join("off.json");
    std::fs::write(&off, r#"{"ledger": {"enabled": false}}"#).unwrap();
    let off_data = home.join("off-data");
    let mut p = serve(
        home,
        &off_data,
        &fake.url(),
        &["--config", off.to_str().unwrap()],
        // Nothing on disk, so no token file: the token is given.
        &[("OCEANCODE_ADMIN_TOKEN", "off-token-0123456789")],
    );
    chat(&c, &p.url, "off", 2).await;
    let mut cmd = proxy_cmd(home);
    cmd.args(["tideline", "--json", "--proxy", &p.url, "30%"])
        .env("OCEANCODE_ADMIN_TOKEN", "off-token-0123456789");
    let t = output(cmd);
    assert!(!t.status.success(), "{t:?}");
    assert!(text(&t.stderr).contains("the ledger is off"), "{t:?}");
    sigterm_and_wait(&mut p);
    let log = p.stderr.lock().unwrap().clone();
    assert!(log.contains("(ledger: off)"), "{log}");
    assert!(!off_data.exists(), "no data dir with the ledger off");
}

/// `ui` on a data dir no proxy runs on does not hand out the viewer of the
/// proxy at the configured address when that one serves another data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ui_on_an_empty_data_dir_names_no_other_data_dirs_proxy() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let mut p = t.serve(&[], &[]);
    let c = http();
    chat(&c, &p.url, "ui-a", 1).await;
    let addr = p.url.trim_start_matches("http://").to_string();
    let token = bearer(data).trim_start_matches("Bearer ").to_string();
    // The proxy at the configured address, its token at hand: its own data
    // dir gets its viewer.
    let ui = |dir: &Path| {
        let mut cmd = with_data(home, dir, &["ui"]);
        cmd.env("OCEANCODE_LISTEN", &addr)
            .env("OCEANCODE_ADMIN_TOKEN", &token);
        output(cmd)
    };
    let o = ui(data);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        text(&o.stdout).starts_with(&format!("{}/_oceancode/ui/", p.url)),
        "{o:?}"
    );
    // Another, empty data dir: not that proxy's viewer.
    let empty = home.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = ui(&empty);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(text(&o.stdout).is_empty(), "{o:?}");
    assert!(
        err.contains("serves the data dir") && err.contains("empty"),
        "{err}"
    );
    sigterm_and_wait(&mut p);
}

/// `status`, `context` and `evict` without a session mean the same one:
/// the session the running proxy saw last, even when the ledger has a
/// later one from a proxy that has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_context_default_to_the_same_session() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let mut p = t.serve(&[], &[]);
    let c = http();
    chat(&c, &p.url, "def-live", 1).await;
    let live = latest(&c, &p.url, data).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    settle(&c, &p.url, data).await;
    // Another proxy on the data dir records a later session, then ends.
    let mut q = t.serve(&[], &[]);
    chat(&c, &q.url, "def-ended", 1).await;
    sigterm_and_wait(&mut q);
    let st = json_of(&output(with_data(home, data, &["status", "--json"])));
    let ctx = json_of(&output(with_data(home, data, &["context", "--json"])));
    assert_eq!(ctx["session"], live.as_str(), "{ctx}");
    assert_eq!(st["session"], live.as_str(), "{st}");
    sigterm_and_wait(&mut p);
}

/// Session ids in `ledger list` (header skipped).
fn listed(home: &Path, data: &Path) -> Vec<String> {
    let o = ledger_cmd(home, data, &["list"]);
    assert!(o.status.success(), "{o:?}");
    text(&o.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_commands_beside_a_running_serve_lose_none_of_its_writes() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let mut p = t.serve(&[], &[]);
    let c = http();
    chat(&c, &p.url, "beside-1", 1).await;
    settle(&c, &p.url, data).await;
    // Commands that open the ledger and close it again, failing or not:
    // none may take the database (and its WAL) from under the proxy.
    for args in [
        &["status", "no-such-session"][..],
        &["ledger", "path", "no-such-session"][..],
        &["ledger", "vacuum"][..],
        &["ledger", "list"][..],
    ] {
        let _ = output(with_data(home, data, args));
    }
    chat(&c, &p.url, "beside-2", 1).await;
    settle(&c, &p.url, data).await;
    // Another process sees the second session while the proxy still runs…
    assert_eq!(listed(home, data).len(), 2, "{:?}", listed(home, data));
    sigterm_and_wait(&mut p);
    // …and after it stopped.
    assert_eq!(listed(home, data).len(), 2);

    // A report piped into a reader that has gone (`| head`) ends quietly.
    let mut cmd = with_data(home, data, &["ledger", "list"]);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_ne!(o.status.code(), Some(101), "{err}");

    // Errors name their cause once.
    let mut cmd = proxy_cmd(home);
    cmd.args(["ledger", "list"])
        .env("OCEANCODE_CONFIG", home.join("missing.json"));
    let o = output(cmd);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_listen_address_needs_allow_remote() {
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    // Refused from the flag and from the environment alike.
    for (listen, env) in [
        (Some("0.0.0.0:0"), None),
        (Some("[::]:0"), None),
        (None, Some("0.0.0.0:0")),
    ] {
        let mut cmd = proxy_cmd(home);
        cmd.args(["serve", "--anthropic-upstream", &fake.url(), "--data-dir"])
            .arg(data);
        if let Some(l) = listen {
            cmd.args(["--listen", l]);
        }
        if let Some(e) = env {
            cmd.env("OCEANCODE_LISTEN", e);
        }
        let o = output(cmd);
        assert!(!o.status.success(), "{o:?}");
        let err = text(&o.stderr);
        assert!(
            err.contains("not a loopback address") && err.contains("--allow-remote"),
            "{err}"
        );
    }
    // Allowed: one warning line, and it serves.
    let mut cmd = proxy_cmd(home);
    cmd.args([
        "serve",
        "--allow-remote",
        "--listen",
        "0.0.0.0:0",
        "--anthropic-upstream",
        &fake.url(),
        "--data-dir",
    ])
    .arg(data)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    let mut child = common::ChildGuard(Some(cmd.spawn().unwrap()));
    let err = child.child().stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let mut warned = 0;
    let mut log = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("WARN") && line.contains("--allow-remote") {
            warned += 1;
        }
        if line.contains("oceancode-proxy listening on") {
            break;
        }
    }
    assert_eq!(warned, 1, "{log}");
    assert!(log.contains("listening on http://0.0.0.0:"), "{log}");
}

/// `T_COUNT` requests (3), each of session `limited` (or with
/// `T_NAMES=each`, of a session named anew each time), then the meter of
/// the running proxy; exits 0.
const LIMITED_CHILD: &str = r#"
import json, os, subprocess, sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
base = os.environ["ANTHROPIC_BASE_URL"]
each = os.environ.get("T_NAMES") == "each"
codes = []
for i in range(int(os.environ.get("T_COUNT", "3"))):
    body = json.dumps({"model": "claude-test", "max_tokens": 256,
                       "messages": [{"role": "user", "content": "hello %d" % i}]}).encode()
    req = urllib.request.Request(base + "/v1/messages", data=body, method="POST",
                                 headers={"content-type": "application/json", "x-api-key": "k",
                                          "x-oceancode-session": "limited-%d" % i if each else "limited",
                                          "anthropic-version": "2023-06-01"})
    try:
        opener.open(req, timeout=10).read()
        codes.append("200")
    except urllib.error.HTTPError as e:
        codes.append(str(e.code))
        print("RETRY=" + str(e.headers.get("x-should-retry")))
        print("REFUSAL=" + json.load(e)["error"]["message"])
print("CODES=" + ",".join(codes))
st = subprocess.run([os.environ["T_BIN"], "--data-dir", os.environ["T_DATA"], "status", "limited"],
                    capture_output=True, text=True)
print(st.stdout)
sys.stdout.flush()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_with_the_limit_code_and_names_the_limit_that_stopped_it() {
    assert!(python3(), "python3 is needed for the run tests");
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let url = fake.url();
    let flags = [
        "--anthropic-upstream",
        &url,
        "--max-steps",
        "2",
        "--max-time",
        "2h",
    ];
    let mut c = run_cmd(home, data, &flags, &["python3", "-c", LIMITED_CHILD]);
    c.env("T_BIN", env!("CARGO_BIN_EXE_oceancode-proxy"))
        .env("T_DATA", data);
    let o = output(c);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(8), "the limit code\n{out}\n{err}");
    assert_eq!(line_value(&out, "CODES="), "200,200,402");
    assert_eq!(line_value(&out, "RETRY="), "false");
    assert!(
        line_value(&out, "REFUSAL=").contains("reached its step limit: 2 steps made of 2 steps"),
        "{out}"
    );
    assert_eq!(fake.request_count(), 2, "the refused request went nowhere");
    assert!(
        err.contains("oceancode-proxy: the run stopped at a limit: the run (every session) reached its step limit: 2 steps made of 2 steps (limits.session.steps, --max-steps) (exit code 8; the command exited with 0)"),
        "{err}"
    );
    // `status` asked the running proxy: steps and elapsed against the bounds.
    assert!(out.contains("limits   steps 2 / 2 · elapsed "), "{out}");
    assert!(out.contains(" / 2h (live from the "), "{out}");
    assert!(out.contains("stopped: the run (every session) "), "{out}");
    // Once the run is over, the ledger still says where it stopped.
    let after = output(with_data(home, data, &["status", "limited"]));
    let after = text(&after.stdout);
    assert!(
        after.contains("stopped  the run (every session) reached its step limit: 2 steps made of 2 steps (limits.session.steps, --max-steps) · the request after step 2 was refused"),
        "{after}"
    );

    // Without a limit reached, `run` keeps the child's code; a bad flag is refused.
    let flags = ["--anthropic-upstream", &url, "--max-steps", "5"];
    let o = output(run_cmd(home, data, &flags, &["sh", "-c", "exit 7"]));
    assert_eq!(o.status.code(), Some(7));
    for bad in [
        ["--max-time", "soon"],
        ["--max-spend", "-1"],
        ["--max-steps", "0"],
    ] {
        let o = output(run_cmd(home, data, &bad, &["true"]));
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {o:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_limits_bound_the_whole_run_whatever_names_its_agent_sends() {
    assert!(python3(), "python3 is needed for the run tests");
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    let url = fake.url();
    // Ten requests, each naming a session of its own: one budget for the run.
    let flags = ["--anthropic-upstream", &url, "--max-steps", "5"];
    let mut c = run_cmd(home, data, &flags, &["python3", "-c", LIMITED_CHILD]);
    c.env("T_BIN", env!("CARGO_BIN_EXE_oceancode-proxy"))
        .env("T_DATA", data)
        .env("T_NAMES", "each")
        .env("T_COUNT", "10");
    let o = output(c);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(8), "the limit code\n{out}\n{err}");
    assert_eq!(
        line_value(&out, "CODES="),
        "200,200,200,200,200,402,402,402,402,402",
        "{err}"
    );
    assert_eq!(fake.request_count(), 5, "five steps in all went upstream");
    assert!(
        err.contains("the run stopped at a limit: the run (every session) reached its step limit: 5 steps made of 5 steps"),
        "{err}"
    );
}

/// `context --receipt` with no proxy reads the receipt file itself: the
/// session dir is the agent's to write, so a FIFO left in the receipt's
/// place must neither hang the command nor be read (issue 33 item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_receipt_without_a_proxy_never_hangs_on_a_fifo() {
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let mut p = t.serve(&[], &[]);
    chat(&http(), &p.url, "cli-fifo", 1).await;
    sigterm_and_wait(&mut p);
    let id = listed(home, data).remove(0);
    let dir = oceancode_ledger::paths::DataDir::new(data).session_dir(&id);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("context.receipt.txt");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let child = with_data(home, data, &["context", &id, "--receipt"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    // Killed if it hangs (the guard's drop).
    let mut guard = ChildGuard(Some(child));
    let status = eventually_async(
        std::time::Duration::from_secs(20),
        "`context --receipt` not to hang on a FIFO in the receipt's place",
        || std::future::ready(guard.child().try_wait().expect("wait")),
    )
    .await;
    guard.0 = None;
    // No proxy and no readable receipt: the no-proxy error, at once.
    assert!(!status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_errors_never_show_the_credentials_of_a_url() {
    // D20 (issue 40, item 10).
    let t = Setup::new().await;
    let (home, data) = (t.home(), t.data.as_path());
    let cfg = home.join("creds.json");
    std::fs::write(
        &cfg,
        r#"{"providers": {"anthropic": {"upstream": "https://cfguser:SECRETPASS3@api.example.com"}}}"#,
    )
    .unwrap();
    let serve_with = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = with_data(home, data, &["serve", "--listen", "127.0.0.1:0"]);
        c.args(args).envs(env.iter().copied());
        output(c)
    };
    for (o, what) in [
        (
            serve_with(
                &[],
                &[(
                    "OCEANCODE_ANTHROPIC_UPSTREAM",
                    "https://user:SECRETPASS2@api.example.com",
                )],
            ),
            "OCEANCODE_ANTHROPIC_UPSTREAM",
        ),
        (
            serve_with(
                &[
                    "--openai-upstream",
                    "https://api.example.com/v1?key=SECRETQ9",
                ],
                &[],
            ),
            "providers.openai.upstream",
        ),
        (
            serve_with(
                &["--openai-upstream", "https://SECRETTOKEN7@api.example.com"],
                &[],
            ),
            "providers.openai.upstream",
        ),
        (
            serve_with(&["--config", cfg.to_str().unwrap()], &[]),
            "providers.anthropic.upstream",
        ),
        (
            output(with_data(
                home,
                data,
                &[
                    "ledger",
                    "list",
                    "--database",
                    "postgres://pg:SECRETPG4@127.0.0.1:1/l?password=SECRETPG5",
                ],
            )),
            "127.0.0.1:1",
        ),
    ] {
        assert!(!o.status.success(), "{o:?}");
        let err = text(&o.stderr);
        assert!(err.contains(what), "names the source {what}: {err}");
        assert!(!err.contains("SECRET"), "a credential printed: {err}");
        assert!(err.contains("***"), "masked: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_admin_token_is_refused_and_a_readable_token_file_made_private() {
    // Issue 40, item 6.
    use std::os::unix::fs::PermissionsExt;
    let t = Setup::new().await;
    let (fake, home, data) = (&t.fake, t.home(), t.data.as_path());
    for extra in [
        &["--listen", "127.0.0.1:0"][..],
        &["--allow-remote", "--listen", "0.0.0.0:0"][..],
    ] {
        let mut c = with_data(home, data, &["serve"]);
        c.args(["--anthropic-upstream", &fake.url()])
            .args(extra)
            .env("OCEANCODE_ADMIN_TOKEN", "a");
        let o = output(c);
        assert!(!o.status.success(), "{extra:?}: {o:?}");
        let err = text(&o.stderr);
        assert!(
            err.contains("OCEANCODE_ADMIN_TOKEN has 1 characters; at least 16"),
            "{extra:?}: {err}"
        );
    }
    // A short token file is refused the same way.
    std::fs::create_dir_all(data).unwrap();
    let file = data.join("admin-token");
    std::fs::write(&file, "short\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut c = with_data(home, data, &["serve", "--listen", "127.0.0.1:0"]);
    c.args(["--anthropic-upstream", &fake.url()]);
    let o = output(c);
    assert!(!o.status.success(), "{o:?}");
    assert!(text(&o.stderr).contains("at least 16"), "{o:?}");
    // A world-readable one is made 0600, with a warning, and used.
    let token = "0123456789abcdef0123456789abcdef";
    std::fs::write(&file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut p = t.serve(&[], &[]);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let c = http();
    let (status, _) = request(
        &c,
        "GET",
        &format!("{}/_oceancode/health", p.url),
        &[("authorization", &format!("Bearer {token}"))],
        String::new(),
    )
    .await;
    assert_eq!(status, 200);
    sigterm_and_wait(&mut p);
    let log = p.stderr.lock().unwrap().clone();
    assert!(
        log.contains("readable by others (mode 644); made it 0600"),
        "{log}"
    );
}
