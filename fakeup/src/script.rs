//! Scripted replies: what the fake answers, in request order, then a default.
//!
//! JSON form (for `--script FILE`): either a bare array of replies or
//! `{"replies": [Reply...], "default": Reply}`. Every field of a [`Reply`] is optional.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The name of the proxy's in-band recall tool ([`Reply::recall`]).
pub const RECALL_TOOL: &str = "oceancode_recall";

/// Text of the built-in reply when nothing is scripted.
pub const DEFAULT_TEXT: &str = "Done. FINAL_ANSWER_MARKER";

/// A sequence of replies consumed one per model request (count_tokens and
/// structured-output requests such as title generation do not consume), then `default`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Consumed in request order.
    #[serde(default)]
    pub replies: Vec<Reply>,
    /// Used once `replies` is exhausted; absent = a short deterministic text reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Reply>,
    /// The answer to a request that declares no tools (a client's title or summary
    /// request), without consuming `replies`; absent = such requests consume as usual.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_tools: Option<Reply>,
}

impl Script {
    /// Replies in order, then the built-in default.
    pub fn replies(replies: impl IntoIterator<Item = Reply>) -> Self {
        Script {
            replies: replies.into_iter().collect(),
            default: None,
            no_tools: None,
        }
    }

    /// Answers every request with `reply`.
    pub fn always(reply: Reply) -> Self {
        Script {
            replies: Vec::new(),
            default: Some(reply),
            no_tools: None,
        }
    }

    /// Sets the reply used after the scripted ones.
    pub fn then(mut self, default: Reply) -> Self {
        self.default = Some(default);
        self
    }

    /// Answers requests that declare no tools with `reply`, without consuming.
    pub fn with_no_tools(mut self, reply: Reply) -> Self {
        self.no_tools = Some(reply);
        self
    }

    /// Parses the JSON form (a bare array of replies or an object).
    pub fn from_json(text: &str) -> Result<Self, ScriptError> {
        let v: Value = serde_json::from_str(text).map_err(ScriptError::Json)?;
        match v {
            Value::Array(_) => Ok(Script {
                replies: serde_json::from_value(v).map_err(ScriptError::Json)?,
                default: None,
                no_tools: None,
            }),
            other => serde_json::from_value(other).map_err(ScriptError::Json),
        }
    }

    /// Reads and parses a script file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path.as_ref()).map_err(ScriptError::Io)?;
        Self::from_json(&text)
    }
}

/// Errors loading a script.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read script: {0}")]
    Io(std::io::Error),
    #[error("invalid script JSON: {0}")]
    Json(serde_json::Error),
}

/// One answer. Precedence: `error`, then `too_long`, then `context_limit`, then
/// `tool_loop`, then content (`fail` cuts the content's stream short).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reply {
    /// Text answer (absent with no tool calls and no thinking = the default text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Send a success with this `Content-Type` instead of the dialect's (a
    /// gateway that labels its answers wrongly); the body is unchanged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Thinking (Anthropic thinking block with a fake signature; Responses reasoning item;
    /// Chat counts it as reasoning tokens only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// Tool calls, emitted after the text.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// `end_turn`/`stop`, `tool_use`/`tool_calls`, `max_tokens`/`length`, or any other
    /// string passed through. Default: tool_use when there are tool calls, else end_turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Wait this long before the response head (first byte).
    #[serde(skip_serializing_if = "is_zero")]
    pub delay_first_ms: u64,
    /// Wait this long between two SSE events.
    #[serde(skip_serializing_if = "is_zero")]
    pub chunk_delay_ms: u64,
    /// Make the text exactly this many bytes (the text, if any, then filler words).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_text_bytes: Option<usize>,
    /// Bytes per text delta (default: max(20, text length / 200)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta_bytes: Option<usize>,
    /// Anthropic, a request with `safeguards`: the auto-mode verdict on this
    /// reply's tool calls, `not_flagged` (default) or `flagged`; `omit`:
    /// no `safeguard_results` (the client falls back to its own classifier).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub safeguard_outcome: Option<String>,
    /// Override reported usage numbers (fields left out keep the simulated values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOverride>,
    /// Answer with this HTTP error, relayed as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorReply>,
    /// Answer with the provider's context-length error (`true`, or the maximum to report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub too_long: Option<TooLong>,
    /// Rule mode: tool calls until the conversation holds `steps` tool results, then text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_loop: Option<ToolLoop>,
    /// Streaming only: break the connection after this many events (no clean end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort_after_events: Option<usize>,
    /// Anthropic: answer with the `input length and `max_tokens` exceed context
    /// limit` error (`true`: the configured context or 200,000; or the limit to report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_limit: Option<TooLong>,
    /// Streaming: the answer fails inside its 200 stream (Responses
    /// `response.failed`, an Anthropic `error` event, a Chat error chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail: Option<StreamFail>,
    /// Streaming: wait this long after the stream's opening events
    /// (`response.created`/`in_progress`, `message_start`/`ping`).
    #[serde(skip_serializing_if = "is_zero")]
    pub open_delay_ms: u64,
    /// Anthropic: compact (server-side) before answering, with this summary,
    /// whatever the request's trigger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction: Option<String>,
    /// A tool call made from the request: its input is a template filled
    /// from the newest `ledger.compress` pointer in the conversation and the
    /// session directory the tideline stub names (see [`FollowPointer`]).
    /// Emitted after `tool_calls`. A request with no pointer to follow or
    /// no stub gets the reply without it, its text [`NO_POINTER_TEXT`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follow_pointer: Option<FollowPointer>,
}

/// The call a `follow_pointer` reply makes: `input` is a template with
/// `{file}` (the pointer's transcript file under the stub's directory),
/// `{path}` (as the pointer names it), `{dir}`, `{from}`/`{to}` (its
/// lines), `{count}` (to − from + 1), `{seq}` and `{tokens}`; a JSON string
/// that is exactly `"{from}"`, `"{to}"`, `"{count}"`, `"{seq}"` or
/// `"{tokens}"` becomes a number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FollowPointer {
    /// The tool to call.
    pub name: String,
    /// The input template.
    #[serde(default = "empty_object")]
    pub input: Value,
    /// Responses API: a `custom_tool_call` (string input), as [`ToolCall::custom`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub custom: bool,
    /// Follow the newest pointer this fake has not followed yet (by its
    /// text), not the newest one: successive replies open different rows.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
}

impl FollowPointer {
    /// A call of `name` with the `input` template.
    pub fn new(name: impl Into<String>, input: Value) -> Self {
        FollowPointer {
            name: name.into(),
            input,
            custom: false,
            fresh: false,
        }
    }

    /// Skips the pointers already followed.
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }
}

/// The text of a `follow_pointer` reply to a request with nothing to follow.
pub const NO_POINTER_TEXT: &str = "follow_pointer: the request holds no compress pointer to follow";

/// A failure inside a 200 stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamFail {
    /// The error code (default `context_length_exceeded`).
    #[serde(default = "default_fail_code")]
    pub code: String,
    /// The message (default: the provider's wording for the code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Events of the answer sent after the opening ones and before the
    /// failure (0: the failure follows the opening events).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub after_events: usize,
}

impl StreamFail {
    /// OpenAI's context overflow, right after the opening events.
    pub fn context_length_exceeded() -> Self {
        StreamFail {
            code: default_fail_code(),
            message: None,
            after_events: 0,
        }
    }

    /// The message sent.
    pub fn message(&self) -> String {
        self.message.clone().unwrap_or_else(|| match self.code.as_str() {
            "context_length_exceeded" => "Your input exceeds the context window of this model. Please adjust your input and try again.".to_string(),
            other => format!("The model failed ({other})."),
        })
    }
}

fn default_fail_code() -> String {
    "context_length_exceeded".to_string()
}

fn is_zero_usize(v: &usize) -> bool {
    *v == 0
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Reply {
    /// A text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Reply {
            text: Some(text.into()),
            ..Reply::default()
        }
    }

    /// One tool call (no text).
    pub fn tool_call(name: impl Into<String>, input: Value) -> Self {
        Reply {
            tool_calls: vec![ToolCall::new(name, input)],
            ..Reply::default()
        }
    }

    /// A call of the proxy's in-band recall tool (`oceancode_recall`, which
    /// the proxy answers itself when `ledger.recall_tool` is on), e.g.
    /// `{"search": "words"}`, `{"seq": 3}`, `{"match": "text"}`.
    pub fn recall(input: Value) -> Self {
        Reply::tool_call(RECALL_TOOL, input)
    }

    /// An HTTP error with this status and JSON body.
    pub fn error(status: u16, body: Value) -> Self {
        Reply {
            error: Some(ErrorReply {
                status,
                body,
                headers: BTreeMap::new(),
            }),
            ..Reply::default()
        }
    }

    /// The provider's "prompt is too long" / `context_length_exceeded` error.
    pub fn too_long() -> Self {
        Reply {
            too_long: Some(TooLong::Flag(true)),
            ..Reply::default()
        }
    }

    /// Anthropic's `input length and `max_tokens` exceed context limit` error.
    pub fn context_limit() -> Self {
        Reply {
            context_limit: Some(TooLong::Flag(true)),
            ..Reply::default()
        }
    }

    /// A stream that fails right after its opening events.
    pub fn fail(fail: StreamFail) -> Self {
        Reply {
            fail: Some(fail),
            ..Reply::default()
        }
    }

    pub fn with_compaction(mut self, summary: impl Into<String>) -> Self {
        self.compaction = Some(summary.into());
        self
    }

    pub fn open_delay(mut self, ms: u64) -> Self {
        self.open_delay_ms = ms;
        self
    }

    /// The tool-loop rule.
    pub fn tool_loop(tool_loop: ToolLoop) -> Self {
        Reply {
            tool_loop: Some(tool_loop),
            ..Reply::default()
        }
    }

    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    pub fn with_thinking(mut self, thinking: impl Into<String>) -> Self {
        self.thinking = Some(thinking.into());
        self
    }

    pub fn with_tool_call(mut self, name: impl Into<String>, input: Value) -> Self {
        self.tool_calls.push(ToolCall::new(name, input));
        self
    }

    pub fn with_stop_reason(mut self, stop: impl Into<String>) -> Self {
        self.stop_reason = Some(stop.into());
        self
    }

    pub fn delay_first(mut self, ms: u64) -> Self {
        self.delay_first_ms = ms;
        self
    }

    pub fn chunk_delay(mut self, ms: u64) -> Self {
        self.chunk_delay_ms = ms;
        self
    }

    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    pub fn pad_text(mut self, bytes: usize) -> Self {
        self.pad_text_bytes = Some(bytes);
        self
    }

    pub fn with_usage(mut self, usage: UsageOverride) -> Self {
        self.usage = Some(usage);
        self
    }

    pub fn abort_after(mut self, events: usize) -> Self {
        self.abort_after_events = Some(events);
        self
    }

    /// A call made from the newest compress pointer of the request (see
    /// [`FollowPointer`]).
    pub fn follow_pointer(call: FollowPointer) -> Self {
        Reply {
            follow_pointer: Some(call),
            ..Reply::default()
        }
    }
}

/// A tool call to emit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    pub name: String,
    /// Tool input (an object; a string for `custom`).
    #[serde(default = "empty_object")]
    pub input: Value,
    /// Responses API: emit a `custom_tool_call` (freeform string input) instead of a
    /// `function_call`. Other dialects wrap a string input as `{"input": ...}`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub custom: bool,
}

impl ToolCall {
    pub fn new(name: impl Into<String>, input: Value) -> Self {
        ToolCall {
            name: name.into(),
            input,
            custom: false,
        }
    }
}

pub(crate) fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// An HTTP error reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    pub status: u16,
    #[serde(default)]
    pub body: Value,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

/// `too_long: true` (maximum = `max_context_tokens` or the provider default) or
/// `too_long: M` (report M as the maximum).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TooLong {
    Flag(bool),
    Max(u64),
}

/// Reported-usage overrides (Anthropic names; for OpenAI `input_tokens` is the prompt
/// total and `cache_read_input_tokens` the cached tokens).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsageOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_creation_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read_input_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
}

/// Rule mode for long sessions: while the conversation holds fewer than `steps` tool
/// results, answer `step_text` plus one call of `tool` (ids `toolu_<n>` / `call_<n>`);
/// then answer `final_text`. `{step}` and `{steps}` in strings of `input`, `step_text`
/// and `final_text` are replaced. Requests declaring `tools: []` get the final text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLoop {
    pub steps: u32,
    #[serde(default = "default_loop_tool")]
    pub tool: String,
    #[serde(default = "default_loop_input")]
    pub input: Value,
    /// Responses: emit `custom_tool_call` items (input must be a string).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub custom: bool,
    /// Per-dialect tool (`"anthropic"`, `"chat"`, `"responses"`), e.g. Codex's
    /// `exec_command` with `{"cmd": ...}` while Claude Code gets `Bash`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_dialect: BTreeMap<String, ToolCall>,
    /// Count only tool results after the last user prompt (steps per turn).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub per_turn: bool,
    /// Text before each call (default "Running step {step}."; "" = none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_text: Option<String>,
    /// Final answer (default "All {steps} steps done. FINAL_ANSWER_MARKER").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<String>,
}

impl ToolLoop {
    /// `steps` calls of `tool` with `input`.
    pub fn new(steps: u32, tool: impl Into<String>, input: Value) -> Self {
        ToolLoop {
            steps,
            tool: tool.into(),
            input,
            custom: false,
            by_dialect: BTreeMap::new(),
            per_turn: false,
            step_text: None,
            final_text: None,
        }
    }

    /// Uses another tool for one dialect (`"anthropic"`, `"chat"`, `"responses"`).
    pub fn for_dialect(mut self, dialect: &str, tool: impl Into<String>, input: Value) -> Self {
        self.by_dialect
            .insert(dialect.to_string(), ToolCall::new(tool, input));
        self
    }
}

fn default_loop_tool() -> String {
    "Bash".to_string()
}

fn default_loop_input() -> Value {
    serde_json::json!({"command": "echo step {step}", "description": "Run step {step}"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_full_and_bare_forms() {
        let s = Script::from_json(
            r#"{"replies":[{"text":"hi","chunk_delay_ms":5},{"too_long":true},{"too_long":1000},
                {"error":{"status":529,"body":{"type":"error"},"headers":{"retry-after":"1"}}},
                {"tool_calls":[{"name":"Bash","input":{"command":"ls"}}]}],
                "default":{"tool_loop":{"steps":3}}}"#,
        )
        .expect("parse");
        assert_eq!(s.replies.len(), 5);
        assert_eq!(s.replies[1].too_long, Some(TooLong::Flag(true)));
        assert_eq!(s.replies[2].too_long, Some(TooLong::Max(1000)));
        let tl = s.default.and_then(|d| d.tool_loop).expect("loop");
        assert_eq!(tl.tool, "Bash");
        assert_eq!(tl.input["command"], json!("echo step {step}"));
        let bare = Script::from_json(r#"[{"text":"a"},{}]"#).expect("bare");
        assert_eq!(bare.replies.len(), 2);
        assert!(Script::from_json(r#"{"replies":[{"txt":"typo"}]}"#).is_err());
    }

    #[test]
    fn round_trips() {
        let s = Script::replies([Reply::text("a").chunk_delay(3), Reply::too_long()]).then(
            Reply::tool_loop(ToolLoop::new(2, "Bash", json!({"command": "ls"}))),
        );
        let text = serde_json::to_string(&s).expect("ser");
        assert_eq!(Script::from_json(&text).expect("de"), s);
    }
}
