//! The PostgreSQL schema: versioned migrations (table `schema_version`, the
//! same numbers as the SQLite ones), applied on first use under an advisory
//! lock so proxies starting together migrate once; a database at a newer
//! version is refused. The day partitions of `rows` and `row_text` are
//! created ahead of time (see [`ensure_partitions`]).

use super::super::error::StoreError;
use super::super::lite::schema::SCHEMA_VERSION;
use tokio_postgres::Client;
use tracing::warn;

/// Advisory lock keys (`pg_advisory_xact_lock`): the migration, and the
/// creation of partitions.
const MIGRATE_LOCK: i64 = 0x6f63_6561_6e01;
const PARTITION_LOCK: i64 = 0x6f63_6561_6e02;

/// How many days of partitions exist ahead of today.
pub(super) const DAYS_AHEAD: i64 = 7;

/// Milliseconds of a day (a session's partition is the day it was created).
pub(super) const DAY_MS: i64 = 86_400_000;

/// `now()` in Unix ms, the database's clock (leases compare against it, so
/// proxies' clocks need not agree).
pub(super) const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Migrations: `(version, SQL)`. The PostgreSQL store starts at version 6
/// (the SQLite schema of that version, in one step); each later SQLite
/// version gets its PostgreSQL twin here under the same number.
///
/// Beside the SQLite tables: `rows` and `row_text` are partitioned by
/// `day` (the day the session was created), so retention drops whole days
/// instead of deleting rows (a DELETE-heavy table bloats); `row_text`
/// keeps a `tsvector` with a GIN index for search; `leases` says which
/// proxy serves a session.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        6,
        r#"
CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    ord            BIGINT GENERATED ALWAYS AS IDENTITY,
    day            BIGINT NOT NULL,
    client         TEXT NOT NULL,
    client_session TEXT,
    dialect        TEXT NOT NULL,
    model          TEXT NOT NULL,
    parent         TEXT,
    created_ms     BIGINT NOT NULL,
    last_ms        BIGINT NOT NULL,
    cut_upto       BIGINT NOT NULL DEFAULT 0,
    meta_json      TEXT NOT NULL,
    parent_seq     BIGINT,
    line           BIGINT,
    line_spec      TEXT,
    line_ms        BIGINT
);
CREATE INDEX sessions_last ON sessions(last_ms);
CREATE INDEX sessions_client ON sessions(client_session);
CREATE INDEX sessions_day ON sessions(day, last_ms);
CREATE TABLE rows (
    session       TEXT NOT NULL,
    day           BIGINT NOT NULL,
    seq           BIGINT NOT NULL,
    branch        BIGINT NOT NULL,
    role          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    turn          BIGINT NOT NULL,
    step          BIGINT NOT NULL,
    tokens        BIGINT NOT NULL,
    raw           TEXT NOT NULL,
    from_response BOOLEAN NOT NULL DEFAULT false,
    hidden        BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (session, seq, day)
) PARTITION BY RANGE (day);
CREATE INDEX rows_turn ON rows(session, hidden, turn, seq);
CREATE TABLE rows_default PARTITION OF rows DEFAULT;
CREATE TABLE row_text (
    session TEXT NOT NULL,
    day     BIGINT NOT NULL,
    seq     BIGINT NOT NULL,
    text    TEXT NOT NULL,
    tsv     tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (session, seq, day)
) PARTITION BY RANGE (day);
CREATE INDEX row_text_tsv ON row_text USING GIN (tsv);
CREATE TABLE row_text_default PARTITION OF row_text DEFAULT;
CREATE TABLE branches (
    session    TEXT NOT NULL,
    branch     BIGINT NOT NULL,
    ord        BIGINT GENERATED ALWAYS AS IDENTITY,
    at_seq     BIGINT NOT NULL,
    hidden     BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (session, branch)
);
CREATE TABLE steps (
    session     TEXT NOT NULL,
    step        BIGINT NOT NULL,
    model       TEXT NOT NULL,
    status      BIGINT NOT NULL,
    input       BIGINT NOT NULL,
    output      BIGINT NOT NULL,
    cache_read  BIGINT NOT NULL,
    cache_write BIGINT NOT NULL,
    window_rows BIGINT NOT NULL,
    ts_ms       BIGINT NOT NULL,
    error       TEXT,
    detail      TEXT,
    PRIMARY KEY (session, step)
);
CREATE TABLE cuts (
    session  TEXT NOT NULL,
    ord      BIGINT GENERATED ALWAYS AS IDENTITY,
    upto_seq BIGINT NOT NULL,
    gauge    BIGINT NOT NULL,
    line     BIGINT NOT NULL,
    ts_ms    BIGINT NOT NULL
);
CREATE INDEX cuts_session ON cuts(session, ts_ms);
CREATE TABLE page_notes (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session    TEXT NOT NULL,
    turn       BIGINT NOT NULL,
    section    TEXT NOT NULL,
    text       TEXT NOT NULL,
    created_ms BIGINT NOT NULL
);
CREATE INDEX page_notes_session ON page_notes(session, id);
CREATE TABLE leases (
    session    TEXT PRIMARY KEY,
    owner      TEXT NOT NULL,
    expires_ms BIGINT NOT NULL
);
CREATE INDEX leases_owner ON leases(owner);
"#,
    ),
    // 7: a session's taken context edits (SQLite's schema 7).
    (
        7,
        r#"
CREATE TABLE context_edits (
    session       TEXT NOT NULL,
    n             BIGINT NOT NULL,
    ts_ms         BIGINT NOT NULL,
    set_json      TEXT NOT NULL,
    seqs_json     TEXT NOT NULL,
    tokens_before BIGINT NOT NULL,
    tokens_after  BIGINT NOT NULL,
    PRIMARY KEY (session, n)
);
"#,
    ),
    (
        8,
        r#"
ALTER TABLE sessions ADD COLUMN line_override TEXT;
"#,
    ),
];

/// Bring the database to [`SCHEMA_VERSION`] (refusing a newer one) in one
/// transaction under an advisory lock.
pub(super) async fn migrate(c: &mut Client) -> Result<(), StoreError> {
    let tx = c.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .await?;
    let found: i64 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM schema_version", &[])
        .await?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sql) in MIGRATIONS {
        if found < *version {
            tx.batch_execute(sql).await?;
        }
    }
    if found < SCHEMA_VERSION {
        tx.execute("DELETE FROM schema_version", &[]).await?;
        tx.execute(
            "INSERT INTO schema_version (version) VALUES ($1)",
            &[&SCHEMA_VERSION],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The day partition tables: `rows_d<day>`, `row_text_d<day>`.
pub(super) fn partition_names(day: i64) -> [String; 2] {
    [format!("rows_d{day}"), format!("row_text_d{day}")]
}

/// Days that have their own partitions (of `rows`), ascending.
pub(super) async fn partition_days(c: &Client) -> Result<Vec<i64>, StoreError> {
    let rows = c
        .query(
            "SELECT c.relname FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
             JOIN pg_class p ON p.oid = i.inhparent
             WHERE p.relname = 'rows' AND c.relname LIKE 'rows_d%'",
            &[],
        )
        .await?;
    let mut days: Vec<i64> = rows
        .iter()
        .filter_map(|r| r.get::<_, String>(0).strip_prefix("rows_d")?.parse().ok())
        .collect();
    days.sort_unstable();
    Ok(days)
}

/// Create the partitions of the days from yesterday to [`DAYS_AHEAD`]
/// days ahead that are missing (under an advisory lock: several proxies
/// may try at once). A session created on a day without a partition (a
/// clock far off) goes to the default partition.
pub(super) async fn ensure_partitions(c: &mut Client, today: i64) -> Result<(), StoreError> {
    let have = partition_days(c).await?;
    let missing: Vec<i64> = (today - 1..=today + DAYS_AHEAD)
        .filter(|d| !have.contains(d))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let tx = c.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PARTITION_LOCK])
        .await?;
    for day in missing {
        let [rows, text] = partition_names(day);
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {rows} PARTITION OF rows FOR VALUES FROM ({day}) TO ({next});
             CREATE TABLE IF NOT EXISTS {text} PARTITION OF row_text FOR VALUES FROM ({day}) TO ({next});",
            next = day + 1
        );
        // A default partition already holding rows of that day refuses
        // it: those days stay in the default partition.
        tx.batch_execute("SAVEPOINT part").await?;
        if let Err(e) = tx.batch_execute(&sql).await {
            warn!("ledger partition for day {day} not created: {e}");
            tx.batch_execute("ROLLBACK TO SAVEPOINT part").await?;
        } else {
            tx.batch_execute("RELEASE SAVEPOINT part").await?;
        }
    }
    tx.commit().await?;
    Ok(())
}
