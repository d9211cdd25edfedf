//! Helpers shared by the `store_*` integration tests.
#![allow(dead_code)]

use oceancode_ledger::store::{Store, StoreOptions};
use oceancode_ledger::{Dialect, Event, Row, RowKind, SessionMeta};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        raw: Arc::from(raw),
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
