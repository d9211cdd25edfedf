//! What the commands print on a terminal: control characters recorded in
//! model names and message content (an OSC 52 clipboard write, a title
//! change, a screen clear) are shown escaped, never sent to the terminal;
//! into a pipe the text stays as recorded.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

mod common;
use common::{output, proxy_cmd};
use oceancode_ledger::store::LedgerWrite;
use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_window::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
use std::path::Path;
use std::process::{Command, Output};

const CLIPBOARD: &str = "\u{1b}]52;c;cm0gLXJmIH4=\u{7}";
const TITLE: &str = "\u{9d}0;pwned\u{9c}";
const CLEAR: &str = "\u{1b}[2J";

fn populate(data: &Path) -> String {
    let id = "term-1".to_string();
    let store = Store::open(data, StoreOptions::default()).expect("store");
    let meta = SessionMeta {
        id: id.clone(),
        client: "claude-code".into(),
        client_session: None,
        dialect: Dialect::Anthropic,
        model: format!("claude{CLIPBOARD}"),
        parent: None,
        parent_seq: None,
        created_ms: 1_700_000_000_000,
        last_ms: 1_700_000_000_000,
    };
    store.submit(Event::Session(meta)).expect("session");
    let raw = serde_json::json!({"role": "user",
        "content": format!("hello {CLEAR}world{TITLE} {CLIPBOARD}")})
    .to_string();
    store
        .submit(Event::Rows {
            session: id.clone(),
            rows: vec![Row {
                seq: 1,
                role: "user".into(),
                kind: RowKind::Prompt,
                raw: raw.as_str().into(),
                tokens: 10,
                turn: 1,
                step: 1,
                branch: 0,
                from_response: false,
            }],
        })
        .expect("rows");
    store
        .submit(Event::Step {
            session: id.clone(),
            step: 1,
            model: format!("claude{CLIPBOARD}"),
            status: 200,
            usage: Usage::default(),
            window_rows: 1,
            ts_ms: 1_700_000_001_000,
            error: None,
            detail: Default::default(),
        })
        .expect("step");
    store.shutdown().expect("shutdown");
    id
}

/// Run the binary with `args` with its stdout and stderr on a terminal (a
/// pty from util-linux's `script`, whose own stdout is what the terminal
/// showed).
fn on_terminal(home: &Path, args: &[&str]) -> Output {
    let bin = proxy_cmd(home);
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let line: Vec<String> = std::iter::once(bin.get_program().to_string_lossy().into_owned())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| quote(&a))
        .collect();
    let mut script = Command::new("script");
    script.args(["-qec", &line.join(" "), "/dev/null"]);
    for (k, v) in bin.get_envs() {
        match v {
            Some(v) => script.env(k, v),
            None => script.env_remove(k),
        };
    }
    output(script)
}

fn assert_escaped(what: &str, shown: &[u8]) {
    let text = String::from_utf8_lossy(shown);
    let raw: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        .collect();
    assert!(
        raw.is_empty(),
        "{what}: control characters reached the terminal: {raw:?}\n{text}"
    );
}

#[test]
fn ledger_text_is_escaped_on_a_terminal_and_verbatim_into_a_pipe() {
    let home = tempfile::tempdir().expect("home");
    let data = home.path().join("data");
    let id = populate(&data);
    let d = data.to_str().expect("utf-8 path");
    for args in [
        vec!["ledger", "list"],
        vec!["status", &id],
        vec!["recall", &id],
        vec!["recall", "search", "hello"],
        vec!["recall", "entry", "1", "--session", &id],
        vec!["export", "--md", &id],
    ] {
        let mut full = vec!["--data-dir", d];
        full.extend(args.iter().copied());
        let o = on_terminal(home.path(), &full);
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert_escaped(&format!("{args:?}"), &o.stdout);
        let shown = String::from_utf8_lossy(&o.stdout);
        assert!(
            shown.contains(r"\u{1b}"),
            "{args:?} shows the escape: {shown}"
        );
    }
    // Into a pipe, the record is printed as it is.
    let mut c = proxy_cmd(home.path());
    c.args(["--data-dir", d, "recall", &id]);
    let o = output(c);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(CLEAR));
}
