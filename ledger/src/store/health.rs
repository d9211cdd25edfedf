//! Health and the behind protocol of the SQLite engine (see
//! [`super::backend`]): what `/_oceancode/health` reports, the sessions
//! behind, their resync, and the restorer's read of a client key.

use super::backend::{Behind, BehindReason, Health, HealthStatus, LoadedSession};
use super::error::StoreError;
use super::queue::Shared;
use super::sql;
use super::Store;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Longest the restorer waits for the writer to commit what is queued of
/// the client key it reads.
pub const RESTORE_WAIT: Duration = Duration::from_secs(1);

impl Store {
    /// Whether the ledger keeps up, and if not why (see
    /// [`super::LedgerWrite::health`]).
    pub fn health(&self) -> Health {
        health_of(&self.inner.shared)
    }

    /// Sessions behind: one atomic load (see [`super::LedgerWrite::behind_count`]).
    pub fn behind_count(&self) -> usize {
        self.inner.shared.behind_count()
    }

    /// Whether `session` is behind.
    pub fn behind(&self, session: &str) -> Option<Behind> {
        self.inner.shared.behind(session)
    }

    /// Every session behind, oldest first.
    pub fn behind_sessions(&self) -> Vec<(String, Behind)> {
        self.inner.shared.behind_sessions()
    }

    /// Clear `session`'s behind mark and return what is committed of it
    /// (None = nothing). With nothing of the session queued
    /// ([`Behind::ready`]) it reads at once; otherwise it runs on the
    /// writer after the session's queued events (which are dropped), so it
    /// waits for them.
    pub fn resync(&self, session: &str) -> Result<Option<LoadedSession>, StoreError> {
        if self.inner.shared.clear_behind_if_idle(session) {
            return self.with_reader(|c| sql::load_session(c, session));
        }
        let id = session.to_string();
        self.run_job(move |w| {
            w.shared.clear_behind(&id);
            w.forget(&id);
            sql::load_session(&w.db.conn, &id)
        })
    }

    /// The recorded sessions of a client key, root first, as committed, each
    /// one's behind mark cleared when nothing of it is queued (the caller
    /// takes them as the sessions' state). It waits for the writer only when
    /// something of the key is still queued, and then at most
    /// [`RESTORE_WAIT`]: a session of it that still has events queued after
    /// that falls behind and heals by resync.
    pub fn restore_client(&self, key: &str) -> Result<Vec<LoadedSession>, StoreError> {
        let s = &self.inner.shared;
        let ids = self.sessions_for_client(key)?;
        let ids = if s.queued_for(key, &ids) {
            match self.settle_within(RESTORE_WAIT) {
                Ok(_) | Err(StoreError::Closed) => {}
                Err(e) => return Err(e),
            }
            self.sessions_for_client(key)?
        } else {
            ids
        };
        let mut out = Vec::new();
        for id in ids {
            if let Some(l) = self.with_reader(|c| sql::load_session(c, &id))? {
                if !s.clear_behind_if_idle(&id) {
                    s.mark_behind(&id, 0, BehindReason::Gap);
                }
                out.push(l);
            }
        }
        Ok(out)
    }
}

/// What `health` reports for an engine's shared writer state (the
/// SQLite and PostgreSQL engines alike).
pub(super) fn health_of(s: &Shared) -> Health {
    let (queued, queued_bytes, lag_ms) = s.queue_state();
    let mut reasons = Vec::new();
    {
        let f = s.faults.lock();
        if let Some(c) = &f.commit {
            reasons.push(format!(
                "ledger commits failing for {:.0}s ({} retries, {queued} events waiting): {}",
                c.since.elapsed().as_secs_f64(),
                c.retries,
                c.error
            ));
        }
        if let Some(c) = &f.files {
            reasons.push(format!(
                "transcript writes failing for {:.0}s ({} sessions wait to be written again): {}",
                c.since.elapsed().as_secs_f64(),
                f.files_sessions,
                c.error
            ));
        }
    }
    if s.shedding() {
        reasons.push(format!(
            "the ledger write queue is full ({queued} events, {queued_bytes} bytes): new events are shed"
        ));
    }
    let behind = s.behind_sessions();
    if !behind.is_empty() {
        let count = |r: BehindReason| behind.iter().filter(|(_, b)| b.reason == r).count();
        let mut why = Vec::new();
        for (r, label) in [
            (BehindReason::Shed, "shed"),
            (BehindReason::Gap, "gap"),
            (BehindReason::Failed, "failed"),
        ] {
            let n = count(r);
            if n > 0 {
                why.push(format!("{n} {label}"));
            }
        }
        let reopened = s.reopens.load(Ordering::Relaxed);
        reasons.push(format!(
            "{} sessions behind ({}{}): each heals from its client's next full resend",
            behind.len(),
            why.join(", "),
            if reopened > 0 {
                format!("; the database was opened afresh {reopened} times after its file was deleted or replaced")
            } else {
                String::new()
            }
        ));
    }
    Health {
        status: if reasons.is_empty() {
            HealthStatus::Ok
        } else {
            HealthStatus::Degraded
        },
        reasons,
        lag_ms,
        queued,
        queued_bytes,
        behind: behind.len() as u64,
    }
}
