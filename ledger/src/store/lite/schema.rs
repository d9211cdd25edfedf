//! The schema: versioned migrations (table `schema_version`), opening a
//! connection the way the store uses it (WAL, `synchronous=NORMAL`, busy
//! timeout), and the search-index backfill run at open.

use super::sql::TextBatch;
use crate::paths;
use crate::store::common::stored_dialect;
use crate::store::error::{io_err, StoreError};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use std::path::Path;
use std::time::Duration;
use tracing::warn;

/// Current schema version (table `schema_version`).
pub const SCHEMA_VERSION: i64 = 8;

/// Schema migrations; entry `i` brings the database to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    client         TEXT NOT NULL,
    client_session TEXT,
    dialect        TEXT NOT NULL,
    model          TEXT NOT NULL,
    parent         TEXT,
    created_ms     INTEGER NOT NULL,
    last_ms        INTEGER NOT NULL,
    cut_upto       INTEGER NOT NULL DEFAULT 0,
    meta_json      TEXT NOT NULL
);
CREATE INDEX sessions_last ON sessions(last_ms);
CREATE TABLE rows (
    session       TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    branch        INTEGER NOT NULL,
    role          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    turn          INTEGER NOT NULL,
    step          INTEGER NOT NULL,
    tokens        INTEGER NOT NULL,
    raw           TEXT NOT NULL,
    from_response INTEGER NOT NULL DEFAULT 0,
    hidden        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session, seq)
);
CREATE INDEX rows_turn ON rows(session, hidden, turn, seq);
CREATE TABLE branches (
    session    TEXT NOT NULL,
    branch     INTEGER NOT NULL,
    at_seq     INTEGER NOT NULL,
    hidden     INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (session, branch)
);
CREATE TABLE steps (
    session     TEXT NOT NULL,
    step        INTEGER NOT NULL,
    model       TEXT NOT NULL,
    status      INTEGER NOT NULL,
    input       INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    window_rows INTEGER NOT NULL,
    ts_ms       INTEGER NOT NULL,
    PRIMARY KEY (session, step)
);
CREATE TABLE cuts (
    session  TEXT NOT NULL,
    upto_seq INTEGER NOT NULL,
    gauge    INTEGER NOT NULL,
    line     INTEGER NOT NULL,
    ts_ms    INTEGER NOT NULL
);
CREATE INDEX cuts_session ON cuts(session, ts_ms);
"#,
    r#"
CREATE TABLE row_text (
    id      INTEGER PRIMARY KEY,
    session TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    text    TEXT NOT NULL,
    UNIQUE (session, seq)
);
CREATE VIRTUAL TABLE row_fts USING fts5(text, content='row_text', content_rowid='id');
CREATE TRIGGER row_text_ai AFTER INSERT ON row_text BEGIN
    INSERT INTO row_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER row_text_ad AFTER DELETE ON row_text BEGIN
    INSERT INTO row_fts(row_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER row_text_au AFTER UPDATE ON row_text BEGIN
    INSERT INTO row_fts(row_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO row_fts(rowid, text) VALUES (new.id, new.text);
END;
CREATE TABLE page_notes (
    id         INTEGER PRIMARY KEY,
    session    TEXT NOT NULL,
    turn       INTEGER NOT NULL,
    section    TEXT NOT NULL,
    text       TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
CREATE INDEX page_notes_session ON page_notes(session, id);
"#,
    // 3: the restorer looks sessions up by client key; a failed step keeps
    // why it failed.
    r#"
CREATE INDEX sessions_client ON sessions(client_session);
ALTER TABLE steps ADD COLUMN error TEXT;
"#,
    // 4: a sibling conversation records where it left its parent.
    r#"
ALTER TABLE sessions ADD COLUMN parent_seq INTEGER;
"#,
    // 5: the line a session ran with, for `status` once no proxy holds it.
    r#"
ALTER TABLE sessions ADD COLUMN line INTEGER;
ALTER TABLE sessions ADD COLUMN line_spec TEXT;
ALTER TABLE sessions ADD COLUMN line_ms INTEGER;
"#,
    // 6: what an answer reported besides its window's usage (tokens billed
    // beyond it, reasoning, server-side compactions, context edits), as JSON.
    r#"
ALTER TABLE steps ADD COLUMN detail TEXT;
"#,
    // 7: the context edits the agent (or the user) made: each taken edit,
    // and the edit set in force after it (the latest is what requests apply).
    r#"
CREATE TABLE context_edits (
    session       TEXT NOT NULL,
    n             INTEGER NOT NULL,
    ts_ms         INTEGER NOT NULL,
    set_json      TEXT NOT NULL,
    seqs_json     TEXT NOT NULL,
    tokens_before INTEGER NOT NULL,
    tokens_after  INTEGER NOT NULL,
    PRIMARY KEY (session, n)
);
"#,
    // 8: the session's own tideline override (`tideline SESSION --set`),
    // as LineSpec JSON (NULL = none): a restarted proxy, or the one that
    // takes the session over, keeps it.
    r#"
ALTER TABLE sessions ADD COLUMN line_override TEXT;
"#,
];

/// Open the write connection: the file made private, WAL, the schema migrated.
pub(crate) fn open_writer(db: &Path, busy: Duration) -> Result<Connection, StoreError> {
    paths::prepare_db_file(db).map_err(io_err(db))?;
    let mut conn = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(busy)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::NotWal(mode));
    }
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    migrate(&mut conn)?;
    // SQLite gives -wal/-shm the db's mode; make sure anyway.
    paths::prepare_db_file(db).map_err(io_err(db))?;
    Ok(conn)
}

/// Open a read-only connection.
pub(crate) fn open_reader(db: &Path, busy: Duration) -> Result<Connection, StoreError> {
    let c = Connection::open_with_flags(
        db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(busy)?;
    Ok(c)
}

/// Bring the database to [`SCHEMA_VERSION`] in one transaction (refusing a
/// newer one), and index rows a crash left out of the search index.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")?;
    let found: i64 = tx.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |r| r.get(0),
    )?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate() {
        if found < i as i64 + 1 {
            tx.execute_batch(sql)?;
        }
    }
    if (1..2).contains(&found) {
        // Version 2 added the search index: fill it from the existing rows.
        backfill_row_text(&tx)?;
    } else if found >= 2 {
        // The writer indexes new rows a moment after committing them (see
        // `Writer::flush_deferred`): rows a crash left unindexed are indexed now.
        let (rows, texts): (i64, i64) = tx.query_row(
            "SELECT (SELECT COUNT(*) FROM rows), (SELECT COUNT(*) FROM row_text)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        if rows != texts {
            backfill_row_text(&tx)?;
        }
    }
    if found < SCHEMA_VERSION {
        tx.execute("DELETE FROM schema_version", [])?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES (?1)",
            [SCHEMA_VERSION],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Fill `row_text` (and so `row_fts`) for every row that has none.
fn backfill_row_text(c: &Connection) -> Result<(), StoreError> {
    let mut stmt = c.prepare(
        "SELECT r.session, r.seq, r.raw, s.dialect FROM rows r JOIN sessions s ON s.id = r.session
         WHERE NOT EXISTS (SELECT 1 FROM row_text t WHERE t.session = r.session AND t.seq = r.seq)",
    )?;
    let mut batch = TextBatch::default();
    let mut rows = stmt.query([])?;
    let mut skipped: Option<String> = None;
    while let Some(r) = rows.next()? {
        let session: String = r.get(0)?;
        let seq: i64 = r.get(1)?;
        let raw: String = r.get(2)?;
        let dialect: String = r.get(3)?;
        match stored_dialect(&session, &dialect) {
            Ok(d) => batch.push(c, &session, seq as u64, d, &raw)?,
            Err(e) if skipped.as_deref() != Some(session.as_str()) => {
                warn!("search index: {e}; its rows are not indexed");
                skipped = Some(session);
            }
            Err(_) => {}
        }
    }
    batch.flush(c)?;
    Ok(())
}
