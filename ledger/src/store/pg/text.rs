//! The search text of the PostgreSQL ledger (`row_text`: each row's plain
//! text, its `tsvector` and the GIN index over it), written behind the
//! rows as the SQLite engine writes its FTS5 index: a batch commits its rows
//! without it, and the writer indexes them in one transaction at the next
//! flush of deferred work (at once when a settle, a job or shutdown asks,
//! else within a second). Keeping the `tsvector` and its GIN entries out of
//! the rows' transaction is most of what a step costs the database.
//!
//! A crash between the two leaves committed rows without search text:
//! each proxy, when it opens, indexes what the recent day partitions and
//! the older sessions still in use miss ([`backfill`], on the writer before
//! anything queued: a settle waits for it); `ledger rebuild` indexes a
//! whole session again.

use super::super::common::stored_dialect;
use super::super::error::StoreError;
use super::schema::DAY_MS;
use super::writer::transient;
use crate::model::{ByteString, Dialect};
use crate::parts;
use std::collections::HashMap;
use tokio_postgres::{Client, GenericClient};
use tracing::{debug, info, warn};

/// Bytes of text per `INSERT` statement.
const CHUNK_BYTES: usize = 4 << 20;
/// Bytes of a row's text indexed when the whole of it is refused (a
/// `tsvector` holds at most 1 MB; a text this long never makes one that
/// large).
const REFUSED_KEEP: usize = 256 << 10;
/// The insert of search text (rows gone meanwhile skipped).
const INSERT: &str = "INSERT INTO row_text (session, day, seq, text)
     SELECT u.s, u.d, u.q, u.t FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[])
        AS u(s, d, q, t)
     WHERE EXISTS (SELECT 1 FROM rows r WHERE r.session = u.s AND r.day = u.d AND r.seq = u.q)
     ON CONFLICT (session, seq, day) DO UPDATE SET text = EXCLUDED.text";
/// Most rows one open indexes (the rest: `ledger rebuild`), and how many
/// it reads at a time.
const BACKFILL_MAX: i64 = 200_000;
const BACKFILL_PAGE: i64 = 5_000;

/// One committed row (or confirmed answer) whose text waits to be indexed.
pub(super) struct TextJob {
    pub(super) session: String,
    pub(super) day: i64,
    pub(super) seq: u64,
    pub(super) dialect: Dialect,
    pub(super) raw: ByteString,
}

/// Text for the search index (PostgreSQL text holds no NUL).
pub(super) fn index_text(dialect: Dialect, raw: &str) -> String {
    let mut t = parts::plain_text(dialect, raw);
    if t.contains('\0') {
        t = t.replace('\0', " ");
    }
    t
}

/// Index `jobs` in one transaction: a row indexed twice (its row, then its
/// confirmed answer) keeps the newest text; a row gone meanwhile (the
/// retention sweep) is skipped. When the database refuses the batch for
/// one row's text (a `tsvector` past its 1 MB limit), the rows are
/// written one by one so that row alone is cut ([`REFUSED_KEEP`]).
/// `client` may be a transaction (`ledger rebuild`'s): then savepoints.
pub(super) async fn write<C: GenericClient>(
    client: &mut C,
    jobs: &[TextJob],
) -> Result<(), StoreError> {
    let mut newest: HashMap<(&str, i64, u64), usize> = HashMap::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        newest.insert((j.session.as_str(), j.day, j.seq), i);
    }
    let mut order: Vec<usize> = newest.into_values().collect();
    order.sort_unstable();
    match write_all(client, jobs, &order).await {
        Err(StoreError::Postgres(e)) if !transient(&e) => {
            debug!("ledger search text written row by row: {e}");
            write_each(client, jobs, &order).await
        }
        r => r,
    }
}

/// [`write`]'s rows in chunks of one statement each.
async fn write_all<C: GenericClient>(
    client: &mut C,
    jobs: &[TextJob],
    order: &[usize],
) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    let stmt = tx.prepare(INSERT).await?;
    let mut chunk = Chunk::default();
    for &i in order {
        let j = &jobs[i];
        chunk.push(&j.session, j.day, j.seq, index_text(j.dialect, &j.raw));
        if chunk.bytes >= CHUNK_BYTES {
            chunk.send(&tx, &stmt).await?;
        }
    }
    chunk.send(&tx, &stmt).await?;
    tx.commit().await?;
    Ok(())
}

/// [`write`]'s rows one at a time, each under a savepoint: a row whose
/// whole text is refused is indexed cut to [`REFUSED_KEEP`] bytes, or
/// left out.
async fn write_each<C: GenericClient>(
    client: &mut C,
    jobs: &[TextJob],
    order: &[usize],
) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    let stmt = tx.prepare(INSERT).await?;
    for &i in order {
        let j = &jobs[i];
        let mut text = index_text(j.dialect, &j.raw);
        for attempt in 0..2 {
            let mut chunk = Chunk::default();
            chunk.push(&j.session, j.day, j.seq, std::mem::take(&mut text));
            tx.batch_execute("SAVEPOINT t").await?;
            match chunk.send(&tx, &stmt).await {
                Ok(()) => {
                    tx.batch_execute("RELEASE SAVEPOINT t").await?;
                    break;
                }
                Err(e) if transient(&e) => return Err(e.into()),
                Err(e) => {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT t").await?;
                    if attempt == 0 {
                        warn!(session = %j.session, seq = j.seq, "ledger search text cut to {REFUSED_KEEP} bytes: {e}");
                        let mut t = chunk.texts.pop().unwrap_or_default();
                        let mut end = REFUSED_KEEP.min(t.len());
                        while !t.is_char_boundary(end) {
                            end -= 1;
                        }
                        t.truncate(end);
                        text = t;
                    } else {
                        warn!(session = %j.session, seq = j.seq, "ledger search text left out: {e}");
                    }
                }
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

/// Columns of one `INSERT`.
#[derive(Default)]
struct Chunk {
    sessions: Vec<String>,
    days: Vec<i64>,
    seqs: Vec<i64>,
    texts: Vec<String>,
    bytes: usize,
}

impl Chunk {
    fn push(&mut self, session: &str, day: i64, seq: u64, text: String) {
        self.bytes += text.len() + session.len() + 16;
        self.sessions.push(session.to_string());
        self.days.push(day);
        self.seqs.push(i64::try_from(seq).unwrap_or(i64::MAX));
        self.texts.push(text);
    }

    async fn send(
        &mut self,
        tx: &tokio_postgres::Transaction<'_>,
        stmt: &tokio_postgres::Statement,
    ) -> Result<(), tokio_postgres::Error> {
        if self.seqs.is_empty() {
            return Ok(());
        }
        tx.execute(stmt, &[&self.sessions, &self.days, &self.seqs, &self.texts])
            .await?;
        *self = Chunk::default();
        Ok(())
    }
}

/// Index the rows that have no search text (a crash between a batch's
/// commit and its text) of the day partitions from `since_day` on and of
/// the older sessions active since then (a session's rows are in its
/// creation day's partition however long it lives), at most
/// [`BACKFILL_MAX`]; returns how many.
pub(super) async fn backfill(client: &mut Client, since_day: i64) -> Result<u64, StoreError> {
    let since_ms = since_day.saturating_mul(DAY_MS);
    let mut done = 0u64;
    // A page at a time (the raw rows are held while their text is made);
    // a row whose text the database refuses even cut comes back in every
    // page, so the pages are bounded too.
    for _ in 0..BACKFILL_MAX / BACKFILL_PAGE {
        let rows = client
            .query(
                "(SELECT r.session, r.day, r.seq, r.raw, s.dialect FROM rows r
                  JOIN sessions s ON s.id = r.session
                  WHERE r.day >= $1 AND NOT EXISTS (SELECT 1 FROM row_text t
                      WHERE t.session = r.session AND t.day = r.day AND t.seq = r.seq))
                 UNION ALL
                 (SELECT r.session, r.day, r.seq, r.raw, s.dialect FROM sessions s
                  JOIN rows r ON r.session = s.id AND r.day = s.day
                  WHERE s.day < $1 AND s.last_ms >= $3 AND NOT EXISTS (SELECT 1 FROM row_text t
                      WHERE t.session = r.session AND t.day = r.day AND t.seq = r.seq))
                 LIMIT $2",
                &[&since_day, &BACKFILL_PAGE, &since_ms],
            )
            .await?;
        let page = rows.len();
        let mut jobs = Vec::with_capacity(page);
        for r in &rows {
            let session: String = r.get(0);
            let dialect = match stored_dialect(&session, &r.get::<_, String>(4)) {
                Ok(d) => d,
                Err(e) => {
                    warn!("search index: {e}; its rows are not indexed");
                    continue;
                }
            };
            jobs.push(TextJob {
                day: r.get(1),
                seq: r.get::<_, i64>(2).max(0) as u64,
                dialect,
                raw: r.get::<_, String>(3).into(),
                session,
            });
        }
        drop(rows);
        write(client, &jobs).await?;
        done += jobs.len() as u64;
        if (page as i64) < BACKFILL_PAGE {
            break;
        }
    }
    if done > 0 {
        info!(
            rows = done,
            "ledger search index: rows a crash left unindexed are indexed now"
        );
    }
    Ok(done)
}
