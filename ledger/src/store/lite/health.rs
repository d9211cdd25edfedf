//! Health and the behind protocol of the SQLite engine (see
//! [`crate::store::backend`]): what `/_oceancode/health` reports, the sessions
//! behind, their resync, and the restorer's read of a client key.

use super::super::health::{health_of, RESTORE_WAIT};
use super::sql;
use super::Store;
use crate::store::backend::{Behind, BehindReason, Health, LoadedSession};
use crate::store::error::StoreError;

impl Store {
    /// Whether the ledger keeps up, and if not why (see
    /// [`crate::store::LedgerWrite::health`]).
    pub fn health(&self) -> Health {
        health_of(&self.inner.shared)
    }

    /// Sessions behind: one atomic load (see [`crate::store::LedgerWrite::behind_count`]).
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
