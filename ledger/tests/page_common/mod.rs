//! A scripted session (Anthropic shape) driven through the store, shared by
//! the page, export, recall and retention tests.
#![allow(dead_code)]

use oceancode_ledger::store::pg::PgStore;
use oceancode_ledger::store::{LedgerStore, Store, StoreOptions};
use oceancode_ledger::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub const T0: i64 = 1_796_000_000_000;

pub fn open(dir: &Path) -> Store {
    Store::open(dir, StoreOptions::default()).expect("open store")
}

/// A ledger of either backend, as the scripted session holds it.
pub trait AnyLedger {
    fn ledger(&self) -> Arc<dyn LedgerStore>;
}

impl AnyLedger for Store {
    fn ledger(&self) -> Arc<dyn LedgerStore> {
        Arc::new(self.clone())
    }
}

impl AnyLedger for PgStore {
    fn ledger(&self) -> Arc<dyn LedgerStore> {
        Arc::new(self.clone())
    }
}

impl AnyLedger for Arc<dyn LedgerStore> {
    fn ledger(&self) -> Arc<dyn LedgerStore> {
        self.clone()
    }
}

/// Drives one session: every call submits its events at once.
pub struct Sim {
    pub store: Arc<dyn LedgerStore>,
    pub id: String,
    pub seq: u64,
    pub turn: u32,
    pub step: u32,
    pub ts: i64,
    pub model: String,
}

impl Sim {
    pub fn new(store: &impl AnyLedger, id: &str, last_ms: i64) -> Sim {
        let sim = Sim {
            store: store.ledger(),
            id: id.to_string(),
            seq: 0,
            turn: 0,
            step: 1,
            ts: last_ms,
            model: "claude-opus-5-5".into(),
        };
        sim.meta();
        sim
    }

    pub fn meta(&self) {
        self.store
            .submit(Event::Session(SessionMeta {
                id: self.id.clone(),
                client: "claude-code".into(),
                client_session: Some(format!("cc:{}", self.id)),
                dialect: Dialect::Anthropic,
                model: self.model.clone(),
                parent: None,
                parent_seq: None,
                created_ms: T0,
                last_ms: self.ts,
            }))
            .expect("submit session");
    }

    fn push(&mut self, kind: RowKind, role: &str, raw: Value) -> u64 {
        self.seq += 1;
        if kind == RowKind::Prompt {
            self.turn += 1;
        }
        let raw = raw.to_string();
        let row = Row {
            seq: self.seq,
            role: role.into(),
            kind,
            tokens: (raw.len() / 4) as u32,
            raw: Arc::from(raw.as_str()),
            turn: self.turn.max(1),
            step: self.step,
            branch: 0,
            from_response: false,
        };
        self.store
            .submit(Event::Rows {
                session: self.id.clone(),
                rows: vec![row],
            })
            .expect("submit rows");
        self.seq
    }

    pub fn system(&mut self, text: &str) -> u64 {
        self.push(
            RowKind::System,
            "system",
            json!({"role": "system", "content": text}),
        )
    }

    pub fn prompt(&mut self, text: &str) -> u64 {
        self.push(
            RowKind::Prompt,
            "user",
            json!({"role": "user", "content": text}),
        )
    }

    /// A prompt of several text blocks (Claude Code's reminders first).
    pub fn prompt_blocks(&mut self, texts: &[&str]) -> u64 {
        let blocks: Vec<Value> = texts
            .iter()
            .map(|t| json!({"type": "text", "text": t}))
            .collect();
        self.push(
            RowKind::Prompt,
            "user",
            json!({"role": "user", "content": blocks}),
        )
    }

    pub fn say(&mut self, text: &str) -> u64 {
        self.push(
            RowKind::Assistant,
            "assistant",
            json!({"role": "assistant", "content": [{"type": "text", "text": text}]}),
        )
    }

    /// An assistant row with thinking, text and one tool call.
    pub fn call(&mut self, id: &str, name: &str, input: Value) -> u64 {
        self.push(
            RowKind::Assistant,
            "assistant",
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "consider it", "signature": "sig"},
                {"type": "text", "text": format!("Running {name}.")},
                {"type": "tool_use", "id": id, "name": name, "input": input}
            ]}),
        )
    }

    pub fn result(&mut self, id: &str, text: &str, is_error: bool) -> u64 {
        self.push(
            RowKind::ToolResult,
            "user",
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": text, "is_error": is_error}
            ]}),
        )
    }

    /// End a step with usage; the next rows belong to the next step.
    pub fn end_step(&mut self, input: u64, output: u64, cache_read: u64, cache_write: u64) {
        self.ts += 1_000;
        self.store
            .submit(Event::Step {
                session: self.id.clone(),
                step: self.step,
                model: self.model.clone(),
                status: 200,
                usage: Usage {
                    input,
                    output,
                    cache_read,
                    cache_write,
                },
                window_rows: self.seq as u32,
                ts_ms: self.ts,
                error: None,
                detail: Default::default(),
            })
            .expect("submit step");
        self.step += 1;
    }

    /// End a step without an answer: `status` and why.
    #[allow(dead_code)] // not every test binary uses it
    pub fn fail_step(&mut self, status: u16, error: &str) {
        self.ts += 1_000;
        self.store
            .submit(Event::Step {
                session: self.id.clone(),
                step: self.step,
                model: self.model.clone(),
                status,
                usage: Usage::default(),
                window_rows: self.seq as u32,
                ts_ms: self.ts,
                error: Some(error.to_string()),
                detail: Default::default(),
            })
            .expect("submit step");
        self.step += 1;
    }

    pub fn cut(&mut self, upto_seq: u64) {
        self.ts += 10;
        self.store
            .submit(Event::Cut {
                session: self.id.clone(),
                upto_seq,
                gauge: 90_000,
                line: 80_000,
                ts_ms: self.ts,
            })
            .expect("submit cut");
    }

    pub fn branch(&mut self, at_seq: u64, hidden: Vec<u64>) {
        self.store
            .submit(Event::Branch {
                session: self.id.clone(),
                at_seq,
                branch: 1,
                hidden,
            })
            .expect("submit branch");
    }

    pub fn settle(&self) {
        self.store.settle_blocking().expect("settle");
    }
}

/// A session that exercises every page fact: goal, files, commands and
/// exit codes, a fixed error, tasks whose status changes, a rewind, and
/// cuts (one in the middle of a turn).
pub fn scripted(store: &impl AnyLedger, id: &str) -> Sim {
    let mut s = Sim::new(store, id, T0);
    s.system("You are a careful engineer.");
    // t1
    s.prompt_blocks(&[
        "<system-reminder>\nctx\n</system-reminder>",
        "Fix the failing parser test in src/parser.rs",
    ]);
    s.call(
        "tu1",
        "TodoWrite",
        json!({"todos": [
        {"content": "find the failing test", "status": "in_progress", "activeForm": "finding"},
        {"content": "fix the parser", "status": "pending", "activeForm": "fixing"}]}),
    );
    s.result("tu1", "Todos have been modified successfully.", false);
    s.call(
        "tu2",
        "Bash",
        json!({"command": "cargo test -p parser", "description": "run tests"}),
    );
    s.result(
        "tu2",
        "Exit code 101\nerror: test parser::tests::nested failed",
        true,
    );
    s.end_step(1_000, 200, 0, 5_000);
    s.say("The nested test fails.");
    s.end_step(50, 100, 6_000, 0);
    // t2
    s.prompt("go ahead and fix it");
    s.call("tu3", "Read", json!({"file_path": "src/parser.rs"}));
    s.result("tu3", "fn parse() {}", false);
    s.call(
        "tu4",
        "Edit",
        json!({"file_path": "src/parser.rs", "old_string": "a", "new_string": "b"}),
    );
    s.result("tu4", "The file src/parser.rs has been updated.", false);
    s.call("tu5", "Bash", json!({"command": "cargo test -p parser"}));
    s.result("tu5", "test result: ok. 12 passed", false);
    s.call(
        "tu6",
        "TodoWrite",
        json!({"todos": [
        {"content": "find the failing test", "status": "completed", "activeForm": "finding"},
        {"content": "fix the parser", "status": "completed", "activeForm": "fixing"}]}),
    );
    s.result("tu6", "Todos have been modified successfully.", false);
    s.end_step(80, 300, 9_000, 1_000);
    s.say("Fixed: the nested case now parses.");
    s.end_step(20, 50, 10_000, 0);
    // t3 (partly rewound)
    s.prompt("now write a changelog entry");
    s.call(
        "tu7",
        "Write",
        json!({"file_path": "CHANGELOG.md", "content": "- fix nested parse"}),
    );
    let w = s.result("tu7", "File created successfully", false);
    s.end_step(30, 60, 11_000, 500);
    s.branch(w - 2, vec![w - 1, w]);
    s.say("Let me reconsider the changelog.");
    s.end_step(10, 40, 11_500, 0);
    // The tideline moves past t1 and t2 (and the start of t3).
    let t3_start = s.seq - 3;
    s.cut(t3_start - 1);
    // t4
    s.prompt("also run clippy");
    s.call("tu8", "Bash", json!({"command": "cargo clippy"}));
    s.result("tu8", "Process exited with code 0", false);
    s.end_step(40, 80, 12_000, 300);
    s.say("Clippy is clean.");
    s.end_step(5, 20, 12_500, 0);
    // A cut in the middle of t4: t3 is now wholly past, t4 only partly.
    s.cut(s.seq - 2);
    // t5
    s.prompt("thanks");
    s.say("You're welcome.");
    s.end_step(5, 10, 13_000, 0);
    s.settle();
    s
}

/// Every file under `dir`, by relative path.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("entry");
            let p = e.path();
            if p.is_dir() {
                walk(base, &p, out);
            } else {
                let rel = p.strip_prefix(base).expect("prefix").display().to_string();
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}
