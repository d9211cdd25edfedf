//! The read side of the PostgreSQL engine (pooled connections, committed
//! state): session lists, steps, cuts, the recorded line, recall and
//! full-text search (`tsvector` + GIN, every word must appear, as FTS5).

use super::super::common::stored_dialect;
use super::super::error::StoreError;
use super::super::records::{CutRecord, LineRecord, SessionSummary, StepRecord};
use super::sql::{big, read_row, ROW_COLS};
use crate::model::{Row, RowKind, Usage};
use crate::recall::{
    clip_body, note_hits, snippet, RecallHit, TooBroad, BODY_MAX, SEARCH_MAX_NOTE_SETS,
    SEARCH_TIME, SNIPPET_SCAN,
};
use deadpool_postgres::Object;
use tracing::warn;

pub(super) async fn summaries(
    c: Object,
    only: Option<String>,
) -> Result<Vec<SessionSummary>, StoreError> {
    let rows = c
        .query(
            "SELECT s.id, s.client, s.model, s.dialect, s.last_ms, s.parent,
               (SELECT COUNT(DISTINCT r.turn) FROM rows r WHERE r.session = s.id AND NOT r.hidden),
               (SELECT COUNT(*) FROM rows r WHERE r.session = s.id AND NOT r.hidden),
               s.parent_seq, s.client_session
             FROM sessions s WHERE $1::text IS NULL OR s.id = $1
             ORDER BY s.last_ms DESC, s.ord DESC",
            &[&only],
        )
        .await?;
    let mut out = Vec::new();
    for r in rows {
        let id: String = r.get(0);
        let dialect = match stored_dialect(&id, &r.get::<_, String>(3)) {
            Ok(d) => d,
            Err(e) => {
                warn!("{e}; not listed");
                continue;
            }
        };
        out.push(SessionSummary {
            id,
            client: r.get(1),
            name: r
                .get::<_, Option<String>>(9)
                .as_deref()
                .and_then(crate::resolve::given_name)
                .map(str::to_string),
            model: r.get(2),
            dialect,
            turns: r.get::<_, i64>(6).max(0) as u32,
            rows: r.get::<_, i64>(7).max(0) as u64,
            last_ms: r.get(4),
            parent: r.get(5),
            parent_seq: r.get::<_, Option<i64>>(8).map(|s| s.max(0) as u64),
        });
    }
    Ok(out)
}

pub(super) async fn candidates(c: Object) -> Result<Vec<crate::resolve::Candidate>, StoreError> {
    let rows = c
        .query(
            "SELECT id, client, client_session, parent, created_ms, last_ms FROM sessions",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| crate::resolve::Candidate {
            id: r.get(0),
            client: r.get(1),
            client_session: r.get(2),
            parent: r.get(3),
            created_ms: r.get(4),
            last_ms: r.get(5),
        })
        .collect())
}

pub(super) async fn steps(c: Object, id: String) -> Result<Vec<StepRecord>, StoreError> {
    let rows = c
        .query(
            "SELECT step, model, status, input, output, cache_read, cache_write, window_rows,
                    ts_ms, error, detail
             FROM steps WHERE session = $1 ORDER BY step",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| StepRecord {
            step: r.get::<_, i64>(0).max(0) as u32,
            model: r.get(1),
            status: r.get::<_, i64>(2).clamp(0, i64::from(u16::MAX)) as u16,
            usage: Usage {
                input: r.get::<_, i64>(3).max(0) as u64,
                output: r.get::<_, i64>(4).max(0) as u64,
                cache_read: r.get::<_, i64>(5).max(0) as u64,
                cache_write: r.get::<_, i64>(6).max(0) as u64,
            },
            window_rows: r.get::<_, i64>(7).max(0) as u32,
            ts_ms: r.get(8),
            error: r.get(9),
            detail: r
                .get::<_, Option<String>>(10)
                .and_then(|d| serde_json::from_str(&d).ok())
                .unwrap_or_default(),
        })
        .collect())
}

pub(super) async fn cuts(c: Object, id: String) -> Result<Vec<CutRecord>, StoreError> {
    let rows = c
        .query(
            "SELECT upto_seq, gauge, line, ts_ms FROM cuts WHERE session = $1 ORDER BY ts_ms, ord",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| CutRecord {
            upto_seq: r.get::<_, i64>(0).max(0) as u64,
            gauge: r.get::<_, i64>(1).max(0) as u64,
            line: r.get::<_, i64>(2).max(0) as u64,
            ts_ms: r.get(3),
        })
        .collect())
}

pub(super) async fn merge_uses(
    c: Object,
    id: String,
) -> Result<Vec<crate::merge::MergeUse>, StoreError> {
    let rows = c
        .query(
            "SELECT text FROM page_notes WHERE session = $1 AND section = $2 ORDER BY id",
            &[&id, &crate::merge::MARKER_SECTION],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| crate::merge::marker_use(&r.get::<_, String>(0)))
        .collect())
}

pub(super) async fn recorded_line(c: Object, id: String) -> Result<Option<LineRecord>, StoreError> {
    Ok(c.query_opt(
        "SELECT line, line_spec, line_ms FROM sessions WHERE id = $1 AND line IS NOT NULL",
        &[&id],
    )
    .await?
    .map(|r| LineRecord {
        line: r.get::<_, i64>(0).max(0) as u64,
        spec: r.get::<_, Option<String>>(1).unwrap_or_default(),
        ts_ms: r.get::<_, Option<i64>>(2).unwrap_or(0),
    }))
}

pub(super) async fn recall_log(
    c: Object,
    session: String,
    pattern: Option<String>,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<RecallHit>, StoreError> {
    // SQLite's LIKE ignores ASCII case; ILIKE does here.
    let rows = c
        .query(
            "SELECT r.seq, r.turn, r.role, r.kind, r.hidden, COALESCE(t.text, r.raw)
             FROM rows r LEFT JOIN row_text t
               ON t.session = r.session AND t.seq = r.seq AND t.day = r.day
             WHERE r.session = $1 AND r.seq < $2
               AND ($3::text IS NULL OR COALESCE(t.text, r.raw) ILIKE '%' || $3 || '%')
             ORDER BY r.seq DESC LIMIT $4",
            &[
                &session,
                &before.map_or(i64::MAX, big),
                &pattern,
                &i64::try_from(limit).unwrap_or(i64::MAX),
            ],
        )
        .await?;
    let mut hits: Vec<RecallHit> = rows
        .iter()
        .map(|r| RecallHit {
            session: session.clone(),
            seq: r.get::<_, i64>(0).max(0) as u64,
            turn: r.get::<_, i64>(1).max(0) as u32,
            role: r.get(2),
            kind: RowKind::parse(&r.get::<_, String>(3)).unwrap_or(RowKind::Other),
            hidden: r.get(4),
            body: clip_body(&r.get::<_, String>(5), BODY_MAX),
        })
        .collect();
    hits.reverse();
    Ok(hits)
}

pub(super) async fn recall_entry(
    c: Object,
    session: String,
    seq: u64,
) -> Result<Option<(Row, bool)>, StoreError> {
    Ok(c.query_opt(
        &format!("SELECT {ROW_COLS} FROM rows WHERE session = $1 AND seq = $2"),
        &[&session, &big(seq)],
    )
    .await?
    .map(|r| read_row(&r)))
}

/// `me AS (…), fam AS (…)`: the sessions a search scoped to the session
/// bound at `$p` reads (it, its parent, its children and its siblings; a
/// fingerprint-keyed session, itself alone; none bound: no scope). One text
/// for the row and the note search.
macro_rules! family_ctes {
    ($p:literal) => {
        concat!(
            "me AS (
               SELECT id, parent FROM sessions
               WHERE id = ",
            $p,
            " AND coalesce(client_session, '') NOT LIKE 'fp:%'),
             fam AS (
               SELECT ",
            $p,
            "::text AS id WHERE ",
            $p,
            "::text IS NOT NULL
               UNION SELECT parent FROM me WHERE parent IS NOT NULL
               UNION SELECT s.id FROM sessions s JOIN me ON s.parent = me.id
               UNION SELECT s.id FROM sessions s JOIN me
                     ON me.parent IS NOT NULL AND s.parent = me.parent)"
        )
    };
}

/// Every word must appear (`plainto_tsquery` ANDs the words' tokens, the
/// `simple` configuration folds case and does not stem, like FTS5's
/// default tokenizer); newest session first, then newest row. `terms` as
/// [`crate::recall::search_terms`] bounds them; `within`: only that
/// session and its parent, children and siblings. The snippets are made
/// here ([`snippet`]), as for SQLite. The statement runs under
/// a `statement_timeout` of [`SEARCH_TIME`]: past it, [`TooBroad`].
pub(super) async fn search(
    mut c: Object,
    terms: Vec<String>,
    limit: usize,
    within: Option<String>,
) -> Result<Vec<RecallHit>, StoreError> {
    let text = terms.join(" ");
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let tx = c.transaction().await?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        SEARCH_TIME.as_millis()
    ))
    .await?;
    let rows = tx
        .query(
            concat!(
                "WITH q AS (SELECT plainto_tsquery('simple', $1) AS q),
             ",
                family_ctes!("$3"),
                ",
             hits AS (
               SELECT t.session, t.seq, t.day, s.last_ms, s.ord
               FROM row_text t JOIN sessions s ON s.id = t.session, q
               WHERE t.tsv @@ q.q AND numnode(q.q) > 0
                 AND ($3::text IS NULL OR t.session IN (SELECT id FROM fam))
               ORDER BY s.last_ms DESC, s.ord DESC, t.seq DESC
               LIMIT $2)
             SELECT h.session, h.seq, r.turn, r.role, r.kind, r.hidden, left(t.text, $4)
             FROM hits h JOIN rows r ON r.session = h.session AND r.seq = h.seq AND r.day = h.day
             JOIN row_text t ON t.session = h.session AND t.seq = h.seq AND t.day = h.day
             ORDER BY h.last_ms DESC, h.ord DESC, h.seq DESC"
            ),
            &[
                &text,
                &i64::try_from(limit).unwrap_or(i64::MAX),
                &within,
                &i32::try_from(SNIPPET_SCAN).unwrap_or(i32::MAX),
            ],
        )
        .await
        .map_err(|e| {
            if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) {
                StoreError::TooBroad(TooBroad::timed_out())
            } else {
                StoreError::Postgres(e)
            }
        })?;
    let mut hits = search_notes(&tx, &terms, within.as_deref()).await?;
    tx.commit().await?;
    hits.truncate(limit);
    let room = limit - hits.len();
    Ok(hits
        .into_iter()
        .chain(rows.iter().take(room).map(|r| RecallHit {
            session: r.get(0),
            seq: r.get::<_, i64>(1).max(0) as u64,
            turn: r.get::<_, i64>(2).max(0) as u32,
            role: r.get(3),
            kind: RowKind::parse(&r.get::<_, String>(4)).unwrap_or(RowKind::Other),
            hidden: r.get(5),
            body: clip_body(&snippet(&r.get::<_, String>(6), &terms), BODY_MAX),
        }))
        .collect())
}

/// The notes in force (each session's latest edit set) holding every term,
/// in the sessions `within` names (None: all), newest session first (at
/// most [`SEARCH_MAX_NOTE_SETS`] sessions with notes are read).
async fn search_notes(
    tx: &deadpool_postgres::Transaction<'_>,
    terms: &[String],
    within: Option<&str>,
) -> Result<Vec<RecallHit>, StoreError> {
    let sets = tx
        .query(
            concat!(
                "WITH ",
                family_ctes!("$1"),
                "
             SELECT e.session, e.set_json FROM context_edits e
             JOIN sessions s ON s.id = e.session
             WHERE e.n = (SELECT max(x.n) FROM context_edits x WHERE x.session = e.session)
               AND strpos(e.set_json, '\"notes\":[{') > 0
               AND ($1::text IS NULL OR e.session IN (SELECT id FROM fam))
             ORDER BY s.last_ms DESC, s.ord DESC
             LIMIT $2"
            ),
            &[
                &within,
                &i64::try_from(SEARCH_MAX_NOTE_SETS).unwrap_or(i64::MAX),
            ],
        )
        .await?;
    let mut out = Vec::new();
    for r in &sets {
        let session: String = r.get(0);
        let set: String = r.get(1);
        // The turns of the rows the notes follow, read first (the closure
        // `note_hits` takes cannot wait).
        let mut turns = std::collections::HashMap::new();
        for after in crate::recall::note_seqs(&set) {
            let t = tx
                .query_opt(
                    "SELECT turn FROM rows WHERE session = $1 AND seq = $2 LIMIT 1",
                    &[&session, &big(after)],
                )
                .await?
                .map_or(0, |r| r.get::<_, i64>(0).max(0) as u32);
            turns.insert(after, t);
        }
        out.extend(note_hits(&session, &set, terms, &mut |seq| {
            turns.get(&seq).copied().unwrap_or(0)
        }));
    }
    Ok(out)
}

pub(super) async fn context_edits(
    c: Object,
    id: String,
) -> Result<Vec<super::super::records::ContextEditRecord>, StoreError> {
    let rows = c
        .query(
            "SELECT n, ts_ms, seqs_json, tokens_before, tokens_after, set_json
             FROM context_edits WHERE session = $1 ORDER BY n",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| super::super::records::ContextEditRecord {
            n: r.get::<_, i64>(0).max(0) as u32,
            ts_ms: r.get(1),
            seqs: serde_json::from_str(&r.get::<_, String>(2)).unwrap_or_default(),
            tokens_before: r.get::<_, i64>(3).max(0) as u64,
            tokens_after: r.get::<_, i64>(4).max(0) as u64,
            set: r.get(5),
        })
        .collect())
}
