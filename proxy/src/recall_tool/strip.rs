//! An answer without its `oceancode_recall` calls, for the client: whole
//! SSE events or the JSON body, the calls' events left out, the other
//! blocks' indexes renumbered, the stop reason a client expects when no
//! tool call is left, and no auto-mode verdict (`safeguard_results`,
//! Claude Code) for a call the client never sees. Unchanged events keep
//! their bytes. Pure.

use super::spec::NAME;
use oceancode_window::Dialect;
use serde_json::Value;
use std::collections::BTreeSet;

/// `bytes` without the recall calls: SSE when `sse`, else a JSON body.
/// `client_calls`: tool calls of the client's left in the answer.
pub fn strip(d: Dialect, sse: bool, bytes: &[u8], client_calls: usize) -> Vec<u8> {
    if !sse {
        let Ok(mut v) = serde_json::from_slice::<Value>(bytes) else {
            return bytes.to_vec();
        };
        strip_json(d, &mut v, client_calls);
        return v.to_string().into_bytes();
    }
    let mut s = Stripper {
        d,
        dropped: BTreeSet::new(),
        dropped_ids: BTreeSet::new(),
        client_calls,
    };
    let mut out = Vec::with_capacity(bytes.len());
    for raw in events(bytes) {
        match s.event(raw) {
            Keep::As => out.extend_from_slice(raw),
            Keep::Drop => {}
            Keep::New(text) => out.extend_from_slice(text.as_bytes()),
        }
    }
    out
}

/// The raw events of an SSE stream, each with its terminating blank line.
fn events(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let end = if bytes[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else if bytes[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else {
            None
        };
        if let Some(e) = end {
            out.push(&bytes[start..e]);
            start = e;
            i = e;
        } else {
            i += 1;
        }
    }
    if start < bytes.len() {
        out.push(&bytes[start..]);
    }
    out
}

enum Keep {
    As,
    Drop,
    New(String),
}

struct Stripper {
    d: Dialect,
    /// Indexes of the recall calls (content block, tool call or output item).
    dropped: BTreeSet<u64>,
    /// Ids of the recall calls (Anthropic: what a verdict names).
    dropped_ids: BTreeSet<String>,
    client_calls: usize,
}

/// `safeguard_results` without the verdicts on `ids` (each result's
/// `status.tool_uses`); whether anything was removed.
fn drop_verdicts(results: &mut Value, ids: &BTreeSet<String>) -> bool {
    let mut changed = false;
    for r in results.as_array_mut().into_iter().flatten() {
        if let Some(m) = r
            .pointer_mut("/status/tool_uses")
            .and_then(Value::as_object_mut)
        {
            for id in ids {
                changed |= m.remove(id).is_some();
            }
        }
    }
    changed
}

impl Stripper {
    fn event(&mut self, raw: &[u8]) -> Keep {
        let text = String::from_utf8_lossy(raw);
        let mut name = String::new();
        let mut data = Vec::new();
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        let data = data.join("\n");
        let Ok(mut v) = serde_json::from_str::<Value>(&data) else {
            return Keep::As;
        };
        let changed = match self.d {
            Dialect::Anthropic => self.anthropic(&mut v),
            Dialect::OpenaiChat => self.chat(&mut v),
            Dialect::OpenaiResponses => self.responses(&mut v),
            Dialect::Gemini => crate::dialect::gemini::strip_calls(&mut v, NAME),
        };
        match changed {
            None => Keep::Drop,
            Some(false) => Keep::As,
            Some(true) => {
                let mut s = String::new();
                if !name.is_empty() {
                    s.push_str("event: ");
                    s.push_str(&name);
                    s.push('\n');
                }
                s.push_str("data: ");
                s.push_str(&v.to_string());
                s.push_str("\n\n");
                Keep::New(s)
            }
        }
    }

    /// The index an event's own index becomes (None: one of the dropped).
    fn renumber(&self, i: u64) -> Option<u64> {
        if self.dropped.contains(&i) {
            return None;
        }
        Some(i - self.dropped.range(..i).count() as u64)
    }

    /// None = drop the event; Some(changed).
    fn anthropic(&mut self, v: &mut Value) -> Option<bool> {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if ty == "content_block_start"
            && v.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use")
            && v.pointer("/content_block/name").and_then(Value::as_str) == Some(NAME)
        {
            if let Some(i) = v.get("index").and_then(Value::as_u64) {
                self.dropped.insert(i);
            }
            if let Some(id) = v.pointer("/content_block/id").and_then(Value::as_str) {
                self.dropped_ids.insert(id.to_string());
            }
            return None;
        }
        if ty == "message_delta" {
            let mut changed = false;
            if self.client_calls == 0 && !self.dropped.is_empty() {
                if let Some(r) = v.pointer_mut("/delta/stop_reason") {
                    if r == "tool_use" {
                        *r = Value::from("end_turn");
                        changed = true;
                    }
                }
            }
            if let Some(r) = v.pointer_mut("/delta/safeguard_results") {
                changed |= drop_verdicts(r, &self.dropped_ids);
            }
            return Some(changed);
        }
        let Some(i) = v.get("index").and_then(Value::as_u64) else {
            return Some(false);
        };
        let n = self.renumber(i)?;
        if n == i {
            return Some(false);
        }
        v["index"] = Value::from(n);
        Some(true)
    }

    fn chat(&mut self, v: &mut Value) -> Option<bool> {
        let mut changed = false;
        let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) else {
            return Some(false);
        };
        for ch in choices.iter_mut() {
            if let Some(calls) = ch
                .pointer_mut("/delta/tool_calls")
                .and_then(Value::as_array_mut)
            {
                for c in calls.iter() {
                    if c.pointer("/function/name").and_then(Value::as_str) == Some(NAME) {
                        if let Some(i) = c.get("index").and_then(Value::as_u64) {
                            self.dropped.insert(i);
                        }
                    }
                }
                let before = calls.len();
                let mut kept = Vec::with_capacity(before);
                for mut c in std::mem::take(calls) {
                    let Some(i) = c.get("index").and_then(Value::as_u64) else {
                        kept.push(c);
                        continue;
                    };
                    let Some(n) = self.renumber(i) else {
                        changed = true;
                        continue;
                    };
                    if n != i {
                        c["index"] = Value::from(n);
                        changed = true;
                    }
                    kept.push(c);
                }
                let empty = kept.is_empty();
                *calls = kept;
                if empty && before > 0 {
                    if let Some(delta) = ch.get_mut("delta").and_then(Value::as_object_mut) {
                        delta.remove("tool_calls");
                    }
                }
            }
            if self.client_calls == 0 && !self.dropped.is_empty() {
                if let Some(r) = ch.get_mut("finish_reason") {
                    if r == "tool_calls" {
                        *r = Value::from("stop");
                        changed = true;
                    }
                }
            }
        }
        Some(changed)
    }

    fn responses(&mut self, v: &mut Value) -> Option<bool> {
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if ty == "response.output_item.added" && is_recall_item(v.get("item")) {
            if let Some(i) = v.get("output_index").and_then(Value::as_u64) {
                self.dropped.insert(i);
            }
            return None;
        }
        let mut changed = false;
        if let Some(resp) = v.get_mut("response") {
            changed |= filter_output(resp);
        }
        if let Some(i) = v.get("output_index").and_then(Value::as_u64) {
            let n = self.renumber(i)?;
            if n != i {
                v["output_index"] = Value::from(n);
                changed = true;
            }
        }
        Some(changed)
    }
}

fn is_recall_item(item: Option<&Value>) -> bool {
    item.is_some_and(|i| {
        i.get("type").and_then(Value::as_str) == Some("function_call")
            && i.get("name").and_then(Value::as_str) == Some(NAME)
    })
}

/// A Responses `response` object without its recall items.
fn filter_output(resp: &mut Value) -> bool {
    let Some(out) = resp.get_mut("output").and_then(Value::as_array_mut) else {
        return false;
    };
    let before = out.len();
    out.retain(|i| !is_recall_item(Some(i)));
    out.len() != before
}

fn strip_json(d: Dialect, v: &mut Value, client_calls: usize) {
    match d {
        Dialect::Anthropic => {
            let mut ids = BTreeSet::new();
            if let Some(c) = v.get_mut("content").and_then(Value::as_array_mut) {
                c.retain(|b| {
                    let recall = b.get("type").and_then(Value::as_str) == Some("tool_use")
                        && b.get("name").and_then(Value::as_str) == Some(NAME);
                    if let (true, Some(id)) = (recall, b.get("id").and_then(Value::as_str)) {
                        ids.insert(id.to_string());
                    }
                    !recall
                });
            }
            if let Some(r) = v.get_mut("safeguard_results") {
                drop_verdicts(r, &ids);
            }
            if client_calls == 0 && v.get("stop_reason").and_then(Value::as_str) == Some("tool_use")
            {
                v["stop_reason"] = Value::from("end_turn");
            }
        }
        Dialect::OpenaiChat => {
            for ch in v
                .get_mut("choices")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(m) = ch.get_mut("message").and_then(Value::as_object_mut) {
                    if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                        calls.retain(|c| {
                            c.pointer("/function/name").and_then(Value::as_str) != Some(NAME)
                        });
                        if calls.is_empty() {
                            m.remove("tool_calls");
                        }
                    }
                }
                if client_calls == 0
                    && ch.get("finish_reason").and_then(Value::as_str) == Some("tool_calls")
                {
                    ch["finish_reason"] = Value::from("stop");
                }
            }
        }
        Dialect::OpenaiResponses => {
            filter_output(v);
        }
        Dialect::Gemini => {
            crate::dialect::gemini::strip_calls(v, NAME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(name: &str, v: Value) -> String {
        format!("event: {name}\ndata: {v}\n\n")
    }

    /// Claude Code's auto mode: the verdict on a recall call the client
    /// never sees leaves with it; the client's calls keep theirs.
    #[test]
    fn auto_mode_verdicts_on_recall_calls_leave_with_them() {
        let results = json!([{"type":"dangerous_tool_use","status":{"type":"available","tool_uses":{
            "t1":{"type":"evaluated","outcome":"not_flagged"},
            "t2":{"type":"evaluated","outcome":"not_flagged"}}}}]);
        let s = [
            ev("message_start", json!({"type":"message_start","message":{}})),
            ev("content_block_start", json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":NAME,"input":{}}})),
            ev("content_block_stop", json!({"type":"content_block_stop","index":0})),
            ev("content_block_start", json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t2","name":"Bash","input":{}}})),
            ev("content_block_stop", json!({"type":"content_block_stop","index":1})),
            ev("message_delta", json!({"type":"message_delta","delta":{"stop_reason":"tool_use","safeguard_results":results}})),
            ev("message_stop", json!({"type":"message_stop"})),
        ]
        .concat();
        let out = String::from_utf8(strip(Dialect::Anthropic, true, s.as_bytes(), 1)).unwrap();
        let delta = out
            .split("\n\n")
            .find(|e| e.contains("message_delta"))
            .and_then(|e| e.split("data: ").nth(1))
            .unwrap();
        let v: Value = serde_json::from_str(delta).unwrap();
        assert_eq!(
            v["delta"]["safeguard_results"][0]["status"]["tool_uses"],
            json!({"t2":{"type":"evaluated","outcome":"not_flagged"}})
        );
        let body = json!({"content":[
            {"type":"tool_use","id":"t1","name":NAME,"input":{}},
            {"type":"tool_use","id":"t2","name":"Bash","input":{}}],
            "stop_reason":"tool_use","safeguard_results":results});
        let out: Value = serde_json::from_slice(&strip(
            Dialect::Anthropic,
            false,
            body.to_string().as_bytes(),
            1,
        ))
        .unwrap();
        assert_eq!(
            out["safeguard_results"][0]["status"]["tool_uses"],
            json!({"t2":{"type":"evaluated","outcome":"not_flagged"}})
        );
        // No recall call: the stream is the upstream's, byte for byte.
        let plain = [
            ev("message_start", json!({"type":"message_start","message":{}})),
            ev("message_delta", json!({"type":"message_delta","delta":{"stop_reason":"tool_use","safeguard_results":results}})),
        ]
        .concat();
        assert_eq!(
            strip(Dialect::Anthropic, true, plain.as_bytes(), 1),
            plain.as_bytes()
        );
    }

    #[test]
    fn an_anthropic_stream_loses_the_recall_block_and_renumbers_the_next() {
        let s = [
            ev("message_start", json!({"type":"message_start","message":{}})),
            ev("content_block_start", json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t1","name":NAME,"input":{}}})),
            ev("content_block_delta", json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}})),
            ev("content_block_stop", json!({"type":"content_block_stop","index":0})),
            ev("content_block_start", json!({"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t2","name":"Bash","input":{}}})),
            ev("content_block_stop", json!({"type":"content_block_stop","index":1})),
            ev("message_delta", json!({"type":"message_delta","delta":{"stop_reason":"tool_use"}})),
            ev("message_stop", json!({"type":"message_stop"})),
        ]
        .concat();
        let out =
            String::from_utf8(strip(Dialect::Anthropic, true, s.as_bytes(), 1)).unwrap_or_default();
        assert!(!out.contains(NAME));
        assert!(
            out.contains(r#""index":0"#) && out.contains(r#""id":"t2""#),
            "{out}"
        );
        assert!(!out.contains(r#""index":1"#), "{out}");
        assert!(
            out.contains(r#""stop_reason":"tool_use""#),
            "a client call is left: {out}"
        );
        let only = strip(Dialect::Anthropic, true, s.as_bytes(), 0);
        assert!(String::from_utf8_lossy(&only).contains("end_turn"));
    }

    #[test]
    fn a_chat_json_answer_loses_the_recall_call() {
        let body = json!({"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"c1","type":"function","function":{"name":NAME,"arguments":"{}"}}]},"finish_reason":"tool_calls"}]});
        let out: Value = serde_json::from_slice(&strip(
            Dialect::OpenaiChat,
            false,
            body.to_string().as_bytes(),
            0,
        ))
        .unwrap_or_default();
        assert!(out["choices"][0]["message"].get("tool_calls").is_none());
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn a_responses_stream_loses_the_recall_item_everywhere() {
        let item = json!({"type":"function_call","call_id":"c1","name":NAME,"arguments":"{}"});
        let msg = json!({"type":"message","role":"assistant","content":[]});
        let s = [
            ev(
                "response.output_item.added",
                json!({"type":"response.output_item.added","output_index":0,"item":item}),
            ),
            ev(
                "response.output_item.done",
                json!({"type":"response.output_item.done","output_index":0,"item":item}),
            ),
            ev(
                "response.output_item.added",
                json!({"type":"response.output_item.added","output_index":1,"item":msg}),
            ),
            ev(
                "response.completed",
                json!({"type":"response.completed","response":{"output":[item, msg]}}),
            ),
        ]
        .concat();
        let out = String::from_utf8(strip(Dialect::OpenaiResponses, true, s.as_bytes(), 0))
            .unwrap_or_default();
        assert!(!out.contains(NAME), "{out}");
        assert!(out.contains(r#""output_index":0"#), "{out}");
    }
}
