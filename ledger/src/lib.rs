//! The ledger of oceancode-proxy: the store behind a backend trait
//! ([`store::LedgerStore`]) with its SQLite engine ([`store::Store`]: one
//! writer thread, per-turn transcripts, the living `SESSION.md` page, search),
//! and what reads the record back (recall, export as Markdown or ATIF,
//! status, rebuild and retention reports).
//!
//! The session model, the pure tideline and the media pricing live in
//! `oceancode-window`; other crates name it directly (the imports below are
//! this crate's own).

pub(crate) use oceancode_window::{cache, media, model};
pub(crate) use oceancode_window::{Pruned, SessionMeta, Usage};

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
