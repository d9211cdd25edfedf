//! PostgreSQL queries shared by the writer, the readers and the jobs: a
//! session's facts, its rows and its whole state as the restorer loads it
//! (the SQLite engine's `sql`, in PostgreSQL's SQL). The reads the files
//! are rendered from are in `source`.

use super::super::common::stored_dialect;
use super::super::error::StoreError;
use super::super::records::{
    kept_exchanges, pointers_at, pointers_of_step, LoadedSession, PointersAt, RECALLS_LIKE,
    RECENT_MODELS, SENT_LIKE,
};
use crate::model::{Row, RowKind, SessionMeta, Usage};
use std::sync::LazyLock;
use tokio_postgres::GenericClient;

/// A `u64` as `BIGINT` (saturating).
pub(super) fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The columns [`read_row`] decodes, in order.
pub(super) const ROW_COLS: &str =
    "seq, role, kind, raw, tokens, turn, step, branch, from_response, hidden";

/// Decode a row selected with [`ROW_COLS`]; also returns `hidden`.
pub(super) fn read_row(r: &tokio_postgres::Row) -> (Row, bool) {
    let kind: String = r.get(2);
    let raw: String = r.get(3);
    (
        Row {
            seq: r.get::<_, i64>(0).max(0) as u64,
            role: r.get(1),
            kind: RowKind::parse(&kind).unwrap_or(RowKind::Other),
            raw: raw.into(),
            tokens: r.get::<_, i64>(4).max(0) as u32,
            turn: r.get::<_, i64>(5).max(0) as u32,
            step: r.get::<_, i64>(6).max(0) as u32,
            branch: r.get::<_, i64>(7).max(0) as u32,
            from_response: r.get(8),
        },
        r.get(9),
    )
}

/// A session's facts.
pub(super) async fn session_meta<C: GenericClient>(
    c: &C,
    id: &str,
) -> Result<Option<SessionMeta>, StoreError> {
    let Some(r) = c
        .query_opt(
            "SELECT client, client_session, dialect, model, parent, created_ms, last_ms,
                    parent_seq
             FROM sessions WHERE id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(None);
    };
    let dialect: String = r.get(2);
    Ok(Some(SessionMeta {
        id: id.to_string(),
        client: r.get(0),
        client_session: r.get(1),
        dialect: stored_dialect(id, &dialect)?,
        model: r.get(3),
        parent: r.get(4),
        parent_seq: r.get::<_, Option<i64>>(7).map(|s| s.max(0) as u64),
        created_ms: r.get(5),
        last_ms: r.get(6),
    }))
}

/// A session's rows in seq order (hidden ones only when asked).
pub(super) async fn session_rows<C: GenericClient>(
    c: &C,
    id: &str,
    include_hidden: bool,
) -> Result<Vec<(Row, bool)>, StoreError> {
    let filter = if include_hidden {
        ""
    } else {
        " AND NOT hidden"
    };
    let rows = c
        .query(
            &format!("SELECT {ROW_COLS} FROM rows WHERE session = $1{filter} ORDER BY seq"),
            &[&id],
        )
        .await?;
    Ok(rows.iter().map(read_row).collect())
}

/// A whole session as committed (None = no such session).
pub(super) async fn load_session<C: GenericClient>(
    c: &C,
    id: &str,
) -> Result<Option<LoadedSession>, StoreError> {
    let Some(meta) = session_meta(c, id).await? else {
        return Ok(None);
    };
    let mut rows = Vec::new();
    let mut hidden = Vec::new();
    for (row, is_hidden) in session_rows(c, id, true).await? {
        if is_hidden {
            hidden.push(row.seq);
        }
        rows.push(row);
    }
    let r = c
        .query_one(
            "SELECT s.cut_upto,
                COALESCE((SELECT branch FROM branches b WHERE b.session = s.id
                          ORDER BY b.ord DESC LIMIT 1), 0),
                COALESCE((SELECT MAX(step) FROM steps t WHERE t.session = s.id), 0),
                s.line_override
             FROM sessions s WHERE s.id = $1",
            &[&id],
        )
        .await?;
    let last_usage = c
        .query_opt(
            "SELECT input, output, cache_read, cache_write FROM steps
             WHERE session = $1 AND input + output + cache_read + cache_write > 0
             ORDER BY step DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map(|u| Usage {
            input: u.get::<_, i64>(0).max(0) as u64,
            output: u.get::<_, i64>(1).max(0) as u64,
            cache_read: u.get::<_, i64>(2).max(0) as u64,
            cache_write: u.get::<_, i64>(3).max(0) as u64,
        });
    let context = c
        .query_opt(
            "SELECT n, set_json FROM context_edits WHERE session = $1 ORDER BY n DESC LIMIT 1",
            &[&id],
        )
        .await?
        .map(|r| (r.get::<_, i64>(0).max(0) as u32, r.get::<_, String>(1)));
    let details = c
        .query(
            "SELECT detail FROM steps WHERE session = $1 AND detail LIKE $2 ORDER BY step",
            &[&id, &RECALLS_LIKE],
        )
        .await?;
    let details: Vec<String> = details.iter().map(|r| r.get(0)).collect();
    let exchanges = kept_exchanges(details.iter().map(String::as_str));
    // The compress pointers the newest recorded window sent.
    let newest: Option<String> = c
        .query_opt(
            "SELECT detail FROM steps WHERE session = $1 AND detail LIKE $2
             ORDER BY step DESC LIMIT 1",
            &[&id, &SENT_LIKE],
        )
        .await?
        .map(|r| r.get(0));
    let pointers = match pointers_at(newest.as_deref()) {
        PointersAt::None => None,
        PointersAt::Here(p) => Some(p),
        PointersAt::Step { step, upto } => {
            let detail: Option<String> = c
                .query_opt(
                    "SELECT detail FROM steps WHERE session = $1 AND step = $2",
                    &[&id, &i64::from(step)],
                )
                .await?
                .and_then(|r| r.get(0));
            pointers_of_step(upto, detail.as_deref())
        }
    };
    let models = c
        .query(
            "SELECT model, MAX(ts_ms) AS last_ts FROM steps WHERE session = $1 AND model <> ''
             GROUP BY model ORDER BY last_ts DESC LIMIT $2",
            &[&id, &(RECENT_MODELS as i64)],
        )
        .await?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .collect();
    Ok(Some(LoadedSession {
        models,
        context,
        exchanges,
        pointers,
        line_override: r.get(3),
        meta,
        rows,
        hidden,
        branch: r.get::<_, i64>(1).max(0) as u32,
        cut_upto: r.get::<_, i64>(0).max(0) as u64,
        last_usage,
        steps: r.get::<_, i64>(2).max(0) as u32,
    }))
}

/// The visible rows of one turn, by seq (readers and the writer's files).
pub(super) static TURN_ROWS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {ROW_COLS} FROM rows WHERE session = $1 AND turn = $2 AND NOT hidden ORDER BY seq"
    )
});

/// Visible rows of one turn, by seq.
pub(super) async fn turn_rows<C: GenericClient>(
    c: &C,
    session: &str,
    turn: u32,
) -> Result<Vec<Row>, StoreError> {
    let rows = c.query(&*TURN_ROWS, &[&session, &i64::from(turn)]).await?;
    Ok(rows.iter().map(|r| read_row(r).0).collect())
}
