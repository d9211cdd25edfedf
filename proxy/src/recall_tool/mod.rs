//! The in-band recall tool (`ledger.recall_tool`): every recorded upstream
//! request of a session carries one more tool, `oceancode_recall`, appended
//! after the client's tools, byte-identical from the session's first
//! request to its last; when the model calls it, the proxy answers the call
//! itself from the ledger and the client never sees it. The loop on the
//! request path is the exchange's recall branch (`exchange/recall.rs`).
//!
//! | module | holds |
//! |---|---|
//! | `spec` | the tool's definition per dialect and the `tools` member with it (pure) |
//! | `calls` | the model's recall calls in an answer, the continuation and hidden messages (pure) |
//! | `strip` | an answer (SSE or JSON) without its recall calls, indexes renumbered (pure) |
//! | `hidden` | the internal exchanges of a session, re-inserted at their place in later requests (pure) |
//! | `search` | the recall itself against the ledger (the `recall` CLI's three reads) |
//!
//! The answer of a request that carries the tool is held whole before the
//! client gets its status: only then is it known whether the model called
//! the tool, and a continuation's failure (429, 5xx) still reaches the
//! client as that status. What that costs is the answer's streaming: the
//! client gets the first byte when the upstream sent the last one.

pub mod calls;
pub(crate) mod hidden;
pub mod search;
pub(crate) mod spec;
pub(crate) mod strip;

pub use hidden::Hidden;
pub use spec::{tool_json, tools_member, NAME};

/// The line the stub ends with when the tool is on.
pub const STUB_NOTE: &str = "[The oceancode_recall tool reads that record back: seq for one entry whole, match or before for this session's log, search for words across related sessions.]";

/// How the proxy runs the tool (`ledger.recall_tool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallTool {
    /// Inject and answer the tool.
    pub enabled: bool,
    /// Most internal round trips (continuations) for one client request.
    pub max_rounds: u32,
    /// The tool's search reads every session of the ledger
    /// (`ledger.recall_tool.search = "all"`); off: the calling session, its
    /// parent, children and siblings.
    pub search_all: bool,
}

impl Default for RecallTool {
    fn default() -> Self {
        RecallTool {
            enabled: false,
            max_rounds: 4,
            search_all: false,
        }
    }
}

impl RecallTool {
    /// From the config's `ledger.recall_tool`.
    pub fn from_config(c: &oceancode_config::RecallToolConfig) -> Self {
        RecallTool {
            enabled: c.enabled,
            max_rounds: c.max_rounds.max(1),
            search_all: c.search == oceancode_config::RecallSearchScope::All,
        }
    }

    /// On.
    pub fn on() -> Self {
        RecallTool {
            enabled: true,
            ..RecallTool::default()
        }
    }
}
