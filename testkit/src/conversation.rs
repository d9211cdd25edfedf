//! A conversation as a client resends it, rendered as the request body of
//! any dialect (Anthropic Messages, OpenAI Chat Completions, OpenAI
//! Responses, Gemini): system prompt, tools, and user / assistant /
//! tool-call / tool-result steps in each API's own shape.

use serde_json::{json, Map, Value};

pub use oceancode_window::Dialect;

/// A conversation being built; [`Conversation::body`] renders it.
#[derive(Clone, Debug)]
pub struct Conversation {
    dialect: Dialect,
    model: Option<String>,
    system: Option<Value>,
    max_tokens: Option<u64>,
    stream: Option<bool>,
    tools: Vec<Value>,
    messages: Vec<Value>,
    members: Map<String, Value>,
    /// Gemini answers a call by its function's name: the names by call id.
    calls: Vec<(String, String)>,
}

impl Conversation {
    /// An empty conversation of `dialect`: no model, system, tools or cap
    /// (what is not set is not in the body).
    pub fn new(dialect: Dialect) -> Conversation {
        Conversation {
            dialect,
            model: None,
            system: None,
            max_tokens: None,
            stream: None,
            tools: Vec::new(),
            messages: Vec::new(),
            members: Map::new(),
            calls: Vec::new(),
        }
    }

    /// The dialect.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The model (not in a Gemini body: Gemini names it in the path).
    pub fn model(mut self, model: &str) -> Self {
        self.model = Some(model.to_string());
        self
    }

    /// The system prompt as text (Anthropic `system`, a first `system`
    /// message in Chat, Responses `instructions`, Gemini `systemInstruction`).
    pub fn system(mut self, text: &str) -> Self {
        self.system = Some(Value::String(text.to_string()));
        self
    }

    /// The system member as given (e.g. Anthropic text blocks with
    /// `cache_control`); only Anthropic and Chat take a non-string one.
    pub fn system_raw(mut self, system: Value) -> Self {
        self.system = Some(system);
        self
    }

    /// The output cap (`max_tokens`, Responses `max_output_tokens`, Gemini
    /// `generationConfig.maxOutputTokens`).
    pub fn max_tokens(mut self, n: u64) -> Self {
        self.max_tokens = Some(n);
        self
    }

    /// `stream` (not in a Gemini body: Gemini streams by its path).
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = Some(stream);
        self
    }

    /// A function tool the client offers, with its JSON schema.
    pub fn tool(mut self, name: &str, description: Option<&str>, schema: Value) -> Self {
        let desc = |mut v: Value| {
            if let Some(d) = description {
                v["description"] = json!(d);
            }
            v
        };
        let tool = match self.dialect {
            Dialect::Anthropic => desc(json!({"name": name, "input_schema": schema})),
            Dialect::OpenaiChat => json!({"type": "function",
                "function": desc(json!({"name": name, "parameters": schema}))}),
            Dialect::OpenaiResponses => {
                let mut t = desc(json!({"name": name, "parameters": schema}));
                t["type"] = json!("function");
                t
            }
            Dialect::Gemini => desc(json!({"name": name, "parameters": schema})),
        };
        self.tools.push(tool);
        self
    }

    /// The `tools` member as given (replaces the tools added so far).
    pub fn tools_raw(mut self, tools: Value) -> Self {
        self.tools = tools.as_array().cloned().unwrap_or_default();
        self
    }

    /// Another top-level member (set last: it replaces one of the builder's).
    pub fn member(mut self, key: &str, value: Value) -> Self {
        self.members.insert(key.to_string(), value);
        self
    }

    /// A user prompt.
    pub fn user(mut self, text: &str) -> Self {
        let m = user(self.dialect, text);
        self.messages.push(m);
        self
    }

    /// An assistant text answer, as the client echoes it.
    pub fn assistant(mut self, text: &str) -> Self {
        let m = assistant(self.dialect, text);
        self.messages.push(m);
        self
    }

    /// An assistant turn that calls tool `name` with `input` (call `id`).
    pub fn tool_call(mut self, id: &str, name: &str, input: Value) -> Self {
        let m = match self.dialect {
            Dialect::Anthropic => json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": id, "name": name, "input": input}]}),
            Dialect::OpenaiChat => json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function",
                 "function": {"name": name, "arguments": input.to_string()}}]}),
            Dialect::OpenaiResponses => json!({"type": "function_call", "call_id": id,
                "name": name, "arguments": input.to_string()}),
            Dialect::Gemini => json!({"role": "model", "parts": [
                {"functionCall": {"id": id, "name": name, "args": input}}]}),
        };
        self.calls.push((id.to_string(), name.to_string()));
        self.messages.push(m);
        self
    }

    /// The result of call `id`.
    pub fn tool_result(mut self, id: &str, output: &str) -> Self {
        let m = match self.dialect {
            Dialect::Anthropic => json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": output}]}),
            Dialect::OpenaiChat => json!({"role": "tool", "tool_call_id": id, "content": output}),
            Dialect::OpenaiResponses => {
                json!({"type": "function_call_output", "call_id": id, "output": output})
            }
            Dialect::Gemini => {
                let name = self
                    .calls
                    .iter()
                    .rev()
                    .find(|(c, _)| c == id)
                    .map_or("unknown", |(_, n)| n.as_str());
                json!({"role": "user", "parts": [{"functionResponse":
                    {"id": id, "name": name, "response": {"output": output}}}]})
            }
        };
        self.messages.push(m);
        self
    }

    /// A message (or Responses item) as given.
    pub fn message(mut self, message: Value) -> Self {
        self.messages.push(message);
        self
    }

    /// Several messages as given.
    pub fn messages(mut self, messages: impl IntoIterator<Item = Value>) -> Self {
        self.messages.extend(messages);
        self
    }

    /// The conversation so far (without the system prompt).
    pub fn history(&self) -> &[Value] {
        &self.messages
    }

    /// The request body as JSON.
    pub fn to_value(&self) -> Value {
        let mut b = Map::new();
        let d = self.dialect;
        if let Some(m) = &self.model {
            if d != Dialect::Gemini {
                b.insert("model".into(), json!(m));
            }
        }
        if let Some(s) = self.stream {
            if d != Dialect::Gemini {
                b.insert("stream".into(), json!(s));
            }
        }
        if let Some(n) = self.max_tokens {
            match d {
                Dialect::Anthropic | Dialect::OpenaiChat => {
                    b.insert("max_tokens".into(), json!(n));
                }
                Dialect::OpenaiResponses => {
                    b.insert("max_output_tokens".into(), json!(n));
                }
                Dialect::Gemini => {
                    b.insert("generationConfig".into(), json!({"maxOutputTokens": n}));
                }
            }
        }
        let mut messages = self.messages.clone();
        if let Some(s) = &self.system {
            match d {
                Dialect::Anthropic => {
                    b.insert("system".into(), s.clone());
                }
                Dialect::OpenaiChat => {
                    messages.insert(0, json!({"role": "system", "content": s}));
                }
                Dialect::OpenaiResponses => {
                    b.insert("instructions".into(), s.clone());
                }
                Dialect::Gemini => {
                    b.insert("systemInstruction".into(), json!({"parts": [{"text": s}]}));
                }
            }
        }
        if !self.tools.is_empty() {
            let tools = match d {
                Dialect::Gemini => json!([{"functionDeclarations": self.tools}]),
                _ => Value::Array(self.tools.clone()),
            };
            b.insert("tools".into(), tools);
        }
        b.insert(conv_key(d).into(), Value::Array(messages));
        for (k, v) in &self.members {
            b.insert(k.clone(), v.clone());
        }
        Value::Object(b)
    }

    /// The request body.
    pub fn body(&self) -> String {
        self.to_value().to_string()
    }
}

/// The member holding the conversation.
pub fn conv_key(d: Dialect) -> &'static str {
    match d {
        Dialect::Anthropic | Dialect::OpenaiChat => "messages",
        Dialect::OpenaiResponses => "input",
        Dialect::Gemini => "contents",
    }
}

/// A user message of `d`.
pub fn user(d: Dialect, text: &str) -> Value {
    match d {
        Dialect::OpenaiResponses => {
            json!({"type":"message","role":"user","content":[{"type":"input_text","text":text}]})
        }
        Dialect::Gemini => json!({"role":"user","parts":[{"text":text}]}),
        _ => json!({"role":"user","content":text}),
    }
}

/// An assistant text message of `d`, as the client echoes it.
pub fn assistant(d: Dialect, text: &str) -> Value {
    match d {
        Dialect::Anthropic => json!({"role":"assistant","content":[{"type":"text","text":text}]}),
        Dialect::OpenaiChat => json!({"role":"assistant","content":text}),
        Dialect::OpenaiResponses => {
            json!({"type":"message","role":"assistant","content":[{"type":"output_text","text":text}]})
        }
        Dialect::Gemini => json!({"role":"model","parts":[{"text":text}]}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool_turn(d: Dialect) -> Value {
        Conversation::new(d)
            .model("m")
            .system("Be terse.")
            .max_tokens(64)
            .tool("Bash", Some("run"), json!({"type": "object"}))
            .user("list")
            .tool_call("c1", "Bash", json!({"command": "ls"}))
            .tool_result("c1", "a.rs")
            .assistant("one file")
            .to_value()
    }

    #[test]
    fn anthropic_messages() {
        assert_eq!(
            tool_turn(Dialect::Anthropic),
            json!({"model": "m", "max_tokens": 64, "system": "Be terse.",
                "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": "list"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "Bash", "input": {"command": "ls"}}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a.rs"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "one file"}]}]})
        );
    }

    #[test]
    fn openai_chat() {
        let b = tool_turn(Dialect::OpenaiChat);
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "Be terse."})
        );
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            r#"{"command":"ls"}"#
        );
        assert_eq!(
            b["messages"][3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "a.rs"})
        );
        assert_eq!(b["tools"][0]["function"]["name"], "Bash");
    }

    #[test]
    fn openai_responses() {
        let b = tool_turn(Dialect::OpenaiResponses);
        assert_eq!(b["instructions"], "Be terse.");
        assert_eq!(b["max_output_tokens"], 64);
        assert_eq!(b["input"][1]["type"], "function_call");
        assert_eq!(
            b["input"][2],
            json!({"type": "function_call_output", "call_id": "c1", "output": "a.rs"})
        );
        assert_eq!(b["tools"][0]["type"], "function");
    }

    #[test]
    fn gemini() {
        let b = tool_turn(Dialect::Gemini);
        assert!(b.get("model").is_none());
        assert_eq!(b["generationConfig"]["maxOutputTokens"], 64);
        assert_eq!(b["systemInstruction"]["parts"][0]["text"], "Be terse.");
        assert_eq!(b["tools"][0]["functionDeclarations"][0]["name"], "Bash");
        assert_eq!(
            b["contents"][2]["parts"][0]["functionResponse"]["name"],
            "Bash"
        );
        assert_eq!(b["contents"][3]["role"], "model");
    }

    #[test]
    fn a_member_replaces_the_builders() {
        let b = Conversation::new(Dialect::Anthropic)
            .max_tokens(1)
            .member("max_tokens", json!(2))
            .to_value();
        assert_eq!(b["max_tokens"], 2);
    }
}
