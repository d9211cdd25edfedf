//! Retention: the idle-session sweep (`retention.days`, default 7) and
//! `ledger vacuum`. A swept session loses its database rows and its
//! `sessions/<id>/` directory together. The engine side is
//! `store::retention`; this module holds the reports.

/// What a sweep removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Ids of the removed sessions.
    pub removed: Vec<String>,
    /// Rows removed with them.
    pub rows: u64,
}

/// What a vacuum did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VacuumReport {
    /// Bytes of `oceancode.db` + `-wal` before.
    pub bytes_before: u64,
    /// Bytes after.
    pub bytes_after: u64,
}
