//! The store's error type (a leaf: every store module and the reports that
//! run on the writer thread use it; it depends on nothing of the store).

use crate::model::Event;
use std::io;
use std::path::{Path, PathBuf};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed (the connection, or a statement).
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// PostgreSQL could not be reached or set up (the pool, the URL).
    #[error("postgres: {0}")]
    PgSetup(String),
    /// A file or directory operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The database was written by a newer build.
    #[error("database schema version {found} is newer than supported ({supported})")]
    SchemaTooNew {
        /// Version found on disk.
        found: i64,
        /// Newest version this build knows.
        supported: i64,
    },
    /// SQLite refused WAL mode.
    #[error("could not enable WAL journal mode (got {0:?})")]
    NotWal(String),
    /// A stored value could not be decoded.
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
    /// The writer is shut down (or died).
    #[error("the ledger writer is shut down")]
    Closed,
    /// `try_submit` found the queue full; the event is handed back.
    #[error("the ledger writer queue is full")]
    QueueFull(Box<Event>),
    /// No session has this id (or id prefix).
    #[error("no session {0:?} in the ledger")]
    UnknownSession(String),
    /// A session name matched no session, or more than one.
    #[error(transparent)]
    Resolve(#[from] crate::resolve::ResolveError),
    /// The ledger has no session yet.
    #[error("the ledger has no session yet")]
    NoSessions,
    /// A search refused or stopped (see [`crate::recall::TooBroad`]).
    #[error(transparent)]
    TooBroad(#[from] crate::recall::TooBroad),
}

/// Map an I/O error on `path` to [`StoreError::Io`].
pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}
