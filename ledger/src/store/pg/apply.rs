//! Applying a batch on the PostgreSQL engine, in one transaction: the
//! leases of its sessions taken or renewed first, then each event's SQL
//! (the SQLite engine's `apply`, in PostgreSQL's SQL). What an event means
//! (the checks, its outcome) is decided in `store/apply.rs`, for both.
//!
//! Round trips are what a batch costs here (the server is across a
//! socket), so: every statement is prepared once per connection
//! ([`Stmts`]); an event's independent statements are pipelined; and a
//! batch first runs without a savepoint per event — every refusal is
//! decided before its event writes anything, so only an error of the
//! database itself needs one. Such an error rolls the attempt back, and
//! the batch runs again with a savepoint around each event, so the
//! failing event alone is refused ([`Mode`]). The search text of new rows
//! is written after the commit, in its own transaction ([`super::text`]),
//! as the SQLite engine does with its full-text index.

use super::super::apply::{
    check_rows, confirmed, hidden, known_next_seq, next_after, rows_written, session_written, take,
    unknown_session,
};
use super::super::effects::{Applied, Known, Outcome};
use super::super::error::StoreError;
use super::super::writer::Queued;
use super::schema::{DAY_MS, NOW_MS};
use super::sql::big;
use super::text::TextJob;
use super::writer::transient;
use super::Leases;
use crate::model::{ByteString, Dialect, Event, SessionMeta};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, GenericClient, Statement, Transaction};

/// The writer connection's prepared statements, by SQL text (emptied when
/// the connection is made again: statements belong to their connection).
/// A statement prepared in a transaction that is rolled back stays
/// prepared (the protocol's Parse is not transactional).
#[derive(Default)]
pub(super) struct Stmts(RefCell<HashMap<String, Statement>>);

impl Stmts {
    pub(super) fn clear(&self) {
        self.0.borrow_mut().clear();
    }

    /// The statement for `sql`, prepared on `c` the first time.
    pub(super) async fn get<C: GenericClient>(
        &self,
        c: &C,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.0.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = c.prepare(sql).await?;
        self.0.borrow_mut().insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

/// How a batch's events are isolated from each other.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// No savepoints: the first error of the database aborts the attempt.
    Fast,
    /// A savepoint around each event: an event the database refuses is
    /// refused alone.
    Careful,
}

/// What one attempt came to.
pub(super) enum Attempt {
    Done(Applied),
    /// An event failed in [`Mode::Fast`]: run the batch again carefully.
    Again,
}

/// The lease upsert: take the sessions that are free, expired or already
/// ours (locking their rows until commit); returns the ones we hold.
static TAKE_LEASES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO leases (session, owner, expires_ms)
         SELECT s, $2, {NOW_MS} + $3 FROM unnest($1::text[]) AS s
         ON CONFLICT (session) DO UPDATE SET owner = EXCLUDED.owner, expires_ms = EXCLUDED.expires_ms
         WHERE leases.owner = EXCLUDED.owner OR leases.expires_ms < {NOW_MS}
         RETURNING session"
    )
});

/// Everything one attempt needs besides the transaction.
pub(super) struct Batch<'a> {
    pub(super) stmts: &'a Stmts,
    pub(super) known: &'a mut HashMap<String, Known>,
    pub(super) leases: &'a Leases,
    pub(super) mode: Mode,
    /// The search text of what this attempt writes, indexed after the
    /// commit ([`super::text`]).
    pub(super) text: &'a mut Vec<TextJob>,
    /// Sessions whose cached files may be stale: newly ours (another proxy
    /// may have written them meanwhile) or refused (this proxy's view of
    /// them was not the database's). Kept when the attempt is not.
    pub(super) stale: &'a mut Vec<String>,
}

impl Batch<'_> {
    async fn exec(
        &self,
        tx: &Transaction<'_>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let s = self.stmts.get(tx, sql).await?;
        tx.execute(&s, params).await
    }

    async fn query(
        &self,
        tx: &Transaction<'_>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let s = self.stmts.get(tx, sql).await?;
        tx.query(&s, params).await
    }

    async fn query_opt(
        &self,
        tx: &Transaction<'_>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        let s = self.stmts.get(tx, sql).await?;
        tx.query_opt(&s, params).await
    }

    /// One attempt at `events` in one transaction.
    pub(super) async fn run(
        &mut self,
        client: &mut Client,
        events: &[Queued],
    ) -> Result<Attempt, StoreError> {
        let tx = client.transaction().await?;
        let mut sessions: Vec<String> = events
            .iter()
            .map(|(ev, _, _)| ev.session().to_string())
            .collect();
        sessions.sort();
        sessions.dedup();
        let ttl = self.leases.ttl.as_millis() as i64;
        let ours: HashSet<String> = self
            .query(&tx, &TAKE_LEASES, &[&sessions, &self.leases.owner, &ttl])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        {
            let mut held = self.leases.held.lock();
            for s in &ours {
                if held.insert(s.clone()) {
                    // Newly ours: what another proxy wrote meanwhile counts.
                    self.known.remove(s);
                    self.stale.push(s.clone());
                }
            }
        }
        let mut out = Applied::default();
        let careful = self.mode == Mode::Careful;
        for (ev, id, _) in events {
            if out.skips(ev) {
                continue;
            }
            let mark = self.text.len();
            let outcome = if !ours.contains(ev.session()) {
                Ok(Outcome::Refused(
                    "another proxy holds the session's lease".into(),
                ))
            } else if careful {
                tx.batch_execute("SAVEPOINT ev").await?;
                let r = self.apply_event(&tx, ev).await;
                match &r {
                    Ok(Outcome::Applied(_)) => tx.batch_execute("RELEASE SAVEPOINT ev").await?,
                    _ => tx.batch_execute("ROLLBACK TO SAVEPOINT ev").await?,
                }
                r
            } else {
                self.apply_event(&tx, ev).await
            };
            let outcome = match outcome {
                Ok(outcome) => Ok(outcome),
                Err(StoreError::Postgres(e)) if transient(&e) => return Err(e.into()),
                Err(e) if !careful => {
                    // The transaction is aborted: this attempt is lost.
                    tracing::debug!("ledger batch runs again with a savepoint per event: {e}");
                    return Ok(Attempt::Again);
                }
                Err(e) => Err(e.to_string()),
            };
            if !take(&mut out, self.known, ev, *id, outcome) {
                self.text.truncate(mark);
                self.known.remove(ev.session());
                self.stale.push(ev.session().to_string());
            }
        }
        tx.commit().await?;
        Ok(Attempt::Done(out))
    }

    /// The session's partition day and dialect (None = no such session).
    async fn session_facts(
        &mut self,
        tx: &Transaction<'_>,
        session: &str,
    ) -> Result<Option<(i64, Dialect)>, StoreError> {
        if let Some(Known {
            day: Some(day),
            dialect: Some(d),
            ..
        }) = self.known.get(session)
        {
            return Ok(Some((*day, *d)));
        }
        let Some(r) = self
            .query_opt(
                tx,
                "SELECT day, dialect FROM sessions WHERE id = $1",
                &[&session],
            )
            .await?
        else {
            return Ok(None);
        };
        let day: i64 = r.get(0);
        let dialect = super::super::common::stored_dialect(session, &r.get::<_, String>(1))?;
        let k = self.known.entry(session.to_string()).or_default();
        k.day = Some(day);
        k.dialect = Some(dialect);
        Ok(Some((day, dialect)))
    }

    /// Mark rows hidden (a branch, or rows a sibling took): the turns they
    /// are in are rewritten and the cached ones dropped.
    async fn hide(
        &self,
        tx: &Transaction<'_>,
        session: &str,
        day: i64,
        seqs: &[u64],
    ) -> Result<Outcome, StoreError> {
        let seqs: Vec<i64> = seqs.iter().map(|s| big(*s)).collect();
        let rows = self
            .query(
                tx,
                "UPDATE rows SET hidden = true WHERE session = $1 AND day = $2 AND seq = ANY($3)
                 RETURNING turn",
                &[&session, &day, &seqs],
            )
            .await?;
        Ok(hidden(rows.iter().map(|r| r.get::<_, i64>(0))))
    }

    /// Apply one event.
    async fn apply_event(
        &mut self,
        tx: &Transaction<'_>,
        ev: &Event,
    ) -> Result<Outcome, StoreError> {
        if let Event::Session(m) = ev {
            return self.apply_session(tx, m).await;
        }
        let session = ev.session();
        let Some((day, dialect)) = self.session_facts(tx, session).await? else {
            return Ok(unknown_session());
        };
        match ev {
            Event::Session(_) => Ok(Outcome::quiet()),
            Event::Rows { rows, .. } => {
                if rows.is_empty() {
                    return Ok(Outcome::quiet());
                }
                let expected = match known_next_seq(self.known, session) {
                    Some(n) => n,
                    None => next_after(
                        self.query(
                            tx,
                            "SELECT COALESCE(MAX(seq), 0)::bigint FROM rows
                             WHERE session = $1 AND day = $2",
                            &[&session, &day],
                        )
                        .await?
                        .first()
                        .map_or(0, |r| r.get(0)),
                    ),
                };
                if let Some(refused) = check_rows(rows, expected) {
                    return Ok(refused);
                }
                let seqs: Vec<i64> = rows.iter().map(|r| big(r.seq)).collect();
                let branches: Vec<i64> = rows.iter().map(|r| i64::from(r.branch)).collect();
                let roles: Vec<Cow<str>> = rows.iter().map(|r| text(&r.role)).collect();
                let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
                let turns_: Vec<i64> = rows.iter().map(|r| i64::from(r.turn)).collect();
                let steps: Vec<i64> = rows.iter().map(|r| i64::from(r.step)).collect();
                let tokens: Vec<i64> = rows.iter().map(|r| i64::from(r.tokens)).collect();
                let raws: Vec<&str> = rows.iter().map(|r| &*r.raw).collect();
                let from: Vec<bool> = rows.iter().map(|r| r.from_response).collect();
                let row_params: [&(dyn ToSql + Sync); 11] = [
                    &session, &day, &seqs, &branches, &roles, &kinds, &turns_, &steps, &tokens,
                    &raws, &from,
                ];
                self.exec(
                    tx,
                    "INSERT INTO rows (session, day, seq, branch, role, kind, turn, step,
                                       tokens, raw, from_response)
                     SELECT $1, $2, * FROM unnest($3::bigint[], $4::bigint[], $5::text[],
                                                  $6::text[], $7::bigint[], $8::bigint[],
                                                  $9::bigint[], $10::text[], $11::bool[])",
                    &row_params,
                )
                .await?;
                for r in rows {
                    self.text.push(TextJob {
                        session: session.to_string(),
                        day,
                        seq: r.seq,
                        dialect,
                        raw: r.raw.clone(),
                    });
                }
                Ok(rows_written(rows))
            }
            Event::Confirm { seq, raw, .. } => {
                let (seq_, raw_) = (big(*seq), &**raw);
                let hit = self
                    .query_opt(
                        tx,
                        "UPDATE rows SET raw = $4, from_response = false
                         WHERE session = $1 AND day = $2 AND seq = $3 RETURNING turn, hidden",
                        &[&session, &day, &seq_, &raw_],
                    )
                    .await?
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, bool>(1)));
                if hit.is_some() {
                    self.text.push(TextJob {
                        session: session.to_string(),
                        day,
                        seq: *seq,
                        dialect,
                        raw: ByteString::from(&**raw),
                    });
                }
                Ok(confirmed(*seq, raw, hit))
            }
            Event::Branch {
                at_seq,
                branch,
                hidden,
                ..
            } => {
                self.exec(
                    tx,
                    "INSERT INTO branches (session, branch, at_seq, hidden, created_ms)
                     VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (session, branch) DO UPDATE SET at_seq = EXCLUDED.at_seq,
                        hidden = EXCLUDED.hidden, created_ms = EXCLUDED.created_ms",
                    &[
                        &session,
                        &i64::from(*branch),
                        &big(*at_seq),
                        &(hidden.len() as i64),
                        &crate::time::now_ms(),
                    ],
                )
                .await?;
                // The replaced row keeps its place in the order: give it the
                // newest one, as SQLite's INSERT OR REPLACE does.
                self.exec(
                    tx,
                    "UPDATE branches SET ord = DEFAULT WHERE session = $1 AND branch = $2",
                    &[&session, &i64::from(*branch)],
                )
                .await?;
                self.hide(tx, session, day, hidden).await
            }
            Event::Hide { seqs, .. } => self.hide(tx, session, day, seqs).await,
            Event::Step {
                step,
                model,
                status,
                usage,
                window_rows,
                ts_ms,
                error,
                detail,
                ..
            } => {
                let detail = detail.stored();
                let nums = [
                    i64::from(*step),
                    i64::from(*status),
                    big(usage.input),
                    big(usage.output),
                    big(usage.cache_read),
                    big(usage.cache_write),
                    i64::from(*window_rows),
                ];
                let (model, error) = (text(model), error.as_deref().map(text));
                let step_params: [&(dyn ToSql + Sync); 12] = [
                    &session, &nums[0], &model, &nums[1], &nums[2], &nums[3], &nums[4], &nums[5],
                    &nums[6], ts_ms, &error, &detail,
                ];
                let last: [&(dyn ToSql + Sync); 2] = [&session, ts_ms];
                tokio::try_join!(
                    self.exec(
                        tx,
                        "INSERT INTO steps (session, step, model, status, input, output,
                            cache_read, cache_write, window_rows, ts_ms, error, detail)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                         ON CONFLICT (session, step) DO UPDATE SET model = EXCLUDED.model,
                            status = EXCLUDED.status, input = EXCLUDED.input,
                            output = EXCLUDED.output, cache_read = EXCLUDED.cache_read,
                            cache_write = EXCLUDED.cache_write,
                            window_rows = EXCLUDED.window_rows, ts_ms = EXCLUDED.ts_ms,
                            error = EXCLUDED.error, detail = EXCLUDED.detail",
                        &step_params,
                    ),
                    self.exec(
                        tx,
                        "UPDATE sessions SET last_ms = GREATEST(last_ms, $2) WHERE id = $1",
                        &last,
                    ),
                )?;
                Ok(Outcome::quiet())
            }
            Event::Cut {
                upto_seq,
                gauge,
                line,
                ts_ms,
                ..
            } => {
                let (upto, gauge, line) = (big(*upto_seq), big(*gauge), big(*line));
                let cut: [&(dyn ToSql + Sync); 5] = [&session, &upto, &gauge, &line, ts_ms];
                let mark: [&(dyn ToSql + Sync); 2] = [&session, &upto];
                tokio::try_join!(
                    self.exec(
                        tx,
                        "INSERT INTO cuts (session, upto_seq, gauge, line, ts_ms)
                         VALUES ($1, $2, $3, $4, $5)",
                        &cut,
                    ),
                    self.exec(tx, "UPDATE sessions SET cut_upto = $2 WHERE id = $1", &mark),
                )?;
                Ok(Outcome::quiet())
            }
            Event::ContextEdit {
                n,
                set,
                seqs,
                tokens_before,
                tokens_after,
                ts_ms,
                ..
            } => {
                self.exec(
                    tx,
                    "INSERT INTO context_edits
                        (session, n, ts_ms, set_json, seqs_json, tokens_before, tokens_after)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (session, n) DO UPDATE SET ts_ms = EXCLUDED.ts_ms,
                        set_json = EXCLUDED.set_json, seqs_json = EXCLUDED.seqs_json,
                        tokens_before = EXCLUDED.tokens_before,
                        tokens_after = EXCLUDED.tokens_after",
                    &[
                        &session,
                        &i64::from(*n),
                        ts_ms,
                        set,
                        &serde_json::to_string(seqs).unwrap_or_default(),
                        &big(*tokens_before),
                        &big(*tokens_after),
                    ],
                )
                .await?;
                Ok(Outcome::quiet())
            }
            Event::Line {
                line,
                spec,
                overridden,
                ts_ms,
                ..
            } => {
                self.exec(
                    tx,
                    "UPDATE sessions SET line = $2, line_spec = $3, line_ms = $4,
                        line_override = $5
                     WHERE id = $1",
                    &[
                        &session,
                        &big(*line),
                        &text(spec),
                        ts_ms,
                        &overridden.as_deref().map(text),
                    ],
                )
                .await?;
                Ok(Outcome::quiet())
            }
        }
    }

    /// A `Session` event: the session's facts upserted (its creation time
    /// and partition day are kept from the first one).
    async fn apply_session(
        &mut self,
        tx: &Transaction<'_>,
        m: &SessionMeta,
    ) -> Result<Outcome, StoreError> {
        let json = serde_json::to_string(m).unwrap_or_default();
        let day = m.created_ms.div_euclid(DAY_MS);
        let parent_seq = m.parent_seq.map(big);
        let r = self
            .query(
                tx,
                "INSERT INTO sessions (id, day, client, client_session, dialect, model, parent,
                                       created_ms, last_ms, meta_json, parent_seq)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (id) DO UPDATE SET
                    client = EXCLUDED.client, client_session = EXCLUDED.client_session,
                    dialect = EXCLUDED.dialect, model = EXCLUDED.model, parent = EXCLUDED.parent,
                    last_ms = GREATEST(sessions.last_ms, EXCLUDED.last_ms),
                    meta_json = EXCLUDED.meta_json, parent_seq = EXCLUDED.parent_seq
                 RETURNING day, created_ms",
                &[
                    &m.id,
                    &day,
                    &text(&m.client),
                    &m.client_session.as_deref().map(text),
                    &m.dialect.as_str(),
                    &text(&m.model),
                    &m.parent.as_deref().map(text),
                    &m.created_ms,
                    &m.last_ms,
                    &json,
                    &parent_seq,
                ],
            )
            .await?;
        let (day, created_ms) = r
            .first()
            .map_or((day, m.created_ms), |r| (r.get(0), r.get(1)));
        let k = self.known.entry(m.id.clone()).or_default();
        k.day = Some(day);
        k.dialect = Some(m.dialect);
        // What the files render: what a read of the database gives.
        let meta = SessionMeta {
            created_ms,
            client: text(&m.client).into_owned(),
            client_session: m.client_session.as_deref().map(|c| text(c).into_owned()),
            model: text(&m.model).into_owned(),
            parent: m.parent.as_deref().map(|p| text(p).into_owned()),
            ..m.clone()
        };
        Ok(session_written(meta))
    }
}

/// A value for a text column: PostgreSQL text holds no NUL, which a JSON
/// string can carry (`\u0000` in a client's model name or message role);
/// it is kept as U+FFFD rather than the event refused (the row's raw JSON,
/// escaped, keeps it as sent).
fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}
