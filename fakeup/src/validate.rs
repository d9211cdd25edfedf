//! Structural validation of conversations, with the providers' error wording, so tests
//! can prove that a proxy's cut windows stay valid (tool calls paired with results).

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::analyze::array;

/// (message, OpenAI `param`).
pub(crate) type Invalid = (String, Option<String>);

fn role(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

fn ty(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

fn ids_of<'a>(m: &'a Value, block_type: &str, key: &str) -> Vec<&'a str> {
    array(m.get("content"))
        .iter()
        .filter(|b| ty(b) == Some(block_type))
        .filter_map(|b| b.get(key).and_then(Value::as_str))
        .collect()
}

/// Anthropic Messages: non-empty, roles user/assistant/system, first non-system message
/// from the user, every tool_use answered in the next message and every tool_result
/// matching a tool_use of the previous message (system messages are skipped).
pub(crate) fn anthropic(obj: &Map<String, Value>) -> Result<(), Invalid> {
    let err = |m: String| Err((m, None));
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) => a,
        Some(_) => return err("messages: Input should be a valid list".into()),
        None => return err("messages: Field required".into()),
    };
    if msgs.is_empty() {
        return err("messages: at least one message is required".into());
    }
    for (i, m) in msgs.iter().enumerate() {
        match role(m) {
            Some("user" | "assistant" | "system") => {}
            Some(r) => {
                return err(format!(
                    "messages.{i}.role: Input should be 'user', 'assistant' or 'system' (got '{r}')"
                ))
            }
            None => return err(format!("messages.{i}.role: Field required")),
        }
        match m.get("content") {
            Some(Value::String(_) | Value::Array(_)) => {}
            _ => {
                return err(format!(
                    "messages.{i}.content: Input should be a valid string or list of content blocks"
                ))
            }
        }
    }
    let convo: Vec<usize> = (0..msgs.len())
        .filter(|&i| role(&msgs[i]) != Some("system"))
        .collect();
    if let Some(&first) = convo.first() {
        if role(&msgs[first]) != Some("user") {
            return err(format!(
                "messages.{first}: the first non-system message must use the \"user\" role"
            ));
        }
    }
    for (pos, &i) in convo.iter().enumerate() {
        let m = &msgs[i];
        let results = ids_of(m, "tool_result", "tool_use_id");
        if !results.is_empty() {
            if role(m) != Some("user") {
                return err(format!(
                    "messages.{i}: `tool_result` blocks are only allowed in \"user\" messages"
                ));
            }
            let prev_uses: HashSet<&str> = pos
                .checked_sub(1)
                .map(|p| &msgs[convo[p]])
                .filter(|p| role(p) == Some("assistant"))
                .map(|p| ids_of(p, "tool_use", "id").into_iter().collect())
                .unwrap_or_default();
            for (j, b) in array(m.get("content")).iter().enumerate() {
                if ty(b) != Some("tool_result") {
                    continue;
                }
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                if !prev_uses.contains(id) {
                    return err(format!(
                        "messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. \
                         Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
            }
        }
        let uses = ids_of(m, "tool_use", "id");
        if !uses.is_empty() && role(m) == Some("assistant") {
            let Some(&next) = convo.get(pos + 1) else {
                continue; // the last message may end with a tool_use
            };
            let answered: HashSet<&str> = if role(&msgs[next]) == Some("user") {
                ids_of(&msgs[next], "tool_result", "tool_use_id")
                    .into_iter()
                    .collect()
            } else {
                HashSet::new()
            };
            let missing: Vec<&str> = uses
                .into_iter()
                .filter(|id| !answered.contains(id))
                .collect();
            if !missing.is_empty() {
                return err(format!(
                    "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. \
                     Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    missing.join(", ")
                ));
            }
        }
    }
    Ok(())
}

fn tool_call_ids(m: &Value) -> Vec<&str> {
    array(m.get("tool_calls"))
        .iter()
        .filter_map(|c| c.get("id").and_then(Value::as_str))
        .collect()
}

/// Chat Completions: every `tool` message answers a `tool_calls` id of the preceding
/// assistant message, and every tool call is answered (unless it is the last message).
pub(crate) fn chat(obj: &Map<String, Value>) -> Result<(), Invalid> {
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => {
            return Err((
                "Invalid 'messages': empty array. Expected an array with minimum length 1.".into(),
                Some("messages".into()),
            ))
        }
    };
    for (i, m) in msgs.iter().enumerate() {
        let param = Some(format!("messages.[{i}].role"));
        match role(m) {
            Some("system" | "developer" | "user" | "assistant" | "function") => {}
            Some("tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let owner = msgs[..i].iter().rev().find(|p| role(p) != Some("tool"));
                let ok = owner
                    .filter(|p| role(p) == Some("assistant"))
                    .is_some_and(|p| tool_call_ids(p).contains(&id));
                if !ok {
                    return Err((
                        format!(
                            "Invalid parameter: messages with role 'tool' must be a response to a preceeding \
                             message with 'tool_calls' (tool_call_id '{id}' not found)."
                        ),
                        param,
                    ));
                }
            }
            other => {
                return Err((
                    format!(
                        "Invalid value: '{}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
                        other.unwrap_or("")
                    ),
                    param,
                ))
            }
        }
        let calls = tool_call_ids(m);
        if role(m) == Some("assistant") && !calls.is_empty() && i + 1 < msgs.len() {
            let answered: HashSet<&str> = msgs[i + 1..]
                .iter()
                .take_while(|n| role(n) == Some("tool"))
                .filter_map(|n| n.get("tool_call_id").and_then(Value::as_str))
                .collect();
            let missing: Vec<&str> = calls
                .into_iter()
                .filter(|c| !answered.contains(c))
                .collect();
            if !missing.is_empty() {
                return Err((
                    format!(
                        "An assistant message with 'tool_calls' must be followed by tool messages responding \
                         to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                        missing.join(", ")
                    ),
                    param,
                ));
            }
        }
    }
    Ok(())
}

fn is_call(t: Option<&str>) -> bool {
    matches!(t, Some("function_call" | "custom_tool_call"))
}

/// Responses: every `*_call_output` has an earlier call with its `call_id`, and every
/// call has an output, except calls in the trailing run of calls/reasoning; a
/// `compaction_trigger` comes last; a `compaction` item carries content this fake issued.
pub(crate) fn responses(obj: &Map<String, Value>) -> Result<(), Invalid> {
    let items = match obj.get("input") {
        Some(Value::String(_)) => return Ok(()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(("Invalid type for 'input'.".into(), Some("input".into()))),
        None => {
            return Err((
                "Missing required parameter: 'input'.".into(),
                Some("input".into()),
            ))
        }
    };
    let param = || Some("input".to_string());
    let mut calls: Vec<(usize, &str)> = Vec::new();
    let mut answered: HashSet<&str> = HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let t = ty(item);
        let call_id = item.get("call_id").and_then(Value::as_str).unwrap_or("");
        if t == Some("compaction_trigger") && i + 1 != items.len() {
            return Err((
                "The 'compaction_trigger' item must be the final input item.".into(),
                param(),
            ));
        }
        if t == Some("compaction")
            && !item
                .get("encrypted_content")
                .and_then(Value::as_str)
                .is_some_and(crate::compaction::verify)
        {
            let id = item.get("id").and_then(Value::as_str).unwrap_or("");
            return Err((
                format!("The encrypted content for item {id} could not be verified."),
                param(),
            ));
        }
        if is_call(t) {
            calls.push((i, call_id));
        } else if matches!(t, Some("function_call_output" | "custom_tool_call_output")) {
            if !calls.iter().any(|(_, c)| *c == call_id) {
                return Err((
                    format!("No tool call found for function call output with call_id {call_id}."),
                    param(),
                ));
            }
            answered.insert(call_id);
        }
    }
    // Start of the trailing run of calls (and reasoning) with nothing after them.
    let trailing = items
        .iter()
        .rposition(|it| !is_call(ty(it)) && ty(it) != Some("reasoning"))
        .map_or(0, |p| p + 1);
    for (i, c) in calls {
        if i < trailing && !answered.contains(c) {
            return Err((
                format!("No tool output found for function call {c}."),
                param(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn anthropic_rules() {
        let ok = json!({"messages":[
            {"role":"user","content":"go"},
            {"role":"system","content":"note"},
            {"role":"assistant","content":[{"type":"tool_use","id":"a","name":"X","input":{}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"r"}]},
            {"role":"assistant","content":[{"type":"tool_use","id":"b","name":"X","input":{}}]}]});
        assert!(anthropic(&obj(ok)).is_ok());
        let orphan = json!({"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"z","content":"r"}]}]});
        assert!(anthropic(&obj(orphan))
            .unwrap_err()
            .0
            .contains("unexpected `tool_use_id`"));
        let unanswered = json!({"messages":[{"role":"user","content":"go"},
            {"role":"assistant","content":[{"type":"tool_use","id":"a","name":"X","input":{}}]},
            {"role":"user","content":"no result"}]});
        assert!(anthropic(&obj(unanswered))
            .unwrap_err()
            .0
            .contains("without `tool_result`"));
        let first = json!({"messages":[{"role":"assistant","content":"hi"}]});
        assert!(anthropic(&obj(first)).is_err());
        assert!(anthropic(&obj(json!({"messages":[]}))).is_err());
        assert!(anthropic(&obj(json!({"messages":[{"role":"tool","content":"x"}]}))).is_err());
    }

    #[test]
    fn chat_rules() {
        let ok = json!({"messages":[{"role":"user","content":"go"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"r"}]});
        assert!(chat(&obj(ok)).is_ok());
        let orphan = json!({"messages":[{"role":"user","content":"go"},{"role":"tool","tool_call_id":"c1","content":"r"}]});
        assert!(chat(&obj(orphan)).is_err());
        let unanswered = json!({"messages":[{"role":"user","content":"go"},
            {"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"user","content":"x"}]});
        assert!(chat(&obj(unanswered)).unwrap_err().0.contains("c1"));
    }

    #[test]
    fn responses_rules() {
        let ok = json!({"input":[{"role":"user","content":"go"},
            {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"type":"function_call_output","call_id":"c1","output":"r"},
            {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"}]});
        assert!(responses(&obj(ok)).is_ok());
        let orphan = json!({"input":[{"type":"function_call_output","call_id":"c9","output":"r"}]});
        assert!(responses(&obj(orphan)).unwrap_err().0.contains("c9"));
        let unanswered = json!({"input":[{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
            {"role":"user","content":"x"}]});
        assert!(responses(&obj(unanswered)).unwrap_err().0.contains("c1"));
    }

    #[test]
    fn responses_compaction_items() {
        let ids = crate::plan::Ids::new();
        let sealed = crate::compaction::seal(&ids, 3);
        let ok = json!({"input":[{"role":"user","content":"go"},
            {"type":"compaction","id":"cmp_1","encrypted_content": sealed},
            {"role":"user","content":"more"},
            {"type":"compaction_trigger"}]});
        assert!(responses(&obj(ok)).is_ok());
        let early = json!({"input":[{"type":"compaction_trigger"},{"role":"user","content":"go"}]});
        assert!(responses(&obj(early))
            .unwrap_err()
            .0
            .contains("final input item"));
        let forged =
            json!({"input":[{"type":"compaction","id":"cmp_2","encrypted_content":"gAAAABnope"}]});
        assert!(responses(&obj(forged))
            .unwrap_err()
            .0
            .contains("cmp_2 could not be verified"));
    }
}
