//! The test kit every crate's tests share (linkerd's `linkerd/app/test` is
//! the model): [`eventually`] instead of hand-written poll loops, and a
//! per-dialect [`Conversation`] builder instead of private request-body
//! builders; with the feature `ledger`, the one ledger kit (module `ledger`:
//! rows, a scripted session, the store backends). Without that feature it
//! depends on no crate of the workspace but the session model
//! (`oceancode-window`), so the fake upstream's tests link no ledger.
// A test kit: a failed wait or a malformed fixture should panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod conversation;
mod eventually;
#[cfg(feature = "ledger")]
pub mod ledger;

pub use conversation::{assistant, conv_key, user, Conversation, Dialect};
pub use eventually::{eventually, eventually_async, Outcome, POLL};
