//! Who is talking: the request's route (dialect and kind), the session name
//! it declares, and the client family — all read from the path, headers and
//! body without touching the conversation.

use crate::dialect::ParsedBody;
use http::HeaderMap;
use oceancode_ledger::Dialect;

/// What a request is, for the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    /// A turn of the conversation: recorded and windowed.
    Main,
    /// `count_tokens`: windowed like the conversation, never recorded.
    CountTokens,
    /// Title generation and other side requests: forwarded untouched.
    Side,
}

/// The route of a path (without the `/s/<name>` prefix and the query).
pub fn route(path: &str) -> Option<(Dialect, ReqKind)> {
    match path.trim_end_matches('/') {
        "/v1/messages" => Some((Dialect::Anthropic, ReqKind::Main)),
        "/v1/messages/count_tokens" => Some((Dialect::Anthropic, ReqKind::CountTokens)),
        "/v1/chat/completions" => Some((Dialect::OpenaiChat, ReqKind::Main)),
        "/v1/responses" => Some((Dialect::OpenaiResponses, ReqKind::Main)),
        _ => None,
    }
}

/// Split `/s/<name>/rest` into (`name`, `/rest`). Names are 1–128 chars of
/// `[A-Za-z0-9._-]` starting with a letter or digit.
pub fn strip_session_prefix(path: &str) -> (Option<String>, &str) {
    if let Some(rest) = path.strip_prefix("/s/") {
        let (name, tail) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if name
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return (Some(name.to_string()), tail);
        }
    }
    (None, path)
}

/// The identity a request declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Key grouping the requests of one client session (`name:..`, `cc:..`,
    /// `codex:..`); None when only a fingerprint can tell.
    pub client_key: Option<String>,
    /// Client family.
    pub client: &'static str,
    /// The request asked for the 1M-token context (`anthropic-beta: context-1m-…`).
    pub context_1m: bool,
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Read the identity: path prefix, `x-oceancode-session`, Claude Code's
/// `X-Claude-Code-Session-Id` / `metadata.user_id.session_id`, Codex
/// `session-id`; otherwise the caller fingerprints the conversation.
pub fn identify(
    prefix: Option<&str>,
    headers: &HeaderMap,
    body: Option<&ParsedBody<'_>>,
) -> Identity {
    let ua = header(headers, "user-agent").unwrap_or("");
    let client = if ua.starts_with("claude-cli") || headers.contains_key("x-claude-code-session-id")
    {
        "claude-code"
    } else if ua.starts_with("codex")
        || header(headers, "originator").is_some_and(|o| o.starts_with("codex"))
    {
        "codex"
    } else if ua.starts_with("OpenAI/") {
        "openai-sdk"
    } else if ua.starts_with("Anthropic/") {
        "anthropic-sdk"
    } else {
        "unknown"
    };
    let key = if let Some(p) = prefix {
        Some(format!("name:{p}"))
    } else if let Some(s) = header(headers, "x-oceancode-session") {
        Some(format!("name:{s}"))
    } else if let Some(s) = header(headers, "x-claude-code-session-id") {
        Some(format!("cc:{s}"))
    } else if let Some(s) = body.and_then(metadata_session_id) {
        Some(format!("cc:{s}"))
    } else {
        header(headers, "session-id").map(|s| format!("codex:{s}"))
    };
    let context_1m = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|b| b.trim().starts_with("context-1m")));
    Identity {
        client_key: key,
        client,
        context_1m,
    }
}

/// Claude Code's `metadata.user_id` is a JSON string carrying `session_id`.
fn metadata_session_id(body: &ParsedBody<'_>) -> Option<String> {
    let meta: serde_json::Value = body.get_as("metadata")?;
    let uid = meta.get("user_id")?.as_str()?;
    let inner: serde_json::Value = serde_json::from_str(uid).ok()?;
    inner.get("session_id")?.as_str().map(str::to_string)
}

/// Title generation and similar side requests: Anthropic requests without
/// tools that ask for a structured output format.
pub fn is_side_request(d: Dialect, body: &ParsedBody<'_>) -> bool {
    if d != Dialect::Anthropic {
        return false;
    }
    // `output_config` first: it is small and usually absent, while `tools`
    // (tens of KB of schemas on a main request) is only looked at then.
    let has_format = body
        .get_as::<serde_json::Value>("output_config")
        .is_some_and(|o| o.get("format").is_some());
    has_format
        && match body.get_as::<Vec<serde::de::IgnoredAny>>("tools") {
            None => body.get("tools").is_none(),
            Some(a) => a.is_empty(),
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn routes_and_prefixes() {
        assert_eq!(
            route("/v1/messages"),
            Some((Dialect::Anthropic, ReqKind::Main))
        );
        assert_eq!(
            route("/v1/messages/count_tokens"),
            Some((Dialect::Anthropic, ReqKind::CountTokens))
        );
        assert_eq!(
            route("/v1/responses"),
            Some((Dialect::OpenaiResponses, ReqKind::Main))
        );
        assert_eq!(route("/v1/models"), None);
        assert_eq!(
            strip_session_prefix("/s/my-run.1/v1/messages"),
            (Some("my-run.1".into()), "/v1/messages")
        );
        assert_eq!(strip_session_prefix("/s/../v1"), (None, "/s/../v1"));
        assert_eq!(strip_session_prefix("/v1/messages"), (None, "/v1/messages"));
    }

    #[test]
    fn identity_precedence() {
        let body = br#"{"metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"abc\"}"},"messages":[]}"#;
        let p = ParsedBody::parse(body, "messages").unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            "user-agent",
            HeaderValue::from_static("claude-cli/2.1.332 (external, sdk-cli)"),
        );
        let id = identify(None, &h, Some(&p));
        assert_eq!(id.client_key.as_deref(), Some("cc:abc"));
        assert_eq!(id.client, "claude-code");
        h.insert("x-claude-code-session-id", HeaderValue::from_static("hdr"));
        assert_eq!(
            identify(None, &h, Some(&p)).client_key.as_deref(),
            Some("cc:hdr")
        );
        h.insert("x-oceancode-session", HeaderValue::from_static("mine"));
        assert_eq!(
            identify(None, &h, Some(&p)).client_key.as_deref(),
            Some("name:mine")
        );
        assert_eq!(
            identify(Some("pfx"), &h, Some(&p)).client_key.as_deref(),
            Some("name:pfx")
        );
        let mut h = HeaderMap::new();
        h.insert("session-id", HeaderValue::from_static("0199"));
        h.insert("originator", HeaderValue::from_static("codex_exec"));
        let id = identify(None, &h, None);
        assert_eq!(id.client_key.as_deref(), Some("codex:0199"));
        assert_eq!(id.client, "codex");
        assert_eq!(identify(None, &HeaderMap::new(), None).client_key, None);
    }

    #[test]
    fn title_requests_are_side_requests() {
        let t = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"output_config":{"format":{"type":"json_schema"}}}"#;
        assert!(is_side_request(
            Dialect::Anthropic,
            &ParsedBody::parse(t, "messages").unwrap()
        ));
        let m = br#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"name":"Bash"}],"output_config":{"effort":"medium"}}"#;
        assert!(!is_side_request(
            Dialect::Anthropic,
            &ParsedBody::parse(m, "messages").unwrap()
        ));
        let side = |b: &[u8]| {
            is_side_request(
                Dialect::Anthropic,
                &ParsedBody::parse(b, "messages").unwrap(),
            )
        };
        assert!(side(br#"{"messages":[],"output_config":{"format":{}}}"#));
        assert!(!side(
            br#"{"messages":[],"tools":[{"name":"Bash"}],"output_config":{"format":{}}}"#
        ));
        assert!(!side(
            br#"{"messages":[],"tools":null,"output_config":{"format":{}}}"#
        ));
        assert!(!side(br#"{"messages":[],"tools":[]}"#));
    }
}
