//! Data-dir layout and permissions.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: failures panic

use oceancode_ledger::paths::{self, sanitize_session_id, DataDir};
use oceancode_ledger::store::{LedgerRead, LedgerWrite};
use oceancode_testkit::ledger::*;
use oceancode_window::{Dialect, Event, RowKind};
use std::os::unix::fs::PermissionsExt;

#[test]
fn store_paths_layout() {
    let d = DataDir::new("/data");
    assert_eq!(d.db_path().to_str(), Some("/data/oceancode.db"));
    assert_eq!(d.session_dir("abc").to_str(), Some("/data/sessions/abc"));
    assert_eq!(
        d.turn_file("abc", 7).to_str(),
        Some("/data/sessions/abc/transcript/0007.md")
    );
    assert_eq!(
        d.turn_file("abc", 12345).to_str(),
        Some("/data/sessions/abc/transcript/12345.md")
    );
    assert_eq!(
        d.index_file("abc").to_str(),
        Some("/data/sessions/abc/transcript/index.md")
    );
    assert_eq!(
        d.session_md("abc").to_str(),
        Some("/data/sessions/abc/SESSION.md")
    );
}

#[test]
fn store_paths_sanitize_session_ids() {
    // Safe ids are kept as they are.
    for id in ["abc", "cc-2f1e_9.x", "019a-uuid-like-0000"] {
        assert_eq!(sanitize_session_id(id), id);
    }
    for id in [
        "../../etc",
        "a/b",
        "a\\b",
        ".",
        "..",
        "",
        ".hidden",
        "é",
        "a b",
        "x\0y",
    ] {
        let s = sanitize_session_id(id);
        assert!(!s.is_empty(), "{id:?}");
        assert!(!s.starts_with('.'), "{id:?} -> {s}");
        assert!(
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{id:?} -> {s}"
        );
        assert_ne!(s, id);
    }
    // Different ids never collide, even when they sanitize alike.
    assert_ne!(sanitize_session_id("a/b"), sanitize_session_id("a_b"));
    assert_ne!(sanitize_session_id("a/b"), sanitize_session_id("a:b"));
    let long = "x".repeat(500);
    assert!(sanitize_session_id(&long).len() <= 96 + 9);
    // Stable.
    assert_eq!(sanitize_session_id("a/b"), sanitize_session_id("a/b"));
}

#[test]
fn store_paths_modes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let root = tmp.path().join("data");
    let store = open(&root);
    store
        .submit(Event::Session(meta("m/1", Dialect::Anthropic)))
        .expect("submit");
    store
        .submit(rows_event(
            "m/1",
            vec![text_row(1, 1, RowKind::Prompt, "hi")],
        ))
        .expect("submit");
    store.settle_blocking().expect("settle");
    let d = store.data_dir();
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&d.sessions_dir()), 0o700);
    assert_eq!(mode(&d.session_dir("m/1")), 0o700);
    assert_eq!(mode(&d.transcript_dir("m/1")), 0o700);
    assert_eq!(mode(&d.turn_file("m/1", 1)), 0o600);
    assert_eq!(mode(&d.index_file("m/1")), 0o600);
    assert_eq!(mode(store.db_path()), 0o600);
    for suffix in ["-wal", "-shm"] {
        let p = std::path::PathBuf::from(format!("{}{suffix}", store.db_path().display()));
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
    assert!(d.session_dir("m/1").starts_with(d.sessions_dir()));
    assert_eq!(store.session_dir("m/1"), d.session_dir("m/1"));
}

#[test]
fn store_paths_existing_db_is_made_private() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = DataDir::new(tmp.path());
    {
        let store = open(tmp.path());
        store.shutdown().expect("shutdown");
    }
    std::fs::set_permissions(d.db_path(), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let store = open(tmp.path());
    assert_eq!(mode(store.db_path()), 0o600);
}

#[test]
fn store_paths_write_atomic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let p = tmp.path().join("f.md");
    paths::write_atomic(&p, b"one").expect("write");
    paths::write_atomic(&p, b"two").expect("rewrite");
    assert_eq!(std::fs::read_to_string(&p).expect("read"), "two");
    assert_eq!(mode(&p), 0o600);
    assert_eq!(std::fs::read_dir(tmp.path()).expect("dir").count(), 1);
    paths::remove_if_exists(&p).expect("rm");
    paths::remove_if_exists(&p).expect("rm again");
}

/// The hole healer's write: creates a private file, never replaces one.
#[test]
fn store_paths_write_new_never_replaces() {
    let tmp = tempfile::tempdir().expect("tmp");
    let f = tmp.path().join("0001.md");
    assert!(paths::write_new(&f, b"first").expect("create"));
    assert_eq!(mode(&f), 0o600);
    assert!(!paths::write_new(&f, b"second").expect("exists"));
    assert_eq!(std::fs::read(&f).expect("read"), b"first");
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temp file left: {left:?}");
}
