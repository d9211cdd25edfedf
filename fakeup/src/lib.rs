//! `oceancode-fakeup`: a fake Anthropic / OpenAI / Gemini model upstream for tests and benchmarks.
//!
//! It serves `POST /v1/messages` (+ `/count_tokens`), `/v1/chat/completions`,
//! `/v1/responses`, `/v1/responses/compact` and Gemini's
//! `/v1beta/models/{model}:generateContent` (`:streamGenerateContent`, `:countTokens`)
//! on loopback only (HTTP/1.1 and h2c),
//! streaming SSE events shaped like the captured real traffic, one event per body frame.
//! Usage is computed with tiktoken `o200k_base` from what it received, with a
//! prompt-cache simulation; replies are scripted ([`Script`]); conversations are
//! validated; context limits produce the providers' real errors; remote compaction
//! answers an opaque `compaction` item; every request is recorded ([`Recorded`]).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use oceancode_fakeup::{FakeConfig, FakeUpstream, Reply, Script};
//! let fake = FakeUpstream::start(
//!     FakeConfig::default().with_script(Script::replies([Reply::text("hi")])),
//! )
//! .await?;
//! println!("{}", fake.url()); // http://127.0.0.1:PORT
//! # Ok(()) }
//! ```

mod analyze;
mod compaction;
mod context;
mod gemini;
pub mod images;
mod json;
mod media;
mod ordered;
mod plan;
mod pointer;
mod render;
mod script;
mod server;
mod tokens;
mod usage;
mod validate;

pub use analyze::{Dialect, Endpoint};
pub use script::{
    ErrorReply, FollowPointer, Reply, Script, ScriptError, StreamFail, TooLong, ToolCall, ToolLoop,
    UsageOverride, DEFAULT_TEXT, NO_POINTER_TEXT, RECALL_TOOL,
};
pub use server::{FakeConfig, FakeHandle, FakeUpstream, Recorded};
pub use tokens::count_tokens;
pub use usage::Usage;

/// Check a request body's conversation against the providers' structural
/// rules as the fake upstream does before answering (the first non-system
/// message from the user, every tool call answered, every result after its
/// call), without serving it; the error is the provider's wording. The
/// window fuzz target uses it as its oracle.
pub fn validate_conversation(dialect: Dialect, body: &[u8]) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let obj = v
        .as_object()
        .ok_or_else(|| "request body must be a JSON object".to_string())?;
    match dialect {
        Dialect::Anthropic => validate::anthropic(obj),
        Dialect::Chat => validate::chat(obj),
        Dialect::Responses => validate::responses(obj),
        Dialect::Gemini => gemini::validate(obj),
    }
    .map_err(|(message, _)| message)
}
