//! The session model shared by the proxy, the store and the tideline:
//! rows (one message each, numbered by a gap-free `seq`), turns, steps and
//! branches, plus the events the request path hands to the single writer.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use bytestring::ByteString;

/// Which provider API a session speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// Anthropic Messages (`/v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    OpenaiChat,
    /// OpenAI Responses (`/v1/responses`).
    OpenaiResponses,
    /// Google Gemini (`/v1beta/models/{model}:generateContent`,
    /// `:streamGenerateContent`).
    Gemini,
}

/// What a row is, independent of dialect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// A user message that carries a prompt (not only tool results): starts a turn.
    Prompt,
    /// A user/tool message (or Responses item) carrying only tool results.
    ToolResult,
    /// A model message (text, thinking, tool calls) or a Responses output item.
    Assistant,
    /// A `system`/`developer` message inside the conversation.
    System,
    /// Anything else (kept verbatim, never interpreted).
    #[default]
    Other,
}

impl RowKind {
    /// Stable lowercase name, as stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            RowKind::Prompt => "prompt",
            RowKind::ToolResult => "tool_result",
            RowKind::Assistant => "assistant",
            RowKind::System => "system",
            RowKind::Other => "other",
        }
    }

    /// Inverse of [`RowKind::as_str`].
    pub fn parse(s: &str) -> Option<RowKind> {
        Some(match s {
            "prompt" => RowKind::Prompt,
            "tool_result" => RowKind::ToolResult,
            "assistant" => RowKind::Assistant,
            "system" => RowKind::System,
            "other" => RowKind::Other,
            _ => return None,
        })
    }
}

/// What a standing part of a conversation message is: instructions or
/// context the client sends inside a user message rather than in the system
/// prompt (Claude Code's CLAUDE.md reminder, Codex's AGENTS.md). When its
/// message leaves the window, the part stays (see
/// [`crate::tideline::plan_pins`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StandingKind {
    /// Project or user instructions (CLAUDE.md and its family, AGENTS.md):
    /// every distinct copy is kept.
    Instructions,
    /// Context a hook added at session start: every distinct copy is kept.
    HookContext,
    /// Commit and pull-request attribution: each copy replaces the one
    /// before, so only the newest copy that left is kept.
    Attribution,
    /// The list of skills: only the newest copy that left is kept.
    Skills,
    /// The list of tools loaded on demand (deferred tools): only the newest
    /// copy that left is kept.
    Tools,
    /// The environment (working directory, shell, date): only the newest
    /// copy that left is kept.
    Environment,
}

impl StandingKind {
    /// True when a later copy replaces an earlier one (only the newest is kept).
    pub fn superseded(self) -> bool {
        matches!(
            self,
            StandingKind::Attribution
                | StandingKind::Skills
                | StandingKind::Tools
                | StandingKind::Environment
        )
    }
}

/// A standing part of one message: which content part, what it is, and a
/// hash of its text (identical copies are kept once).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Standing {
    /// Index of the part in the message's content array.
    pub part: u32,
    /// What it is.
    pub kind: StandingKind,
    /// Hash of the part's text.
    pub hash: u64,
}

/// One message of a session, stored verbatim.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// 1-based, gap-free within the session (across branches).
    pub seq: u64,
    /// The role as sent (`user`, `assistant`, `system`, `tool`, `developer`),
    /// or for an OpenAI Responses item without a role its `type`
    /// (`function_call`, `function_call_output`, `reasoning`, ...).
    pub role: String,
    /// Dialect-independent classification.
    pub kind: RowKind,
    /// The exact JSON bytes of the message as the client sent it (or as
    /// reassembled from the response, until the client echoes it). A
    /// [`ByteString`] so that a row can share the request body's bytes
    /// instead of copying them (`ByteString::from` a `&str` copies).
    pub raw: ByteString,
    /// Token estimate: the row's text bytes divided by the session's
    /// bytes-per-token, learned from the provider's real usage (see
    /// `oceancode_proxy::sessions`), plus what its images and documents cost
    /// by the provider's rules ([`crate::media`]).
    pub tokens: u32,
    /// 1-based turn number.
    pub turn: u32,
    /// 1-based step (request/response) number that introduced the row.
    pub step: u32,
    /// Branch the row belongs to (0 = the first line of the session).
    pub branch: u32,
    /// True while the row is the proxy's reassembly of a response that the
    /// client has not yet echoed back.
    pub from_response: bool,
}

/// Real usage of one step, as reported by the provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write: u64,
}

impl Usage {
    /// Everything the window held after the step: input + cache read + cache write + output.
    pub fn window_total(&self) -> u64 {
        self.input + self.cache_read + self.cache_write + self.output
    }

    /// All input tokens (uncached + cache read + cache write).
    pub fn input_total(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }

    /// Field by field sum.
    pub fn plus(self, o: Usage) -> Usage {
        Usage {
            input: self.input.saturating_add(o.input),
            output: self.output.saturating_add(o.output),
            cache_read: self.cache_read.saturating_add(o.cache_read),
            cache_write: self.cache_write.saturating_add(o.cache_write),
        }
    }

    /// Field by field difference, never below zero.
    pub fn minus(self, o: Usage) -> Usage {
        Usage {
            input: self.input.saturating_sub(o.input),
            output: self.output.saturating_sub(o.output),
            cache_read: self.cache_read.saturating_sub(o.cache_read),
            cache_write: self.cache_write.saturating_sub(o.cache_write),
        }
    }

    /// No token at all.
    pub fn is_zero(&self) -> bool {
        self.window_total() == 0
    }
}

/// What a step's answer reported besides the usage of its window.
///
/// `Usage` of a step is its window (what the gauge reads); what the provider
/// billed beyond it, and what it did to the context on its own, is here.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepDetail {
    /// Tokens billed beyond the window's usage: Anthropic's server-side
    /// compaction (`usage.iterations[]` entries of type `compaction`, which
    /// the top-level usage leaves out) and the earlier sampling iterations of
    /// a server-tool loop. Counted in tokens and spend, never in the gauge.
    #[serde(skip_serializing_if = "Usage::is_zero")]
    pub extra: Usage,
    /// Output tokens spent on reasoning (`reasoning_tokens`,
    /// `thinking_tokens`): a part of the output, never added to it.
    #[serde(skip_serializing_if = "is_zero")]
    pub reasoning: u64,
    /// Server-side compactions in the answer (Anthropic `compaction` blocks).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub compactions: u32,
    /// Context edits the provider applied to the request
    /// (Anthropic `context_management.applied_edits`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub edits: Vec<AppliedEdit>,
    /// The `oceancode_recall` calls the proxy answered itself in this step
    /// (the client never saw them): each with its result and the messages
    /// the proxy re-inserts into the session's later requests.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recalls: Vec<InternalRecall>,
    /// What `ledger.compress` did to the window this step sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compress: Option<Pruned>,
    /// What the proxy sent upstream in this step, message by message (what
    /// the viewer's model view shows); None for a step recorded before the
    /// proxy kept it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<SentWindow>,
    /// The prompt cache at this step: cold on arrival, a free cut, a miss
    /// and its cause ([`crate::cache::CacheNote`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::cache::CacheNote>,
}

/// The messages a step sent upstream, as references into the ledger: runs
/// of rows, the stub, rows an edit rewrote, notes, the recall tool's
/// exchanges. A few dozen bytes a step; the stub's text (which changes only
/// at a cut) is kept on the first step that sent it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SentWindow {
    /// The messages, in the order sent.
    pub pieces: Vec<SentPiece>,
    /// The last row that left the window (what the stub names; 0 = none).
    #[serde(skip_serializing_if = "is_zero")]
    pub upto: u64,
    /// The context edit in force (its number; 0 = none). Its set
    /// (`context_edits`) holds the rewritten rows' and the notes' JSON.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub edit: u32,
    /// The stub message sent (raw JSON), on the first step that sent it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stub: Option<String>,
    /// The step whose record holds the stub message this one sent (0 =
    /// this one, or no stub).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub stub_step: u32,
    /// The request's last row (what a recall exchange of this step follows).
    #[serde(skip_serializing_if = "is_zero")]
    pub tail: u64,
    /// A conversation the provider holds (`previous_response_id`): only the
    /// request's own messages were sent.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stateful: bool,
    /// The tool outputs `ledger.compress` sent as pointers, by row: `(seq,
    /// [(part, pointer text)])`, on the first step that sent this set (it
    /// changes only at a cut).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pointers: Option<Vec<RowPointers>>,
    /// The step whose record holds the pointers this one sent (0 = this
    /// one, or none).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub pointers_step: u32,
}

/// The pointers of one row's pruned tool outputs: `(seq, [(part, text)])`.
pub type RowPointers = (u64, Vec<(u32, String)>);

/// One part of a [`SentWindow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SentPiece {
    /// The rows `from..=to` (consecutive seqs), each as the ledger holds it.
    Rows(u64, u64),
    /// The stub message (its text, the state block, the standing parts).
    Stub,
    /// A row as the edit set in force rewrote it.
    Edited(u64),
    /// A row with tool outputs sent as pointers (`ledger.compress`; the
    /// pointers in [`SentWindow::pointers`]).
    Pruned(u64),
    /// A note of the edit set in force, by id.
    Note(u32),
    /// The recall tool's exchange after a row (the proxy's own): `(seq,
    /// messages)`.
    Recall(u64, u32),
    /// Messages past the recorded line (none for a recorded step).
    Tail(u32),
}

impl SentWindow {
    /// Append the row `seq` (joining the run it continues).
    pub fn push_row(&mut self, seq: u64) {
        if let Some(SentPiece::Rows(_, to)) = self.pieces.last_mut() {
            if *to + 1 == seq {
                *to = seq;
                return;
            }
        }
        self.pieces.push(SentPiece::Rows(seq, seq));
    }

    /// Messages sent.
    pub fn messages(&self) -> usize {
        self.pieces
            .iter()
            .map(|p| match *p {
                SentPiece::Rows(a, b) => usize::try_from(b.saturating_sub(a) + 1).unwrap_or(0),
                SentPiece::Recall(_, n) | SentPiece::Tail(n) => n as usize,
                _ => 1,
            })
            .sum()
    }
}

/// One `oceancode_recall` call the proxy answered itself (the in-band
/// recall tool): kept in the step's detail, not as a row, so the rows stay
/// what the client sent and saw.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InternalRecall {
    /// The internal round (1 = the client's request's own answer).
    pub round: u32,
    /// The call's id as the model gave it.
    pub call_id: String,
    /// The call's input (JSON text).
    pub input: String,
    /// Characters of the result the model got.
    pub result_chars: u64,
    /// Whether the proxy sent a continuation for it (false: the answer also
    /// called client tools, or the round limit was reached; the result goes
    /// with the next request).
    pub continued: bool,
    /// The messages re-inserted into later requests (raw JSON, in order):
    /// the model's call and its result.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<String>,
    /// The seq of the row the step's exchange follows in later requests
    /// (the last row of the request's history); None when the proxy did not
    /// keep it (the continuation failed). What a restart rebuilds the
    /// session's internal exchanges from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
}

/// The tool outputs a window carried as pointers (`ledger.compress`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Pruned {
    /// Tool outputs sent as a pointer.
    pub outputs: u32,
    /// Their estimated tokens (what the pointers stand for).
    pub tokens: u64,
    /// The saved estimate the gauge adds (removed bytes ÷ 4, images and
    /// documents by their own tokens).
    pub saved: u64,
    /// The rows whose outputs this step's cut made pointers (only on the
    /// step that chose the set; the rows before stay pointers until they
    /// leave the window).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<u64>,
}

impl StepDetail {
    /// Nothing beyond the window's usage.
    pub fn is_empty(&self) -> bool {
        *self == StepDetail::default()
    }

    /// As the ledger stores it: its JSON, or None when it is empty.
    pub fn stored(&self) -> Option<String> {
        if self.is_empty() {
            None
        } else {
            serde_json::to_string(self).ok()
        }
    }

    /// The internal exchange this step kept: the seq of the row it follows
    /// and its messages in order (every round's, as later requests carry
    /// them); None when the step kept none.
    pub fn kept_exchange(&self) -> Option<(u64, Vec<String>)> {
        let after = self.recalls.iter().find_map(|r| r.after)?;
        let messages: Vec<String> = self
            .recalls
            .iter()
            .flat_map(|r| r.messages.iter().cloned())
            .collect();
        (!messages.is_empty()).then_some((after, messages))
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// One context edit the provider applied, as it reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppliedEdit {
    /// The edit's `type` (`clear_tool_uses_20250919`, `clear_thinking_20251015`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Input tokens the edit took out of the request.
    pub cleared_input_tokens: u64,
    /// Tool uses it cleared (`clear_tool_uses_*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleared_tool_uses: Option<u64>,
    /// Thinking turns it cleared (`clear_thinking_*`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleared_thinking_turns: Option<u64>,
}

/// Descriptive facts about a session (upserted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// Ledger session id (also its directory name under `sessions/`).
    pub id: String,
    /// Client family: `claude-code`, `codex`, `openai-sdk`, `anthropic-sdk`, or `unknown`.
    pub client: String,
    /// The client's own session id, if it sent one.
    pub client_session: Option<String>,
    /// API dialect.
    pub dialect: Dialect,
    /// Model of the latest request.
    pub model: String,
    /// The session this one is linked to: a sub-agent's parent, or the
    /// session a sibling conversation diverged from.
    pub parent: Option<String>,
    /// For a sibling: the parent's last row it shares (the divergence
    /// point, a seq of the parent; the sibling's own rows repeat that
    /// opening). None for a sub-agent or a first session.
    #[serde(default)]
    pub parent_seq: Option<u64>,
    /// Unix milliseconds of creation.
    pub created_ms: i64,
    /// Unix milliseconds of the latest activity.
    pub last_ms: i64,
}

/// A write handed from the request path to the single writer, in order.
#[derive(Clone, Debug)]
pub enum Event {
    /// Create or update a session's facts.
    Session(SessionMeta),
    /// Append rows (their `seq`s continue the session's sequence without a gap).
    Rows {
        /// Ledger session id.
        session: String,
        /// New rows, in `seq` order.
        rows: Vec<Row>,
    },
    /// The client echoed a response row with other bytes: keep the client's bytes.
    Confirm {
        /// Ledger session id.
        session: String,
        /// Row being confirmed.
        seq: u64,
        /// The bytes the client sent.
        raw: Arc<str>,
    },
    /// The client rewound or compacted: rows after `at_seq` on the old line are
    /// hidden (never deleted) and `branch` starts after `at_seq`.
    Branch {
        /// Ledger session id.
        session: String,
        /// Last row shared by both lines (0 = none).
        at_seq: u64,
        /// The new branch id.
        branch: u32,
        /// The rows that are no longer on the active line.
        hidden: Vec<u64>,
    },
    /// Rows that left this session without a branch: the answer of a
    /// request that turned out to be another conversation's (its sibling
    /// session records the rows again). Hidden, never deleted.
    Hide {
        /// Ledger session id.
        session: String,
        /// The rows hidden.
        seqs: Vec<u64>,
    },
    /// One request/response finished.
    Step {
        /// Ledger session id.
        session: String,
        /// Step number.
        step: u32,
        /// Model that answered.
        model: String,
        /// HTTP status returned to the client.
        status: u16,
        /// Real usage (zero when the provider reported none).
        usage: Usage,
        /// Rows sent upstream in this step's window (after the tideline).
        window_rows: u32,
        /// Unix milliseconds.
        ts_ms: i64,
        /// Why the step failed, when it did (`upstream_timeout`,
        /// `upstream_unreachable`, `stream_cut`, ...; None = it completed).
        error: Option<String>,
        /// What the answer reported besides its window's usage (boxed: most
        /// steps have none, and events queue by value).
        detail: Box<StepDetail>,
    },
    /// The tideline moved: every row up to `upto_seq` left the window.
    Cut {
        /// Ledger session id.
        session: String,
        /// Last seq that left the window.
        upto_seq: u64,
        /// Gauge before the cut.
        gauge: u64,
        /// The line in force.
        line: u64,
        /// Unix milliseconds.
        ts_ms: i64,
    },
    /// The agent (or the user) edited the session's context: edit `n` was
    /// taken, and `set` (the edit set's JSON) is what every later request
    /// applies. The rows stay as they are: the edit is rendering.
    ContextEdit {
        /// Ledger session id.
        session: String,
        /// 1-based number of the edit in the session.
        n: u32,
        /// The edit set in force after it, as JSON.
        set: String,
        /// The seqs it deleted, rewrote or restored.
        seqs: Vec<u64>,
        /// Estimated tokens of the window before and after it.
        tokens_before: u64,
        /// See `tokens_before`.
        tokens_after: u64,
        /// Unix milliseconds.
        ts_ms: i64,
    },
    /// The line in force for the session changed (its first request, a
    /// `tideline` override, a learned ceiling): what `status` shows for a
    /// session no running proxy holds.
    Line {
        /// Ledger session id.
        session: String,
        /// The line in tokens.
        line: u64,
        /// How it was set, as a person reads it (`40%`, `20k`, `ceiling`).
        spec: String,
        /// The session's own override in force (`tideline SESSION --set`),
        /// as the proxy writes it (LineSpec JSON); None = none.
        overridden: Option<String>,
        /// Unix milliseconds.
        ts_ms: i64,
    },
}

impl Event {
    /// The ledger session the event belongs to.
    pub fn session(&self) -> &str {
        match self {
            Event::Session(m) => &m.id,
            Event::Rows { session, .. }
            | Event::Confirm { session, .. }
            | Event::Branch { session, .. }
            | Event::Hide { session, .. }
            | Event::Step { session, .. }
            | Event::Cut { session, .. }
            | Event::Line { session, .. }
            | Event::ContextEdit { session, .. } => session,
        }
    }
}
