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
//!   kept system rows in OpenAI; an unchanged body none, nor one that only
//!   masking rewrote (tool outputs as pointers before any cut);
//! * between two window events (the ticket's `window_event`) a window only
//!   appends to the one before; an event that keeps the stub (masking)
//!   only turns more tool outputs into pointers;
//! * it ends with the request's newest messages as they came (at least the
//!   newest one); the rows kept from before them are the request's own,
//!   byte for byte, each once: system rows and at most one ask (pinned);
//!   a reasoning item is followed by the item that followed it; the other
//!   members of the body are unchanged;
//! * after a `tideline now` that names rows, the next window has its stub.
//!
//! Context edits (`Op::Edit`: delete rows or `t`, rewrite a row's text,
//! restore, add or remove a note, taken or refused through
//! `SessionManager::edit_changes` as an edited context.txt would be) are in
//! force on every later request: its body must still pass the validator,
//! pair calls with results and keep reasoning items with their successor;
//! it has at most one stub, ends with the request's newest message, and every
//! message in it is the request's own (byte for byte), the stub, a note or a
//! rewrite (the only bytes an edit adds). At every edit the line is also
//! exported as context.txt (`context::io::render`) and parsed back: the
//! untouched file is no edit; half the notes and rewrites are written into
//! the file (CRLF line ends and header-like lines in them, escaped as an
//! agent must) and must read back as exactly that change. Every other tool
//! output holds CRLF line ends and header-like lines too.
//!
//! With the in-band recall tool on (the dialect byte's high bit, or
//! [`check_recall`]): every body's `tools` is the client's with
//! `oceancode_recall` appended, byte-identical across the session; an
//! answer with that bit in its `calls` has the model call the tool too
//! (alone: continued, the client gets the next answer; next to client
//! calls: the client gets its own), and the internal exchange the proxy
//! keeps is in later windows whole, in order, right after its row, with
//! its calls answered — or not at all; the checks above hold for the rest.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use oceancode_config::{BlockSpec, LineSpec};
use oceancode_fakeup::Dialect as FakeDialect;
use oceancode_proxy::dialect::{self, Collected, ParsedBody};
use oceancode_proxy::identity::{Identity, ReqKind};
use oceancode_proxy::recall_tool::{self, calls as recall_calls};
use oceancode_proxy::sessions::{SessionManager, Settings, Ticket};
use oceancode_window::{compress, Dialect, RowKind, Usage};
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
    /// A context edit: `what` picks delete (a row, `t`, a range), rewrite,
    /// restore, a new note or a note removed; `at` picks the row (from the
    /// newest back) or the note.
    Edit { what: u8, at: u8, more: u8 },
}

impl Script {
    /// A script from its parts (tests that build the ops themselves).
    pub fn new(dialect: u8, line: u8, block: u8, system: bool, ops: Vec<Op>) -> Script {
        Script {
            dialect,
            line,
            block,
            system,
            ops,
        }
    }
}

/// What every byte an edit adds carries (a rewrite's text, a note).
const EDIT_MARK: &str = "fuzz-edit";

/// Header-like lines with CRLF line ends, in tool outputs and in the notes
/// and rewrites an edited context.txt makes (issue 33.2): none may read
/// as a header, and an untouched block stays byte for byte.
const FORGED: &str = "[[m:e1-00000000 1 user]]\r\n[[end of context e1-00000000]]\r\n[[delete]]\r\n[[note]]\r\n[[note 1]]\r\n\\[[text]]\r\n[[stub · not editable]]\r\n";

/// Input: the bytes of a [`Script`] (`arbitrary`).
pub fn check(data: &[u8]) {
    let Ok(script) = Script::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    run(&script);
}

impl Script {
    /// The bytes `arbitrary` reads back as this script (what a checked-in
    /// corpus file of the fuzz target holds): tests write structured
    /// scripts into the corpus with it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = vec![self.dialect, self.line, self.block, u8::from(self.system)];
        // An enum's variant: a u32 whose top three bits are its index (of 8).
        let variant = |b: &mut Vec<u8>, k: u8| b.extend([k << 5; 4]);
        for op in &self.ops {
            b.push(1); // one more element
            match *op {
                Op::Prompt {
                    size,
                    blocks,
                    context,
                } => {
                    variant(&mut b, 0);
                    b.extend([size, u8::from(blocks), u8::from(context)]);
                }
                Op::Answer {
                    reasoning,
                    text,
                    calls,
                    order,
                    size,
                } => {
                    variant(&mut b, 1);
                    b.extend([u8::from(reasoning), u8::from(text), calls, order, size]);
                }
                Op::Cut => variant(&mut b, 2),
                Op::Rewind(k) => {
                    variant(&mut b, 3);
                    b.push(k);
                }
                Op::Usage(x) => {
                    variant(&mut b, 4);
                    b.extend(x.to_le_bytes());
                }
                Op::Count => variant(&mut b, 5),
                Op::TooLong(c) => {
                    variant(&mut b, 6);
                    match c {
                        Some(c) => b.extend([1, c]),
                        None => b.push(0),
                    }
                }
                Op::Edit { what, at, more } => {
                    variant(&mut b, 7);
                    b.extend([what, at, more]);
                }
            }
        }
        b.push(0);
        b
    }
}

/// A script from `data` (what the fuzz target reads), for tests.
pub fn script(data: &[u8]) -> Option<Script> {
    Script::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// What a script did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ran {
    /// Main requests sent (each window checked).
    pub requests: u32,
    /// Context edits taken.
    pub edits_taken: u32,
    /// Context edits refused.
    pub edits_refused: u32,
    /// Main requests sent with edits in force.
    pub edited_requests: u32,
}

/// [`check`] with the recall tool on whatever the dialect byte says.
pub fn check_recall(data: &[u8]) {
    let Ok(mut script) = Script::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    script.dialect |= 0x80;
    run(&script);
}

/// Play a script, checking every body sent.
pub fn run(script: &Script) -> Ran {
    let recall = script.dialect & 0x80 != 0;
    // Bit 0x40 of the dialect byte: Gemini (the low bits choose among the others).
    let d = match script.dialect % 3 {
        _ if script.dialect & 0x40 != 0 => Dialect::Gemini,
        0 => Dialect::Anthropic,
        1 => Dialect::OpenaiChat,
        _ => Dialect::OpenaiResponses,
    };
    let settings = Settings {
        line: LineSpec::Tokens(20_000 + u64::from(script.line) * 500),
        block: BlockSpec::PercentOfLine(10.0 + f64::from(script.block % 80)),
        state_tokens: Some(2_000),
        // ledger.compress on for half the scripts, with a zone of a few of
        // the script's (small) outputs and every output large enough; half
        // of those mask first (`free`, issue 34).
        compress: oceancode_config::CompressConfig {
            enabled: script.block >= 128,
            protect: Some(BlockSpec::Tokens(u64::from(script.line % 16) * 4)),
            min_tokens: 1,
            free: (script.block % 2 == 1).then_some(BlockSpec::PercentOfLine(50.0)),
        },
        ..Settings::for_tests("/nonexistent/oceancode-fuzz")
    };
    let rows: Rows = Arc::default();
    let sink_rows = rows.clone();
    let sink = Arc::new(move |events: Vec<oceancode_window::Event>| {
        let mut r = sink_rows.lock().unwrap_or_else(|e| e.into_inner());
        for e in events {
            match e {
                oceancode_window::Event::Rows { session, rows } => {
                    for row in rows {
                        r.insert((session.clone(), row.seq), Arc::from(&*row.raw));
                    }
                }
                oceancode_window::Event::Confirm { session, seq, raw } => {
                    r.insert((session, seq), raw);
                }
                _ => {}
            }
        }
    });
    let mut sim = Sim {
        d,
        m: SessionManager::new(settings, sink).with_recall_tool(recall),
        rows,
        edited: false,
        ran: Ran::default(),
        recall: recall.then(Recall::default),
        ident: Identity {
            client_key: Some("name:fuzz".into()),
            client: "unknown",
            context_1m: false,
            model: None,
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
        last_window: None,
    };
    if sim.system && !matches!(d, Dialect::Anthropic | Dialect::Gemini) {
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
    sim.ran
}

/// The ledger's rows as the sink saw them, by session and seq.
type Rows = Arc<std::sync::Mutex<std::collections::HashMap<(String, u64), Arc<str>>>>;

struct Sim {
    d: Dialect,
    m: SessionManager,
    rows: Rows,
    /// An edit was taken: the checks allow for what edits do.
    edited: bool,
    ran: Ran,
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
    /// The last main request's window: its stub, its event generation
    /// (`Ticket::window_event`) and its messages.
    last_window: Option<(Option<String>, u64, Vec<String>)>,
    /// The recall tool is on: what the proxy keeps of it.
    recall: Option<Recall>,
}

/// What the checks know of the recall tool in a session.
#[derive(Debug, Default, Clone)]
pub struct Recall {
    /// The internal exchanges the proxy kept, each whole, in order.
    pub exchanges: Vec<Vec<String>>,
    /// The `tools` member of the session's first body.
    pub tools: Option<String>,
    /// Results given so far (their texts are numbered).
    n: u32,
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
            Dialect::Gemini => json!({"role": "user", "parts": [{"text": text}]}),
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
                let recall = self.recall.is_some() && calls & 0x80 != 0;
                let calls = usize::from(calls % 4);
                let (items, results) =
                    self.model_turn(reasoning, text || calls == 0, calls, order, size);
                if recall {
                    self.recall_exchange(&items, calls);
                }
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
                check_window_with(
                    self.d,
                    &body,
                    &p.body,
                    false,
                    self.edit_mode(false),
                    self.recall.as_mut(),
                );
            }
            Op::Edit { what, at, more } => self.edit(what, at, more),
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
                    check_window_with(
                        self.d,
                        &original,
                        &b,
                        false,
                        self.edit_mode(false),
                        self.recall.as_mut(),
                    );
                }
                self.pending = Some((t, sent));
            }
        }
    }

    /// How the checks allow for edits (`newest`: the request's newest
    /// message is a new row, no edit names it).
    fn edit_mode(&self, newest: bool) -> Edits {
        match (self.edited, newest) {
            (false, _) => Edits::None,
            (true, true) => Edits::InForce,
            (true, false) => Edits::InForceAnyTail,
        }
    }

    /// A context edit on the session, as an edited file would make it.
    fn edit(&mut self, what: u8, at: u8, more: u8) {
        use oceancode_proxy::context::edits::Change;
        let Some(session) = self.session.as_ref().and_then(|id| self.m.get(id)) else {
            return;
        };
        let (line, notes) = self.m.context_line(&session);
        if line.is_empty() {
            return;
        }
        let rows: std::collections::HashMap<u64, Arc<str>> = self
            .rows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((s, _), _)| *s == session.id)
            .map(|((_, q), r)| (*q, r.clone()))
            .collect();
        let pick = |k: u8| line[line.len() - 1 - usize::from(k) % line.len()];
        let seq = pick(at);
        // The line as context.txt: untouched, it is no edit; a note or a
        // rewrite written into it is read back as exactly that change.
        let file = ContextFile::of(self.d, &line, &rows);
        let changes = match what % 6 {
            0 => vec![Change::Delete { seq, line: 0 }],
            1 => {
                // A range of rows, as `--drop A-B` names them.
                let other = pick(at.wrapping_add(more % 8));
                let (a, b) = (seq.min(other), seq.max(other));
                line.iter()
                    .filter(|&&s| s >= a && s <= b)
                    .map(|&s| Change::Delete { seq: s, line: 0 })
                    .collect()
            }
            2 => {
                let Some(raw) = rows.get(&seq) else { return };
                let Some((body, _)) = oceancode_proxy::context::body::read(self.d, raw) else {
                    return;
                };
                // Text put before the first line that is not a marker (in a
                // tool call's JSON that breaks it: refused).
                let mut done = false;
                let text: Vec<String> = body
                    .text
                    .split('\n')
                    .map(|l| {
                        if !done && !l.starts_with("[[") {
                            done = true;
                            format!("{EDIT_MARK} {more} {l}")
                        } else {
                            l.to_string()
                        }
                    })
                    .collect();
                let mut text = text.join("\n");
                if !done {
                    text.push_str(&format!("\n{EDIT_MARK} {more}"));
                }
                match file.as_ref() {
                    // Written into the file and read back.
                    Some(f) if more & 1 == 1 => match f.rewrite(seq, &text) {
                        Some(c) => c,
                        None => return,
                    },
                    _ => vec![Change::Rewrite {
                        seq,
                        line: 0,
                        body: text,
                    }],
                }
            }
            3 => vec![Change::Restore { seq, line: 0 }],
            4 => {
                let text = format!("{EDIT_MARK} note {more}");
                match file.as_ref() {
                    // Written under the block of `seq`, CRLF and forged
                    // headers (escaped, as an agent must) in it.
                    Some(f) if more & 1 == 1 => f.note(seq, &format!("{text}\r\n{FORGED}")),
                    _ => vec![Change::NoteNew { after: seq, text }],
                }
            }
            _ => match notes.get(usize::from(at) % notes.len().max(1)) {
                Some(&id) => vec![Change::NoteGone { id }],
                None => return,
            },
        };
        let receipt = self.m.edit_changes(&session, &changes, &rows);
        if receipt.starts_with("taken") {
            self.edited = true;
            // The window changes with the edit: stable again from the next.
            self.last_window = None;
            self.ran.edits_taken += 1;
        } else {
            self.ran.edits_refused += 1;
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
        // Every other output as a Windows tool prints it, with lines a
        // context.txt would read as headers if they were not escaped.
        let out_of = |id: &str| {
            if id.ends_with(['1', '3', '5', '7', '9']) {
                format!("output of {id}\r\n{FORGED}")
            } else {
                format!("output of {id}")
            }
        };
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
            Dialect::Gemini => {
                let mut parts = Vec::new();
                if let Some(t) = thought {
                    parts.push(json!({"text": t, "thought": true}));
                }
                if let Some(t) = said {
                    parts.push(json!({"text": t}));
                }
                for id in &ids {
                    parts.push(json!({"functionCall": {"id": id, "name": "shell", "args": {}}}));
                }
                if parts.is_empty() {
                    parts.push(json!({"text": "done"}));
                }
                items.push(json!({"role": "model", "parts": parts}).to_string());
                if !ids.is_empty() {
                    let answers: Vec<Value> = answered
                        .iter()
                        .map(|id| {
                            json!({"functionResponse": {"id": id, "name": "shell",
                                         "response": {"output": out_of(id)}}})
                        })
                        .collect();
                    results.push(json!({"role": "user", "parts": answers}).to_string());
                }
            }
        }
        (items, results)
    }

    /// The model called `oceancode_recall` in its answer to the pending
    /// request too: next to the client's `calls` in `items` (the client
    /// gets `items`, the proxy keeps the hidden pair), or alone (the proxy
    /// continued, the client gets `items`, the proxy keeps the
    /// continuation). The exchange is kept on the ticket as the recall loop
    /// keeps it, built by the loop's own functions.
    fn recall_exchange(&mut self, items: &[String], calls: usize) {
        if self.pending.is_none() {
            return;
        }
        let n = self.id();
        let (id, input) = (format!("recall_{n:04}"), r#"{"match":"ask"}"#);
        let call = match self.d {
            Dialect::Anthropic => {
                json!({"type": "tool_use", "id": id, "name": recall_tool::NAME, "input": {"match": "ask"}})
            }
            Dialect::OpenaiChat => {
                json!({"id": id, "type": "function", "function": {"name": recall_tool::NAME, "arguments": input}})
            }
            Dialect::OpenaiResponses => {
                json!({"type": "function_call", "call_id": id, "name": recall_tool::NAME, "arguments": input})
            }
            Dialect::Gemini => {
                json!({"functionCall": {"id": id, "name": recall_tool::NAME, "args": {"match": "ask"}}})
            }
        };
        // What the model answered: the client's items with the call added
        // (next to its calls), or the call alone (before the continuation).
        let answered: Vec<String> = if calls > 0 {
            let mut out = items.to_vec();
            match self.d {
                Dialect::Anthropic | Dialect::OpenaiChat | Dialect::Gemini => {
                    let key = match self.d {
                        Dialect::Anthropic => "content",
                        Dialect::Gemini => "parts",
                        _ => "tool_calls",
                    };
                    let last = out.len() - 1;
                    let mut m: Value = serde_json::from_str(&out[last]).expect("an answer row");
                    m[key].as_array_mut().expect("its calls").push(call);
                    out[last] = m.to_string();
                }
                Dialect::OpenaiResponses => out.push(call.to_string()),
            }
            out
        } else {
            vec![match self.d {
                Dialect::Anthropic => json!({"role": "assistant", "content": [call]}),
                Dialect::OpenaiChat => {
                    json!({"role": "assistant", "content": null, "tool_calls": [call]})
                }
                Dialect::OpenaiResponses => call,
                Dialect::Gemini => json!({"role": "model", "parts": [call]}),
            }
            .to_string()]
        };
        let found = recall_calls::find(self.d, &answered);
        assert_eq!(found.recall.len(), 1, "the recall call is found");
        assert_eq!(found.client, calls, "the client's calls are counted");
        let r = self.recall.as_mut().expect("the tool is on");
        r.n += 1;
        let texts = vec![format!("seq {} · recall result {}", r.n, r.n)];
        let kept = if calls > 0 {
            recall_calls::hidden_pair(self.d, &found.recall, &texts)
        } else {
            recall_calls::continuation(self.d, &answered, &found.recall, &texts)
        };
        r.exchanges.push(kept.clone());
        if let Some((t, _)) = &self.pending {
            t.keep_hidden(kept);
        }
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
            Dialect::Gemini => {
                let system = if self.system {
                    r#""systemInstruction":{"parts":[{"text":"You are a coding agent."}]},"#
                } else {
                    ""
                };
                format!(
                    r#"{{{system}"contents":{conv},"tools":[{{"functionDeclarations":[{{"name":"shell"}}]}}]}}"#
                )
            }
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
        check_window_with(
            self.d,
            &body,
            &p.body,
            self.expect_stub,
            self.edit_mode(true),
            self.recall.as_mut(),
        );
        let t = p.ticket.expect("a main request has a ticket");
        self.between_cuts(&p.body, t.window_event);
        self.ran.requests += 1;
        if self.edited {
            self.ran.edited_requests += 1;
        }
        self.expect_stub = false;
        self.rewound = false;
        self.session = Some(t.session.id.clone());
        self.pending = Some((t, p.body.len()));
    }
}

impl Sim {
    /// Between window events (the proxy's event generation, `event`, is
    /// the same; no rewind) a window only appends to the one before: the
    /// stub, the pinned parts and compress pointers are byte-stable. At an
    /// event that keeps the stub (masking without a cut) every message of
    /// the window before is still there, the same or with more of its tool
    /// outputs as pointers (a pointer never turns back into its output).
    fn between_cuts(&mut self, out: &[u8], event: u64) {
        let po = ParsedBody::parse(out, dialect::conv_key(self.d)).expect("the window parses");
        let msgs: Vec<String> = po.messages.iter().map(|m| m.to_string()).collect();
        let stub = msgs
            .iter()
            .find(|m| serde_json::from_str::<Value>(m).is_ok_and(|v| is_stub(&v)))
            .cloned();
        let last = self.last_window.take();
        if let Some((last_stub, last_event, last_msgs)) = last {
            if !self.rewound && stub == last_stub && last_msgs.len() <= msgs.len() {
                for (i, m) in last_msgs.iter().enumerate() {
                    if event == last_event {
                        assert_eq!(
                            m,
                            &msgs[i],
                            "between events window message {i} changed\n{}",
                            outline(self.d, out)
                        );
                    } else {
                        assert!(
                            same_or_pruned(self.d, &msgs[i], m),
                            "at a masking event window message {i} changed beyond pointers\n{}",
                            outline(self.d, out)
                        );
                    }
                }
            }
        }
        self.last_window = Some((stub, event, msgs));
    }
}

static POINTERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Compress pointers the checks have seen in windows (in this process).
pub fn pointers_seen() -> u64 {
    POINTERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// `out` is `sent`, byte for byte, or `sent` with some of its tool outputs
/// replaced by compress pointers (everything else byte for byte).
fn same_or_pruned(d: Dialect, out: &str, sent: &str) -> bool {
    if out == sent {
        return true;
    }
    let o = compress::outputs(d, out);
    let s = compress::outputs(d, sent);
    if o.len() != s.len() || o.is_empty() {
        return false;
    }
    let mut parts: Vec<(u32, String)> = Vec::new();
    for (a, b) in o.iter().zip(&s) {
        if a.part != b.part {
            return false;
        }
        let text = serde_json::from_str::<String>(&out[a.start..a.end]).ok();
        match text {
            Some(t) if compress::is_pointer(&t) => parts.push((a.part, t)),
            _ => {}
        }
    }
    if !parts.is_empty() {
        POINTERS.fetch_add(parts.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
    let parts: Vec<(u32, &str)> = parts.iter().map(|(p, t)| (*p, t.as_str())).collect();
    compress::rewrite(d, sent, &parts).as_deref() == Some(out)
}

/// The session's line as an exported context.txt (what `context` writes),
/// parsed back: an untouched file must diff to nothing.
struct ContextFile {
    text: String,
    record: oceancode_proxy::context::edits::Export,
}

impl ContextFile {
    const NONCE: &'static str = "e9-0123abcd";

    fn of(
        d: Dialect,
        line: &[u64],
        rows: &std::collections::HashMap<u64, Arc<str>>,
    ) -> Option<ContextFile> {
        use oceancode_proxy::context::{edits, file, io};
        let pieces: Vec<(edits::Src, &str)> = line
            .iter()
            .map(|s| rows.get(s).map(|r| (edits::Src::Row(*s), &**r)))
            .collect::<Option<_>>()?;
        let (text, record) = io::render(d, "fuzz", Self::NONCE, &pieces, &[]);
        let f = ContextFile { text, record };
        let parsed = file::parse(f.text.as_bytes())
            .unwrap_or_else(|e| panic!("an export does not parse: {e:?}\n{}", f.text));
        let changes = edits::diff(&f.record, &parsed, &edits::EditSet::default())
            .unwrap_or_else(|e| panic!("an untouched export is refused: {e:?}"));
        assert!(
            changes.is_empty(),
            "an untouched export is an edit: {changes:?}\n{}",
            f.text
        );
        Some(f)
    }

    /// The changes the file with `edited` in place of the text under the
    /// header of `seq` makes: it must be read as that block's rewrite.
    fn rewrite(
        &self,
        seq: u64,
        edited: &str,
    ) -> Option<Vec<oceancode_proxy::context::edits::Change>> {
        use oceancode_proxy::context::edits::Change;
        let (start, end) = self.block(seq)?;
        let text = format!("{}{edited}\n\n{}", &self.text[..start], &self.text[end..]);
        let changes = self.read(&text);
        assert!(
            changes
                .iter()
                .all(|c| matches!(c, Change::Rewrite { seq: s, .. } if *s == seq)),
            "a rewrite of seq {seq} read as {changes:?}"
        );
        Some(changes)
    }

    /// The changes of a `[[note]]` with `note` (escaped) under the block of `seq`.
    fn note(&self, seq: u64, note: &str) -> Vec<oceancode_proxy::context::edits::Change> {
        use oceancode_proxy::context::{body, edits::Change};
        let Some((_, end)) = self.block(seq) else {
            return Vec::new();
        };
        let mut escaped = String::new();
        body::escape(note, &mut escaped);
        let text = format!(
            "{}[[note]]\n{escaped}\n\n{}",
            &self.text[..end],
            &self.text[end..]
        );
        let changes = self.read(&text);
        assert_eq!(
            changes,
            vec![Change::NoteNew {
                after: seq,
                text: note.trim().to_string()
            }],
            "a note under seq {seq}"
        );
        changes
    }

    /// Byte range of the body under `seq`'s header (to the next header).
    fn block(&self, seq: u64) -> Option<(usize, usize)> {
        let header = format!("[[m:{} {seq} ", Self::NONCE);
        let at = self.text.find(&format!("\n{header}"))? + 1;
        let start = at + self.text[at..].find('\n')? + 1;
        let next = ["\n[[m:", "\n[[end of context "]
            .iter()
            .filter_map(|h| self.text[start - 1..].find(h))
            .min()?;
        Some((start, start - 1 + next + 1))
    }

    fn read(&self, text: &str) -> Vec<oceancode_proxy::context::edits::Change> {
        use oceancode_proxy::context::{edits, file};
        let parsed = file::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("an edited export does not parse: {e:?}\n{text}"));
        edits::diff(&self.record, &parsed, &edits::EditSet::default())
            .unwrap_or_else(|e| panic!("an edited export is refused: {e:?}\n{text}"))
    }
}

fn fake(d: Dialect) -> FakeDialect {
    match d {
        Dialect::Anthropic => FakeDialect::Anthropic,
        Dialect::OpenaiChat => FakeDialect::Chat,
        Dialect::OpenaiResponses => FakeDialect::Responses,
        Dialect::Gemini => FakeDialect::Gemini,
    }
}

fn is_stub(v: &Value) -> bool {
    let text = match v.get("content").or_else(|| v.get("parts")) {
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Array(parts)) => parts.first().and_then(|p| p["text"].as_str()),
        _ => None,
    };
    text.is_some_and(|t| t.starts_with(STUB_PREFIX))
}

/// What the context edits in force allow a window to differ by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edits {
    /// No edit was ever taken: the window is the tideline's alone.
    None,
    /// Edits are in force; the request's newest message is new (no edit
    /// names it).
    InForce,
    /// Edits are in force and may name the request's newest message (a
    /// count request or a retry of the last request).
    InForceAnyTail,
}

/// The invariants of one body sent upstream (`out`) for a request (`sent`).
pub fn check_window(d: Dialect, sent: &[u8], out: &[u8], expect_stub: bool) {
    check_window_with(d, sent, out, expect_stub, Edits::None, None);
}

/// [`check_window`] with context edits in force (`edits`), and the recall
/// tool on when `recall` is given.
pub fn check_window_with(
    d: Dialect,
    sent: &[u8],
    out: &[u8],
    expect_stub: bool,
    edits: Edits,
    recall: Option<&mut Recall>,
) {
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
    // Every other member is unchanged, in order (but `tools` with the
    // recall tool on: the client's, then the tool's, the same bytes in
    // every body of the session).
    assert_eq!(ps.conv_field, po.conv_field, "{}", show());
    let member = |p: &ParsedBody<'_>, k: &str| -> Option<String> {
        p.fields
            .iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.map(str::to_string))
    };
    let mut exchanges: &[Vec<String>] = &[];
    let tool_on = recall.is_some();
    if let Some(r) = recall {
        let tools = member(&po, "tools");
        assert_eq!(
            tools,
            recall_tool::tools_member(d, member(&ps, "tools").as_deref()),
            "the tools are the client's, then oceancode_recall"
        );
        let first = r
            .tools
            .get_or_insert_with(|| tools.clone().unwrap_or_default());
        assert_eq!(
            Some(first.as_str()),
            tools.as_deref(),
            "the tools are byte-identical across the session"
        );
        let strip = |p: &ParsedBody<'_>| -> Vec<(String, Option<String>)> {
            p.fields
                .iter()
                .filter(|(n, _)| n != "tools")
                .map(|(n, v)| (n.to_string(), v.map(str::to_string)))
                .collect()
        };
        assert_eq!(strip(&ps), strip(&po), "the other members are unchanged");
        exchanges = &r.exchanges;
    } else {
        assert_eq!(ps.fields, po.fields, "the other members are unchanged");
    }
    let all: Vec<Value> = po
        .messages
        .iter()
        .map(|m| serde_json::from_str(m).expect("a window message is JSON"))
        .collect();
    // Calls and results pair up inside the whole window, the recall tool's
    // exchanges included.
    let mut open: Vec<String> = Vec::new();
    for (i, v) in all.iter().enumerate() {
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
    }
    assert!(
        open.is_empty(),
        "calls {open:?} have no result in the window\n{}",
        show()
    );
    // Each exchange is in the window whole, in order, or not at all; it
    // follows a message of the request's (its row), never the stub.
    let mut internal = vec![false; po.messages.len()];
    for x in exchanges {
        let Some(at) = po.messages.iter().position(|m| *m == x[0]) else {
            assert!(
                x.iter().all(|m| !po.messages.contains(&m.as_str())),
                "an exchange is in the window in part\n{}",
                show()
            );
            continue;
        };
        assert!(
            po.messages.len() >= at + x.len()
                && po.messages[at..at + x.len()]
                    .iter()
                    .zip(x)
                    .all(|(a, b)| a == b),
            "an exchange is in the window whole and in order\n{}",
            show()
        );
        assert!(
            at > 0 && !is_stub(&all[at - 1]) && !internal[at - 1],
            "an exchange follows a row of the request's\n{}",
            show()
        );
        internal[at..at + x.len()].fill(true);
    }
    // What follows is about the request's own rows.
    let messages: Vec<&str> = po
        .messages
        .iter()
        .zip(&internal)
        .filter(|(_, x)| !**x)
        .map(|(m, _)| *m)
        .collect();
    let values: Vec<Value> = all
        .into_iter()
        .zip(&internal)
        .filter(|(_, x)| !**x)
        .map(|(v, _)| v)
        .collect();
    let po = ParsedBody { messages, ..po };
    let stubs: Vec<usize> = (0..values.len()).filter(|&i| is_stub(&values[i])).collect();
    let unchanged = if tool_on {
        po.messages == ps.messages
    } else {
        out == sent
    };
    // Masking before any cut: the request's own messages, some tool
    // outputs sent as pointers, and no stub.
    let masked_only = stubs.is_empty()
        && po.messages.len() == ps.messages.len()
        && po
            .messages
            .iter()
            .zip(&ps.messages)
            .all(|(o, s)| same_or_pruned(d, o, s));
    if unchanged {
        assert!(stubs.is_empty(), "an unchanged request has no stub");
    } else if edits != Edits::None || masked_only {
        assert!(stubs.len() <= 1, "one stub at most\n{}", show());
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
        for (v, m) in values[..s].iter().zip(&po.messages) {
            // A system row an edit rewrote is kept where it was, whatever
            // its text now reads as.
            if edits != Edits::None && m.contains(EDIT_MARK) {
                continue;
            }
            let kind = dialect::classify(d, v).kind;
            assert!(
                matches!(kind, RowKind::System | RowKind::Other),
                "only system rows before the stub, not {kind:?}\n{}",
                show()
            );
        }
    }
    if edits != Edits::None {
        check_edited(d, &ps, &po, &values, &stubs, edits, &show);
        return;
    }
    // The window ends with the request's newest messages, as they came; the
    // rows it keeps from before them (system rows, the pinned ask) are the
    // request's own, byte for byte, each once.
    let tail = (0..po.messages.len().min(ps.messages.len()))
        .take_while(|&k| {
            let (i, j) = (po.messages.len() - 1 - k, ps.messages.len() - 1 - k);
            !stubs.contains(&i) && same_or_pruned(d, po.messages[i], ps.messages[j])
        })
        .count();
    assert!(tail >= 1, "the newest message is in the window\n{}", show());
    assert_eq!(
        po.messages.last(),
        ps.messages.last(),
        "the newest message is never pruned\n{}",
        show()
    );
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
    for (i, v) in values.iter().enumerate() {
        let info = dialect::classify(d, v);
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
}

/// The checks of a window with context edits in force: it ends with the
/// request's newest message (when no edit can name it); every message is
/// the request's own byte for byte, the stub, or what an edit added (a
/// note, a rewrite: they carry [`EDIT_MARK`]); calls and results pair up;
/// a reasoning item has an item after it that is the request's own.
fn check_edited(
    d: Dialect,
    ps: &ParsedBody<'_>,
    po: &ParsedBody<'_>,
    values: &[Value],
    stubs: &[usize],
    edits: Edits,
    show: &dyn Fn() -> String,
) {
    if edits == Edits::InForce {
        assert_eq!(
            po.messages.last(),
            ps.messages.last(),
            "the window ends with the request's newest message\n{}",
            show()
        );
    }
    let own: std::collections::HashSet<&str> = ps.messages.iter().copied().collect();
    for (i, m) in po.messages.iter().enumerate() {
        if stubs.contains(&i) || own.contains(m) {
            continue;
        }
        // A compress pointer in place of a tool output is the request's too.
        assert!(
            m.contains(EDIT_MARK) || ps.messages.iter().any(|s| same_or_pruned(d, m, s)),
            "window message {i} is neither the request's, the stub nor an edit's\n{}",
            show()
        );
    }
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
            let next = po.messages.get(i + 1);
            assert!(
                next.is_some_and(|n| {
                    own.contains(n)
                        || n.contains(EDIT_MARK)
                        || ps.messages.iter().any(|s| same_or_pruned(d, n, s))
                }) && !next.is_some_and(|n| n.contains(&format!("{EDIT_MARK} note"))),
                "a reasoning item keeps an item after it (not a note)\n{}",
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
