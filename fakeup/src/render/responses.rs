//! OpenAI Responses: `response.created`, `response.in_progress`, per output item
//! `output_item.added` … `output_item.done` (reasoning summary, message with
//! `content_part`/`output_text` events, `function_call` with
//! `function_call_arguments.delta/done`, `custom_tool_call` with `custom_tool_call_input`),
//! then `response.completed` (or `response.incomplete`) carrying the usage. Every event
//! has a `sequence_number`.

use bytes::Bytes;

use super::{sse, Ctx};
use crate::json::{obj, J};
use crate::plan::{split_args, split_text, Plan, Stop};
use crate::usage::Usage;

fn usage(u: &Usage) -> J {
    obj! {
        "input_tokens": u.input_tokens,
        "input_tokens_details": obj! { "cached_tokens": u.cache_read_input_tokens },
        "output_tokens": u.output_tokens,
        "output_tokens_details": obj! { "reasoning_tokens": u.reasoning_tokens },
        "total_tokens": u.input_tokens + u.output_tokens,
    }
}

struct Seq {
    n: u64,
    out: Vec<Bytes>,
}

impl Seq {
    /// Emits `{"type": name, "sequence_number": n, ...fields}`.
    fn emit(&mut self, name: &'static str, fields: Vec<(&'static str, J)>) {
        let mut all = vec![("type", J::from(name)), ("sequence_number", J::U(self.n))];
        all.extend(fields);
        self.n += 1;
        self.out.push(sse(Some(name), &J::O(all)));
    }
}

fn response_obj(id: &str, ctx: &Ctx, status: &str, output: Vec<J>, u: Option<&Usage>) -> J {
    let mut fields = vec![
        ("id", J::from(id)),
        ("object", J::from("response")),
        ("created_at", J::from(ctx.created)),
        ("status", J::from(status)),
        ("model", J::from(ctx.model)),
        ("output", J::A(output)),
        ("usage", u.map_or(J::Null, usage)),
    ];
    if status == "incomplete" {
        fields.push(("incomplete_details", obj! { "reason": "max_output_tokens" }));
    }
    J::O(fields)
}

/// Output items as they are when done, with their ids.
struct Items {
    done: Vec<J>,
    ids: Vec<String>,
}

fn items(p: &Plan, ctx: &Ctx) -> Items {
    let mut done = Vec::new();
    let mut ids = Vec::new();
    if let Some(t) = &p.thinking {
        let id = format!("rs_{}", ctx.ids.hex(20));
        done.push(obj! {
            "id": &id,
            "type": "reasoning",
            "summary": vec![obj! { "type": "summary_text", "text": t }],
            "encrypted_content": &p.signature,
        });
        ids.push(id);
    }
    if let Some(t) = &p.text {
        let id = format!("msg_{}", ctx.ids.hex(20));
        done.push(obj! {
            "id": &id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": vec![obj! { "type": "output_text", "text": t, "annotations": Vec::<J>::new() }],
        });
        ids.push(id);
    }
    for c in &p.calls {
        if c.custom {
            let id = format!("ctc_{}", ctx.ids.hex(20));
            done.push(obj! {
                "id": &id,
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": format!("call_{}", c.n),
                "name": &c.name,
                "input": c.arguments(),
            });
            ids.push(id);
        } else {
            let id = format!("fc_{}", ctx.ids.hex(20));
            done.push(obj! {
                "id": &id,
                "type": "function_call",
                "status": "completed",
                "call_id": format!("call_{}", c.n),
                "name": &c.name,
                "arguments": c.arguments(),
            });
            ids.push(id);
        }
    }
    Items { done, ids }
}

fn final_status(p: &Plan) -> &'static str {
    if p.stop == Stop::MaxTokens {
        "incomplete"
    } else {
        "completed"
    }
}

/// A new response id and the stream's first two events.
fn started(ctx: &Ctx) -> (String, Seq) {
    let resp_id = format!("resp_{}", ctx.ids.hex(24));
    let mut s = Seq {
        n: 0,
        out: Vec::new(),
    };
    let start = response_obj(&resp_id, ctx, "in_progress", Vec::new(), None);
    s.emit("response.created", vec![("response", start.clone())]);
    s.emit("response.in_progress", vec![("response", start)]);
    (resp_id, s)
}

pub(crate) fn stream(p: &Plan, ctx: &Ctx) -> Vec<Bytes> {
    let (resp_id, mut s) = started(ctx);
    let Items { done, ids } = items(p, ctx);
    let mut k = 0usize;
    let mut calls = p.calls.iter();
    if let Some(t) = &p.thinking {
        let id = &ids[k];
        s.emit(
            "response.output_item.added",
            vec![
                ("output_index", J::from(k)),
                (
                    "item",
                    obj! { "id": id, "type": "reasoning", "summary": Vec::<J>::new() },
                ),
            ],
        );
        let common = |extra: Vec<(&'static str, J)>| -> Vec<(&'static str, J)> {
            let mut f = vec![
                ("item_id", J::from(id)),
                ("output_index", J::from(k)),
                ("summary_index", J::U(0)),
            ];
            f.extend(extra);
            f
        };
        s.emit(
            "response.reasoning_summary_part.added",
            common(vec![("part", obj! { "type": "summary_text", "text": "" })]),
        );
        for piece in split_text(t, p.delta_bytes) {
            s.emit(
                "response.reasoning_summary_text.delta",
                common(vec![("delta", J::from(piece))]),
            );
        }
        s.emit(
            "response.reasoning_summary_text.done",
            common(vec![("text", J::from(t))]),
        );
        s.emit(
            "response.reasoning_summary_part.done",
            common(vec![("part", obj! { "type": "summary_text", "text": t })]),
        );
        s.emit(
            "response.output_item.done",
            vec![("output_index", J::from(k)), ("item", done[k].clone())],
        );
        k += 1;
    }
    if let Some(t) = &p.text {
        let id = &ids[k];
        s.emit(
            "response.output_item.added",
            vec![
                ("output_index", J::from(k)),
                (
                    "item",
                    obj! {
                        "id": id,
                        "type": "message",
                        "status": "in_progress",
                        "role": "assistant",
                        "content": Vec::<J>::new(),
                    },
                ),
            ],
        );
        let common = |extra: Vec<(&'static str, J)>| -> Vec<(&'static str, J)> {
            let mut f = vec![
                ("item_id", J::from(id)),
                ("output_index", J::from(k)),
                ("content_index", J::U(0)),
            ];
            f.extend(extra);
            f
        };
        let part = |text: &str| obj! { "type": "output_text", "text": text, "annotations": Vec::<J>::new() };
        s.emit(
            "response.content_part.added",
            common(vec![("part", part(""))]),
        );
        for piece in split_text(t, p.delta_bytes) {
            s.emit(
                "response.output_text.delta",
                common(vec![("delta", J::from(piece))]),
            );
        }
        s.emit(
            "response.output_text.done",
            common(vec![("text", J::from(t))]),
        );
        s.emit(
            "response.content_part.done",
            common(vec![("part", part(t))]),
        );
        s.emit(
            "response.output_item.done",
            vec![("output_index", J::from(k)), ("item", done[k].clone())],
        );
        k += 1;
    }
    while k < done.len() {
        let Some(c) = calls.next() else { break };
        let id = &ids[k];
        let args = c.arguments();
        let (added, delta_ev, done_ev, key) = if c.custom {
            (
                obj! {
                    "id": id,
                    "type": "custom_tool_call",
                    "status": "in_progress",
                    "call_id": format!("call_{}", c.n),
                    "name": &c.name,
                    "input": "",
                },
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "input",
            )
        } else {
            (
                obj! {
                    "id": id,
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": format!("call_{}", c.n),
                    "name": &c.name,
                    "arguments": "",
                },
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "arguments",
            )
        };
        s.emit(
            "response.output_item.added",
            vec![("output_index", J::from(k)), ("item", added)],
        );
        for piece in split_args(&args) {
            s.emit(
                delta_ev,
                vec![
                    ("item_id", J::from(id)),
                    ("output_index", J::from(k)),
                    ("delta", J::from(piece)),
                ],
            );
        }
        s.emit(
            done_ev,
            vec![
                ("item_id", J::from(id)),
                ("output_index", J::from(k)),
                (key, J::from(&args)),
            ],
        );
        s.emit(
            "response.output_item.done",
            vec![("output_index", J::from(k)), ("item", done[k].clone())],
        );
        k += 1;
    }
    let status = final_status(p);
    let last = response_obj(&resp_id, ctx, status, done, Some(&p.usage));
    let name = if status == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    s.emit(name, vec![("response", last)]);
    s.out
}

pub(crate) fn json(p: &Plan, ctx: &Ctx) -> Vec<u8> {
    let resp_id = format!("resp_{}", ctx.ids.hex(24));
    let Items { done, .. } = items(p, ctx);
    response_obj(&resp_id, ctx, final_status(p), done, Some(&p.usage)).to_vec()
}

/// Events of a stream that open it (`response.created`, `response.in_progress`).
pub(crate) const OPENING_EVENTS: usize = 2;

/// `response.failed` as event number `n` of a stream: status `failed`, the
/// error's `code` and `message`, no usage (the shape Codex reads).
pub(crate) fn failed(n: u64, ctx: &Ctx, code: &str, message: &str) -> Bytes {
    let resp_id = format!("resp_{}", ctx.ids.hex(24));
    let mut r = response_obj(&resp_id, ctx, "failed", Vec::new(), None);
    if let J::O(fields) = &mut r {
        fields.push(("error", obj! { "code": code, "message": message }));
    }
    sse(
        Some("response.failed"),
        &J::O(vec![
            ("type", J::from("response.failed")),
            ("sequence_number", J::U(n)),
            ("response", r),
        ]),
    )
}

/// A stream that fails right after its opening events.
pub(crate) fn failed_stream(ctx: &Ctx, code: &str, message: &str) -> Vec<Bytes> {
    let (_, s) = started(ctx);
    let mut out = s.out;
    out.push(failed(out.len() as u64, ctx, code, message));
    out
}

/// V2 compaction answer, streamed: one `compaction` output item, then `response.completed`.
pub(crate) fn compaction_stream(item: J, ctx: &Ctx, u: &Usage) -> Vec<Bytes> {
    let (resp_id, mut s) = started(ctx);
    s.emit(
        "response.output_item.added",
        vec![("output_index", J::U(0)), ("item", item.clone())],
    );
    s.emit(
        "response.output_item.done",
        vec![("output_index", J::U(0)), ("item", item.clone())],
    );
    let last = response_obj(&resp_id, ctx, "completed", vec![item], Some(u));
    s.emit("response.completed", vec![("response", last)]);
    s.out
}

/// V2 compaction answer as one JSON response.
pub(crate) fn compaction_json(item: J, ctx: &Ctx, u: &Usage) -> Vec<u8> {
    let resp_id = format!("resp_{}", ctx.ids.hex(24));
    response_obj(&resp_id, ctx, "completed", vec![item], Some(u)).to_vec()
}

/// V1 `POST /v1/responses/compact`: the `response.compaction` object.
pub(crate) fn compacted(output: Vec<J>, ctx: &Ctx, u: &Usage) -> Vec<u8> {
    obj! {
        "id": format!("resp_{}", ctx.ids.hex(24)),
        "object": "response.compaction",
        "created_at": ctx.created,
        "output": output,
        "usage": usage(u),
    }
    .to_vec()
}
