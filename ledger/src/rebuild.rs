//! `ledger rebuild`: a session's transcripts, `index.md`, `SESSION.md` and
//! search index made again from the database alone (mechanical, no model
//! call), with the same pure renderers as the live writer. The engine side is
//! `store::rebuild`; this module holds what callers see of it.

use std::sync::Arc;

/// Progress callback: `(done, total)` rows.
pub type Progress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// What a rebuild wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RebuildReport {
    /// Session id.
    pub session: String,
    /// Rows read (hidden ones included).
    pub rows: u64,
    /// Turn files written.
    pub turns: u32,
    /// Stale turn files removed.
    pub removed: u32,
    /// Whether `SESSION.md` was written.
    pub page: bool,
}
