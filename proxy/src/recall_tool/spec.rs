//! The tool's definition, one constant string per dialect, and the
//! `tools` member of a request with it appended (pure). The bytes never
//! depend on the request, so the tools prefix of every request of a session
//! is the same and stays in the provider's prompt cache.

use oceancode_ledger::Dialect;

/// The tool's name.
pub const NAME: &str = "oceancode_recall";

const ANTHROPIC: &str = concat!(
    r#"{"name":"oceancode_recall","description":"#,
    r#""Read back the verbatim record of this conversation kept by the proxy: what left your context window (the note at the start of the conversation names the last entry that left) and its related sessions (parent, sub-agents). Give seq to read one entry whole; match (text, SQL LIKE wildcards % and _) and/or before (a seq) to list this session's entries, newest last; or search (at most 8 words) to find entries across this session and its related ones. limit caps the lines listed (default 20). Each line starts with its seq.","#,
    r#""input_schema":{"type":"object","properties":{"match":{"type":"string","description":"only entries whose text contains this"},"before":{"type":"integer","description":"only entries with a seq below this one"},"seq":{"type":"integer","description":"one entry, whole"},"search":{"type":"string","description":"words that must all appear (at most 8), across this session and its related ones"},"limit":{"type":"integer","description":"most lines listed (default 20)"}}}}"#
);

const CHAT: &str = concat!(
    r#"{"type":"function","function":{"name":"oceancode_recall","description":"#,
    r#""Read back the verbatim record of this conversation kept by the proxy: what left your context window (the note at the start of the conversation names the last entry that left) and its related sessions (parent, sub-agents). Give seq to read one entry whole; match (text, SQL LIKE wildcards % and _) and/or before (a seq) to list this session's entries, newest last; or search (at most 8 words) to find entries across this session and its related ones. limit caps the lines listed (default 20). Each line starts with its seq.","#,
    r#""parameters":{"type":"object","properties":{"match":{"type":"string","description":"only entries whose text contains this"},"before":{"type":"integer","description":"only entries with a seq below this one"},"seq":{"type":"integer","description":"one entry, whole"},"search":{"type":"string","description":"words that must all appear (at most 8), across this session and its related ones"},"limit":{"type":"integer","description":"most lines listed (default 20)"}}}}}"#
);

const RESPONSES: &str = concat!(
    r#"{"type":"function","name":"oceancode_recall","description":"#,
    r#""Read back the verbatim record of this conversation kept by the proxy: what left your context window (the note at the start of the conversation names the last entry that left) and its related sessions (parent, sub-agents). Give seq to read one entry whole; match (text, SQL LIKE wildcards % and _) and/or before (a seq) to list this session's entries, newest last; or search (at most 8 words) to find entries across this session and its related ones. limit caps the lines listed (default 20). Each line starts with its seq.","#,
    r#""parameters":{"type":"object","properties":{"match":{"type":"string","description":"only entries whose text contains this"},"before":{"type":"integer","description":"only entries with a seq below this one"},"seq":{"type":"integer","description":"one entry, whole"},"search":{"type":"string","description":"words that must all appear (at most 8), across this session and its related ones"},"limit":{"type":"integer","description":"most lines listed (default 20)"}}}}"#
);

/// The tool's definition in the dialect's `tools` shape.
pub fn tool_json(d: Dialect) -> &'static str {
    match d {
        Dialect::Anthropic => ANTHROPIC,
        Dialect::OpenaiChat => CHAT,
        Dialect::OpenaiResponses => RESPONSES,
        Dialect::Gemini => crate::dialect::gemini::RECALL_TOOL,
    }
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
