//! Provider dialects: how a request body splits into messages (rows), how a
//! message is classified and compared, how a cut window is rendered back into
//! a valid body, and how a response (SSE or JSON) yields usage and the
//! assistant's rows. One module per API; this module holds what they share.
//! The pure per-dialect facts (routes, the conversation key, call and result
//! ids, the stub, error envelopes, too-long errors, usage objects, the recall
//! tool) are each dialect's [`DialectSpec`] in `oceancode_window::dialect`.

pub mod anthropic;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;
pub mod splice;
pub mod standing;

use oceancode_window::{AppliedEdit, Dialect, RowKind, StepDetail, Usage};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

pub use oceancode_window::dialect::{
    openai_usage, openai_usage_with_writes, spec, DialectSpec, StreamCut,
};

/// A request body split at the top level, every value kept as raw JSON (a
/// slice of the body's own bytes) so that unchanged parts are forwarded byte
/// for byte.
#[derive(Debug)]
pub struct ParsedBody<'a> {
    /// Top-level members in their original order; the conversation array's
    /// value is `None` (its elements are in `messages`).
    pub fields: Vec<(Cow<'a, str>, Option<&'a str>)>,
    /// Index in `fields` of the conversation array (`messages` / `input`).
    pub conv_field: Option<usize>,
    /// The conversation's elements, raw JSON.
    pub messages: Vec<&'a str>,
}

impl<'a> ParsedBody<'a> {
    /// Parse a body; `conv_key` names the conversation array.
    ///
    /// One pass over the bytes: the conversation array is split into its raw
    /// elements while the top level is split into raw members (a 200 KB body
    /// is scanned once, not twice). A conversation value that is not an
    /// array (a Responses `input` string) is kept raw.
    pub fn parse(bytes: &'a [u8], conv_key: &str) -> Result<Self, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let top = TopSeed { conv_key }.deserialize(&mut de)?;
        de.end()?;
        let Top {
            mut fields,
            conv_field,
            messages,
            conv_is_array,
        } = top;
        if let (Some(i), false) = (conv_field, conv_is_array) {
            // Rare: re-read the one member whose raw bytes the scan skipped.
            let all: OrderedRaw<'a> = serde_json::from_slice(bytes)?;
            fields[i].1 = all.0.into_iter().nth(i).map(|(_, v)| v.get());
        }
        Ok(ParsedBody {
            fields,
            conv_field,
            messages,
        })
    }

    /// A top-level member, raw.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| *v)
    }

    /// A top-level member parsed as `T` (None when absent or of another shape).
    pub fn get_as<T: serde::de::DeserializeOwned>(&self, key: &str) -> Option<T> {
        self.get(key).and_then(|v| serde_json::from_str(v).ok())
    }

    /// `model` as a string.
    pub fn model(&self) -> Option<String> {
        self.get_as::<String>("model")
    }

    /// `stream: true`?
    pub fn stream(&self) -> bool {
        self.get_as::<bool>("stream").unwrap_or(false)
    }

    /// The body with the top-level member `key` set to `raw` (in its place,
    /// or appended); every other member and the conversation as they are.
    pub fn with_member<'b>(&self, key: &'b str, raw: &'b str) -> ParsedBody<'b>
    where
        'a: 'b,
    {
        let mut fields: Vec<(Cow<'b, str>, Option<&'b str>)> = self
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), v.map(|v| v as &'b str)))
            .collect();
        match fields.iter_mut().find(|(k, _)| k == key) {
            Some(f) => f.1 = Some(raw),
            None => fields.push((Cow::Borrowed(key), Some(raw))),
        }
        ParsedBody {
            fields,
            conv_field: self.conv_field,
            messages: self.messages.iter().map(|m| *m as &'b str).collect(),
        }
    }

    /// Re-emit the body with the conversation replaced by `parts` (raw JSON
    /// elements, in order). Every other member keeps its original bytes.
    pub fn render_with(&self, parts: &[&str]) -> Vec<u8> {
        let cap = self
            .fields
            .iter()
            .map(|(k, v)| k.len() + v.map_or(4, str::len) + 4)
            .sum::<usize>()
            + parts.iter().map(|p| p.len() + 1).sum::<usize>();
        let mut out = Vec::with_capacity(cap + 16);
        out.push(b'{');
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // Keys are re-escaped (serde gave us the unescaped text).
            match serde_json::to_string(k.as_ref()) {
                Ok(s) => out.extend_from_slice(s.as_bytes()),
                Err(_) => out.extend_from_slice(b"\"\""),
            }
            out.push(b':');
            if Some(i) == self.conv_field {
                out.push(b'[');
                for (j, p) in parts.iter().enumerate() {
                    if j > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(p.as_bytes());
                }
                out.push(b']');
            } else if let Some(v) = v {
                out.extend_from_slice(v.as_bytes());
            } else {
                out.extend_from_slice(b"null");
            }
        }
        out.push(b'}');
        out
    }
}

/// The message of a body refused for a repeated top-level key: an upstream
/// that takes the last one would see another request than the one recorded.
pub fn duplicate_key(k: &str) -> String {
    format!("the top-level key {k:?} appears twice")
}

/// Top-level keys seen so far: a scan of the few members a body has, a set
/// past that (a hostile body may have millions).
#[derive(Default)]
pub(crate) struct Seen {
    few: Vec<String>,
    many: std::collections::HashSet<String>,
}

impl Seen {
    /// Add `k`; false if it was already there.
    pub(crate) fn insert(&mut self, k: &str) -> bool {
        const FEW: usize = 32;
        if self.many.is_empty() {
            if self.few.iter().any(|f| f == k) {
                return false;
            }
            self.few.push(k.to_string());
            if self.few.len() > FEW {
                self.many = self.few.drain(..).collect();
            }
            true
        } else {
            self.many.insert(k.to_string())
        }
    }
}

/// What the one-pass top-level scan yields.
struct Top<'a> {
    fields: Vec<(Cow<'a, str>, Option<&'a str>)>,
    conv_field: Option<usize>,
    messages: Vec<&'a str>,
    conv_is_array: bool,
}

/// Splits the top level into raw members and, in the same pass, the member
/// named `conv_key` into raw elements.
struct TopSeed<'k> {
    conv_key: &'k str,
}

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = Top<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = Top<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = Top {
            fields: Vec::with_capacity(map.size_hint().unwrap_or(16)),
            conv_field: None,
            messages: Vec::new(),
            conv_is_array: false,
        };
        let mut seen = Seen::default();
        while let Some(k) = map.next_key::<Cow<'de, str>>()? {
            if !seen.insert(&k) {
                return Err(serde::de::Error::custom(duplicate_key(&k)));
            }
            if top.conv_field.is_none() && k == self.conv_key {
                top.conv_field = Some(top.fields.len());
                match map.next_value_seed(ConvSeed)? {
                    Some(elements) => {
                        top.messages = elements;
                        top.conv_is_array = true;
                    }
                    None => top.conv_is_array = false,
                }
                top.fields.push((k, None));
            } else {
                let v: &'de RawValue = map.next_value()?;
                top.fields.push((k, Some(v.get())));
            }
        }
        Ok(top)
    }
}

/// The conversation member: `Some(elements)` for an array, `None` (value
/// skipped) for anything else.
struct ConvSeed;

impl<'de> DeserializeSeed<'de> for ConvSeed {
    type Value = Option<Vec<&'de str>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ConvSeed {
    type Value = Option<Vec<&'de str>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(64));
        while let Some(v) = seq.next_element::<&'de RawValue>()? {
            out.push(v.get());
        }
        Ok(Some(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Deserializes a JSON object into its members in order, values raw.
struct OrderedRaw<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for OrderedRaw<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OrderedRaw<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(k) = map.next_key::<Cow<'de, str>>()? {
                    let v: &'de RawValue = map.next_value()?;
                    out.push((k, v));
                }
                Ok(OrderedRaw(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// What a response yielded once it ended.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Collected {
    /// Real usage, when the provider reported it.
    pub usage: Option<Usage>,
    /// Model named by the response.
    pub model: Option<String>,
    /// The response's id (`msg_…`, `chatcmpl-…`, `resp_…`).
    pub response_id: Option<String>,
    /// The assistant's messages/items, as JSON in the request dialect's
    /// shape (what the client will echo back next time).
    pub rows: Vec<String>,
    /// Stop/finish reason.
    pub stop_reason: Option<String>,
    /// An error event inside a 200 stream, or an error body.
    pub error: Option<String>,
    /// The response's terminal event was seen (`message_stop`, `[DONE]`,
    /// `response.completed`), or a whole JSON body was read: the answer is
    /// complete even if the client closed the connection right after it.
    pub terminal: bool,
    /// The answer was longer than what the proxy keeps of one answer: the
    /// rows hold its beginning and end with [`Keep::marker`].
    pub truncated: bool,
    /// What the answer reported besides its window's usage: tokens billed
    /// beyond it (Anthropic's compaction iterations), reasoning tokens,
    /// server-side compactions, applied context edits.
    pub detail: StepDetail,
}

/// Most bytes of one answer a collector keeps by default
/// (`limits.max_recorded_response_bytes`).
pub const DEFAULT_KEEP: usize = 4 << 20;

/// How much more of an answer a collector may keep.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    limit: usize,
    left: usize,
    cut: bool,
}

impl Default for Keep {
    fn default() -> Self {
        Keep::new(DEFAULT_KEEP)
    }
}

impl Keep {
    /// Room for `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Keep {
            limit,
            left: limit,
            cut: false,
        }
    }

    /// Take room for `n` bytes; false (from then on) once there is none:
    /// the answer is recorded truncated.
    pub fn take(&mut self, n: usize) -> bool {
        if self.cut || n > self.left {
            self.cut = true;
            return false;
        }
        self.left -= n;
        true
    }

    /// Part of the answer was not kept (the tap dropped it).
    pub fn cut(&mut self) {
        self.cut = true;
    }

    /// Was part of the answer not kept?
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// The text that ends a truncated answer's rows.
    pub fn marker(&self) -> String {
        format!(
            "[oceancode-proxy: this answer was longer than the {} bytes the ledger keeps of one answer (limits.max_recorded_response_bytes); the rest of it was not recorded]",
            self.limit
        )
    }
}

/// Consumes a response on the side (never alters it).
pub trait ResponseCollector: Send {
    /// One SSE event of a streamed response.
    fn on_event(&mut self, event: &str, data: &str);
    /// A whole non-streamed JSON body.
    fn on_json(&mut self, body: &[u8]);
    /// Part of the answer was not fed (an event or a JSON body over the
    /// size the proxy keeps): record it truncated.
    fn truncated(&mut self);
    /// Everything seen so far.
    fn finish(self: Box<Self>) -> Collected;
}

/// A fresh collector for the dialect, keeping up to [`DEFAULT_KEEP`] bytes.
pub fn collector(d: Dialect) -> Box<dyn ResponseCollector> {
    collector_keeping(d, DEFAULT_KEEP)
}

/// A fresh collector for the dialect, keeping up to `limit` bytes of the answer.
pub fn collector_keeping(d: Dialect, limit: usize) -> Box<dyn ResponseCollector> {
    let keep = Keep::new(limit);
    match d {
        Dialect::Anthropic => Box::new(anthropic::Collector::keeping(keep)),
        Dialect::OpenaiChat => Box::new(openai_chat::Collector::keeping(keep)),
        Dialect::OpenaiResponses => Box::new(openai_responses::Collector::keeping(keep)),
        Dialect::Gemini => Box::new(gemini::Collector::keeping(keep)),
    }
}

/// The dialect's own error event that ends a stream cut mid-way, so an SDK
/// raises its usual error instead of seeing a silent truncation: Anthropic
/// `event: error` (`overloaded_error` for a silent upstream, `api_error`
/// otherwise), an OpenAI Chat error chunk, a Responses `error` event.
pub fn stream_error_event(d: Dialect, cut: StreamCut, message: &str) -> String {
    spec(d).stream_error_event(cut, message)
}

/// What the proxy needs to know of one message, from a full parse.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MessageInfo {
    /// Role, or the item type for role-less Responses items.
    pub role: String,
    /// Classification.
    pub kind: RowKind,
    /// Whether a cut window may start at this message, as far as the message
    /// alone tells (a tool result never can); see also `opens`/`closes`.
    pub starts_ok: bool,
    /// First line of the prompt text (for stubs and indexes), ≤ 80 chars.
    pub first_line: Option<String>,
    /// Ids of the tool calls this message makes (`tool_use`, `tool_calls`,
    /// `function_call`…): no window may start while one is unanswered.
    pub opens: Vec<String>,
    /// Ids of the tool calls this message answers.
    pub closes: Vec<String>,
    /// The message must stay with the one after it (a Responses `reasoning`
    /// item): no window may start right after it.
    pub binds_next: bool,
    /// Parts of a user message that are standing instructions or context
    /// (CLAUDE.md, AGENTS.md, ...; see [`standing`]), kept when the rest of
    /// the message leaves the window. Empty for a message kept whole.
    pub standing: Vec<oceancode_window::Standing>,
    /// An Anthropic assistant message holding a server-side `compaction`
    /// block with a summary: the API drops everything before that block.
    pub compaction: bool,
    /// A tool-result message that also carries words the user typed (Claude
    /// Code folds a prompt typed after an interrupted tool call into it):
    /// it starts a turn and is an ask, and stays a tool result for the
    /// window (no window starts at it, its calls stay with it).
    pub asks: bool,
}

/// The text of a message's `content` that names it: the string itself, or
/// the first part carrying `text` that is not a context block (the user's
/// words rather than a leading reminder), else the first part with text.
pub(crate) fn content_text(v: &Value) -> Option<&str> {
    match v.get("content") {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Array(parts)) => {
            let mut texts = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str));
            let first = texts.next()?;
            if !standing::is_context_block(first) {
                return Some(first);
            }
            texts
                .find(|t| !standing::is_context_block(t))
                .or(Some(first))
        }
        _ => None,
    }
}

/// A [`MessageInfo`]: a window may start anywhere but at a tool result, and
/// prompts carry their first line.
pub(crate) fn info(role: String, kind: RowKind, text: Option<&str>) -> MessageInfo {
    MessageInfo {
        role,
        kind,
        starts_ok: kind != RowKind::ToolResult,
        first_line: if kind == RowKind::Prompt {
            text.and_then(|t| first_line(t, 80))
        } else {
            None
        },
        ..MessageInfo::default()
    }
}

/// A user message made only of context blocks — Codex's
/// `<environment_context>…</environment_context>`, its AGENTS.md message
/// (`# AGENTS.md instructions for …`) and `<user_instructions>`, Claude
/// Code's reminder-only messages, Qwen Code's environment message — is
/// context, not an ask: it is kept like a system row when its part of the
/// conversation is cut, and it does not start a turn.
pub(crate) fn context_only(v: &Value) -> bool {
    match v.get("content") {
        Some(Value::String(s)) => standing::is_context_block(s),
        Some(Value::Array(parts)) => {
            !parts.is_empty()
                && parts.iter().all(|p| {
                    matches!(
                        p.get("type").and_then(Value::as_str),
                        Some("text" | "input_text")
                    ) && p
                        .get("text")
                        .and_then(Value::as_str)
                        .is_some_and(standing::is_context_block)
                })
        }
        _ => false,
    }
}

/// Classify a message of the given dialect. A user message that is an ask
/// or carries tool results gets its standing parts (a context-only message
/// is a system row, kept whole).
pub fn classify(d: Dialect, v: &Value) -> MessageInfo {
    let mut info = match d {
        Dialect::Anthropic => anthropic::classify(v),
        Dialect::OpenaiChat => openai_chat::classify(v),
        Dialect::OpenaiResponses => openai_responses::classify(v),
        Dialect::Gemini => gemini::classify(v),
    };
    if info.role == "user" && matches!(info.kind, RowKind::Prompt | RowKind::ToolResult) {
        info.standing = standing::parts_of(v);
    }
    info
}

/// The dialect's stub message carrying `text`, as raw JSON.
pub fn stub_message(d: Dialect, text: &str) -> String {
    spec(d).stub_message(text, &[])
}

/// The stub message with `pinned` — raw content parts kept from rows that
/// left the window (standing instructions, see [`standing`]) — right after
/// the stub's text, in one user message: the parts keep the client's bytes,
/// and no new message is added (Anthropic's user/assistant alternation is
/// what it was). Without parts it is [`stub_message`].
pub fn stub_message_with(d: Dialect, text: &str, pinned: &[&str]) -> String {
    spec(d).stub_message(text, pinned)
}

/// The raw elements of a message's `content` array (slices of `raw`);
/// None when the content is not an array or the message is not JSON.
pub fn content_parts(raw: &str) -> Option<Vec<&str>> {
    // `content` (Anthropic, OpenAI) or `parts` (Gemini).
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow, alias = "parts")]
        content: Vec<&'a RawValue>,
    }
    let m: Msg<'_> = serde_json::from_str(raw).ok()?;
    Some(m.content.into_iter().map(RawValue::get).collect())
}

/// The conversation array's key in request bodies.
pub fn conv_key(d: Dialect) -> &'static str {
    spec(d).conv_key()
}

/// Hash of a message after normalization: `cache_control` removed anywhere,
/// a string `content` equal to a one-text-block list, object keys sorted, and
/// a Responses message item (`"type": "message"`) reduced to its role and
/// content: its `id`, `status` and client metadata name or annotate the item,
/// they are not what it says (Codex re-injects its instructions after a
/// compaction with new ids and without their `create_time`).
pub fn normalized_hash(v: &Value) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    hash_norm(v, &mut h, true);
    h.digest()
}

fn hash_norm(v: &Value, h: &mut xxhash_rust::xxh3::Xxh3, top: bool) {
    match v {
        Value::Null => h.update(b"n"),
        Value::Bool(b) => h.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            h.update(b"#");
            h.update(n.to_string().as_bytes());
        }
        Value::String(s) => {
            h.update(b"s");
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
        }
        Value::Array(a) => {
            h.update(b"[");
            h.update(&(a.len() as u64).to_le_bytes());
            for x in a {
                hash_norm(x, h, false);
            }
        }
        Value::Object(m) => {
            let item = top && m.get("type").and_then(Value::as_str) == Some("message");
            let mut keys: Vec<&String> = m
                .keys()
                .filter(|k| {
                    *k != "cache_control"
                        && (!item || matches!(k.as_str(), "type" | "role" | "content"))
                })
                .collect();
            keys.sort_unstable();
            h.update(b"{");
            h.update(&(keys.len() as u64).to_le_bytes());
            for k in keys {
                h.update(&(k.len() as u64).to_le_bytes());
                h.update(k.as_bytes());
                let val = &m[k.as_str()];
                match (top, k.as_str(), val) {
                    (true, "content", Value::String(s)) => {
                        // String content ≡ one text block (type per dialect folds to "text").
                        h.update(b"[");
                        h.update(&1u64.to_le_bytes());
                        text_block_hash(s, h);
                    }
                    (true, "content", Value::Array(a)) => {
                        h.update(b"[");
                        h.update(&(a.len() as u64).to_le_bytes());
                        for x in a {
                            match text_of_plain_block(x) {
                                Some(s) => text_block_hash(s, h),
                                None => hash_norm(x, h, false),
                            }
                        }
                    }
                    _ => hash_norm(val, h, false),
                }
            }
        }
    }
}

fn text_block_hash(s: &str, h: &mut xxhash_rust::xxh3::Xxh3) {
    h.update(b"T");
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

/// A content block that only carries text (`text`, `input_text`,
/// `output_text`), ignoring `cache_control`.
fn text_of_plain_block(v: &Value) -> Option<&str> {
    let m = v.as_object()?;
    let ty = m.get("type")?.as_str()?;
    if !matches!(ty, "text" | "input_text" | "output_text") {
        return None;
    }
    if m.keys()
        .any(|k| !matches!(k.as_str(), "type" | "text" | "cache_control"))
    {
        return None;
    }
    m.get("text")?.as_str()
}

/// Fast hash of raw bytes.
pub fn raw_hash(raw: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(raw.as_bytes())
}

/// First line of a text, trimmed, at most `max` characters.
pub fn first_line(text: &str, max: usize) -> Option<String> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('<'))?;
    Some(line.chars().take(max).collect())
}

/// Anthropic's `context_management.applied_edits` of a message (or of a
/// `message_delta` event), as reported.
pub(crate) fn applied_edits(v: &Value) -> Option<Vec<AppliedEdit>> {
    let edits = v.pointer("/context_management/applied_edits")?.as_array()?;
    Some(
        edits
            .iter()
            .take(64)
            .filter_map(|e| serde_json::from_value(e.clone()).ok())
            .collect(),
    )
}

/// Read a u64 field of a JSON object.
pub(crate) fn u64_of(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_content_equals_one_text_block_and_cache_control_is_ignored() {
        let a = json!({"role":"user","content":"hello"});
        let b = json!({"role":"user","content":[{"type":"text","text":"hello","cache_control":{"type":"ephemeral"}}]});
        let c = json!({"content":[{"text":"hello","type":"text"}],"role":"user"});
        let d = json!({"role":"user","content":"hello!"});
        assert_eq!(normalized_hash(&a), normalized_hash(&b));
        assert_eq!(normalized_hash(&a), normalized_hash(&c));
        assert_ne!(normalized_hash(&a), normalized_hash(&d));
        let e = json!({"role":"user","content":[{"type":"text","text":"hello"},{"type":"text","text":"x"}]});
        assert_ne!(normalized_hash(&a), normalized_hash(&e));
        // A Responses message item is its role and content; other ids (a
        // call's, a nested one) are part of what they say.
        let item = |id: &str| json!({"type": "message", "id": id, "role": "developer", "content": [{"type": "input_text", "text": "rules"}]});
        assert_eq!(
            normalized_hash(&item("msg_1")),
            normalized_hash(&item("msg_2"))
        );
        let call = |id: &str| json!({"type": "function_call", "id": id, "call_id": "c", "name": "f", "arguments": "{}"});
        assert_ne!(
            normalized_hash(&call("fc_1")),
            normalized_hash(&call("fc_2"))
        );
        let mut meta = item("msg_3");
        meta["status"] = json!("completed");
        meta["internal_chat_message_metadata_passthrough"] = json!({"create_time": 1.5});
        assert_eq!(normalized_hash(&item("msg_1")), normalized_hash(&meta));
        let mut other = item("msg_1");
        other["role"] = json!("user");
        assert_ne!(normalized_hash(&item("msg_1")), normalized_hash(&other));
        let nested = |id: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x", "id": id}]});
        assert_ne!(normalized_hash(&nested("a")), normalized_hash(&nested("b")));
    }

    #[test]
    fn body_round_trips_byte_for_byte_and_renders_a_new_conversation() {
        let src = br#"{"model":"m","messages":[{"role":"user","content":"a"} , {"role":"assistant","content":"b"}],"stream":true,"we\"ird":1}"#;
        let p = ParsedBody::parse(src, "messages").unwrap();
        assert_eq!(p.messages.len(), 2);
        assert_eq!(p.model().as_deref(), Some("m"));
        assert!(p.stream());
        let parts: Vec<&str> = p.messages.clone();
        let out = p.render_with(&parts);
        let expect = br#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"stream":true,"we\"ird":1}"#;
        assert_eq!(
            String::from_utf8(out).unwrap(),
            String::from_utf8(expect.to_vec()).unwrap()
        );
        let out = p.render_with(&[r#"{"x":1}"#]);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["messages"], json!([{"x":1}]));
        assert_eq!(v["we\"ird"], 1);
    }

    #[test]
    fn wrapped_context_messages_are_not_asks() {
        let env = json!({"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"}]});
        assert_eq!(
            classify(Dialect::OpenaiResponses, &env).kind,
            RowKind::System
        );
        let ask = json!({"type":"message","role":"user","content":[{"type":"input_text","text":"fix <b>it</b>"}]});
        assert_eq!(
            classify(Dialect::OpenaiResponses, &ask).kind,
            RowKind::Prompt
        );
        let reminder = json!({"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"}]});
        assert_eq!(
            classify(Dialect::Anthropic, &reminder).kind,
            RowKind::System
        );
        let mixed = json!({"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"list the files"}]});
        assert_eq!(classify(Dialect::Anthropic, &mixed).kind, RowKind::Prompt);
        let chat =
            json!({"role":"user","content":"<user_instructions>be brief</user_instructions>"});
        assert_eq!(classify(Dialect::OpenaiChat, &chat).kind, RowKind::System);
        assert_eq!(
            classify(Dialect::OpenaiChat, &json!({"role":"user","content":"<b>"})).kind,
            RowKind::Prompt
        );
    }

    #[test]
    fn standing_parts_of_captured_messages() {
        // Claude Code 2.1.332's first user message (fixtures/captures/anthropic_11_claude_md).
        let first = json!({"role":"user","content":[
            {"type":"text","text":"<system-reminder>\nCodebase and user instructions are shown below. Be sure to adhere to these instructions.\n\nContents of /home/dev/proj/CLAUDE.md (project instructions, checked into the codebase):\n\nALWAYS run make lint before committing.\n</system-reminder>"},
            {"type":"text","text":"<system-reminder>\nAttribution for git commits and pull requests you create from here on\n</system-reminder>\n"},
            {"type":"text","text":"say hi"}]});
        let i = classify(Dialect::Anthropic, &first);
        assert_eq!(i.kind, RowKind::Prompt);
        assert_eq!(i.first_line.as_deref(), Some("say hi"));
        let kinds: Vec<_> = i.standing.iter().map(|s| (s.part, s.kind)).collect();
        use oceancode_window::StandingKind::*;
        assert_eq!(kinds, [(0, Instructions), (1, Attribution)]);
        // A nested CLAUDE.md after a read, in the tool result's message.
        let nested = json!({"role":"user","content":[
            {"tool_use_id":"toolu_1","type":"tool_result","content":"1\thello"},
            {"type":"text","text":"<system-reminder>\nContents of /p/sub/CLAUDE.md:\n\nNested rule\n</system-reminder>"}]});
        let i = classify(Dialect::Anthropic, &nested);
        assert_eq!(i.kind, RowKind::ToolResult);
        assert_eq!(i.standing.iter().map(|s| s.part).collect::<Vec<_>>(), [1]);
        // Codex 0.171's AGENTS.md + environment message is context, kept whole
        // (fixtures/captures/openai_07_codex_agents_md); it opens no turn.
        let agents = json!({"type":"message","role":"user","content":[
            {"type":"input_text","text":"# AGENTS.md instructions for /home/dev/proj\n\n<INSTRUCTIONS>\nALWAYS run make lint\n\n</INSTRUCTIONS>"},
            {"type":"input_text","text":"<environment_context>\n  <cwd>/home/dev/proj</cwd>\n</environment_context>"}]});
        let i = classify(Dialect::OpenaiResponses, &agents);
        assert_eq!(i.kind, RowKind::System);
        assert!(i.standing.is_empty(), "kept whole, nothing to pin");
        // Qwen Code 0.24's first message: reminders, then the ask, which names the turn.
        let qwen_first = json!({"role":"user","content":[
            {"type":"text","text":"<system-reminder>\nThe following skills are available for use with the Skill tool.\n</system-reminder>"},
            {"type":"text","text":"<system-reminder>\nThis is the Qwen Code. We are setting up the context for our chat.\n</system-reminder>"},
            {"type":"text","text":"Work through the numbered steps."}]});
        let i = classify(Dialect::OpenaiChat, &qwen_first);
        assert_eq!(i.kind, RowKind::Prompt);
        assert_eq!(
            i.first_line.as_deref(),
            Some("Work through the numbered steps.")
        );
        assert_eq!(i.standing.len(), 2);
        // Qwen Code's environment message (Chat, a string).
        let qwen = json!({"role":"user","content":"This is the Qwen Code. We are setting up the context for our chat.\nToday's date is Monday."});
        assert_eq!(classify(Dialect::OpenaiChat, &qwen).kind, RowKind::System);
        // An assistant message quoting a reminder carries no standing part.
        let echo = json!({"role":"assistant","content":[first["content"][0].clone()]});
        assert!(classify(Dialect::Anthropic, &echo).standing.is_empty());
    }

    #[test]
    fn the_stub_message_carries_pinned_parts_verbatim() {
        let parts = [
            r#"{"type":"text","text":"A",  "x":1}"#,
            r#"{"text":"B","type":"text"}"#,
        ];
        for d in [
            Dialect::Anthropic,
            Dialect::OpenaiChat,
            Dialect::OpenaiResponses,
        ] {
            assert_eq!(
                stub_message_with(d, "[stub]", &[]),
                stub_message(d, "[stub]")
            );
            let m = stub_message_with(d, "[stub]", &parts);
            let v: Value = serde_json::from_str(&m).expect("valid JSON");
            assert_eq!(v["role"], "user");
            assert_eq!(v["content"][0]["text"], "[stub]");
            assert_eq!(v["content"][1]["text"], "A");
            assert_eq!(v["content"][2]["text"], "B");
            assert!(
                m.ends_with(&format!(",{},{}]}}", parts[0], parts[1])),
                "{m}"
            );
            assert_eq!(
                classify(d, &v).kind,
                RowKind::Prompt,
                "{d:?}: the stub's message reads as a user message"
            );
        }
        let v: Value =
            serde_json::from_str(&stub_message_with(Dialect::OpenaiResponses, "s", &parts))
                .unwrap();
        assert_eq!(
            (v["type"].as_str(), v["content"][0]["type"].as_str()),
            (Some("message"), Some("input_text"))
        );
        let raw = r#"{"role":"user","content":[ {"type":"text","text":"a"} ,{"b":[1, 2]}]}"#;
        assert_eq!(
            content_parts(raw),
            Some(vec![r#"{"type":"text","text":"a"}"#, r#"{"b":[1, 2]}"#])
        );
        assert_eq!(content_parts(r#"{"role":"user","content":"a"}"#), None);
        assert_eq!(content_parts("not json"), None);
    }

    #[test]
    fn non_object_bodies_are_errors() {
        assert!(ParsedBody::parse(b"[1,2]", "messages").is_err());
        assert!(ParsedBody::parse(b"{\"a\":", "messages").is_err());
        assert!(ParsedBody::parse(br#"{"messages":[{"a":1},]}"#, "messages").is_err());
        assert!(ParsedBody::parse(br#"{"messages":[1]} x"#, "messages").is_err());
    }

    #[test]
    fn collectors_keep_what_the_bound_allows_and_mark_the_rest() {
        let marker = Keep::new(100).marker();
        // Chat: content past the bound is left out, the marker ends it.
        let mut c = collector_keeping(Dialect::OpenaiChat, 100);
        for _ in 0..10 {
            c.on_event("", r#"{"choices":[{"index":0,"delta":{"content":"0123456789012345678901234567890123456789"}}]}"#);
        }
        c.on_event(
            "",
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9}}"#,
        );
        let got = c.finish();
        assert!(got.truncated);
        assert!(got.usage.is_some(), "usage is read past the bound");
        let v: Value = serde_json::from_str(&got.rows[0]).unwrap();
        let text = v["content"].as_str().unwrap();
        assert!(text.ends_with(&marker), "{text}");
        assert!(text.len() < 100 + marker.len() + 1);
        // Responses: items past the bound are left out, a marker item ends them.
        let mut c = collector_keeping(Dialect::OpenaiResponses, 200);
        let item = r#"{"type":"response.output_item.done","item":{"type":"message","role":"assistant","content":[{"type":"output_text","text":"0123456789"}]}}"#;
        for _ in 0..5 {
            c.on_event("", item);
        }
        c.on_event("", r#"{"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":4}}}"#);
        let got = c.finish();
        assert!(got.truncated && got.usage.is_some());
        assert_eq!(got.rows.len(), 1 + 1, "one item fits, then the marker");
        assert!(got.rows[1].contains("limits.max_recorded_response_bytes"));
        // A JSON answer the tap could not keep: a marker row alone.
        let mut c = collector_keeping(Dialect::Anthropic, 100);
        c.truncated();
        let got = c.finish();
        assert_eq!(got.rows.len(), 1);
        assert!(got.rows[0].contains("limits.max_recorded_response_bytes"));
    }

    #[test]
    fn stream_error_events_are_each_dialects_own() {
        let a = stream_error_event(Dialect::Anthropic, StreamCut::Idle, "m");
        assert_eq!(
            a,
            "event: error\ndata: {\"error\":{\"message\":\"m\",\"type\":\"overloaded_error\"},\"type\":\"error\"}\n\n"
        );
        let c = stream_error_event(Dialect::OpenaiChat, StreamCut::Broken, "m");
        assert!(c.starts_with("data: {\"error\":{"), "{c}");
        let r = stream_error_event(Dialect::OpenaiResponses, StreamCut::Broken, "m");
        assert!(r.starts_with("event: error\ndata: {"), "{r}");
        assert!(r.contains("\"type\":\"error\""), "{r}");
    }

    #[test]
    fn a_repeated_top_level_key_is_refused() {
        // An upstream that takes the last `messages` would see another
        // conversation than the first one the ledger would record.
        for b in [
            &br#"{"model":"a","messages":[{"role":"user","content":"x"}],"messages":[]}"#[..],
            br#"{"model":"a","model":"b","messages":[]}"#,
            br#"{"messages":[],"m\u006fdel":"a","model":"b"}"#,
        ] {
            let e = ParsedBody::parse(b, "messages").unwrap_err();
            assert!(e.to_string().contains("appears twice"), "{e}");
        }
        // Nested objects may repeat keys of the top level.
        assert!(ParsedBody::parse(
            br#"{"model":"a","metadata":{"model":"b"},"messages":[]}"#,
            "messages"
        )
        .is_ok());
        // Many distinct keys are fine; one repeat among them is not.
        let mut many: String = (0..200).map(|i| format!("\"k{i}\":{i},")).collect();
        many.push_str("\"messages\":[]");
        assert!(ParsedBody::parse(format!("{{{many}}}").as_bytes(), "messages").is_ok());
        assert!(ParsedBody::parse(format!("{{{many},\"k7\":0}}").as_bytes(), "messages").is_err());
    }

    #[test]
    fn a_conversation_that_is_not_an_array_stays_raw() {
        for (src, key) in [
            (
                &br#"{"model":"m","input":"hi \"there\"","stream":false}"#[..],
                "input",
            ),
            (br#"{"input":{"a":[1,2]},"z":1}"#, "input"),
            (br#"{"messages":null}"#, "messages"),
            (br#"{"messages":42,"m":"x"}"#, "messages"),
        ] {
            let p = ParsedBody::parse(src, key).unwrap();
            assert!(p.messages.is_empty());
            assert!(p.conv_field.is_some());
            let raw: Value = serde_json::from_slice(src).unwrap();
            let got: Value = serde_json::from_str(p.get(key).unwrap()).unwrap();
            assert_eq!(got, raw[key]);
        }
        let p = ParsedBody::parse(br#"{"input":"hi","messages":[1]}"#, "input").unwrap();
        assert_eq!(p.get_as::<String>("input").as_deref(), Some("hi"));
        assert_eq!(p.get("messages").unwrap(), "[1]");
        // The conversation array itself is only reachable as elements.
        let p = ParsedBody::parse(br#"{"messages":[ 1 , {"b":2} ]}"#, "messages").unwrap();
        assert!(p.get("messages").is_none());
        assert_eq!(p.messages.clone(), ["1", r#"{"b":2}"#]);
    }
}
