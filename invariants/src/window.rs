//! The window renderer as a structured input: a random conversation of one
//! dialect (prompts, context-only messages, answers with text, reasoning
//! and parallel tool calls, their results in any order, rewinds, count
//! requests) is sent step by step, as an agent resends it, through the
//! proxy's real path (`SessionManager::prepare`: matching, recording, the
//! tideline's planning in oceancode-window, the dialect's rendering), with
//! cuts at arbitrary points (`tideline now`, a small line and the usage the
//! fake answers report, a too-long retry). Every body it would send
//! upstream must hold:
//!
//! * valid for the dialect, by the fake upstream's validator
//!   (`oceancode_fakeup::validate_conversation`): first message from the
//!   user, every tool call answered, every result after its call;
//! * every call in it answered later in it and every result preceded by its
//!   call (by the dialect's own classification);
//! * a rewritten body has exactly one stub, first in Anthropic, after the
//!   kept system rows in OpenAI; an unchanged body none;
//! * it ends with the request's newest messages as they came (at least the
//!   newest one); the rows kept from before them are the request's own,
//!   byte for byte, each once: system rows and at most one ask (pinned);
//!   a reasoning item is followed by the item that followed it; the other
//!   members of the body are unchanged;
//! * after a `tideline now` that names rows, the next window has its stub.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use oceancode_config::{BlockSpec, LineSpec};
use oceancode_fakeup::Dialect as FakeDialect;
use oceancode_proxy::dialect::{self, Collected, ParsedBody};
use oceancode_proxy::identity::{Identity, ReqKind};
use oceancode_proxy::sessions::{ModelLimits, SessionManager, Settings, Ticket};
use oceancode_window::{Dialect, RowKind, Usage};
use serde_json::{json, Value};
use std::sync::Arc;

/// Steps of one script at most (a script is replayed whole per input).
const MAX_OPS: usize = 48;

/// The stub's first words (`tideline::stub_text`).
const STUB_PREFIX: &str = "[Earlier content of this session is past the tideline";

/// One fuzz input: the dialect, the line, and what the agent does.
#[derive(Arbitrary, Debug)]
pub struct Script {
    dialect: u8,
    line: u8,
    block: u8,
    system: bool,
    ops: Vec<Op>,
}

/// What happens next in the conversation.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Op {
    /// The user asks (after a context-only message when `context`): a request.
    Prompt {
        /// Text size, in 32-byte units.
        size: u8,
        /// Content as a list of text parts rather than a string.
        blocks: bool,
        /// A context-only message (`<system-reminder>`) before it.
        context: bool,
    },
    /// The model answers the pending request: reasoning, text and `calls`
    /// parallel tool calls (mod 4), whose results the client sends back in
    /// an order picked by `order` (a request); no calls ends the turn.
    Answer {
        reasoning: bool,
        text: bool,
        calls: u8,
        order: u8,
        size: u8,
    },
    /// `tideline now` on the session.
    Cut,
    /// The client goes back before one of its prompts (a branch).
    Rewind(u8),
    /// The next answer reports this many input tokens (× 4) instead of the
    /// size of what it was sent.
    Usage(u16),
    /// A `count_tokens` request on the conversation as it is.
    Count,
    /// The pending request's answer is "prompt is too long" (ceiling × 1000
    /// tokens, when given): the single retry's window.
    TooLong(Option<u8>),
}

/// Input: the bytes of a [`Script`] (`arbitrary`).
pub fn check(data: &[u8]) {
    let Ok(script) = Script::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    run(&script);
}

/// Play a script, checking every body sent.
pub fn run(script: &Script) {
    let d = match script.dialect % 3 {
        0 => Dialect::Anthropic,
        1 => Dialect::OpenaiChat,
        _ => Dialect::OpenaiResponses,
    };
    let settings = Settings {
        data_dir: "/nonexistent/oceancode-fuzz".into(),
        line: LineSpec::Tokens(20_000 + u64::from(script.line) * 500),
        block: BlockSpec::PercentOfLine(10.0 + f64::from(script.block % 80)),
        models: Arc::new(|_: &str, _: Option<u64>| ModelLimits {
            context: Some(200_000),
            max_output: Some(8_000),
        }),
        tideline_enabled: true,
        live_window: oceancode_proxy::sessions::LIVE_WINDOW,
        state_tokens: Some(2_000),
    };
    let mut sim = Sim {
        d,
        m: SessionManager::new(settings, Arc::new(|_| {})),
        ident: Identity {
            client_key: Some("name:fuzz".into()),
            client: "unknown",
            context_1m: false,
        },
        msgs: Vec::new(),
        prompts: Vec::new(),
        system: script.system,
        next_id: 0,
        pending: None,
        usage: None,
        session: None,
        expect_stub: false,
        rewound: false,
    };
    if sim.system && d != Dialect::Anthropic {
        let sys = match d {
            Dialect::OpenaiChat => json!({"role": "system", "content": "You are a coding agent."}),
            _ => json!({"type": "message", "role": "developer",
                        "content": [{"type": "input_text", "text": "You are a coding agent."}]}),
        };
        sim.msgs.push(sys.to_string());
    }
    for op in script.ops.iter().take(MAX_OPS) {
        sim.step(*op);
    }
    sim.answer(Vec::new());
}

struct Sim {
    d: Dialect,
    m: SessionManager,
    ident: Identity,
    /// The conversation as the client holds it (raw JSON messages).
    msgs: Vec<String>,
    /// Indices of its prompts (where a rewind may go back to).
    prompts: Vec<usize>,
    system: bool,
    next_id: u32,
    /// The request waiting for its answer.
    pending: Option<(Ticket, usize)>,
    /// Input tokens the next answer reports.
    usage: Option<u64>,
    session: Option<String>,
    /// A `tideline now` named rows: the next window must have its stub.
    expect_stub: bool,
    /// The client went back since its last request.
    rewound: bool,
}

impl Sim {
    fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    fn text(&mut self, what: &str, size: u8) -> String {
        let n = self.id();
        let mut t = format!("{what} {n}.");
        let filler = format!(" {what} {n} goes on");
        while t.len() < usize::from(size) * 32 {
            t.push_str(&filler);
        }
        t
    }

    fn user_text(&self, text: &str, blocks: bool) -> Value {
        match self.d {
            Dialect::Anthropic if blocks => {
                json!({"role": "user", "content": [{"type": "text", "text": text}]})
            }
            Dialect::Anthropic | Dialect::OpenaiChat => json!({"role": "user", "content": text}),
            Dialect::OpenaiResponses => json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": text}]}),
        }
    }

    /// The last message is the model's (or there is none): no request can be pending.
    fn awaiting_user(&self) -> bool {
        self.pending.is_none()
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Prompt {
                size,
                blocks,
                context,
            } => {
                self.answer(Vec::new());
                if context {
                    let n = self.id();
                    let v = self.user_text(
                        &format!("<system-reminder>context {n}</system-reminder>"),
                        blocks,
                    );
                    self.msgs.push(v.to_string());
                }
                let t = self.text("ask", size);
                let v = self.user_text(&t, blocks);
                self.prompts.push(self.msgs.len());
                self.msgs.push(v.to_string());
                self.request();
            }
            Op::Answer {
                reasoning,
                text,
                calls,
                order,
                size,
            } => {
                if self.awaiting_user() {
                    return;
                }
                let calls = usize::from(calls % 4);
                let (items, results) =
                    self.model_turn(reasoning, text || calls == 0, calls, order, size);
                self.answer(items.clone());
                self.msgs.extend(items);
                if !results.is_empty() {
                    self.msgs.extend(results);
                    self.request();
                }
            }
            Op::Cut => {
                if let Some(id) = &self.session {
                    // The next request extends the line that was cut, unless
                    // the client went back since its last request.
                    if let Ok(upto) = self.m.cut_now(id) {
                        self.expect_stub = upto > 0 && !self.rewound;
                    }
                }
            }
            Op::Rewind(k) => {
                self.answer(Vec::new());
                self.expect_stub = false;
                self.rewound = true;
                if self.prompts.is_empty() {
                    return;
                }
                let back = usize::from(k) % self.prompts.len();
                let p = self.prompts[self.prompts.len() - 1 - back];
                // Keep what came before the prompt (a context message of its
                // own stays: the new prompt follows it).
                self.msgs.truncate(p);
                self.prompts.retain(|&i| i < p);
            }
            Op::Usage(x) => self.usage = Some(u64::from(x) * 4),
            Op::Count => {
                if self.pending.is_none() || self.msgs.is_empty() {
                    return;
                }
                let body = self.body();
                let p = self
                    .m
                    .prepare(self.d, ReqKind::CountTokens, &self.ident, body.clone());
                assert!(p.ticket.is_none(), "count_tokens is never recorded");
                check_window(self.d, &body, &p.body, false);
            }
            Op::TooLong(ceiling) => {
                let Some((mut t, sent)) = self.pending.take() else {
                    return;
                };
                // Nothing changed the conversation since it was sent.
                let original = self.body();
                let retry = self
                    .m
                    .too_long(&mut t, ceiling.map(|c| 20_000 + u64::from(c) * 1000));
                if let Some(b) = retry {
                    check_window(self.d, &original, &b, false);
                }
                self.pending = Some((t, sent));
            }
        }
    }

    /// The model's items for one answer, and the client's results for its calls.
    fn model_turn(
        &mut self,
        reasoning: bool,
        text: bool,
        calls: usize,
        order: u8,
        size: u8,
    ) -> (Vec<String>, Vec<String>) {
        let said = text.then(|| self.text("answer", size));
        let ids: Vec<String> = (0..calls)
            .map(|_| {
                let n = self.id();
                match self.d {
                    Dialect::Anthropic => format!("toolu_{n:04}"),
                    _ => format!("call_{n:04}"),
                }
            })
            .collect();
        let thought = reasoning.then(|| self.text("thinking", 2));
        let mut answered = ids.clone();
        if !answered.is_empty() {
            let r = usize::from(order) % answered.len();
            answered.rotate_left(r);
            if order & 0x80 != 0 {
                answered.reverse();
            }
        }
        let out_of = |id: &str| format!("output of {id}");
        let mut items = Vec::new();
        let mut results = Vec::new();
        match self.d {
            Dialect::Anthropic => {
                let mut content = Vec::new();
                if let Some(t) = thought {
                    content.push(json!({"type": "thinking", "thinking": t, "signature": "sig"}));
                }
                if let Some(t) = said {
                    content.push(json!({"type": "text", "text": t}));
                }
                for id in &ids {
                    content.push(json!({"type": "tool_use", "id": id, "name": "Bash",
                                        "input": {"command": format!("run {id}")}}));
                }
                items.push(json!({"role": "assistant", "content": content}).to_string());
                if !ids.is_empty() {
                    let blocks: Vec<Value> = answered
                        .iter()
                        .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": out_of(id)}))
                        .collect();
                    results.push(json!({"role": "user", "content": blocks}).to_string());
                }
            }
            Dialect::OpenaiChat => {
                let mut m = json!({"role": "assistant", "content": said});
                if !ids.is_empty() {
                    m["tool_calls"] = ids
                        .iter()
                        .map(|id| {
                            json!({"id": id, "type": "function",
                                         "function": {"name": "shell", "arguments": "{}"}})
                        })
                        .collect();
                }
                items.push(m.to_string());
                for id in &answered {
                    results.push(
                        json!({"role": "tool", "tool_call_id": id, "content": out_of(id)})
                            .to_string(),
                    );
                }
            }
            Dialect::OpenaiResponses => {
                if let Some(t) = thought {
                    let n = self.id();
                    items.push(
                        json!({"type": "reasoning", "id": format!("rs_{n:04}"),
                               "summary": [{"type": "summary_text", "text": t}],
                               "encrypted_content": "opaque"})
                        .to_string(),
                    );
                }
                if let Some(t) = said {
                    items.push(
                        json!({"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": t}]})
                        .to_string(),
                    );
                }
                for id in &ids {
                    items.push(
                        json!({"type": "function_call", "call_id": id, "name": "shell",
                               "arguments": "{}"})
                        .to_string(),
                    );
                }
                // A reasoning item alone would end the turn on a bare reasoning item.
                if items.is_empty() {
                    items.push(
                        json!({"type": "message", "role": "assistant",
                               "content": [{"type": "output_text", "text": "done"}]})
                        .to_string(),
                    );
                }
                for id in &answered {
                    results.push(
                        json!({"type": "function_call_output", "call_id": id, "output": out_of(id)})
                            .to_string(),
                    );
                }
            }
        }
        (items, results)
    }

    /// Finish the pending request with an answer carrying `rows`.
    fn answer(&mut self, rows: Vec<String>) {
        let Some((t, sent)) = self.pending.take() else {
            return;
        };
        let input = self.usage.take().unwrap_or(sent as u64 / 4);
        let c = Collected {
            usage: Some(Usage {
                input,
                output: 50,
                cache_read: 0,
                cache_write: 0,
            }),
            model: Some("fuzz-model".into()),
            rows,
            stop_reason: Some("end_turn".into()),
            terminal: true,
            ..Collected::default()
        };
        t.complete(200, true, &c);
    }

    /// The request body for the conversation as it is.
    fn body(&self) -> Bytes {
        let conv = format!("[{}]", self.msgs.join(","));
        let s = match self.d {
            Dialect::Anthropic => {
                let system = if self.system {
                    r#""system":"You are a coding agent.","#
                } else {
                    ""
                };
                format!(
                    r#"{{"model":"fuzz-model","max_tokens":1000,{system}"messages":{conv},"tools":[{{"name":"Bash","input_schema":{{"type":"object"}}}}],"stream":true}}"#
                )
            }
            Dialect::OpenaiChat => format!(
                r#"{{"model":"fuzz-model","messages":{conv},"tools":[{{"type":"function","function":{{"name":"shell"}}}}],"stream":true}}"#
            ),
            Dialect::OpenaiResponses => format!(
                r#"{{"model":"fuzz-model","instructions":"Be brief.","input":{conv},"tools":[{{"type":"function","name":"shell"}}],"stream":true}}"#
            ),
        };
        Bytes::from(s)
    }

    /// Send the conversation as a request; its answer comes with the next op.
    fn request(&mut self) {
        self.answer(Vec::new());
        let body = self.body();
        let p = self
            .m
            .prepare(self.d, ReqKind::Main, &self.ident, body.clone());
        check_window(self.d, &body, &p.body, self.expect_stub);
        self.expect_stub = false;
        self.rewound = false;
        let t = p.ticket.expect("a main request has a ticket");
        self.session = Some(t.session.id.clone());
        self.pending = Some((t, p.body.len()));
    }
}

fn fake(d: Dialect) -> FakeDialect {
    match d {
        Dialect::Anthropic => FakeDialect::Anthropic,
        Dialect::OpenaiChat => FakeDialect::Chat,
        Dialect::OpenaiResponses => FakeDialect::Responses,
    }
}

fn is_stub(v: &Value) -> bool {
    let text = match v.get("content") {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Array(parts)) => parts.first().and_then(|p| p["text"].as_str()),
        _ => None,
    };
    text.is_some_and(|t| t.starts_with(STUB_PREFIX))
}

/// The invariants of one body sent upstream (`out`) for a request (`sent`).
pub fn check_window(d: Dialect, sent: &[u8], out: &[u8], expect_stub: bool) {
    let show = || outline(d, out);
    if let Err(e) = oceancode_fakeup::validate_conversation(fake(d), sent) {
        panic!(
            "the script made an invalid request ({e}):\n{}",
            outline(d, sent)
        );
    }
    if let Err(e) = oceancode_fakeup::validate_conversation(fake(d), out) {
        panic!("the window is invalid for {d:?}: {e}\n{}", show());
    }
    let key = dialect::conv_key(d);
    let ps = ParsedBody::parse(sent, key).expect("the request parses");
    let po = ParsedBody::parse(out, key).expect("the window parses");
    // Every other member is unchanged, in order.
    assert_eq!(ps.conv_field, po.conv_field, "{}", show());
    assert_eq!(ps.fields, po.fields, "the other members are unchanged");
    let values: Vec<Value> = po
        .messages
        .iter()
        .map(|m| serde_json::from_str(m).expect("a window message is JSON"))
        .collect();
    let stubs: Vec<usize> = (0..values.len()).filter(|&i| is_stub(&values[i])).collect();
    if out == sent {
        assert!(stubs.is_empty(), "an unchanged request has no stub");
    } else {
        assert_eq!(
            stubs.len(),
            1,
            "a rewritten window has one stub\n{}",
            show()
        );
    }
    if expect_stub {
        assert_eq!(
            stubs.len(),
            1,
            "the window after `tideline now` has its stub\n{}",
            show()
        );
    }
    if let Some(&s) = stubs.first() {
        if d == Dialect::Anthropic {
            assert_eq!(s, 0, "the stub opens an Anthropic window\n{}", show());
        }
        for v in &values[..s] {
            let kind = dialect::classify(d, v).kind;
            assert!(
                matches!(kind, RowKind::System | RowKind::Other),
                "only system rows before the stub, not {kind:?}\n{}",
                show()
            );
        }
    }
    // The window ends with the request's newest messages, as they came; the
    // rows it keeps from before them (system rows, the pinned ask) are the
    // request's own, byte for byte, each once.
    let tail = (0..po.messages.len().min(ps.messages.len()))
        .take_while(|&k| {
            let (i, j) = (po.messages.len() - 1 - k, ps.messages.len() - 1 - k);
            !stubs.contains(&i) && po.messages[i] == ps.messages[j]
        })
        .count();
    assert!(tail >= 1, "the newest message is in the window\n{}", show());
    let (kept_end, from) = (po.messages.len() - tail, ps.messages.len() - tail);
    let mut origin: Vec<Option<usize>> = vec![None; po.messages.len()];
    let mut used = Vec::new();
    let mut prompts = 0;
    for i in 0..kept_end {
        if stubs.contains(&i) {
            continue;
        }
        let Some(j) = (0..from).find(|&j| !used.contains(&j) && ps.messages[j] == po.messages[i])
        else {
            panic!("window message {i} is none of the request's messages before {from}, byte for byte\n{}", show());
        };
        used.push(j);
        origin[i] = Some(j);
        match dialect::classify(d, &values[i]).kind {
            RowKind::System | RowKind::Other => {}
            RowKind::Prompt => prompts += 1,
            kind => panic!(
                "a {kind:?} row is kept from before the window's start\n{}",
                show()
            ),
        }
    }
    assert!(prompts <= 1, "one ask is pinned at most\n{}", show());
    for k in 0..tail {
        origin[kept_end + k] = Some(from + k);
    }
    // Calls and results pair up inside the window.
    let mut open: Vec<String> = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let info = dialect::classify(d, v);
        for c in &info.closes {
            let Some(k) = open.iter().position(|o| o == c) else {
                panic!(
                    "window message {i} answers {c}, which no earlier message calls\n{}",
                    show()
                );
            };
            open.remove(k);
        }
        open.extend(info.opens);
        if info.binds_next {
            let j = origin[i].expect("a stub does not bind");
            assert_eq!(
                origin.get(i + 1).copied().flatten(),
                Some(j + 1),
                "a reasoning item keeps the item after it\n{}",
                show()
            );
        }
    }
    assert!(
        open.is_empty(),
        "calls {open:?} have no result in the window\n{}",
        show()
    );
}

/// One line per message of a body (role or type, then its first 60
/// characters), for failure messages.
fn outline(d: Dialect, body: &[u8]) -> String {
    let Ok(p) = ParsedBody::parse(body, dialect::conv_key(d)) else {
        return String::from_utf8_lossy(&body[..body.len().min(600)]).into_owned();
    };
    p.messages
        .iter()
        .enumerate()
        .map(|(i, m)| format!("  {i}: {}", m.chars().take(90).collect::<String>()))
        .collect::<Vec<_>>()
        .join("\n")
}
