//! The ledger of oceancode-proxy: the session model, the pure tideline window
//! logic, and the single-writer SQLite store with per-turn transcripts.

pub mod model;

pub use model::{Dialect, Event, Row, RowKind, SessionMeta, Usage};
pub mod paths;
pub mod store;
pub mod tideline;
pub mod transcript;
