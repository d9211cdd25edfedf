//! Concurrent agents with the same opening and no session header (pass@k
//! sampling, a fleet running one prompt, an SDK script started twice): each
//! is its own session, a sibling linked to the first at the shared opening,
//! with its own tideline, cuts and stub; rows are written once per message.
//! And a genuine rewind of such a client is still a branch of its session.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_fakeup::{FakeConfig, Recorded, Reply, Script};
use oceancode_ledger::store::LedgerRead;
use oceancode_ledger::store::LoadedSession;
use oceancode_proxy::sessions::ModelLimits;
use oceancode_testkit::{Conversation, Dialect};
use oceancode_tests::{push_tool_step, stub_seq, Harness};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const LINE: u64 = 20_000;
/// 70% of the line (the default block).
const BLOCK: u64 = 14_000;
const SYSTEM: &str = "You are a careful coding agent.";
const FIRST: &str = "Fix the failing tests in this repository. Run them after each change.";

/// What only agent `a`'s messages carry.
fn marker(a: usize) -> String {
    format!("agent-{a:02}-checkout")
}

/// Which agents' markers `text` carries.
fn markers_in(text: &str, agents: usize) -> BTreeSet<usize> {
    (0..agents).filter(|a| text.contains(&marker(*a))).collect()
}

/// ~1.5k tokens of tool output from agent `a`'s checkout.
fn tool_output(a: usize, step: usize) -> String {
    format!(
        "{} step {step}\n{}",
        marker(a),
        oceancode_tests::tool_lines(step, 55, a + 1)
    )
}

async fn harness(live: Option<Duration>) -> Harness {
    let fake = FakeConfig::default().with_script(Script::always(
        Reply::tool_call("Bash", json!({"command": "cargo test"}))
            .with_text("Running the tests.")
            .delay_first(2),
    ));
    Harness::start(fake, |o| {
        o.sessions.models = Arc::new(|_m: &str, _l: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(32_000),
        });
        o.sessions.line = oceancode_config::LineSpec::Tokens(LINE);
        if let Some(live) = live {
            o.sessions.live_window = live;
        }
    })
    .await
}

fn body(history: &[Value]) -> String {
    Conversation::new(Dialect::Anthropic)
        .model("claude-test-200k")
        .max_tokens(8192)
        .system(SYSTEM)
        .tool(
            "Bash",
            Some("Run a shell command"),
            json!({"type":"object","properties":{"command":{"type":"string"}}}),
        )
        .messages(history.iter().cloned())
        .body()
}

/// One step of agent `a`, with no session header: send its history, take
/// the tool call, append the result. Returns the window the upstream saw
/// (input + cache read + cache write, as the client is told).
async fn step(h: &Harness, history: &mut Vec<Value>, a: usize, n: usize) -> u64 {
    let got = h.post("/v1/messages", &[], body(history)).await;
    assert_eq!(got.status, 200, "agent {a} step {n}: {}", got.text());
    let v = got.json();
    let u = &v["usage"];
    let window = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .map(|k| u[k].as_u64().unwrap_or(0))
    .sum();
    push_tool_step(history, &v["content"], &tool_output(a, n));
    window
}

fn opening() -> Vec<Value> {
    vec![json!({"role":"user","content":FIRST})]
}

/// What `agents` agents did through one proxy.
struct Run {
    histories: Vec<Vec<Value>>,
    windows: Vec<Vec<u64>>,
}

/// `agents` agents of `steps` steps each, their requests interleaved one
/// by one.
async fn interleaved(h: &Harness, agents: usize, steps: usize) -> Run {
    let mut run = Run {
        histories: vec![opening(); agents],
        windows: vec![Vec::new(); agents],
    };
    go_on(h, &mut run, steps).await;
    run
}

/// `steps` more steps of every agent of `run`, interleaved.
async fn go_on(h: &Harness, run: &mut Run, steps: usize) {
    let from = run.windows[0].len();
    for n in from..from + steps {
        for a in 0..run.histories.len() {
            let w = step(h, &mut run.histories[a], a, n).await;
            run.windows[a].push(w);
        }
    }
}

/// `agents` agents of `steps` steps each, all running at once.
async fn parallel(h: Arc<Harness>, agents: usize, steps: usize) -> Run {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..agents)
        .map(|a| {
            let (h, in_flight, most) = (h.clone(), in_flight.clone(), most.clone());
            tokio::spawn(async move {
                let mut history = opening();
                let mut windows = Vec::new();
                for n in 0..steps {
                    // Uneven pacing, as agents have: the order keeps changing.
                    tokio::time::sleep(Duration::from_millis(((a * 7 + n * 3) % 5) as u64)).await;
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    windows.push(step(&h, &mut history, a, n).await);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                }
                (history, windows)
            })
        })
        .collect();
    let mut run = Run {
        histories: Vec::new(),
        windows: Vec::new(),
    };
    for t in tasks {
        let (history, windows) = t.await.expect("agent task");
        run.histories.push(history);
        run.windows.push(windows);
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most >= 2,
        "the agents' requests overlapped (at most {most} at once)"
    );
    run
}

/// The stub's session directory, if `msg` is a stub.
fn stub_dir(msg: &Value) -> Option<String> {
    stub_seq(msg)?;
    let text = msg["content"][0]["text"].as_str()?;
    let start = text.find("The verbatim record is ")? + "The verbatim record is ".len();
    let end = text[start..].find("/transcript/")?;
    Some(text[start..start + end].to_string())
}

/// Check what the upstream saw and what the ledger holds; print the numbers.
async fn check(h: &Harness, run: &Run, label: &str) {
    let agents = run.histories.len();
    // Every upstream request was valid and carried one agent's messages only.
    let reqs: Vec<Recorded> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/messages"))
        .collect();
    let mut stubs: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(r.status, 200, "{label}: upstream request {i} is valid");
        let text = String::from_utf8_lossy(&r.body);
        let who = markers_in(&text, agents);
        assert!(
            who.len() <= 1,
            "{label}: upstream request {i} mixes agents {who:?}"
        );
        let msgs = r.json().expect("json")["messages"].clone();
        if let (Some(a), Some(dir)) = (who.first(), stub_dir(&msgs[0])) {
            stubs.entry(*a).or_default().insert(dir);
        }
    }
    // The ledger: rows written against messages, sessions and their links.
    h.settle().await;
    let store = h.store();
    let loaded: Vec<LoadedSession> = store
        .list_sessions()
        .unwrap()
        .iter()
        .map(|m| store.load_session(&m.id).unwrap().unwrap())
        .collect();
    let rows: usize = loaded.iter().map(|s| s.rows.len()).sum();
    let hidden: usize = loaded.iter().map(|s| s.hidden.len()).sum();
    let branches: u32 = loaded.iter().map(|s| s.branch).sum();
    // What the proxy saw of each agent: every message it sent and the last answer.
    let messages: usize = run.histories.iter().map(|h| h.len() - 1).sum();
    let windows: Vec<String> = run
        .windows
        .iter()
        .map(|w| {
            format!(
                "max {} last {}",
                w.iter().max().unwrap_or(&0),
                w.last().unwrap_or(&0)
            )
        })
        .collect();
    println!(
        "{label}: {agents} agents, {} sessions, {rows} rows written ({hidden} hidden, {branches} branches) for {messages} messages ({:.3}x); windows per agent: {windows:?}",
        loaded.len(),
        rows as f64 / messages as f64
    );

    assert!(
        rows as f64 <= 1.05 * messages as f64,
        "{label}: {rows} rows written for {messages} messages"
    );
    assert_eq!(branches, 0, "{label}: no branch");
    assert_eq!(loaded.len(), agents, "{label}: one session per agent");
    // Each session holds one agent's messages; one is the first, the others
    // its siblings, linked at the shared opening (seq 1, the first prompt).
    let root: Vec<&LoadedSession> = loaded.iter().filter(|s| s.meta.parent.is_none()).collect();
    assert_eq!(root.len(), 1, "{label}: one first session");
    let root_id = root[0].meta.id.clone();
    let mut owner = BTreeMap::new();
    for s in &loaded {
        let text: String = s
            .rows
            .iter()
            .filter(|r| !s.hidden.contains(&r.seq))
            .map(|r| r.raw.to_string())
            .collect();
        let who = markers_in(&text, agents);
        assert_eq!(who.len(), 1, "{label}: {} holds agents {who:?}", s.meta.id);
        assert!(
            owner
                .insert(*who.first().unwrap(), s.meta.id.clone())
                .is_none(),
            "{label}: one session per agent"
        );
        assert!(
            s.rows[0].raw.contains(FIRST),
            "every session opens with the first prompt"
        );
        if s.meta.id != root_id {
            assert_eq!(s.meta.parent.as_deref(), Some(root_id.as_str()), "{label}");
            assert_eq!(s.meta.parent_seq, Some(1), "{label}: linked at the opening");
        }
    }
    let metrics = h.metrics().await;
    assert!(
        metrics.contains(&format!("\noceancode_siblings_total {}\n", agents - 1)),
        "{label}: {metrics}"
    );
    // The admin API lists them with their link.
    let live = h.admin("/_oceancode/sessions").await;
    let live = live["sessions"].as_array().cloned().unwrap_or_default();
    assert_eq!(live.len(), agents, "{label}");
    for v in &live {
        if v["id"] != root_id.as_str() {
            assert_eq!(v["parent"], root_id.as_str(), "{label}");
            assert_eq!(v["parent_seq"], 1, "{label}");
            assert!(
                v["meter"]["cuts"].as_u64() > Some(0),
                "{label}: its own cuts: {v}"
            );
        }
    }
    // Each sibling's ledger reads and exports on its own, with its link.
    for s in loaded.iter().filter(|s| s.meta.id != root_id) {
        let id = &s.meta.id;
        let mut md = Vec::new();
        oceancode_ledger::export::markdown(store, id, &|_: &str| None, &mut md, None).unwrap();
        let md = String::from_utf8(md).unwrap();
        assert!(
            md.contains(&format!("parent: \"{root_id}\"\nparent_seq: 1\n")),
            "{md:.400}"
        );
        assert!(
            md.contains(FIRST),
            "the export opens with the shared opening"
        );
        assert_eq!(
            markers_in(&md, agents).len(),
            1,
            "{label}: {id}'s export is its own"
        );
        let atif = oceancode_ledger::atif::trajectory(store, id, &|_: &str| None).unwrap();
        assert_eq!(atif["extra"]["parent_seq"], 1, "{atif:.300}");
        let index =
            std::fs::read_to_string(store.session_dir(id).join("transcript").join("index.md"))
                .unwrap();
        assert!(
            index.contains("(a sibling: diverged after its seq 1)"),
            "{index}"
        );
    }
    // Each agent was cut under its line, with its own stub.
    for a in 0..agents {
        let max = run.windows[a].iter().max().copied().unwrap_or(0);
        assert!(
            max <= LINE + BLOCK,
            "{label}: agent {a}'s window reached {max} (line {LINE})"
        );
        let dirs = stubs.get(&a).cloned().unwrap_or_default();
        assert_eq!(dirs.len(), 1, "{label}: agent {a} has one stub: {dirs:?}");
        let dir = dirs.first().unwrap();
        assert!(
            dir.ends_with(&owner[&a]),
            "{label}: agent {a}'s stub names its own session: {dir}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_interleaved_agents_with_the_same_opening_are_two_sessions_each_under_its_line() {
    let h = harness(None).await;
    let run = interleaved(&h, 2, 60).await;
    check(&h, &run, "2 interleaved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_parallel_agents_with_the_same_opening_are_two_sessions_each_under_its_line() {
    let h = Arc::new(harness(None).await);
    let run = parallel(h.clone(), 2, 60).await;
    check(&h, &run, "2 parallel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_interleaved_agents_with_the_same_opening_are_eight_sessions() {
    let h = harness(None).await;
    let run = interleaved(&h, 8, 30).await;
    check(&h, &run, "8 interleaved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_parallel_agents_with_the_same_opening_are_eight_sessions() {
    let h = Arc::new(harness(None).await);
    let run = parallel(h.clone(), 8, 30).await;
    check(&h, &run, "8 parallel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_read_back_from_the_ledger_go_on_apart() {
    let h = harness(None).await;
    let mut run = interleaved(&h, 2, 25).await;
    h.settle().await;
    let app = &h.proxy().app;
    assert_eq!(app.sessions.evict_idle(-1), 2, "both left memory");
    go_on(&h, &mut run, 25).await;
    check(&h, &run, "2 restored").await;
}

/// A headerless client that answers `questions` one after another, then
/// goes back to after the first answer with its second question edited,
/// `pause` after the last answer. Returns the sessions recorded.
async fn rewind_after(pause: Duration, live: Duration) -> (Harness, Vec<LoadedSession>) {
    let fake = FakeConfig::default().with_script(Script::always(Reply::text("an answer")));
    let h = Harness::start(fake, |o| o.sessions.live_window = live).await;
    let body = |msgs: &[Value]| {
        Conversation::new(Dialect::Anthropic)
            .model("claude-sonnet-4-5")
            .max_tokens(100)
            .system(SYSTEM)
            .messages(msgs.iter().cloned())
            .body()
    };
    let mut history = opening();
    for q in ["question two", "question three"] {
        let got = h.post("/v1/messages", &[], body(&history)).await;
        assert_eq!(got.status, 200, "{}", got.text());
        history.push(json!({"role":"assistant","content":got.json()["content"]}));
        history.push(json!({"role":"user","content":q}));
    }
    let got = h.post("/v1/messages", &[], body(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.clock.advance(pause);
    history.truncate(2);
    history.push(json!({"role":"user","content":"question two EDITED"}));
    let got = h.post("/v1/messages", &[], body(&history)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    h.settle().await;
    let store = h.store();
    let loaded = store
        .list_sessions()
        .unwrap()
        .iter()
        .map(|m| store.load_session(&m.id).unwrap().unwrap())
        .collect();
    (h, loaded)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headerless_rewind_of_a_quiet_line_is_still_a_branch() {
    let (_h, loaded) = rewind_after(Duration::from_millis(700), Duration::from_millis(300)).await;
    assert_eq!(
        loaded.len(),
        1,
        "one session: {:?}",
        loaded.iter().map(|s| &s.meta).collect::<Vec<_>>()
    );
    let s = &loaded[0];
    assert_eq!(s.branch, 1, "the rewind is a branch");
    assert!(s.meta.parent.is_none());
    // q1 a1 | q2 a2 q3 a3 (hidden) | q2 EDITED a
    assert_eq!(s.hidden, [3, 4, 5, 6]);
    assert!(s.rows[6].raw.contains("question two EDITED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_headerless_request_leaving_a_line_answered_moments_ago_is_a_sibling() {
    // Within the live window a headerless client's rewind cannot be told
    // from another agent with the same opening: its own session, linked
    // where it left (a client that rewinds fast names its session).
    let (_h, loaded) = rewind_after(Duration::ZERO, Duration::from_secs(300)).await;
    assert_eq!(loaded.len(), 2);
    let (first, sibling): (Vec<_>, Vec<_>) = loaded.iter().partition(|s| s.meta.parent.is_none());
    let (first, sibling) = (first[0], sibling[0]);
    assert_eq!(first.branch + sibling.branch, 0, "no branch");
    assert!(first.hidden.is_empty() && sibling.hidden.is_empty());
    assert_eq!(sibling.meta.parent.as_deref(), Some(first.meta.id.as_str()));
    assert_eq!(
        sibling.meta.parent_seq,
        Some(2),
        "it left after the first answer"
    );
    assert_eq!(first.rows.len(), 6, "the first line is whole");
    let texts: Vec<&str> = sibling.rows.iter().map(|r| &*r.raw).collect();
    assert_eq!(
        texts.len(),
        4,
        "opening, its answer, the edit, its answer: {texts:?}"
    );
    assert!(texts[0].contains(FIRST) && texts[2].contains("question two EDITED"));
}
