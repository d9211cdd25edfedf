//! The tool's definition (one constant string per dialect, in the
//! dialect's module of `oceancode_window::dialect`), and the
//! `tools` member of a request with it appended (pure). The bytes never
//! depend on the request, so the tools prefix of every request of a session
//! is the same and stays in the provider's prompt cache.

#[cfg(test)]
use oceancode_window::dialect::{
    anthropic::RECALL_TOOL as ANTHROPIC, openai_chat::RECALL_TOOL as CHAT,
    openai_responses::RECALL_TOOL as RESPONSES,
};
use oceancode_window::Dialect;

/// The tool's name.
pub const NAME: &str = "oceancode_recall";

/// The tool's definition in the dialect's `tools` shape (its
/// [`oceancode_window::dialect::DialectSpec::recall_tool`]).
pub fn tool_json(d: Dialect) -> &'static str {
    oceancode_window::dialect::spec(d).recall_tool()
}

/// The `tools` member with the tool appended after the client's tools (its
/// bytes kept as sent), or `[tool]` when the request has none. None when
/// the client's `tools` is not an array (the request is left as it is) or
/// already declares a tool of that name.
pub fn tools_member(d: Dialect, client: Option<&str>) -> Option<String> {
    let tool = tool_json(d);
    let Some(raw) = client.map(str::trim).filter(|r| *r != "null") else {
        return Some(format!("[{tool}]"));
    };
    let inner = raw.strip_prefix('[')?.strip_suffix(']')?;
    if declares(raw) {
        return None;
    }
    if inner.trim().is_empty() {
        return Some(format!("[{tool}]"));
    }
    Some(format!("[{inner},{tool}]"))
}

/// The client's tools already name one `oceancode_recall` (its own).
fn declares(raw: &str) -> bool {
    if !raw.contains(NAME) {
        return false;
    }
    let Ok(tools) = serde_json::from_str::<Vec<serde_json::Value>>(raw) else {
        return true;
    };
    tools.iter().any(|t| {
        t.get("name").and_then(|n| n.as_str()) == Some(NAME)
            || t.pointer("/function/name").and_then(|n| n.as_str()) == Some(NAME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::Value;

    #[test]
    fn every_definition_is_json_of_the_dialects_shape() {
        for d in [
            Dialect::Anthropic,
            Dialect::OpenaiChat,
            Dialect::OpenaiResponses,
        ] {
            let v: Value = serde_json::from_str(tool_json(d)).expect("json");
            let name = v
                .get("name")
                .or_else(|| v.pointer("/function/name"))
                .and_then(Value::as_str);
            assert_eq!(name, Some(NAME), "{d:?}");
        }
        let a: Value = serde_json::from_str(ANTHROPIC).unwrap_or_default();
        assert!(a["input_schema"]["properties"]["seq"].is_object());
        let c: Value = serde_json::from_str(CHAT).unwrap_or_default();
        assert_eq!(c["type"], "function");
        assert!(c["function"]["parameters"]["properties"]["search"].is_object());
        let r: Value = serde_json::from_str(RESPONSES).unwrap_or_default();
        assert!(r["parameters"]["properties"]["match"].is_object());
    }

    #[test]
    fn the_tool_goes_after_the_clients_tools_which_keep_their_bytes() {
        let client =
            r#"[ {"name":"Bash","input_schema":{},"cache_control":{"type":"ephemeral"}} ]"#;
        let m = tools_member(Dialect::Anthropic, Some(client)).unwrap_or_default();
        assert!(m.starts_with(
            r#"[ {"name":"Bash","input_schema":{},"cache_control":{"type":"ephemeral"}} ,"#
        ));
        assert!(m.ends_with(&format!(",{ANTHROPIC}]")));
        assert_eq!(
            tools_member(Dialect::OpenaiChat, None).as_deref(),
            Some(format!("[{CHAT}]").as_str())
        );
        assert_eq!(
            tools_member(Dialect::OpenaiResponses, Some("[]")).as_deref(),
            Some(format!("[{RESPONSES}]").as_str())
        );
        // The same client tools give the same bytes, every time.
        assert_eq!(
            tools_member(Dialect::Anthropic, Some(client)),
            tools_member(Dialect::Anthropic, Some(client))
        );
        assert_eq!(tools_member(Dialect::Anthropic, Some(r#"{"a":1}"#)), None);
        let own = r#"[{"name":"oceancode_recall","input_schema":{}}]"#;
        assert_eq!(tools_member(Dialect::Anthropic, Some(own)), None);
    }
}
