//! `follow_pointer`: a scripted tool call made from what the request holds,
//! so a fixed script can play an agent that follows a `ledger.compress`
//! pointer back to the original tool output.
//!
//! The proxy sends an old tool output as one line
//! `[pruned tool output: seq N · T tokens · transcript/0007.md lines A–B · oceancode-proxy recall entry N]`,
//! the path relative to the session directory its tideline stub names
//! (`… The verbatim record is <dir>/transcript/ (one file per turn) …`).
//! [`follow`] finds the newest such pointer (the last in the conversation)
//! and the stub's directory, and fills a tool call's input template:
//! `{file}` (the absolute path: `<dir>/transcript/0007.md`), `{path}` (as the
//! pointer names it), `{dir}`, `{from}` (A), `{to}` (B), `{count}`
//! (B − A + 1), `{seq}` (N), `{tokens}` (T). A string that is exactly
//! `"{from}"`, `"{to}"`, `"{count}"`, `"{seq}"` or `"{tokens}"` becomes a
//! number (Claude Code's `Read` wants `offset`/`limit` as numbers). With
//! `fresh`, pointers an earlier reply followed are skipped.

use serde_json::Value;

use std::collections::HashSet;

use crate::script::{FollowPointer, Reply, ToolCall, NO_POINTER_TEXT};

/// The head of a compress pointer line.
const POINTER_HEAD: &str = "[pruned tool output: seq ";
/// What precedes the session directory in the tideline stub.
const STUB_DIR_HEAD: &str = "The verbatim record is ";
/// What follows it.
const STUB_DIR_TAIL: &str = "/transcript/";

/// One compress pointer with its line range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pointer {
    /// The whole line.
    pub text: String,
    pub seq: u64,
    pub tokens: u64,
    /// The transcript file, relative to the session directory.
    pub path: String,
    pub from: u64,
    pub to: u64,
}

/// Parses one pointer line (None: not a pointer, or one without lines).
pub(crate) fn parse(text: &str) -> Option<Pointer> {
    let rest = text.strip_prefix(POINTER_HEAD)?.strip_suffix(']')?;
    let mut fields = rest.split(" · ");
    let seq = fields.next()?.parse().ok()?;
    let tokens = fields.next()?.strip_suffix(" tokens")?.parse().ok()?;
    let (path, lines) = fields.next()?.split_once(" lines ")?;
    let (from, to) = lines.split_once('–')?;
    let (from, to): (u64, u64) = (from.parse().ok()?, to.parse().ok()?);
    fields
        .next()?
        .strip_prefix("oceancode-proxy recall entry ")?;
    (from >= 1 && to >= from).then(|| Pointer {
        text: text.to_string(),
        seq,
        tokens,
        path: path.to_string(),
        from,
        to,
    })
}

/// Every string inside `v`, in document order (arrays in order; an
/// object's members in the order serde_json keeps them).
fn strings<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(m) => m.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// The conversation of a request body: Anthropic and Chat `messages`,
/// Responses `input`.
fn conversation(body: &Value) -> Vec<&str> {
    let mut out = Vec::new();
    for key in ["messages", "input"] {
        if let Some(v) = body.get(key) {
            strings(v, &mut out);
        }
    }
    out
}

/// The newest pointer with a line range in the request's conversation
/// whose text is not in `skip`.
pub(crate) fn newest(body: &Value, skip: &HashSet<String>) -> Option<Pointer> {
    conversation(body)
        .into_iter()
        .rev()
        .filter(|s| !skip.contains(*s))
        .find_map(parse)
}

/// The session directory the tideline stub names (anywhere in the body).
pub(crate) fn session_dir(body: &Value) -> Option<String> {
    let mut all = Vec::new();
    strings(body, &mut all);
    all.into_iter().find_map(|s| {
        let at = s.find(STUB_DIR_HEAD)? + STUB_DIR_HEAD.len();
        let rest = &s[at..];
        let end = rest.find(STUB_DIR_TAIL)?;
        (end > 0).then(|| rest[..end].to_string())
    })
}

/// The call `template` made from the newest pointer of `body` (with
/// `fresh`, the newest not in `followed`) and the stub's directory, and the
/// pointer's text; None when the request holds no such pointer or no stub
/// naming a directory.
pub(crate) fn follow(
    body: &Value,
    template: &FollowPointer,
    followed: &HashSet<String>,
) -> Option<(ToolCall, String)> {
    let none = HashSet::new();
    let p = newest(body, if template.fresh { followed } else { &none })?;
    let dir = session_dir(body)?;
    let file = format!("{dir}/{}", p.path);
    let call = ToolCall {
        name: template.name.clone(),
        input: fill(&template.input, &p, &dir, &file),
        custom: template.custom,
    };
    Some((call, p.text))
}

/// `reply` with its `follow_pointer` made a concrete tool call for the
/// request `body` (appended to its calls; the pointer goes into
/// `followed`), or, with nothing to follow, without it and with the text
/// [`NO_POINTER_TEXT`].
pub(crate) fn resolve(mut reply: Reply, body: &[u8], followed: &mut HashSet<String>) -> Reply {
    let Some(template) = reply.follow_pointer.take() else {
        return reply;
    };
    let call = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| follow(&v, &template, followed));
    match call {
        Some((call, pointer)) => {
            reply.tool_calls.push(call);
            followed.insert(pointer);
        }
        None => reply.text = Some(NO_POINTER_TEXT.to_string()),
    }
    reply
}

fn fill(v: &Value, p: &Pointer, dir: &str, file: &str) -> Value {
    match v {
        Value::String(s) => {
            let number = match s.as_str() {
                "{from}" => Some(p.from),
                "{to}" => Some(p.to),
                "{count}" => Some(p.to - p.from + 1),
                "{seq}" => Some(p.seq),
                "{tokens}" => Some(p.tokens),
                _ => None,
            };
            match number {
                Some(n) => Value::from(n),
                None => Value::String(
                    s.replace("{file}", file)
                        .replace("{path}", &p.path)
                        .replace("{dir}", dir)
                        .replace("{from}", &p.from.to_string())
                        .replace("{to}", &p.to.to_string())
                        .replace("{count}", &(p.to - p.from + 1).to_string())
                        .replace("{seq}", &p.seq.to_string())
                        .replace("{tokens}", &p.tokens.to_string()),
                ),
            }
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| fill(x, p, dir, file)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), fill(x, p, dir, file)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const P7: &str = "[pruned tool output: seq 7 · 1234 tokens · transcript/0002.md lines 10–40 · oceancode-proxy recall entry 7]";
    const STUB: &str = "[Earlier content of this session is past the tideline: every row up to seq 3 left this window. The verbatim record is /d/s1/transcript/ (one file per turn) and /d/s1/SESSION.md carries the merged state.]";

    #[test]
    fn parses_a_pointer_with_lines_only() {
        assert_eq!(
            parse(P7),
            Some(Pointer {
                text: P7.into(),
                seq: 7,
                tokens: 1234,
                path: "transcript/0002.md".into(),
                from: 10,
                to: 40
            })
        );
        // The form without a line index, a truncated line, other text: none.
        assert_eq!(parse("[pruned tool output: seq 7 · 1234 tokens · transcript/0002.md · oceancode-proxy recall entry 7]"), None);
        assert_eq!(parse(&P7[..P7.len() - 1]), None);
        assert_eq!(parse("seq 7"), None);
        assert_eq!(
            parse("[pruned tool output: seq 7 · 1 tokens · t.md lines 9–8 · oceancode-proxy recall entry 7]"),
            None,
            "an empty range"
        );
    }

    fn window(pointers: &[&str]) -> Value {
        let mut msgs = vec![json!({"role": "user", "content": [{"type": "text", "text": STUB}]})];
        for (i, p) in pointers.iter().enumerate() {
            msgs.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": format!("t{i}"), "content": p}]}));
        }
        json!({ "messages": msgs })
    }

    #[test]
    fn fills_numbers_and_paths() {
        let p9 = P7.replace("seq 7", "seq 9").replace("10–40", "50–52");
        let no_lines = "[pruned tool output: seq 11 · 9 tokens · transcript/0003.md · oceancode-proxy recall entry 11]";
        let body = window(&[P7, &p9, no_lines]);
        let template = FollowPointer::new(
            "Read",
            json!({"file_path": "{file}", "offset": "{from}", "limit": "{count}",
                   "note": "{seq}:{tokens} {path} {from}-{to} in {dir}", "n": [1, "{to}"]}),
        );
        let (call, text) = follow(&body, &template, &HashSet::new()).expect("a pointer");
        assert_eq!(call.name, "Read");
        assert_eq!(text, p9, "the newest pointer with lines");
        assert_eq!(
            call.input,
            json!({"file_path": "/d/s1/transcript/0002.md", "offset": 50, "limit": 3,
                   "note": "9:1234 transcript/0002.md 50-52 in /d/s1", "n": [1, 52]})
        );
        // Responses items and a shell command.
        let resp = json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": STUB.replace("/d/s1", "/d/s 2")}]},
            {"type": "function_call_output", "call_id": "c1", "output": P7}
        ]});
        let sed = FollowPointer::new(
            "exec_command",
            json!({"cmd": "sed -n '{from},{to}p' '{file}'"}),
        );
        let (call, _) = follow(&resp, &sed, &HashSet::new()).expect("follow");
        assert_eq!(
            call.input,
            json!({"cmd": "sed -n '10,40p' '/d/s 2/transcript/0002.md'"})
        );
        // No pointer, or no stub: nothing to follow.
        let none = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert!(follow(&none, &sed, &HashSet::new()).is_none());
        let no_stub = json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": P7}]}]});
        assert!(follow(&no_stub, &sed, &HashSet::new()).is_none());
    }

    #[test]
    fn fresh_skips_what_was_followed() {
        let p9 = P7.replace("seq 7", "seq 9");
        let body = serde_json::to_vec(&window(&[P7, &p9])).expect("json");
        let reply = |fresh: bool| {
            let t = FollowPointer::new("Read", json!({"n": "{seq}"}));
            Reply::follow_pointer(if fresh { t.fresh() } else { t })
                .with_tool_call("Bash", json!({}))
        };
        let mut followed = HashSet::new();
        let seq_of = |r: &Reply| r.tool_calls.get(1).map(|c| c.input["n"].clone());
        // Not fresh: the newest, each time (and remembered).
        assert_eq!(
            seq_of(&resolve(reply(false), &body, &mut followed)),
            Some(json!(9))
        );
        assert_eq!(
            seq_of(&resolve(reply(false), &body, &mut followed)),
            Some(json!(9))
        );
        // Fresh: the newest not followed yet, then nothing left (the
        // reply's own calls stay; its text says why).
        let r = resolve(reply(true), &body, &mut followed);
        assert_eq!(seq_of(&r), Some(json!(7)));
        let r = resolve(reply(true), &body, &mut followed);
        assert_eq!(r.tool_calls.len(), 1, "only the Bash call");
        assert_eq!(r.text.as_deref(), Some(NO_POINTER_TEXT));
        assert_eq!(followed.len(), 2);
        // A reply without follow_pointer is left as it is.
        let plain = Reply::text("hi");
        assert_eq!(resolve(plain.clone(), &body, &mut followed), plain);
    }
}
