//! Synthetic Anthropic Messages conversations for the load benchmarks.
//!
//! A base history of `messages` messages (odd, so it ends with a user message)
//! and about `bytes` bytes: turns of `turn_len` messages, each a prompt, a tool
//! loop of `(assistant tool_use, user tool_result)` pairs and a closing
//! assistant text. Every step of a running session appends one more pair to
//! the last turn (an agent's tool loop), so bodies grow like a real client's.
//! Message text is pseudo-random words (tokenizers see realistic input); the
//! content is the same for every session except the first prompt, which
//! carries the session's tag.

use bytes::Bytes;

/// Shape of a conversation.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Messages in the base history (rounded up to an odd number).
    pub messages: usize,
    /// Approximate size of the whole base body in bytes.
    pub bytes: usize,
    /// Messages per turn.
    pub turn_len: usize,
    /// `model` of the requests.
    pub model: String,
}

/// A deterministic xorshift generator (no dependency, reproducible bodies).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (0 is replaced by a constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// Next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }
}

const WORDS: &[&str] = &[
    "the",
    "file",
    "src",
    "main",
    "test",
    "error",
    "function",
    "return",
    "value",
    "cargo",
    "build",
    "let",
    "mut",
    "struct",
    "impl",
    "self",
    "config",
    "session",
    "request",
    "body",
    "line",
    "token",
    "window",
    "proxy",
    "ledger",
    "writer",
    "match",
    "some",
    "none",
    "result",
    "async",
    "await",
    "fn",
    "pub",
    "use",
    "crate",
    "mod",
    "type",
    "where",
    "for",
    "in",
    "if",
    "else",
    "loop",
    "break",
    "println",
    "assert_eq",
    "ok",
    "err",
    "vec",
    "string",
    "u64",
    "warning:",
    "unused",
    "variable",
    "-->",
    "src/lib.rs:42:9",
    "|",
    "=",
    "note:",
    "help:",
    "passed;",
    "failed;",
    "running",
    "tests",
    "finished",
    "release",
    "debug",
    "0.42s",
];

/// About `n` bytes of words (JSON-safe: no quotes or backslashes).
pub fn filler(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n + 16);
    let mut col = 0;
    while s.len() < n {
        let w = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
        s.push_str(w);
        col += w.len() + 1;
        if col > 80 {
            s.push_str("\\n");
            col = 0;
        } else {
            s.push(' ');
        }
    }
    s.truncate(n);
    // Never end inside a `\\n` escape.
    while s.ends_with('\\') {
        s.pop();
    }
    s
}

/// A session's conversation: a shared base plus its own growing tail.
#[derive(Clone, Debug)]
pub struct Conv {
    /// `{"model":..,"messages":[m0,...,mN` (no closing bracket).
    pub head: Bytes,
    /// Messages in `head`.
    pub base_messages: usize,
    /// Bytes of one message's filler text.
    pub msg_text: usize,
    tag: String,
    tail: Vec<u8>,
    steps: usize,
    rng: Rng,
}

fn prompt(tag: &str, turn: usize, text: &str) -> String {
    format!(r#"{{"role":"user","content":"[{tag}] turn {turn}: {text}"}}"#)
}

fn tool_use(id: &str, text: &str) -> String {
    format!(
        r#"{{"role":"assistant","content":[{{"type":"tool_use","id":"{id}","name":"Bash","input":{{"command":"{text}"}}}}]}}"#
    )
}

fn tool_result(id: &str, text: &str) -> String {
    format!(
        r#"{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"{id}","content":"{text}"}}]}}"#
    )
}

fn closing(text: &str) -> String {
    format!(r#"{{"role":"assistant","content":"{text}"}}"#)
}

/// JSON bytes of a tool step around its texts (both messages, commas included).
fn pair_overhead() -> usize {
    tool_use("t00000", "").len() + tool_result("t00000", "").len() + 2
}

/// The fixed part of every request (model, limits, system, tools).
fn preamble(model: &str) -> String {
    let mut rng = Rng::new(7);
    let system = filler(&mut rng, 2_000);
    format!(
        r#"{{"model":"{model}","max_tokens":32000,"stream":true,"system":[{{"type":"text","text":"You are a coding agent. {system}"}}],"tools":[{{"name":"Bash","description":"Run a shell command and return its output.","input_schema":{{"type":"object","properties":{{"command":{{"type":"string","description":"The command to run"}}}},"required":["command"]}}}}],"messages":["#
    )
}

impl Conv {
    /// The base history for session `tag`.
    pub fn new(spec: &Spec, tag: &str) -> Conv {
        let messages = spec.messages.max(1) | 1;
        let pre = preamble(&spec.model);
        let per_msg = spec.bytes.saturating_sub(pre.len()) / messages;
        let msg_text = per_msg.saturating_sub(pair_overhead() / 2).max(4);
        let mut rng = Rng::new(42);
        let mut out = String::with_capacity(spec.bytes + messages * 200);
        out.push_str(&pre);
        let turn_len = spec.turn_len.max(4);
        let mut turn = 1;
        let mut in_turn = 1;
        let mut pending_id: Option<String> = None;
        out.push_str(&prompt(tag, turn, &filler(&mut rng, msg_text)));
        for i in 1..messages {
            out.push(',');
            let text = filler(&mut rng, msg_text);
            let assistant = i % 2 == 1;
            let msg = if assistant {
                // Close the turn when it is long enough and the next message
                // (a new prompt) still fits in the history.
                if in_turn + 2 >= turn_len && i + 1 < messages {
                    closing(&text)
                } else {
                    let id = format!("t{i:05}");
                    let m = tool_use(&id, &text);
                    pending_id = Some(id);
                    m
                }
            } else if let Some(id) = pending_id.take() {
                tool_result(&id, &text)
            } else {
                turn += 1;
                in_turn = 0;
                prompt(tag, turn, &text)
            };
            in_turn += 1;
            out.push_str(&msg);
        }
        Conv {
            head: Bytes::from(out),
            base_messages: messages,
            msg_text,
            tag: tag.to_string(),
            tail: Vec::new(),
            steps: 0,
            rng: Rng::new(1000),
        }
    }

    /// The same base for another session (only the first prompt differs):
    /// cheap to call for many sessions.
    pub fn retag(&self, tag: &str) -> Conv {
        let old = format!("\"[{}] turn 1:", self.tag);
        let new = format!("\"[{tag}] turn 1:");
        let s = std::str::from_utf8(&self.head).unwrap_or("");
        let head = s.replacen(&old, &new, 1);
        Conv {
            head: Bytes::from(head),
            base_messages: self.base_messages,
            msg_text: self.msg_text,
            tag: tag.to_string(),
            tail: Vec::new(),
            steps: 0,
            rng: Rng::new(1000),
        }
    }

    /// Messages in the next body.
    pub fn messages(&self) -> usize {
        self.base_messages + 2 * self.steps
    }

    /// Append one step: the model's tool call (the client's echo of the
    /// answer) and the tool's result.
    pub fn step(&mut self) {
        self.steps += 1;
        let id = format!("s{:05}", self.steps);
        let a = filler(&mut self.rng, self.msg_text);
        let r = filler(&mut self.rng, self.msg_text);
        self.tail.push(b',');
        self.tail.extend_from_slice(tool_use(&id, &a).as_bytes());
        self.tail.push(b',');
        self.tail.extend_from_slice(tool_result(&id, &r).as_bytes());
    }

    /// The body as frames: shared head, this session's tail, `]}`.
    pub fn frames(&self) -> [Bytes; 3] {
        [
            self.head.clone(),
            Bytes::copy_from_slice(&self.tail),
            Bytes::from_static(b"]}"),
        ]
    }

    /// The body as one buffer.
    pub fn body(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.head.len() + self.tail.len() + 2);
        for f in self.frames() {
            v.extend_from_slice(&f);
        }
        v
    }

    /// Length of the next body.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len() + 2
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_shape_and_size() {
        let spec = Spec {
            messages: 2000,
            bytes: 200_000,
            turn_len: 40,
            model: "m".into(),
        };
        let mut c = Conv::new(&spec, "a");
        c.step();
        let v: serde_json::Value = serde_json::from_slice(&c.body()).expect("json");
        let msgs = v["messages"].as_array().expect("messages");
        assert_eq!(msgs.len(), 2001 + 2);
        assert_eq!(msgs.last().unwrap()["role"], "user");
        let len = c.len() as f64;
        assert!((180_000.0..230_000.0).contains(&len), "{len}");
        let b = c.retag("bb");
        assert!(String::from_utf8_lossy(&b.body()).contains("[bb] turn 1:"));
    }
}
