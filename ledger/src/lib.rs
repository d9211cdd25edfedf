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

/// What the crate's unit tests share.
#[cfg(test)]
pub(crate) mod test_support {
    /// Session `id` of `client`: Anthropic, model `m`, no parent, time 0.
    pub(crate) fn meta(id: &str, client: &str) -> crate::SessionMeta {
        crate::SessionMeta {
            id: id.into(),
            client: client.into(),
            client_session: None,
            dialect: crate::model::Dialect::Anthropic,
            model: "m".into(),
            parent: None,
            parent_seq: None,
            created_ms: 0,
            last_ms: 0,
        }
    }
}
