//! Turning a scripted [`Reply`] into concrete content (tool-loop rule, padding, ids,
//! output token counts) that the dialect renderers emit.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::analyze::{Analysis, Dialect};
use crate::script::{Reply, ToolCall, ToolLoop, DEFAULT_TEXT};
use crate::tokens::{count_tokens, TokenMemo};
use crate::usage::Usage;

/// Why the answer stopped, in dialect-neutral form.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stop {
    EndTurn,
    ToolUse,
    MaxTokens,
    Other(String),
}

impl Stop {
    fn parse(s: &str) -> Stop {
        match s {
            "end_turn" | "stop" | "completed" => Stop::EndTurn,
            "tool_use" | "tool_calls" => Stop::ToolUse,
            "max_tokens" | "length" | "max_output_tokens" => Stop::MaxTokens,
            other => Stop::Other(other.to_string()),
        }
    }

    pub(crate) fn anthropic(&self) -> &str {
        match self {
            Stop::EndTurn => "end_turn",
            Stop::ToolUse => "tool_use",
            Stop::MaxTokens => "max_tokens",
            Stop::Other(s) => s,
        }
    }

    pub(crate) fn chat(&self) -> &str {
        match self {
            Stop::EndTurn => "stop",
            Stop::ToolUse => "tool_calls",
            Stop::MaxTokens => "length",
            Stop::Other(s) => s,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct PlannedCall {
    /// Unique number: ids are `toolu_<n>` / `call_<n>`.
    pub n: u64,
    pub name: String,
    pub input: Value,
    pub custom: bool,
}

impl PlannedCall {
    /// Arguments as JSON text (Chat/Responses), or the raw string of a custom call.
    pub(crate) fn arguments(&self) -> String {
        match &self.input {
            Value::String(s) if self.custom => s.clone(),
            v => serde_json::to_string(v).unwrap_or_default(),
        }
    }

    /// Anthropic input: always an object.
    pub(crate) fn object_input(&self) -> Value {
        match &self.input {
            Value::Object(_) => self.input.clone(),
            other => serde_json::json!({ "input": other }),
        }
    }
}

/// Concrete content of a successful answer.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub thinking: Option<String>,
    pub signature: String,
    pub text: Option<String>,
    pub calls: Vec<PlannedCall>,
    pub stop: Stop,
    pub usage: Usage,
    pub delta_bytes: usize,
    /// Anthropic: the summary of a server-side compaction (a `compaction`
    /// block opens the answer).
    pub compaction: Option<String>,
    /// Anthropic `usage.iterations[]` (empty: none reported).
    pub iterations: Vec<(&'static str, Usage)>,
    /// Anthropic `context_management.applied_edits`.
    pub edits: Vec<crate::context::Applied>,
    /// Anthropic: answer `safeguard_results`, a verdict per tool call
    /// (the request asked for it), with this outcome.
    pub safeguards: Option<String>,
}

/// Unique ids for one server.
pub(crate) struct Ids {
    seed: u64,
    n: AtomicU64,
    tools: AtomicU64,
}

impl Ids {
    pub(crate) fn new() -> Self {
        Self::with_seed(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        )
    }

    /// Ids from a fixed seed (the same ids in the same order).
    pub(crate) fn with_seed(seed: u64) -> Self {
        Ids {
            seed,
            n: AtomicU64::new(0),
            tools: AtomicU64::new(0),
        }
    }

    /// `len` random-looking hex chars (len <= 32).
    pub(crate) fn hex(&self, len: usize) -> String {
        let n = self.n.fetch_add(1, Ordering::Relaxed).to_le_bytes();
        let a = xxh3_64_with_seed(&n, self.seed);
        let b = xxh3_64_with_seed(&n, self.seed ^ 0x5bd1_e995);
        let s = format!("{a:016x}{b:016x}");
        s[..len.min(32)].to_string()
    }

    fn tool(&self) -> u64 {
        self.tools.fetch_add(1, Ordering::Relaxed) + 1
    }
}

fn substitute(v: &Value, step: u32, steps: u32) -> Value {
    match v {
        Value::String(s) => Value::String(subst_str(s, step, steps)),
        Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, step, steps)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), substitute(x, step, steps)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn subst_str(s: &str, step: u32, steps: u32) -> String {
    s.replace("{steps}", &steps.to_string())
        .replace("{step}", &step.to_string())
}

/// Applies the tool-loop rule: (text, calls).
fn resolve_loop(tl: &ToolLoop, dialect: Dialect, a: &Analysis) -> (Option<String>, Vec<ToolCall>) {
    let done = if tl.per_turn {
        a.tool_results_this_turn
    } else {
        a.tool_results
    };
    if (done as u64) < u64::from(tl.steps) && !a.tools_empty {
        let step = done as u32 + 1;
        let spec = tl
            .by_dialect
            .get(dialect.key())
            .cloned()
            .unwrap_or(ToolCall {
                name: tl.tool.clone(),
                input: tl.input.clone(),
                custom: tl.custom,
            });
        let call = ToolCall {
            name: spec.name,
            input: substitute(&spec.input, step, tl.steps),
            custom: spec.custom,
        };
        let text = tl
            .step_text
            .clone()
            .unwrap_or_else(|| "Running step {step}.".to_string());
        let text = (!text.is_empty()).then(|| subst_str(&text, step, tl.steps));
        (text, vec![call])
    } else {
        let text = tl
            .final_text
            .clone()
            .unwrap_or_else(|| "All {steps} steps done. FINAL_ANSWER_MARKER".to_string());
        (Some(subst_str(&text, tl.steps, tl.steps)), Vec::new())
    }
}

const FILLER: &[&str] = &[
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
    "sed",
    "do",
    "eiusmod",
    "tempor",
    "incididunt",
    "ut",
    "labore",
    "et",
    "dolore",
    "magna",
    "aliqua",
    "enim",
    "ad",
    "minim",
    "veniam",
    "quis",
    "nostrud",
    "exercitation",
    "ullamco",
    "laboris",
    "nisi",
    "aliquip",
    "ex",
    "ea",
    "commodo",
    "consequat.",
];

/// `base` followed by filler words, exactly `bytes` long (unless `base` is longer).
fn pad(base: Option<String>, bytes: usize) -> String {
    let mut s = base.unwrap_or_default();
    let mut i = 0;
    while s.len() < bytes {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(FILLER[i % FILLER.len()]);
        i += 1;
    }
    if s.len() > bytes && s.is_char_boundary(bytes) && i > 0 {
        s.truncate(bytes);
    }
    s
}

/// Builds the content of a successful answer.
pub(crate) fn build(
    dialect: Dialect,
    reply: &Reply,
    a: &Analysis,
    mut usage: Usage,
    memo: &TokenMemo,
    ids: &Ids,
) -> Plan {
    let (mut text, calls) = match &reply.tool_loop {
        Some(tl) => resolve_loop(tl, dialect, a),
        None => (reply.text.clone(), reply.tool_calls.clone()),
    };
    if let Some(bytes) = reply.pad_text_bytes {
        text = Some(pad(text, bytes));
    }
    if text.is_none() && calls.is_empty() && reply.thinking.is_none() {
        text = Some(DEFAULT_TEXT.to_string());
    }
    let calls: Vec<PlannedCall> = calls
        .into_iter()
        .map(|c| PlannedCall {
            n: ids.tool(),
            name: c.name,
            input: c.input,
            custom: c.custom,
        })
        .collect();
    let stop = match &reply.stop_reason {
        Some(s) => Stop::parse(s),
        None if calls.is_empty() => Stop::EndTurn,
        None => Stop::ToolUse,
    };
    let thinking = reply.thinking.clone();
    let signature = thinking.as_ref().map_or_else(String::new, |t| {
        let h = xxh3_64_with_seed(t.as_bytes(), 7);
        format!("EqFakeSig{h:016x}{:016x}", h.rotate_left(17))
    });
    let reasoning = thinking.as_deref().map_or(0, |t| memo.text(t));
    let out = reasoning
        + text.as_deref().map_or(0, |t| memo.text(t))
        + calls
            .iter()
            .map(|c| count_tokens(&c.name) + memo.text(&c.arguments()))
            .sum::<u64>();
    usage.output_tokens = out.max(1);
    usage.reasoning_tokens = reasoning;
    if let Some(o) = &reply.usage {
        usage.apply(o);
    }
    let longest = text.as_ref().map_or(0, String::len);
    let delta_bytes = reply
        .delta_bytes
        .unwrap_or_else(|| (longest / 200).max(20))
        .max(1);
    Plan {
        thinking,
        signature,
        text,
        calls,
        stop,
        usage,
        delta_bytes,
        compaction: None,
        iterations: Vec::new(),
        edits: Vec::new(),
        safeguards: a
            .safeguards
            .then(|| {
                reply
                    .safeguard_outcome
                    .clone()
                    .unwrap_or_else(|| "not_flagged".into())
            })
            .filter(|o| o != "omit"),
    }
}

/// Splits `s` into pieces of at most `max` bytes, preferring to cut before whitespace.
pub(crate) fn split_text(s: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        if rest.len() <= max {
            out.push(rest);
            break;
        }
        let mut cut = max;
        while cut > 0 && !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        if let Some(ws) = rest[..cut].rfind(' ') {
            if ws > 0 {
                cut = ws;
            }
        }
        if cut == 0 {
            cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

/// Splits tool arguments into a few partial chunks (at least two when long enough).
pub(crate) fn split_args(s: &str) -> Vec<&str> {
    let size = s.len().div_ceil(3).max(8);
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut cut = size.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (head, tail) = rest.split_at(cut);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pads_exactly() {
        assert_eq!(pad(None, 1000).len(), 1000);
        assert_eq!(pad(Some("hi".into()), 7), "hi lore");
        assert_eq!(pad(Some("long text".into()), 3), "long text");
    }

    #[test]
    fn splits_cover_input() {
        let s = "Done. FINAL_ANSWER_MARKER with more words é ü";
        assert_eq!(split_text(s, 10).concat(), s);
        assert!(split_text(s, 10).len() > 2);
        let args = r#"{"command":"ls -la","description":"List files"}"#;
        assert!(split_args(args).len() >= 3);
        assert_eq!(split_args(args).concat(), args);
    }

    #[test]
    fn tool_loop_steps_then_final() {
        let tl = ToolLoop::new(2, "Bash", json!({"command": "echo {step}/{steps}"})).for_dialect(
            "responses",
            "exec_command",
            json!({"cmd": "echo {step}"}),
        );
        let mut a = Analysis::default();
        let (t, c) = resolve_loop(&tl, Dialect::Anthropic, &a);
        assert_eq!(t.as_deref(), Some("Running step 1."));
        assert_eq!(c[0].input, json!({"command": "echo 1/2"}));
        let (_, c) = resolve_loop(&tl, Dialect::Responses, &a);
        assert_eq!(
            (c[0].name.as_str(), &c[0].input),
            ("exec_command", &json!({"cmd": "echo 1"}))
        );
        a.tool_results = 2;
        let (t, c) = resolve_loop(&tl, Dialect::Anthropic, &a);
        assert!(c.is_empty());
        assert_eq!(t.as_deref(), Some("All 2 steps done. FINAL_ANSWER_MARKER"));
    }
}
