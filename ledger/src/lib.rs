//! The ledger of oceancode-proxy: the store behind a backend trait
//! ([`store::LedgerStore`]) with its SQLite engine ([`store::Store`]: one
//! writer thread, per-turn transcripts, the living `SESSION.md` page, search),
//! and what reads the record back (recall, export as Markdown or ATIF,
//! status, rebuild and retention reports).
//!
//! The session model, the pure tideline and the media pricing live in
//! `oceancode-window` and are re-exported here under their old paths.

pub use oceancode_window::{cache, compress, media, model, tideline};
pub use oceancode_window::{
    AppliedEdit, Dialect, Event, InternalRecall, Pruned, Row, RowKind, RowPointers, SentPiece,
    SentWindow, SessionMeta, Standing, StandingKind, StepDetail, Usage,
};

pub mod atif;
pub mod export;
pub mod facts;
pub mod inside;
pub mod merge;
pub mod page;
pub mod parts;
pub mod paths;
pub mod rebuild;
pub mod recall;
pub mod resolve;
pub mod retention;
pub mod state_block;
pub mod status;
pub mod store;
pub mod time;
pub mod transcript;
