//! A home per provider dialect: the pure facts and functions of each API in
//! one module behind one trait, [`DialectSpec`] — the routes it serves, the
//! conversation's key, where a tool call's and a tool result's ids are, the
//! stub message, the error envelope and the stream's error event, the
//! too-long error, the usage object, the recall tool's declaration.
//! [`spec`] gives a dialect's implementation; [`ALL`] lists the dialects
//! (a new one adds itself there, writes its module, and the conformance
//! suite `proxy/tests/dialects.rs` runs it through the same cases).
//!
//! Pure: no I/O, JSON in and out. What needs the proxy's machinery (the
//! response collectors, the request classification with standing parts,
//! the splice) stays in `oceancode_proxy::dialect` and calls these.

pub mod anthropic;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;

use crate::model::{Dialect, Usage};
use crate::spans::Span;
use serde_json::Value;

/// Every dialect, in a stable order. A new dialect adds itself here.
pub const ALL: [Dialect; 4] = [
    Dialect::Anthropic,
    Dialect::OpenaiChat,
    Dialect::OpenaiResponses,
    Dialect::Gemini,
];

// The enum is the model's (a leaf); what each variant is lives here.
impl Dialect {
    /// Stable lowercase name, as stored in the database.
    pub fn as_str(self) -> &'static str {
        self.spec().name()
    }

    /// Inverse of [`Dialect::as_str`].
    pub fn parse(s: &str) -> Option<Dialect> {
        ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// The dialect's pure facts and functions ([`spec`]).
    pub fn spec(self) -> &'static dyn DialectSpec {
        spec(self)
    }
}

/// The dialect's implementation.
pub fn spec(d: Dialect) -> &'static dyn DialectSpec {
    match d {
        Dialect::Anthropic => &anthropic::Anthropic,
        Dialect::OpenaiChat => &openai_chat::OpenaiChat,
        Dialect::OpenaiResponses => &openai_responses::OpenaiResponses,
        Dialect::Gemini => &gemini::Gemini,
    }
}

/// The dialect and kind of a provider route (`path` without the
/// `/s/<name>` prefix, the query and a trailing slash), if any dialect
/// serves it.
pub fn route(path: &str) -> Option<(Dialect, Route)> {
    ALL.iter()
        .find_map(|&d| spec(d).route(path).map(|r| (d, r)))
}

/// What a request on a provider route is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A turn of the conversation: recorded and windowed.
    Main,
    /// `count_tokens`: windowed like the conversation, never recorded.
    CountTokens,
    /// Remote compaction, `countTokens` and other side requests: forwarded
    /// untouched, never recorded.
    Side,
}

/// Who serves a dialect: which upstream it goes to and which error
/// envelope its clients read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// Anthropic: `{"type":"error","error":{"type":..,"message":..}}`.
    Anthropic,
    /// OpenAI: `{"error":{"message":..,"type":..,"param":null,"code":..}}`.
    OpenAi,
    /// Google Gemini: `{"error":{"code":..,"message":..,"status":..}}`.
    Gemini,
}

impl From<Dialect> for Provider {
    fn from(d: Dialect) -> Self {
        spec(d).provider()
    }
}

impl Provider {
    /// The OpenTelemetry GenAI conventions' `gen_ai.provider.name`.
    pub fn otel_name(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
            Provider::Gemini => "gcp.gemini",
        }
    }

    /// An error body in this provider's envelope (see
    /// [`DialectSpec::error_body`]).
    pub fn error_body(self, status: u16, kind: &str, code: &str, message: &str) -> Value {
        match self {
            Provider::Anthropic => anthropic::error_body(kind, message),
            Provider::OpenAi => openai_chat::error_body(status, code, message),
            Provider::Gemini => gemini::error_body(status, message),
        }
    }
}

/// Why a stream the client was reading ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCut {
    /// The upstream sent nothing for the idle timeout.
    Idle,
    /// The upstream's body failed (reset, broken chunking).
    Broken,
}

/// A context-limit (too-long) error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextLimit {
    /// The context window it names (the ceiling to learn), if it names one.
    pub ceiling: Option<u64>,
    /// The limit counts the request's `max_tokens` as well as its input.
    pub counts_max_tokens: bool,
}

/// A tool result a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The id of the call it answers.
    pub id: String,
    /// The result reports a failure (Anthropic `is_error`, a Gemini
    /// `functionResponse` whose `response` holds `error`); false where the
    /// dialect has no such flag.
    pub is_error: bool,
}

/// One tool call of a model message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPart {
    /// The call's id (`tool_use.id`, `tool_calls[].id`, `call_id`, a
    /// `functionCall`'s id or name); empty when absent.
    pub id: String,
    /// The tool's name; empty when absent (and for a Responses call that
    /// is not a `function_call`).
    pub name: String,
    /// Its input, JSON text (`{}` when absent).
    pub input: String,
    /// The call as it came (a content block, a `tool_calls` entry, an
    /// output item, a part), raw JSON.
    pub raw: String,
}

/// A string member of `v`, or the empty string.
pub(crate) fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// The raw values of `raws` that parse.
pub(crate) fn values(raws: &[String]) -> Vec<Value> {
    raws.iter()
        .filter_map(|r| serde_json::from_str(r).ok())
        .collect()
}

/// The pure facts of one provider dialect. Every method is a function of
/// its arguments; defaults are what most dialects share.
pub trait DialectSpec: Send + Sync {
    /// The dialect this is.
    fn dialect(&self) -> Dialect;

    /// Stable lowercase name, as stored in the database.
    fn name(&self) -> &'static str;

    /// The kind of request `path` is on this dialect's routes (`path`
    /// without the `/s/<name>` prefix and the query; a trailing slash is
    /// ignored), None when the dialect does not serve it.
    fn route(&self, path: &str) -> Option<Route>;

    /// The path of the main route for `model` (what a test or a client
    /// posts a turn to).
    fn main_path(&self, model: &str) -> String;

    /// Who serves it: its upstream and error envelope.
    fn provider(&self) -> Provider;

    /// The stub goes before the system rows the window keeps (Anthropic:
    /// its system prompt is a top-level member, the conversation holds no
    /// system rows to stay first), else right after them.
    fn stub_first(&self) -> bool {
        false
    }

    /// The API wants the conversation to open with a user message (no
    /// assistant message may come first).
    fn user_first(&self) -> bool {
        false
    }

    /// The top-level member holding the conversation array.
    fn conv_key(&self) -> &'static str {
        "messages"
    }

    /// Ids of the tool calls message `v` makes, in order (a window may not
    /// start while one is unanswered). A message of another shape has none.
    fn calls(&self, v: &Value) -> Vec<String>;

    /// The tool results message `v` carries, in order.
    fn results(&self, v: &Value) -> Vec<ToolResult>;

    /// The tool outputs of raw message `raw`, in order, as byte spans of
    /// their content values (what `ledger.compress` may replace with a
    /// pointer; the result's id and flags stay). A message that does not
    /// parse, or carries no output, has none.
    fn tool_outputs(&self, raw: &str) -> Vec<Span>;

    /// The stub message carrying `text` with `pinned` (raw content parts
    /// kept from rows that left the window) right after it, as raw JSON: one
    /// user message, every pinned part byte for byte.
    fn stub_message(&self, text: &str, pinned: &[&str]) -> String;

    /// An error body in the dialect's envelope: `status` the HTTP status,
    /// `kind` the error's type in Anthropic's words (`invalid_request_error`,
    /// `api_error`, ...), `code` its machine code (`request_too_large`), and
    /// the message. Each envelope takes what it carries.
    fn error_body(&self, status: u16, kind: &str, code: &str, message: &str) -> Value {
        self.provider().error_body(status, kind, code, message)
    }

    /// The message of an error body in the dialect's envelope, None when
    /// `body` is not one.
    fn error_message(&self, body: &Value) -> Option<String> {
        body.pointer("/error/message")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    /// The dialect's own SSE error event (whole, with its blank line) that
    /// ends a stream cut mid-way, so an SDK raises its usual error.
    fn stream_error_event(&self, cut: StreamCut, message: &str) -> String;

    /// A context-limit error body of the dialect, with the ceiling it names.
    fn context_limit(&self, body: &Value) -> Option<ContextLimit>;

    /// Where a whole (not streamed) answer carries its usage object.
    fn usage_key(&self) -> &'static str {
        "usage"
    }

    /// The provider's usage object as [`Usage`] (the cache reads and
    /// writes apart from the uncached input) and the reasoning tokens it
    /// reports (a part of the output, never added). None when `u` is not
    /// one.
    fn usage(&self, u: &Value) -> Option<(Usage, u64)>;

    /// The recall tool's declaration in the dialect's `tools` shape: one
    /// element of `tools`, constant bytes (the tools prefix of every request
    /// stays in the provider's prompt cache).
    fn recall_tool(&self) -> &'static str;

    /// Every tool call model message `raw` makes, in order, with its name
    /// and input (the recall tool tells its own calls from the client's by
    /// name). A message that does not parse has none.
    fn call_parts(&self, raw: &str) -> Vec<CallPart>;

    /// The messages answering `calls` (`(id, name)`) with `texts`,
    /// pairwise: one message or one per call, as the dialect answers
    /// parallel calls.
    fn results_messages(&self, calls: &[(&str, &str)], texts: &[String]) -> Vec<String>;

    /// The model messages making the calls whose raw parts
    /// ([`CallPart::raw`]) are `raws`, in order, and nothing else.
    fn calls_messages(&self, raws: &[String]) -> Vec<String>;

    // Building a conversation (the conformance suite, test kits).

    /// A minimal valid request body for `model` with `messages` (raw JSON
    /// elements, in order) as its conversation.
    fn request_body(&self, model: &str, messages: &[String]) -> String;

    /// A user message asking `text` (what a client sends as a prompt).
    fn user_message(&self, text: &str) -> String {
        self.stub_message(text, &[])
    }

    /// A model message of plain text `text`.
    fn assistant_message(&self, text: &str) -> String;

    /// A model message making one tool call `id` to `name` with the JSON
    /// object `args`.
    fn tool_call_message(&self, id: &str, name: &str, args: &Value) -> String;

    /// The message answering call `id` (to `name`) with `output`; an error
    /// result when `is_error` (where the dialect can say so).
    fn tool_result_message(&self, id: &str, name: &str, output: &str, is_error: bool) -> String;
}

/// Map OpenAI-style usage to [`Usage`]. OpenAI's `prompt_tokens` /
/// `input_tokens` is the whole input and `cached_tokens` (and
/// `cache_write_tokens`) a part of it, where Anthropic's `input_tokens`
/// leaves the cache reads and writes out: the uncached input is what is
/// left, so that `input + cache_read + cache_write` is the prompt total
/// again and the gauge never counts the cache twice.
pub fn openai_usage(input_total: u64, cached: u64, output: u64) -> Usage {
    openai_usage_with_writes(input_total, cached, 0, output)
}

/// [`openai_usage`] with the tokens written to the cache (a part of the input too).
pub fn openai_usage_with_writes(input_total: u64, cached: u64, written: u64, output: u64) -> Usage {
    let cache_read = cached.min(input_total);
    let cache_write = written.min(input_total - cache_read);
    Usage {
        input: input_total - cache_read - cache_write,
        output,
        cache_read,
        cache_write,
    }
}

/// The members of raw message `raw` the `tool_outputs` look at.
pub(crate) fn top(raw: &str) -> Option<crate::spans::Top<'_>> {
    serde_json::from_str(raw).ok()
}

/// Read a u64 field of a JSON object.
pub(crate) fn u64_of(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// String values of `key` in each element of `arr`.
pub(crate) fn ids_of<'a>(arr: impl IntoIterator<Item = &'a Value>, key: &str) -> Vec<String> {
    arr.into_iter()
        .filter_map(|x| x.get(key).and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

/// The recall tool's description, the same in every dialect.
macro_rules! recall_description {
    () => {
        r#""Read back the verbatim record of this conversation kept by the proxy: what left your context window (the note at the start of the conversation names the last entry that left) and its related sessions (parent, sub-agents). Give seq to read one entry whole; match (text, SQL LIKE wildcards % and _) and/or before (a seq) to list this session's entries, newest last; or search (at most 8 words) to find entries across this session and its related ones. limit caps the lines listed (default 20). Each line starts with its seq.""#
    };
}

/// The recall tool's parameters (a JSON schema object), the same in every dialect.
macro_rules! recall_parameters {
    () => {
        r#"{"type":"object","properties":{"match":{"type":"string","description":"only entries whose text contains this"},"before":{"type":"integer","description":"only entries with a seq below this one"},"seq":{"type":"integer","description":"one entry, whole"},"search":{"type":"string","description":"words that must all appear (at most 8), across this session and its related ones"},"limit":{"type":"integer","description":"most lines listed (default 20)"}}}"#
    };
}
pub(crate) use {recall_description, recall_parameters};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_each_dialect_once_under_its_name_and_route() {
        for (i, &d) in ALL.iter().enumerate() {
            let s = spec(d);
            assert_eq!(s.dialect(), d);
            assert_eq!(Dialect::parse(s.name()), Some(d));
            assert!(!ALL[..i].contains(&d), "{d:?} twice");
            assert_eq!(route(&s.main_path("m")), Some((d, Route::Main)), "{d:?}");
            assert_eq!(Provider::from(d), s.provider());
        }
        assert_eq!(route("/v1/unknown"), None);
    }
}
