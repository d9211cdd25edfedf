//! The ledger of oceancode-proxy: the session model, the pure tideline window
//! logic, and the single-writer SQLite store with per-turn transcripts, the
//! living `SESSION.md` page, search and recall, export (Markdown, ATIF),
//! rebuild and retention.

pub mod model;

pub use model::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
pub mod atif;
pub mod export;
pub mod merge;
pub mod page;
pub mod parts;
pub mod paths;
pub mod rebuild;
pub mod recall;
pub mod retention;
pub mod status;
pub mod store;
pub mod tideline;
pub mod transcript;
