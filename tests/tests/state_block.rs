//! The artifact-trail probe (issue 13): after every cut, every file path
//! touched in the rows that left and the current task list are visible in
//! what the upstream gets (window ∪ stub ∪ state block); the state block is
//! within its budget, byte-stable between cuts, and the transcript lines it
//! names land on the rows. Sessions open like the captured clients
//! (`fixtures/captures/anthropic_11_claude_md`: Claude Code 2.1;
//! `fixtures/captures/openai_07_codex_agents_md`: Codex 0.171) and then run
//! a long scripted tool loop through the fake upstream with the clients'
//! own tool shapes, at a fixed 20k line.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{count_tokens, FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_proxy::dialect::ParsedBody;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_tests::{captured, tool_lines, Captured, Harness};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

const STEPS: usize = 150;
const STATE_HEAD: &str = "[State at the tideline:";
const ROOT: &str = "/home/dev/proj";

/// The proxy options of `serve --tideline 20k` (200k context), the state
/// block on or off.
fn opts_20k(o: &mut oceancode_proxy::runtime::ProxyOptions, state: Option<u32>) {
    o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
        context: Some(200_000),
        max_output: Some(32_000),
    });
    o.sessions.line = oceancode_config::LineSpec::Tokens(20_000);
    o.sessions.state_tokens = state;
}

/// A proxy with [`opts_20k`].
async fn harness_20k(fake: FakeConfig, state: Option<u32>) -> Harness {
    Harness::start(fake, move |o| opts_20k(o, state)).await
}

/// A captured client: its first request (made non-streaming) sent again at
/// every step, with the conversation so far under `key`.
struct Client {
    cap: Captured,
    body: Value,
    key: &'static str,
}

impl Client {
    /// The client of the capture `run`, and the conversation it opens with.
    fn open(run: &str, key: &'static str) -> (Client, Vec<Value>) {
        let cap = captured(run).swap_remove(0);
        let mut body: Value = serde_json::from_slice(&cap.body).unwrap();
        body["stream"] = json!(false);
        let conversation = body[key].as_array().unwrap().clone();
        (Client { cap, body, key }, conversation)
    }

    /// Step `i`: `conversation` through the proxy; the answer (a 200).
    async fn send(&mut self, h: &Harness, conversation: &[Value], i: usize) -> Value {
        self.body[self.key] = Value::Array(conversation.to_vec());
        let headers: Vec<(&str, &str)> = self
            .cap
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let got = h
            .post(&self.cap.path, &headers, self.body.to_string())
            .await;
        assert_eq!(got.status, 200, "step {i}: {}", got.text());
        got.json()
    }
}

/// The id of the tool call in an Anthropic answer's `content`.
fn tool_use_id(content: &Value) -> String {
    content
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .and_then(|b| b["id"].as_str())
        .unwrap()
        .to_string()
}

/// The tasks of step `i` (statuses move on as the session goes).
fn tasks(i: usize) -> Vec<(String, &'static str)> {
    (0..5)
        .map(|k| {
            let status = match (i / 20).cmp(&k) {
                std::cmp::Ordering::Greater => "completed",
                std::cmp::Ordering::Equal => "in_progress",
                std::cmp::Ordering::Less => "pending",
            };
            (
                format!("Task {k}: port module {k} (round {})", i / 40),
                status,
            )
        })
        .collect()
}

/// One scripted step of a client: the tool call, and the paths it touches.
struct Step {
    tool: &'static str,
    input: Value,
    paths: Vec<String>,
    tasks: Option<Vec<(String, &'static str)>>,
    output: String,
}

/// Claude Code's tools: Read, Edit, Write, MultiEdit, NotebookEdit, Bash
/// (some failing), Grep, TodoWrite.
fn claude_step(i: usize) -> Step {
    let f = |stem: &str| format!("{ROOT}/pkg/{stem}_{i}.py");
    let out = tool_lines(i, 90, 3);
    let (tool, input, paths, tasks_, output) = match i % 9 {
        0 => {
            let t = tasks(i);
            let todos: Vec<Value> = t
                .iter()
                .map(|(c, s)| json!({"content": c, "status": s, "activeForm": c}))
                .collect();
            (
                "TodoWrite",
                json!({"todos": todos}),
                vec![],
                Some(t),
                "Todos have been modified successfully.".to_string(),
            )
        }
        1 => (
            "Read",
            json!({"file_path": f("alpha")}),
            vec![f("alpha")],
            None,
            out,
        ),
        2 => (
            "Edit",
            json!({"file_path": f("beta"), "old_string": "x = 1", "new_string": "x = 2"}),
            vec![f("beta")],
            None,
            "The file has been updated.".to_string() + &out,
        ),
        3 => (
            "Bash",
            json!({"command": format!("python -m pytest tests/test_{i}.py"), "description": "Run the tests"}),
            vec![],
            None,
            if i % 2 == 1 {
                format!("Exit code 1\nFAILED tests/test_{i}.py\n{out}")
            } else {
                out
            },
        ),
        4 => (
            "Write",
            json!({"file_path": f("gamma"), "content": "print('hi')\n"}),
            vec![f("gamma")],
            None,
            format!("File created successfully at: {}", f("gamma")),
        ),
        5 => (
            "MultiEdit",
            json!({"file_path": f("delta"), "edits": [{"old_string": "a", "new_string": "b"}]}),
            vec![f("delta")],
            None,
            out,
        ),
        6 => (
            "NotebookEdit",
            json!({"notebook_path": format!("{ROOT}/nb/eps_{i}.ipynb"), "new_source": "1+1", "cell_id": "c1"}),
            vec![format!("{ROOT}/nb/eps_{i}.ipynb")],
            None,
            out,
        ),
        7 => (
            "Grep",
            json!({"pattern": "def main", "path": format!("{ROOT}/zeta_{i}")}),
            vec![format!("{ROOT}/zeta_{i}")],
            None,
            out,
        ),
        _ => (
            "Bash",
            json!({"command": format!("cat {ROOT}/conf/eta_{i}.toml && ls"), "description": "Show config"}),
            vec![format!("{ROOT}/conf/eta_{i}.toml")],
            None,
            out,
        ),
    };
    Step {
        tool,
        input,
        paths,
        tasks: tasks_,
        output,
    }
}

/// Codex's tools: exec_command reading files (`sed -n`, `nl`, `cat`),
/// writing one (`cat > f <<EOF`), apply_patch (a tool and inside a shell
/// command), update_plan, a failing build.
fn codex_step(i: usize) -> Step {
    let out = format!(
        "Chunk ID: {i:06x}\nWall time: 0.0100 seconds\nProcess exited with code {}\nOriginal token count: 900\nOutput:\n{}",
        if i % 7 == 4 { 101 } else { 0 },
        tool_lines(i, 90, 5)
    );
    let p = |stem: &str| format!("src/{stem}_{i}.rs");
    let (tool, input, paths, tasks_) = match i % 7 {
        0 => {
            let t = tasks(i);
            let plan: Vec<Value> = t
                .iter()
                .map(|(c, s)| json!({"step": c, "status": s}))
                .collect();
            ("update_plan", json!({"plan": plan}), vec![], Some(t))
        }
        1 => (
            "exec_command",
            json!({"cmd": format!("sed -n '1,200p' {}", p("alpha"))}),
            vec![p("alpha")],
            None,
        ),
        2 => (
            "exec_command",
            json!({"cmd": format!("nl -ba {} | sed -n 40,90p", p("beta"))}),
            vec![p("beta")],
            None,
        ),
        3 => (
            "apply_patch",
            json!({"input": format!("*** Begin Patch\n*** Update File: {}\n@@\n-a\n+b\n*** Add File: {}\n+new\n*** End Patch\n", p("gamma"), p("delta"))}),
            vec![p("gamma"), p("delta")],
            None,
        ),
        4 => (
            "exec_command",
            json!({"cmd": "cargo build --workspace"}),
            vec![],
            None,
        ),
        5 => (
            "exec_command",
            json!({"cmd": format!("cat > {} <<'EOF'\nfn main() {{}}\nEOF", p("eps"))}),
            vec![p("eps")],
            None,
        ),
        _ => (
            "shell",
            json!({"command": ["bash", "-lc", format!("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {}\n@@\n-x\n+y\n*** End Patch\nEOF", p("zeta"))]}),
            vec![p("zeta")],
            None,
        ),
    };
    Step {
        tool,
        input,
        paths,
        tasks: tasks_,
        output: out,
    }
}

/// What a session left for the probe to look for: the paths each row
/// touched (by seq), and the task list the client had written by each of
/// its requests.
#[derive(Default)]
struct Trail {
    touched: HashMap<u64, Vec<String>>,
    tasks_at: Vec<Option<Vec<(String, &'static str)>>>,
    tasks_now: Option<Vec<(String, &'static str)>>,
}

impl Trail {
    /// A request goes out with the task list written so far.
    fn request(&mut self) {
        self.tasks_at.push(self.tasks_now.clone());
    }

    /// The step's task list, if it wrote one, is the client's from now on.
    fn wrote(&mut self, s: &Step) {
        if let Some(t) = &s.tasks {
            self.tasks_now = Some(t.clone());
        }
    }
}

/// What the probe found over one session.
#[derive(Debug, Default)]
struct Probe {
    cut_windows: usize,
    cuts: usize,
    paths_expected: usize,
    paths_seen: usize,
    tasks_expected: usize,
    tasks_seen: usize,
    block_tokens: Vec<u64>,
    missing: Vec<String>,
}

impl Probe {
    fn share(&self) -> f64 {
        let all = self.paths_expected + self.tasks_expected;
        if all == 0 {
            return 1.0;
        }
        (self.paths_seen + self.tasks_seen) as f64 / all as f64
    }

    /// Reports, then asserts that the line was crossed many times and every
    /// path and task list stayed visible in a block within its budget.
    fn assert_whole_trail(&self, what: &str) {
        let p = self;
        p.report(what);
        assert!(p.cuts >= 5, "the line was crossed many times: {}", p.cuts);
        assert!(p.paths_expected > 100 && p.tasks_expected > 0, "{p:?}");
        assert!(
            p.missing.is_empty(),
            "not visible: {:#?}",
            &p.missing[..p.missing.len().min(20)]
        );
        assert!(
            p.block_tokens.iter().all(|&t| t <= 2_000),
            "{:?}",
            p.block_tokens
        );
    }

    fn report(&self, what: &str) {
        let max = self.block_tokens.iter().copied().max().unwrap_or(0);
        let mean = if self.block_tokens.is_empty() {
            0
        } else {
            self.block_tokens.iter().sum::<u64>() / self.block_tokens.len() as u64
        };
        println!(
            "probe {what}: cuts={} cut windows={} paths {}/{} tasks {}/{} share={:.1}% block tokens max={max} mean={mean}",
            self.cuts,
            self.cut_windows,
            self.paths_seen,
            self.paths_expected,
            self.tasks_seen,
            self.tasks_expected,
            self.share() * 100.0
        );
    }
}

/// `N` of the stub's "every row up to seq N left this window".
fn stub_upto(text: &str) -> Option<u64> {
    let at = text.find("every row up to seq ")? + "every row up to seq ".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The stub message's first text (stub line, turn lines, state block).
fn stub_text(sent: &[Value]) -> Option<String> {
    sent.iter().find_map(|m| {
        let t = m["content"][0]["text"].as_str().or(m["content"].as_str())?;
        t.starts_with("[Earlier content of this session is past the tideline")
            .then(|| t.to_string())
    })
}

/// Run the probe over every upstream request: `trail.touched[seq]` are the
/// paths the row `seq` touched, `trail.tasks_at[k]` the task list the
/// client had written by its request `k`.
fn probe(reqs: &[Recorded], key: &str, trail: &Trail) -> Probe {
    let (touched, tasks_at) = (&trail.touched, &trail.tasks_at);
    let mut p = Probe::default();
    let mut last_stub: Option<String> = None;
    let mut last_raw: Option<Vec<String>> = None;
    for (k, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "request {k} is valid for the upstream");
        let body = std::str::from_utf8(&r.body).unwrap();
        let parsed = ParsedBody::parse(&r.body, key).unwrap();
        let raw: Vec<String> = parsed.messages.iter().map(|m| m.to_string()).collect();
        let msgs: Vec<Value> = raw
            .iter()
            .map(|m| serde_json::from_str(m).unwrap())
            .collect();
        let Some(stub) = stub_text(&msgs) else {
            continue;
        };
        let upto = stub_upto(&stub).unwrap();
        p.cut_windows += 1;
        let block = stub
            .find(STATE_HEAD)
            .map(|at| stub[at..].to_string())
            .expect("a cut window carries the state block");
        if last_stub.as_deref() == Some(stub.as_str()) {
            // Between cuts: the window only appends, byte for byte.
            let prev = last_raw.as_ref().unwrap();
            assert!(
                raw.len() >= prev.len() && raw[..prev.len()] == prev[..],
                "request {k}: the window changed without a cut"
            );
        } else {
            p.cuts += 1;
            p.block_tokens.push(count_tokens(&block));
        }
        last_stub = Some(stub.clone());
        last_raw = Some(raw.clone());
        let mut paths: BTreeSet<&str> = BTreeSet::new();
        for (seq, ps) in touched {
            if *seq <= upto {
                paths.extend(ps.iter().map(String::as_str));
            }
        }
        for path in paths {
            p.paths_expected += 1;
            // The block names a relative path (a shell command's) resolved
            // against the working directory the client states (ROOT).
            let resolved = if path.starts_with('/') {
                path.to_string()
            } else {
                format!("{ROOT}/{}", path.trim_start_matches("./"))
            };
            let (dir, name) = resolved
                .rsplit_once('/')
                .map_or(("", resolved.as_str()), |(d, n)| (d, n));
            let in_block = block.lines().any(|l| {
                l.starts_with(&format!("- {dir}/:"))
                    || l.starts_with(&format!("- {dir}/ (t")) && (l.contains(&format!(" {name} (")))
            });
            if body.contains(path) || in_block {
                p.paths_seen += 1;
            } else {
                p.missing.push(format!("request {k} (upto {upto}): {path}"));
            }
        }
        if let Some(list) = &tasks_at[k] {
            for (content, status) in list {
                p.tasks_expected += 1;
                let mark = match *status {
                    "completed" => "[x]",
                    "in_progress" => "[~]",
                    _ => "[ ]",
                };
                // In the window as the client wrote it, or in the block with its status.
                // (Codex's arguments are a JSON string: its quotes escaped.)
                let in_window = raw.iter().filter(|m| !m.contains(STATE_HEAD)).any(|m| {
                    let m = m.replace("\\\"", "\"");
                    m.contains(&format!(
                        "\"content\":\"{content}\",\"status\":\"{status}\""
                    )) || m.contains(&format!("\"status\":\"{status}\",\"step\":\"{content}\""))
                });
                if in_window || block.contains(&format!("- {mark} {content}")) {
                    p.tasks_seen += 1;
                } else {
                    p.missing
                        .push(format!("request {k}: task {content} ({status})"));
                }
            }
        }
    }
    p
}

/// Every `transcript/NNNN.md lines A–B: seq X–Y` range of `block` lands
/// on its rows: line A is the anchor of seq X, line B the end of seq Y.
fn assert_ranges_land(block: &str) -> usize {
    let mut n = 0;
    let dir = block
        .split_once("Where to look (the verbatim rows, in ")
        .and_then(|(_, r)| r.split_once("):"))
        .map(|(d, _)| d.to_string())
        .expect("the transcript dir");
    for line in block.lines() {
        let Some(rest) = line.strip_prefix("- ") else {
            continue;
        };
        let Some((file, tail)) = rest.split_once(".md lines ") else {
            continue;
        };
        let file = format!("{dir}{file}.md");
        let (lines, seqs) = tail.split_once(": seq ").unwrap();
        let parse = |s: &str| -> (u64, u64) {
            let s = s.split_whitespace().next().unwrap();
            match s.split_once('–') {
                Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                None => (s.parse().unwrap(), s.parse().unwrap()),
            }
        };
        let ((a, b), (x, y)) = (parse(lines), parse(seqs));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let all: Vec<&str> = text.split('\n').collect();
        assert!(
            all[a as usize - 1].starts_with(&format!("## seq {x} · ")),
            "{file} line {a}: {:?}",
            all[a as usize - 1]
        );
        // After the range: the next row's anchor (or the file goes on / ends).
        let next = all.get(b as usize + 1).copied().unwrap_or("");
        assert!(
            next.is_empty() || next.starts_with(&format!("## seq {} · ", y + 1)),
            "{file} line {}: {next:?}",
            b + 2
        );
        n += 1;
    }
    n
}

/// The Claude Code session: the capture's opening, then `STEPS` tool steps.
async fn claude_session(state: Option<u32>) -> (Harness, Vec<Recorded>, Probe) {
    let (mut client, mut history) = Client::open("anthropic_11_claude_md", "messages");
    let steps: Vec<Step> = (0..STEPS).map(claude_step).collect();
    let script = Script::replies(
        steps
            .iter()
            .map(|s| Reply::tool_call(s.tool, s.input.clone()).with_text("On it.")),
    )
    .then(Reply::text("All done."));
    let h = harness_20k(FakeConfig::default().with_script(script), state).await;
    let mut trail = Trail::default();
    for (i, s) in steps.iter().enumerate() {
        trail.request();
        let content = client.send(&h, &history, i).await["content"].clone();
        let id = tool_use_id(&content);
        history.push(json!({"role": "assistant", "content": content}));
        trail.touched.insert(history.len() as u64, s.paths.clone());
        let is_error = s.output.starts_with("Exit code 1");
        history.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": s.output, "is_error": is_error}]}));
        trail.wrote(s);
    }
    h.settle().await;
    let reqs = h.requests_to("/v1/messages");
    assert_eq!(reqs.len(), STEPS);
    let p = if state.is_some() {
        probe(&reqs, "messages", &trail)
    } else {
        Probe::default()
    };
    (h, reqs, p)
}

/// The Codex session: the capture's opening, then `STEPS` tool steps.
async fn codex_session() -> (Harness, Vec<Recorded>, Probe) {
    let (mut client, mut input) = Client::open("openai_07_codex_agents_md", "input");
    let steps: Vec<Step> = (0..STEPS).map(codex_step).collect();
    let script = Script::replies(
        steps
            .iter()
            .map(|s| Reply::tool_call(s.tool, s.input.clone())),
    )
    .then(Reply::text("All done."));
    let h = harness_20k(FakeConfig::default().with_script(script), Some(2_000)).await;
    let mut trail = Trail::default();
    for (i, s) in steps.iter().enumerate() {
        trail.request();
        let out = client.send(&h, &input, i).await["output"]
            .as_array()
            .unwrap()
            .clone();
        for item in &out {
            input.push(item.clone());
            if item["type"] == "function_call" {
                trail.touched.insert(input.len() as u64, s.paths.clone());
            }
        }
        for c in out.iter().filter(|i| i["type"] == "function_call") {
            input.push(
                json!({"type":"function_call_output","call_id":c["call_id"],"output":s.output}),
            );
        }
        trail.wrote(s);
    }
    h.settle().await;
    let reqs = h.requests_to("/v1/responses");
    assert_eq!(reqs.len(), STEPS);
    let p = probe(&reqs, "input", &trail);
    (h, reqs, p)
}

fn last_block(reqs: &[Recorded]) -> String {
    let body = std::str::from_utf8(&reqs.last().unwrap().body)
        .unwrap()
        .to_string();
    let v: Value = serde_json::from_str(&body).unwrap();
    let msgs = v["messages"]
        .as_array()
        .or(v["input"].as_array())
        .unwrap()
        .clone();
    let stub = stub_text(&msgs).unwrap();
    stub[stub.find(STATE_HEAD).unwrap()..].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_trail_probe_claude_code() {
    let (h, reqs, p) = claude_session(Some(2_000)).await;
    p.assert_whole_trail("claude code");
    let block = last_block(&reqs);
    assert!(block.contains("Goal (t01, seq 1): say hi"), "{block}");
    assert!(
        block.contains("→ exit 1"),
        "a failed command is listed: {block}"
    );
    assert!(assert_ranges_land(&block) >= 1, "{block}");
    println!("last state block:\n{block}");
    // A long headless turn: SESSION.md has its files and commands after the first cut.
    let store = h.store();
    let id = store.latest_session().unwrap().unwrap();
    let page = std::fs::read_to_string(store.data_dir().session_md(&id)).unwrap();
    assert!(page.contains("alpha_1.py"), "{page}");
    assert!(page.contains("python -m pytest"), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_trail_probe_codex() {
    let (h, reqs, p) = codex_session().await;
    p.assert_whole_trail("codex");
    let block = last_block(&reqs);
    assert!(
        block.contains("`cargo build --workspace` → exit 101"),
        "{block}"
    );
    assert!(assert_ranges_land(&block) >= 1, "{block}");
    println!("last state block:\n{block}");
    drop(h);
}

/// What the block costs: tokens sent over the session with and without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_block_costs_its_size_per_request_and_nothing_else() {
    let (_h1, with, _) = claude_session(Some(2_000)).await;
    let (_h2, without, _) = claude_session(None).await;
    let sent = |reqs: &[Recorded]| -> u64 {
        reqs.iter()
            .map(|r| count_tokens(std::str::from_utf8(&r.body).unwrap()))
            .sum()
    };
    let (a, b) = (sent(&with), sent(&without));
    let stubbed = with
        .iter()
        .filter(|r| std::str::from_utf8(&r.body).unwrap().contains(STATE_HEAD))
        .count();
    println!(
        "tokens sent over {STEPS} steps: with the block {a}, without {b} (+{:.2}%, {stubbed} requests carried it)",
        (a as f64 - b as f64) / b as f64 * 100.0
    );
    assert!(stubbed > 0);
    assert!(a > b, "the block is sent");
    assert!(
        (a - b) as f64 / (b as f64) < 0.15,
        "the block is small against the window: {a} vs {b}"
    );
    assert!(!std::str::from_utf8(&without.last().unwrap().body)
        .unwrap()
        .contains(STATE_HEAD));
}

/// A multi-turn Claude Code session: every 30th step the model answers in
/// text and the user asks the next thing (a new turn); else a tool step.
/// `restart_at`: before these steps' requests the proxy is stopped and a
/// new one opened on the same data dir (the ledger read back). Returns the
/// harness and the bodies the upstream got.
async fn multi_turn_session(restart_at: &[usize]) -> (Harness, Vec<Vec<u8>>) {
    const N: usize = 120;
    let (mut client, mut history) = Client::open("anthropic_11_claude_md", "messages");
    let turn_end = |i: usize| i % 30 == 29;
    let replies: Vec<Reply> = (0..N)
        .map(|i| {
            if turn_end(i) {
                Reply::text(format!("Round {} is done.", i / 30))
            } else {
                let s = claude_step(i);
                Reply::tool_call(s.tool, s.input).with_text("On it.")
            }
        })
        .collect();
    let fake = FakeConfig::default().with_script(Script::replies(replies));
    let mut h = harness_20k(fake, Some(2_000)).await;
    for i in 0..N {
        if restart_at.contains(&i) {
            h.restart(|o| opts_20k(o, Some(2_000))).await;
        }
        let content = client.send(&h, &history, i).await["content"].clone();
        history.push(json!({"role": "assistant", "content": content.clone()}));
        if turn_end(i) {
            history.push(json!({"role": "user", "content": format!(
                "Now round {}: port the next module and keep the tests green.",
                i / 30 + 1
            )}));
        } else {
            let id = tool_use_id(&content);
            let s = claude_step(i);
            history.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": s.output}]}));
        }
    }
    h.settle().await;
    let bodies = h
        .requests_to("/v1/messages")
        .into_iter()
        .map(|r| r.body.to_vec())
        .collect();
    (h, bodies)
}

/// `(stub's upto, state block)` of a request body, if it is cut.
fn cut_of(body: &str) -> Option<(u64, String)> {
    let v: Value = serde_json::from_str(body).unwrap();
    let stub = stub_text(v["messages"].as_array()?)?;
    let at = stub.find(STATE_HEAD)?;
    Some((stub_upto(&stub)?, stub[at..].to_string()))
}

/// After a restart the proxy reads the session back from the ledger: until
/// its next cut every request it sends is the bytes a proxy that never
/// stopped sends (the state block included), whether it restarted right
/// at a cut, the request after, or between cuts; and the block of a cut is
/// the same bytes in both whenever they cut at the same seq. (A restarted
/// proxy re-seeds its blocks from row estimates, so its next cut may fall
/// at another seq than the never-stopped one's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_block_and_window_are_byte_identical_after_a_restart() {
    let (a, sent_a) = multi_turn_session(&[]).await;
    let text = |b: &Vec<u8>| String::from_utf8(b.clone()).unwrap();
    // Where the never-stopped proxy cut: restart right after the second and
    // the fourth cut (before the next request), one request later, and
    // between cuts.
    let mut cut_at = Vec::new();
    let mut last = None;
    for (k, b) in sent_a.iter().enumerate() {
        let c = cut_of(&text(b)).map(|(u, _)| u);
        if c.is_some() && c != last {
            cut_at.push(k);
        }
        last = c;
    }
    assert!(cut_at.len() >= 5, "cuts at requests {cut_at:?}");
    let (c2, c4) = (cut_at[1], cut_at[3]);
    let between = (c2 + cut_at[2]) / 2;
    let restarts = [c2 + 1, c2 + 2, between, c4 + 1];
    assert!(c2 + 2 < between && between < c4);
    let (b, sent_b) = multi_turn_session(&restarts).await;
    assert_eq!(sent_a.len(), sent_b.len());
    // The two proxies name their own data dir and session id.
    let id = |h: &Harness| h.store().latest_session().unwrap().unwrap();
    let dir = |h: &Harness| h.data.path().to_string_lossy().into_owned();
    let (id_a, id_b, dir_a, dir_b) = (id(&a), id(&b), dir(&a), dir(&b));
    let norm = |x: &Vec<u8>| text(x).replace(&dir_a, &dir_b).replace(&id_a, &id_b);
    let mut blocks_a: HashMap<u64, String> = HashMap::new();
    for x in &sent_a {
        if let Some((u, block)) = cut_of(&norm(x)) {
            blocks_a.insert(u, block);
        }
    }
    let messages = |body: &str| -> Vec<String> {
        ParsedBody::parse(body.as_bytes(), "messages")
            .unwrap()
            .messages
            .iter()
            .map(|m| m.to_string())
            .collect()
    };
    // Across each restart: the cut, its state block and the window up to
    // the new request are the bytes sent before it.
    for &r in &restarts {
        let (before, after) = (text(&sent_b[r - 1]), text(&sent_b[r]));
        let (cut_before, cut_after) = (cut_of(&before), cut_of(&after));
        assert!(cut_before.is_some(), "request {}: cut", r - 1);
        assert_eq!(
            cut_before, cut_after,
            "restart before request {r}: the same cut and block"
        );
        let (m0, m1) = (messages(&before), messages(&after));
        assert!(
            m1.len() > m0.len() && m1[..m0.len()] == m0[..],
            "restart before request {r}: the window only appended"
        );
    }
    // Up to the first restart the two runs are one: from it until either
    // cuts again, every request is the same bytes.
    let r = restarts[0];
    let upto = cut_of(&text(&sent_b[r - 1])).map(|(u, _)| u);
    let mut same = 0;
    for k in 0..sent_b.len() {
        let (x, y) = (norm(&sent_a[k]), text(&sent_b[k]));
        if k >= r && (cut_of(&x).map(|(u, _)| u) != upto || cut_of(&y).map(|(u, _)| u) != upto) {
            break; // one of them cut again
        }
        if x != y {
            let at = x
                .bytes()
                .zip(y.bytes())
                .position(|(p, q)| p != q)
                .unwrap_or(x.len().min(y.len()));
            panic!(
                "request {k} differs at byte {at}:\n  never stopped: {}\n  restarted:     {}",
                &x[at.saturating_sub(200)..(at + 200).min(x.len())],
                &y[at.saturating_sub(200)..(at + 200).min(y.len())]
            );
        }
        same += 1;
    }
    assert!(same > r + 1, "{same} requests alike, restart before {r}");
    // A cut both made: the same state block.
    let mut shared = 0;
    for y in &sent_b {
        if let Some((u, block)) = cut_of(&text(y)) {
            assert!(block.contains(&format!("recall {id_b} --before {}", u + 1)));
            if let Some(x) = blocks_a.get(&u) {
                assert_eq!(x, &block, "the block of the cut at seq {u}");
                shared += 1;
            }
        }
    }
    assert!(shared > 10, "{shared}");
    // A multi-turn block: the newest ask that left is named.
    assert!(
        blocks_a
            .values()
            .any(|b| b.contains("Latest ask that left")),
        "a multi-turn block"
    );
}
