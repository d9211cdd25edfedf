//! The ledger's test kit (feature `ledger`): what the store, page,
//! recall, export and CLI tests build sessions with. Rows and session
//! metas ([`row`], [`text_row`], [`meta`], fixture transcripts), a scripted
//! session driven through any backend ([`Sim`], [`scripted`]), and the
//! backends the shared store suite runs on ([`backends`]: SQLite always,
//! PostgreSQL when `OCEANCODE_TEST_DATABASE_URL` names a server (`.ci/run`
//! starts a throwaway cluster and exports it; `.ci/pg.sh start DIR` does so
//! by hand). Each PostgreSQL test gets a database of its own. Without the
//! variable the PostgreSQL half is skipped with a line saying so, except
//! under CI (`CI` set), where it fails).

use oceancode_ledger::store::pg::PgStore;
use oceancode_ledger::store::{LedgerStore, Store, StoreOptions};
use oceancode_window::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

// Rows and sessions.

pub fn meta(id: &str, dialect: Dialect) -> SessionMeta {
    SessionMeta {
        id: id.to_string(),
        client: "claude-code".into(),
        client_session: Some(format!("cs-{id}")),
        dialect,
        model: "claude-opus-5-5".into(),
        parent: None,
        parent_seq: None,
        created_ms: 1_796_000_000_000,
        last_ms: 1_796_000_000_000,
    }
}

/// The role of a raw message (`role`, else `type`).
pub fn role_of(raw: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(raw).expect("fixture json");
    v.get("role")
        .or_else(|| v.get("type"))
        .and_then(|r| r.as_str())
        .unwrap_or("unknown")
        .to_string()
}

pub fn row(seq: u64, turn: u32, kind: RowKind, raw: &str) -> Row {
    Row {
        seq,
        role: role_of(raw),
        kind,
        raw: raw.into(),
        tokens: (raw.len() / 4) as u32,
        turn,
        step: turn,
        branch: 0,
        from_response: false,
    }
}

/// A user prompt / assistant answer in Anthropic shape.
pub fn text_row(seq: u64, turn: u32, kind: RowKind, text: &str) -> Row {
    let role = if kind == RowKind::Assistant {
        "assistant"
    } else {
        "user"
    };
    let raw = serde_json::json!({ "role": role, "content": text }).to_string();
    row(seq, turn, kind, &raw)
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/transcript")
}

/// Rows of `fixtures/transcript/<name>.tsv` (`kind \t turn \t raw`), seq from 1.
pub fn fixture_rows(name: &str) -> Vec<Row> {
    let text =
        std::fs::read_to_string(fixtures_dir().join(format!("{name}.tsv"))).expect("fixture");
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            let mut parts = line.splitn(3, '\t');
            let kind = RowKind::parse(parts.next().expect("kind")).expect("kind name");
            let turn: u32 = parts.next().expect("turn").parse().expect("turn number");
            row(i as u64 + 1, turn, kind, parts.next().expect("raw"))
        })
        .collect()
}

pub fn open(dir: &Path) -> Store {
    Store::open(dir, StoreOptions::default()).expect("open store")
}

pub fn rows_event(session: &str, rows: Vec<Row>) -> Event {
    Event::Rows {
        session: session.to_string(),
        rows,
    }
}

pub fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

// A scripted session (Anthropic shape), shared by the page, export,
// recall and retention tests.

pub const T0: i64 = 1_796_000_000_000;

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

    /// A session of `meta` (submitted now), its clock at `meta.last_ms`
    /// ([`Sim::meta`] would submit the kit's own meta instead).
    pub fn with_meta(store: &impl AnyLedger, meta: SessionMeta) -> Sim {
        let sim = Sim {
            store: store.ledger(),
            id: meta.id.clone(),
            seq: 0,
            turn: 0,
            step: 1,
            ts: meta.last_ms,
            model: meta.model.clone(),
        };
        sim.store
            .submit(Event::Session(meta))
            .expect("submit session");
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
            raw: raw.as_str().into(),
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

    /// A row of `kind` as given (its role: `system`, `assistant` for
    /// answers, else `user`).
    pub fn row(&mut self, kind: RowKind, raw: Value) -> u64 {
        let role = match kind {
            RowKind::System => "system",
            RowKind::Assistant => "assistant",
            _ => "user",
        };
        self.push(kind, role, raw)
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
        self.cut_at(upto_seq, self.ts);
    }

    /// A cut up to `upto_seq` recorded at `ts_ms` (the session's clock
    /// does not move).
    pub fn cut_at(&mut self, upto_seq: u64, ts_ms: i64) {
        self.store
            .submit(Event::Cut {
                session: self.id.clone(),
                upto_seq,
                gauge: 90_000,
                line: 80_000,
                ts_ms,
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

// The backends of the shared store suite.

pub const URL_VAR: &str = "OCEANCODE_TEST_DATABASE_URL";

/// The server's URL, if the PostgreSQL half runs.
pub fn server_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("{URL_VAR} is not set under CI: the PostgreSQL store tests must run");
            }
            eprintln!(
                "SKIPPED: the PostgreSQL half of this test ({URL_VAR} is not set; `.ci/pg.sh start DIR` starts a server)"
            );
            None
        }
    }
}

/// `url` with another database name.
pub fn with_db(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    format!("{base}/{db}{query}")
}

/// Run SQL on the server's own database.
pub fn admin(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test server");
        tokio::spawn(conn);
        c.batch_execute(sql).await.expect("admin sql");
    });
}

/// A fresh, empty database on the test server: its URL.
pub fn fresh_db() -> Option<String> {
    static N: AtomicU32 = AtomicU32::new(0);
    let url = server_url()?;
    let name = format!(
        "oc_test_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    admin(&url, &format!("CREATE DATABASE {name}"));
    Some(with_db(&url, &name))
}

/// One backend of the parameterized suite.
#[derive(Clone, Debug)]
pub enum Backend {
    Sqlite,
    Postgres(String),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    pub fn open(&self, dir: &Path) -> Arc<dyn LedgerStore> {
        self.open_with(dir, StoreOptions::default())
    }

    pub fn open_with(&self, dir: &Path, opts: StoreOptions) -> Arc<dyn LedgerStore> {
        match self {
            Backend::Sqlite => Arc::new(Store::open(dir, opts).expect("open sqlite store")),
            Backend::Postgres(url) => {
                Arc::new(PgStore::open(url, dir, opts).expect("open postgres store"))
            }
        }
    }
}

/// SQLite, then PostgreSQL (a database of its own) when a server is set.
pub fn backends() -> Vec<Backend> {
    let mut v = vec![Backend::Sqlite];
    if let Some(url) = fresh_db() {
        v.push(Backend::Postgres(url));
    }
    v
}
