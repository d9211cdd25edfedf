//! OpenAI Chat Completions: `chat.completion.chunk`s (role delta, content deltas,
//! `tool_calls` deltas with index/id/name then argument pieces, finish chunk, the
//! usage-only chunk with `choices: []` when `include_usage`), then `data: [DONE]`.

use bytes::Bytes;

use super::{sse, Ctx};
use crate::json::{obj, J};
use crate::plan::{split_args, split_text, Plan};
use crate::usage::Usage;

pub(crate) fn usage(u: &Usage) -> J {
    obj! {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
        "prompt_tokens_details": obj! {
            "cached_tokens": u.cache_read_input_tokens,
            "audio_tokens": 0u64,
        },
        "completion_tokens_details": obj! {
            "reasoning_tokens": u.reasoning_tokens,
            "audio_tokens": 0u64,
            "accepted_prediction_tokens": 0u64,
            "rejected_prediction_tokens": 0u64,
        },
    }
}

pub(crate) fn stream(p: &Plan, ctx: &Ctx) -> Vec<Bytes> {
    let id = format!("chatcmpl-{}", ctx.ids.hex(20));
    let chunk = |choices: Vec<J>, usage: Option<J>| -> Bytes {
        let mut fields = vec![
            ("id", J::from(&id)),
            ("object", J::from("chat.completion.chunk")),
            ("created", J::from(ctx.created)),
            ("model", J::from(ctx.model)),
            ("system_fingerprint", J::from("fp_fake")),
            ("choices", J::A(choices)),
        ];
        if ctx.include_usage {
            fields.push(("usage", usage.unwrap_or(J::Null)));
        }
        sse(None, &J::O(fields))
    };
    let choice = |delta: J, finish: Option<&str>| -> Vec<J> {
        vec![obj! { "index": 0usize, "delta": delta, "logprobs": (), "finish_reason": finish }]
    };
    let first_content = if p.text.is_some() || p.calls.is_empty() {
        J::from("")
    } else {
        J::Null
    };
    let mut out = vec![chunk(
        choice(
            obj! { "role": "assistant", "content": first_content, "refusal": () },
            None,
        ),
        None,
    )];
    if let Some(t) = &p.text {
        for piece in split_text(t, p.delta_bytes) {
            out.push(chunk(choice(obj! { "content": piece }, None), None));
        }
    }
    for (k, c) in p.calls.iter().enumerate() {
        out.push(chunk(
            choice(
                obj! { "tool_calls": vec![obj! {
                    "index": k,
                    "id": format!("call_{}", c.n),
                    "type": "function",
                    "function": obj! { "name": &c.name, "arguments": "" },
                }] },
                None,
            ),
            None,
        ));
        let args = c.arguments();
        for piece in split_args(&args) {
            out.push(chunk(
                choice(
                    obj! { "tool_calls": vec![obj! {
                        "index": k,
                        "function": obj! { "arguments": piece },
                    }] },
                    None,
                ),
                None,
            ));
        }
    }
    out.push(chunk(choice(obj! {}, Some(p.stop.chat())), None));
    if ctx.include_usage {
        out.push(chunk(Vec::new(), Some(usage(&p.usage))));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

pub(crate) fn json(p: &Plan, ctx: &Ctx) -> Vec<u8> {
    let mut message = vec![
        ("role", J::from("assistant")),
        ("content", J::from(p.text.clone())),
        ("refusal", J::Null),
    ];
    if !p.calls.is_empty() {
        let calls = p
            .calls
            .iter()
            .map(|c| {
                obj! {
                    "id": format!("call_{}", c.n),
                    "type": "function",
                    "function": obj! { "name": &c.name, "arguments": c.arguments() },
                }
            })
            .collect::<Vec<J>>();
        message.push(("tool_calls", J::A(calls)));
    }
    obj! {
        "id": format!("chatcmpl-{}", ctx.ids.hex(20)),
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": vec![obj! {
            "index": 0usize,
            "message": J::O(message),
            "logprobs": (),
            "finish_reason": p.stop.chat(),
        }],
        "usage": usage(&p.usage),
        "system_fingerprint": "fp_fake",
    }
    .to_vec()
}

/// `{"error":{"message":M,"type":T,"param":P,"code":C}}` (also used for Responses).
pub(crate) fn error(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Vec<u8> {
    obj! {
        "error": obj! {
            "message": message,
            "type": kind,
            "param": param,
            "code": code,
        },
    }
    .to_vec()
}

/// An error chunk inside a 200 stream (`data: {"error": {...}}`).
pub(crate) fn stream_error(code: &str, message: &str) -> Bytes {
    sse(
        None,
        &obj! { "error": obj! { "message": message, "type": "invalid_request_error", "param": (), "code": code } },
    )
}
