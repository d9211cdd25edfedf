//! The model's `oceancode_recall` calls in an answer (as the dialect's
//! collector assembled it), and the messages the internal exchange is made
//! of: the continuation's (the answer as it came, then the results) and the
//! hidden pair re-inserted when the client got the rest of the answer (an
//! assistant message with only the recall calls, then the results). Pure.

use super::spec::NAME;
use oceancode_window::dialect::spec;
use oceancode_window::Dialect;
#[cfg(test)]
use serde_json::{json, Value};

/// One recall call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The call's id (`tool_use.id`, `tool_calls[].id`, `call_id`).
    pub id: String,
    /// Its input, JSON text (`{}` when absent).
    pub input: String,
    /// The call as it came (a content block, a `tool_calls` entry, an
    /// output item), raw JSON.
    pub raw: String,
}

/// The calls of an answer: the recall ones and whether any other tool was
/// called (the client's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Calls {
    /// Calls of `oceancode_recall`, in order.
    pub recall: Vec<Call>,
    /// Calls of any other tool.
    pub client: usize,
}

/// The calls in an answer's rows (the dialect's
/// [`oceancode_window::dialect::DialectSpec::call_parts`]).
pub fn find(d: Dialect, rows: &[String]) -> Calls {
    let mut out = Calls::default();
    for row in rows {
        for c in spec(d).call_parts(row) {
            if c.name == NAME {
                out.recall.push(Call {
                    id: c.id,
                    input: c.input,
                    raw: c.raw,
                });
            } else {
                out.client += 1;
            }
        }
    }
    out
}

/// The results' messages ([`oceancode_window::dialect::DialectSpec::results_messages`]): one user
/// message of `tool_result` blocks (Anthropic), one `tool` message per call
/// (Chat), one `function_call_output` item per call (Responses), one `user`
/// content of `functionResponse` parts (Gemini).
pub fn results(d: Dialect, calls: &[Call], texts: &[String]) -> Vec<String> {
    let ids: Vec<(&str, &str)> = calls.iter().map(|c| (c.id.as_str(), NAME)).collect();
    spec(d).results_messages(&ids, texts)
}

/// What a continuation appends to the request: the answer's rows as they
/// came (the model's own message, recall calls included), then the results.
pub fn continuation(d: Dialect, rows: &[String], calls: &[Call], texts: &[String]) -> Vec<String> {
    let mut out = rows.to_vec();
    out.extend(results(d, calls, texts));
    out
}

/// The hidden pair of an answer the client got the rest of: an assistant
/// message with only the recall calls, then the results. Re-inserted before
/// the client's echo of the answer, it keeps every later request valid
/// (each call answered) and tells the model what it read.
pub fn hidden_pair(d: Dialect, calls: &[Call], texts: &[String]) -> Vec<String> {
    let raws: Vec<String> = calls.iter().map(|c| c.raw.clone()).collect();
    let mut out = spec(d).calls_messages(&raws);
    out.extend(results(d, calls, texts));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_calls_are_told_from_the_clients_in_every_dialect() {
        let a = json!({"role":"assistant","content":[
            {"type":"text","text":"let me look"},
            {"type":"tool_use","id":"toolu_1","name":"oceancode_recall","input":{"seq":3}},
            {"type":"tool_use","id":"toolu_2","name":"Bash","input":{"command":"ls"}}]})
        .to_string();
        let c = find(Dialect::Anthropic, &[a]);
        assert_eq!(c.client, 1);
        assert_eq!(c.recall.len(), 1);
        assert_eq!(c.recall[0].id, "toolu_1");
        assert_eq!(c.recall[0].input, r#"{"seq":3}"#);
        let chat = json!({"role":"assistant","content":null,"tool_calls":[
            {"id":"call_1","type":"function","function":{"name":"oceancode_recall","arguments":"{\"search\":\"x\"}"}}]})
        .to_string();
        let c = find(Dialect::OpenaiChat, &[chat]);
        assert_eq!((c.client, c.recall.len()), (0, 1));
        assert_eq!(c.recall[0].input, r#"{"search":"x"}"#);
        let items = vec![
            json!({"type":"message","role":"assistant","content":[]}).to_string(),
            json!({"type":"function_call","call_id":"c1","name":"oceancode_recall","arguments":"{}"}).to_string(),
            json!({"type":"function_call","call_id":"c2","name":"shell","arguments":"{}"}).to_string(),
        ];
        let c = find(Dialect::OpenaiResponses, &items);
        assert_eq!((c.client, c.recall.len()), (1, 1));
        assert_eq!(c.recall[0].id, "c1");
    }

    #[test]
    fn a_hidden_pair_answers_every_call_it_holds() {
        let call = Call {
            id: "toolu_1".into(),
            input: "{}".into(),
            raw: json!({"type":"tool_use","id":"toolu_1","name":NAME,"input":{}}).to_string(),
        };
        let p = hidden_pair(
            Dialect::Anthropic,
            std::slice::from_ref(&call),
            &["r".into()],
        );
        let a: Value = serde_json::from_str(&p[0]).unwrap_or_default();
        let u: Value = serde_json::from_str(&p[1]).unwrap_or_default();
        assert_eq!(a["content"][0]["id"], "toolu_1");
        assert_eq!(u["content"][0]["tool_use_id"], "toolu_1");
        assert_eq!(u["content"][0]["content"], "r");
    }
}
