//! A step's spans: built when the step finishes, from plain facts the
//! session hands over ([`StepFacts`]).

use super::Sink;
use crate::dialect::Collected;
use oceancode_window::Dialect;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;
use std::borrow::Cow;
use std::time::SystemTime;

/// The GenAI semantic conventions version followed.
pub const SEMCONV_VERSION: &str = "1.41.0";
/// The schema URL of that version.
const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";
/// Most bytes of one captured content attribute.
const MAX_CONTENT: usize = 128 << 10;

pub(super) fn resource() -> Resource {
    Resource::builder_empty()
        .with_attributes([
            KeyValue::new("service.name", "oceancode-proxy"),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build()
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("oceancode-proxy")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(SCHEMA_URL)
        .build()
}

/// A cut the tideline made (kept on the session's meter until the step
/// that made it finishes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutNote {
    /// The step whose request made it.
    pub step: u32,
    /// The last seq that left the window.
    pub upto_seq: u64,
    /// Rows that left the window at this cut.
    pub rows: u64,
    /// The gauge when it was made.
    pub gauge: u64,
    /// The line in force.
    pub line: u64,
    /// When.
    pub at: SystemTime,
}

/// Another upstream call within a step: a child span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// The single retry after a context-limit answer: `ceiling` known (a
    /// 400/413 "too long") or not (a stream failing with
    /// `context_length_exceeded`).
    Retry {
        /// A 400/413 told the ceiling.
        too_long: bool,
    },
    /// A continuation of the recall tool's loop, after the proxy answered
    /// `calls` recall calls of round `round`.
    Recall {
        /// The round answered (1 = the request's own answer).
        round: u32,
        /// Recall calls answered.
        calls: u32,
    },
}

struct Open {
    child: Child,
    id: SpanId,
    start: SystemTime,
    end: Option<SystemTime>,
}

/// The bounds of `limits.session`, where set (`oceancode.limits.*`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bounds {
    /// Most steps.
    pub steps: Option<u32>,
    /// Most USD.
    pub spend_usd: Option<f64>,
    /// Longest run (seconds).
    pub time_s: Option<u64>,
}

/// One step's trace, carried on its ticket from the request to the finish.
pub struct StepTrace {
    sink: Sink,
    capture: bool,
    bounds: Bounds,
    trace_id: TraceId,
    span_id: SpanId,
    start: SystemTime,
    children: Vec<Open>,
}

/// What a finished step tells its span (all plain values; nothing from the
/// request's headers).
pub struct StepFacts<'a> {
    /// The ledger session (`gen_ai.conversation.id`).
    pub session: &'a str,
    /// Step number.
    pub step: u32,
    /// Dialect.
    pub dialect: Dialect,
    /// The model the request asked for.
    pub request_model: &'a str,
    /// The status the client got.
    pub status: u16,
    /// What the answer reported.
    pub collected: &'a Collected,
    /// Why the step failed, if it did.
    pub error: Option<&'static str>,
    /// Rows in the window sent.
    pub window_rows: usize,
    /// Rows on the session's active line.
    pub active_rows: usize,
    /// The gauge, the line, the block, the model's context window.
    pub gauge: u64,
    /// Tideline (tokens).
    pub line: u64,
    /// Block size (tokens).
    pub block: u64,
    /// The model's context window, if known.
    pub context: Option<u64>,
    /// The last seq past the tideline.
    pub cut_upto: u64,
    /// The cut this step's request made, if any.
    pub cut: Option<CutNote>,
    /// Tool outputs sent as pointers (`ledger.compress`).
    pub pointers: u32,
    /// Their saved estimate.
    pub pointer_saved_tokens: u64,
    /// Tokens of the state block carried after the stub.
    pub state_tokens: u64,
    /// The agent's context edit in force (0 = none).
    pub context_edit: u32,
    /// Context edits the provider applied.
    pub provider_edits: usize,
    /// Recall calls the proxy answered in the step.
    pub recalls: usize,
    /// The client's request body (read only with content capture on).
    pub request: &'a [u8],
}

fn random_u128() -> u128 {
    let mut b = [0u8; 16];
    if getrandom::getrandom(&mut b).is_err() {
        // No entropy source: still unique enough within a process.
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        b = t.to_le_bytes();
    }
    u128::from_le_bytes(b)
}

fn new_span_id() -> SpanId {
    let id = (random_u128() as u64).max(1);
    SpanId::from_bytes(id.to_be_bytes())
}

/// `gen_ai.provider.name`: the provider that serves the dialect.
fn provider(d: Dialect) -> &'static str {
    d.spec().provider().otel_name()
}

fn clip(s: &str) -> String {
    if s.len() <= MAX_CONTENT {
        return s.to_string();
    }
    let mut end = MAX_CONTENT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The request's conversation member, raw (`messages`, or `input`).
fn input_messages(d: Dialect, body: &[u8]) -> Option<String> {
    let key = match d {
        Dialect::OpenaiResponses => "input",
        _ => "messages",
    };
    let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body).ok()?;
    Some(clip(&v.get(key)?.to_string()))
}

impl StepTrace {
    pub(super) fn new(sink: Sink, capture: bool, bounds: Bounds, start: SystemTime) -> Self {
        StepTrace {
            sink,
            capture,
            bounds,
            trace_id: TraceId::from_bytes(random_u128().max(1).to_be_bytes()),
            span_id: new_span_id(),
            start,
            children: Vec::new(),
        }
    }

    /// Another upstream call of the step begins (the one before it ends).
    pub fn child(&mut self, child: Child) {
        let now = SystemTime::now();
        if let Some(last) = self.children.last_mut() {
            last.end.get_or_insert(now);
        }
        self.children.push(Open {
            child,
            id: new_span_id(),
            start: now,
            end: None,
        });
    }

    fn context(&self, id: SpanId) -> SpanContext {
        SpanContext::new(
            self.trace_id,
            id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        )
    }

    /// The step finished: its span and its children go to the export queue.
    pub fn finish(self, f: &StepFacts<'_>) {
        let end = SystemTime::now();
        let c = f.collected;
        let response_model = c.model.as_deref().unwrap_or(f.request_model);
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", provider(f.dialect)),
            KeyValue::new("gen_ai.request.model", f.request_model.to_string()),
            KeyValue::new("gen_ai.conversation.id", f.session.to_string()),
            // Phoenix groups a conversation's traces by this.
            KeyValue::new("session.id", f.session.to_string()),
            KeyValue::new("oceancode.step", i64::from(f.step)),
            KeyValue::new("http.response.status_code", i64::from(f.status)),
        ];
        if c.model.is_some() {
            attrs.push(KeyValue::new(
                "gen_ai.response.model",
                response_model.to_string(),
            ));
        }
        if let Some(id) = &c.response_id {
            attrs.push(KeyValue::new("gen_ai.response.id", id.clone()));
        }
        if let Some(u) = c.usage {
            let u = u.plus(c.detail.extra);
            let input = u.input + u.cache_read + u.cache_write;
            attrs.push(KeyValue::new("gen_ai.usage.input_tokens", input as i64));
            attrs.push(KeyValue::new("gen_ai.usage.output_tokens", u.output as i64));
            attrs.push(KeyValue::new(
                "gen_ai.usage.cache_read.input_tokens",
                u.cache_read as i64,
            ));
            attrs.push(KeyValue::new(
                "gen_ai.usage.cache_creation.input_tokens",
                u.cache_write as i64,
            ));
        }
        if let Some(r) = &c.stop_reason {
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(
                    vec![opentelemetry::StringValue::from(r.clone())].into(),
                ),
            ));
        }
        let error_type = f.error.map(|e| {
            if f.status >= 400 {
                f.status.to_string()
            } else {
                e.to_string()
            }
        });
        if let Some(e) = &error_type {
            attrs.push(KeyValue::new("error.type", e.clone()));
        }
        attrs.extend([
            KeyValue::new("oceancode.window.rows", f.window_rows as i64),
            KeyValue::new("oceancode.window.active_rows", f.active_rows as i64),
            KeyValue::new(
                "oceancode.window.rows_out",
                f.active_rows.saturating_sub(f.window_rows) as i64,
            ),
            KeyValue::new("oceancode.window.gauge_tokens", f.gauge as i64),
            KeyValue::new("oceancode.line.tokens", f.line as i64),
            KeyValue::new("oceancode.line.block_tokens", f.block as i64),
            KeyValue::new("oceancode.cut.upto_seq", f.cut_upto as i64),
            KeyValue::new("oceancode.cut.made", f.cut.is_some()),
            KeyValue::new("oceancode.compress.pointers", i64::from(f.pointers)),
            KeyValue::new(
                "oceancode.compress.saved_tokens",
                f.pointer_saved_tokens as i64,
            ),
            KeyValue::new("oceancode.state_block.tokens", f.state_tokens as i64),
            KeyValue::new("oceancode.context_edit", i64::from(f.context_edit)),
            KeyValue::new("oceancode.provider_edits", f.provider_edits as i64),
            KeyValue::new("oceancode.recall.calls", f.recalls as i64),
        ]);
        if let Some(cut) = &f.cut {
            attrs.push(KeyValue::new("oceancode.cut.rows", cut.rows as i64));
        }
        if let Some(ctx) = f.context {
            attrs.push(KeyValue::new("oceancode.limits.context_tokens", ctx as i64));
        }
        if let Some(n) = self.bounds.steps {
            attrs.push(KeyValue::new("oceancode.limits.steps", i64::from(n)));
        }
        if let Some(usd) = self.bounds.spend_usd {
            attrs.push(KeyValue::new("oceancode.limits.spend_usd", usd));
        }
        if let Some(s) = self.bounds.time_s {
            attrs.push(KeyValue::new("oceancode.limits.time_s", s as i64));
        }
        if self.capture {
            if let Some(m) = input_messages(f.dialect, f.request) {
                attrs.push(KeyValue::new("gen_ai.input.messages", m));
            }
            if !c.rows.is_empty() {
                let out = format!("[{}]", c.rows.join(","));
                attrs.push(KeyValue::new("gen_ai.output.messages", clip(&out)));
            }
        }
        let mut events = SpanEvents::default();
        if let Some(cut) = &f.cut {
            events.events.push(opentelemetry::trace::Event::new(
                "oceancode.cut",
                cut.at,
                vec![
                    KeyValue::new("oceancode.cut.upto_seq", cut.upto_seq as i64),
                    KeyValue::new("oceancode.cut.rows", cut.rows as i64),
                    KeyValue::new("oceancode.cut.gauge_tokens", cut.gauge as i64),
                    KeyValue::new("oceancode.line.tokens", cut.line as i64),
                ],
                0,
            ));
        }
        let status = match &error_type {
            Some(e) => Status::error(e.clone()),
            None => Status::Unset,
        };
        let name = format!("chat {}", f.request_model);
        let scope = scope();
        let mut spans = Vec::with_capacity(1 + self.children.len());
        for ch in &self.children {
            let (what, extra) = match ch.child {
                Child::Retry { too_long } => (
                    "retry",
                    KeyValue::new(
                        "oceancode.retry.reason",
                        if too_long { "too_long" } else { "overflow" },
                    ),
                ),
                Child::Recall { round, .. } => (
                    "recall",
                    KeyValue::new("oceancode.recall.round", i64::from(round) + 1),
                ),
            };
            let mut a = vec![
                KeyValue::new("gen_ai.operation.name", "chat"),
                KeyValue::new("gen_ai.provider.name", provider(f.dialect)),
                KeyValue::new("gen_ai.request.model", f.request_model.to_string()),
                KeyValue::new("gen_ai.conversation.id", f.session.to_string()),
                KeyValue::new("session.id", f.session.to_string()),
                KeyValue::new("oceancode.call", what),
                extra,
            ];
            if let Child::Recall { calls, .. } = ch.child {
                a.push(KeyValue::new("oceancode.recall.calls", i64::from(calls)));
            }
            spans.push(SpanData {
                span_context: self.context(ch.id),
                parent_span_id: self.span_id,
                parent_span_is_remote: false,
                span_kind: SpanKind::Client,
                name: Cow::Owned(format!("chat {} ({what})", f.request_model)),
                start_time: ch.start,
                end_time: ch.end.unwrap_or(end),
                attributes: a,
                dropped_attributes_count: 0,
                events: SpanEvents::default(),
                links: SpanLinks::default(),
                status: Status::Unset,
                instrumentation_scope: scope.clone(),
            });
        }
        spans.push(SpanData {
            span_context: self.context(self.span_id),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Client,
            name: Cow::Owned(name),
            start_time: self.start,
            end_time: end,
            attributes: attrs,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope,
        });
        self.sink.send(spans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemini was reported as `openai` (a catch-all arm).
    #[test]
    fn each_dialect_names_its_provider() {
        assert_eq!(provider(Dialect::Anthropic), "anthropic");
        assert_eq!(provider(Dialect::OpenaiChat), "openai");
        assert_eq!(provider(Dialect::OpenaiResponses), "openai");
        assert_eq!(provider(Dialect::Gemini), "gcp.gemini");
    }
}
