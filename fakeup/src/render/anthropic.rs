//! Anthropic Messages: `message_start`, `ping`, content blocks (a server-side
//! `compaction` with one `compaction_delta`, thinking with `signature_delta`, text,
//! tool_use with several `input_json_delta`s), `message_delta` with the cumulative
//! usage (and its `iterations`) and the applied context edits, `message_stop`.

use bytes::Bytes;

use super::{sse, Ctx};
use crate::json::{obj, J};
use crate::plan::{split_args, split_text, Plan};
use crate::usage::Usage;

fn usage(u: &Usage, output: u64) -> J {
    obj! {
        "input_tokens": u.input_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
        "output_tokens": output,
    }
}

/// The final usage: with `iterations` when the plan has them.
fn final_usage(p: &Plan) -> J {
    let mut u = usage(&p.usage, p.usage.output_tokens);
    if let (J::O(fields), false) = (&mut u, p.iterations.is_empty()) {
        let its = p
            .iterations
            .iter()
            .map(|(kind, it)| {
                let mut f = vec![("type", J::from(*kind))];
                if let J::O(rest) = usage(it, it.output_tokens) {
                    f.extend(rest);
                }
                J::O(f)
            })
            .collect();
        fields.push(("iterations", J::A(its)));
    }
    u
}

/// `{"applied_edits": [...]}`, when the plan applied any.
fn context_management(p: &Plan) -> Option<J> {
    if p.edits.is_empty() {
        return None;
    }
    let edits = p
        .edits
        .iter()
        .map(|e| {
            let what = if e.kind.starts_with("clear_thinking") {
                "cleared_thinking_turns"
            } else {
                "cleared_tool_uses"
            };
            J::O(vec![
                ("type", J::from(e.kind)),
                (what, J::U(e.cleared)),
                ("cleared_input_tokens", J::U(e.cleared_input_tokens)),
            ])
        })
        .collect();
    Some(obj! { "applied_edits": J::A(edits) })
}

/// `[{"type": "dangerous_tool_use", "status": {"type": "available",
/// "tool_uses": {ID: {"type": "evaluated", "outcome": "not_flagged"}}}}]`
/// (or the reply's `safeguard_outcome`):
/// auto mode's verdict on every tool call of the answer (the contract
/// Claude Code 2.1.332 reads; a call it has no verdict for it classifies
/// itself).
fn safeguard_results(p: &Plan) -> Option<J> {
    let outcome = p.safeguards.as_deref()?;
    let verdicts: serde_json::Map<String, serde_json::Value> = p
        .calls
        .iter()
        .map(|c| {
            (
                format!("toolu_{}", c.n),
                serde_json::json!({ "type": "evaluated", "outcome": outcome }),
            )
        })
        .collect();
    Some(J::A(vec![obj! {
        "type": crate::analyze::DANGEROUS_TOOL_USE,
        "status": obj! { "type": "available", "tool_uses": J::V(verdicts.into()) },
    }]))
}

fn ev(name: &'static str, data: J) -> Bytes {
    sse(Some(name), &data)
}

pub(crate) fn stream(p: &Plan, ctx: &Ctx) -> Vec<Bytes> {
    let id = format!("msg_fake_{}", ctx.ids.hex(20));
    let mut out = vec![
        ev(
            "message_start",
            obj! {
                "type": "message_start",
                "message": obj! {
                    "id": id,
                    "type": "message",
                    "role": "assistant",
                    "model": ctx.model,
                    "content": Vec::<J>::new(),
                    "stop_reason": (),
                    "stop_sequence": (),
                    "usage": usage(&p.usage, 1),
                },
            },
        ),
        ev("ping", obj! { "type": "ping" }),
    ];
    let mut index = 0usize;
    let start = |i: usize, block: J| {
        ev(
            "content_block_start",
            obj! { "type": "content_block_start", "index": i, "content_block": block },
        )
    };
    let delta = |i: usize, d: J| {
        ev(
            "content_block_delta",
            obj! { "type": "content_block_delta", "index": i, "delta": d },
        )
    };
    let stop = |i: usize| {
        ev(
            "content_block_stop",
            obj! { "type": "content_block_stop", "index": i },
        )
    };
    if let Some(summary) = &p.compaction {
        out.push(start(index, obj! { "type": "compaction", "content": () }));
        out.push(delta(
            index,
            obj! { "type": "compaction_delta", "content": summary },
        ));
        out.push(stop(index));
        index += 1;
    }
    if let Some(t) = &p.thinking {
        out.push(start(
            index,
            obj! { "type": "thinking", "thinking": "", "signature": "" },
        ));
        for piece in split_text(t, p.delta_bytes) {
            out.push(delta(
                index,
                obj! { "type": "thinking_delta", "thinking": piece },
            ));
        }
        out.push(delta(
            index,
            obj! { "type": "signature_delta", "signature": &p.signature },
        ));
        out.push(stop(index));
        index += 1;
    }
    if let Some(t) = &p.text {
        out.push(start(index, obj! { "type": "text", "text": "" }));
        for piece in split_text(t, p.delta_bytes) {
            out.push(delta(index, obj! { "type": "text_delta", "text": piece }));
        }
        out.push(stop(index));
        index += 1;
    }
    for c in &p.calls {
        out.push(start(
            index,
            obj! {
                "type": "tool_use",
                "id": format!("toolu_{}", c.n),
                "name": &c.name,
                "input": obj! {},
            },
        ));
        let args = serde_json::to_string(&c.object_input()).unwrap_or_default();
        out.push(delta(
            index,
            obj! { "type": "input_json_delta", "partial_json": "" },
        ));
        for piece in split_args(&args) {
            out.push(delta(
                index,
                obj! { "type": "input_json_delta", "partial_json": piece },
            ));
        }
        out.push(stop(index));
        index += 1;
    }
    let mut delta = vec![
        ("stop_reason", J::from(p.stop.anthropic())),
        ("stop_sequence", J::Null),
    ];
    if let Some(r) = safeguard_results(p) {
        delta.push(("safeguard_results", r));
    }
    let mut md = vec![("type", J::from("message_delta")), ("delta", J::O(delta))];
    if let Some(cm) = context_management(p) {
        md.push(("context_management", cm));
    }
    md.push(("usage", final_usage(p)));
    out.push(ev("message_delta", J::O(md)));
    out.push(ev("message_stop", obj! { "type": "message_stop" }));
    out
}

pub(crate) fn json(p: &Plan, ctx: &Ctx) -> Vec<u8> {
    let mut content = Vec::new();
    if let Some(summary) = &p.compaction {
        content.push(obj! { "type": "compaction", "content": summary });
    }
    if let Some(t) = &p.thinking {
        content.push(obj! { "type": "thinking", "thinking": t, "signature": &p.signature });
    }
    if let Some(t) = &p.text {
        content.push(obj! { "type": "text", "text": t });
    }
    for c in &p.calls {
        content.push(obj! {
            "type": "tool_use",
            "id": format!("toolu_{}", c.n),
            "name": &c.name,
            "input": c.object_input(),
        });
    }
    let mut m = vec![
        (
            "id",
            J::from(format!("msg_fake_{}", ctx.ids.hex(20)).as_str()),
        ),
        ("type", J::from("message")),
        ("role", J::from("assistant")),
        ("model", J::from(ctx.model)),
        ("content", J::A(content)),
        ("stop_reason", J::from(p.stop.anthropic())),
        ("stop_sequence", J::Null),
    ];
    if let Some(cm) = context_management(p) {
        m.push(("context_management", cm));
    }
    if let Some(r) = safeguard_results(p) {
        m.push(("safeguard_results", r));
    }
    m.push(("usage", final_usage(p)));
    J::O(m).to_vec()
}

/// An `error` event inside a 200 stream.
pub(crate) fn stream_error(kind: &str, message: &str) -> Bytes {
    ev(
        "error",
        obj! { "type": "error", "error": obj! { "type": kind, "message": message } },
    )
}

/// Events of a stream that open it (before any content).
pub(crate) const OPENING_EVENTS: usize = 2;

/// `{"type":"error","error":{"type":T,"message":M},"request_id":R}`
pub(crate) fn error(kind: &str, message: &str, request_id: &str) -> Vec<u8> {
    obj! {
        "type": "error",
        "error": obj! { "type": kind, "message": message },
        "request_id": request_id,
    }
    .to_vec()
}
