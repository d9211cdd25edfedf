//! What both engines share below the traits (a leaf: it depends on nothing
//! of the store but its error type): the clock, integers as the databases
//! store them, and the one policy for a stored dialect this build does not
//! know.

use super::error::StoreError;
use crate::model::Dialect;

/// Unix milliseconds now.
pub(crate) use crate::time::now_ms;

/// A `u64` as SQLite's `INTEGER` (saturating).
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The dialect stored for session `id`.
///
/// The one policy for a dialect this build does not know (a newer build
/// wrote it, or the file was edited): the session is unreadable here — asked
/// for by id it is [`StoreError::Corrupt`]; where sessions are enumerated
/// (lists, indexing, healing) it is skipped with a warning.
pub(crate) fn stored_dialect(id: &str, stored: &str) -> Result<Dialect, StoreError> {
    Dialect::parse(stored)
        .ok_or_else(|| StoreError::Corrupt(format!("session {id}: unknown dialect {stored:?}")))
}
